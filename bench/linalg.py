"""Linear algebra on tpu against PyTorch CPU eager, side by side in one run:
each factorization's first call (compilation included) and its steady time.

    python bench/linalg.py [orders...]          (default: 16 64 256 1024)

float32, one matrix of each order, a right-hand side of 3 columns; each call
is read back. A fresh compilation cache, so the first call compiles.
"""
import os
import sys
import tempfile
import time

import torch

os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-bench-"))
import torchtpu  # noqa: E402

REPEATS = 5

CALLS = {
    "solve": lambda a, b, spd: torch.linalg.solve(a, b),
    "inv": lambda a, b, spd: torch.linalg.inv(a),
    "slogdet": lambda a, b, spd: torch.linalg.slogdet(a)[1],
    "cholesky": lambda a, b, spd: torch.linalg.cholesky(spd),
    "eigh": lambda a, b, spd: torch.linalg.eigh(spd)[1],
    "svd": lambda a, b, spd: torch.linalg.svd(a)[0],
    "svdvals": lambda a, b, spd: torch.linalg.svdvals(a),
}


def timed(fn, *args):
    start = time.perf_counter()
    fn(*args).cpu()
    return time.perf_counter() - start


def main():
    orders = [int(n) for n in sys.argv[1:]] or [16, 64, 256, 1024]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, tpu via {torchtpu._C.init()}")
    print(f"\n{'call':<10}{'order':>6}{'tpu first s':>13}{'tpu ms':>10}{'CPU eager ms':>14}{'CPU/tpu':>9}")
    for name, call in CALLS.items():
        for n in orders:
            g = torch.Generator().manual_seed(n)
            a, b = torch.randn(n, n, generator=g), torch.randn(n, 3, generator=g)
            spd = a @ a.T + n * torch.eye(n)
            on_tpu = [t.to("tpu") for t in (a, b, spd)]
            first = timed(call, *on_tpu)
            tpu = min(timed(call, *on_tpu) for _ in range(REPEATS))
            cpu = min(timed(call, a, b, spd) for _ in range(REPEATS))
            print(f"{name:<10}{n:>6}{first:>13.2f}{tpu * 1e3:>10.2f}{cpu * 1e3:>14.3f}{cpu / tpu:>8.3f}x")
    print(f"\nfallbacks: {torchtpu.metrics()['fallbacks'] or 'none'}")


if __name__ == "__main__":
    main()
