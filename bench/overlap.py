"""Step flushes on the flush thread (`exec/overlap.rs`) vs on the main thread
(TORCHTPU_OVERLAP=0), side by side in one run, for the three workloads of
examples/workloads.py, in a loop that reads its losses every 10 steps:

- the first 10 steps of a fresh process with an empty cache (the first
  steps' compiles overlap the recording of the steps after them);
- steps/s over the next 30 steps (every program compiled).

    python bench/overlap.py

Each number comes from its own fresh process.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FIRST, STEADY, READ_EVERY = 10, 30, 10


def _worker(workload):
    import torch

    import torchtpu  # noqa: F401
    from workloads import WORKLOADS, _flat_cross_entropy

    w = WORKLOADS[workload]
    torch.manual_seed(0)
    model = w.model().to("tpu")
    opt = w.optimizer(model.parameters(), w.lr)
    xs, ys = w.batches(FIRST + STEADY)
    losses = []

    def steps(first, count):
        for step in range(first, first + count):
            x, y = xs[step].to("tpu"), ys[step].to("tpu")
            opt.zero_grad()
            loss = _flat_cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if (step + 1) % READ_EVERY == 0:
                [l.item() for l in losses[-READ_EVERY:]]

    start = time.perf_counter()
    steps(0, FIRST)
    first = time.perf_counter() - start
    start = time.perf_counter()
    steps(FIRST, STEADY)
    print(first, STEADY / (time.perf_counter() - start), repr([l.item() for l in losses]))


def _run(workload, overlap):
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES), "TORCHTPU_CACHE_DIR": "", "TORCHTPU_OVERLAP": overlap}
    out = subprocess.run([sys.executable, __file__, workload], capture_output=True, text=True, env=env, check=True)
    first, per_s, losses = out.stdout.strip().splitlines()[-1].split(maxsplit=2)
    return float(first), float(per_s), losses


def main():
    print(f"first {FIRST} steps (cold cache) and steps/s after them; losses read every {READ_EVERY} steps")
    print("workload      first steps: overlapped  main thread  ratio   steps/s: overlapped  main thread  ratio")
    for workload in ("mlp", "transformer", "cnn"):
        (f1, s1, l1), (f0, s0, l0) = _run(workload, "1"), _run(workload, "0")
        same = "same losses" if l1 == l0 else "LOSSES DIFFER"
        print(f"{workload:12s} {f1:20.2f} s {f0:10.2f} s {f0 / f1:6.2f}x  {s1:17.1f} {s0:12.1f} {s1 / s0:7.2f}x"
              f"  ({same})")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _worker(sys.argv[1])
    else:
        main()
