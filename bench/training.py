"""Training steps per second of the three workloads of examples/workloads.py:
tpu fused vs tpu strict vs PyTorch CPU eager, side by side in one run, plus
the MLP step written in JAX and jitted whole on XLA's CPU backend (the floor
for fused mode). First-step time includes compilation (an empty disk cache
unless TORCHTPU_CACHE_DIR points at a warm one).

    make bench        (installs requirements-kernels.txt: JAX; runs every benchmark)
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-bench-"))
import torchtpu  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
from workloads import train  # noqa: E402

STEPS = {"mlp": 20, "transformer": 10, "cnn": 10}


def run(workload, device):
    """(first step seconds, steps/s over the steps after the third)."""
    marks = [time.perf_counter()]
    torchtpu.reset_metrics()
    train(workload, device, STEPS[workload], on_step=lambda *_: marks.append(time.perf_counter()))
    fallbacks = torchtpu.metrics()["fallbacks"]
    if device == "tpu" and fallbacks:
        print(f"  ({workload} on tpu/{torchtpu.get_mode()} fell back to the CPU: {fallbacks})")
    return marks[1] - marks[0], (len(marks) - 4) / (marks[-1] - marks[3])


def jax_mlp(plugin):
    """(first step seconds, steps/s) of bench/jax_mlp.py on `plugin` (None:
    jaxlib's CPU backend), or None without JAX."""
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", ""))
    args = [plugin] if plugin else []
    out = subprocess.run([sys.executable, str(HERE / "jax_mlp.py"), *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        print(f"  (JAX reference not run: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode})")
        return None
    first, rate = out.stdout.split()
    return float(first), float(rate)


def main():
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, tpu via {torchtpu._C.init()}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"\n{'workload':<12} {'CPU eager':>10} {'strict':>10} {'fused':>10} {'fused/strict':>13} "
          f"{'fused/CPU':>10} {'first step fused':>17} {'JAX jit':>10} {'JAX/fused':>10}")
    plugin = str(torchtpu._plugin.find_plugin()[0])
    for workload in STEPS:
        _, cpu = run(workload, "cpu")
        with torchtpu.mode("strict"):
            _, strict = run(workload, "tpu")
        with torchtpu.mode("fused"):
            first, fused = run(workload, "tpu")
        jax = jax_mlp(plugin) if workload == "mlp" else None
        jax_cols = f"{jax[1]:>10.2f} {jax[1] / fused:>9.2f}x" if jax else f"{'-':>10} {'-':>10}"
        print(f"{workload:<12} {cpu:>10.2f} {strict:>10.2f} {fused:>10.2f} {fused / strict:>12.2f}x "
              f"{fused / cpu:>9.2f}x {first:>16.2f}s {jax_cols}")
    own = jax_mlp(None)
    if own:
        print(f"{'mlp':<12} JAX jit on jaxlib's own XLA CPU backend (another XLA build): {own[1]:.2f} steps/s")
    print("\n(steps/s; ratios > 1 mean fused is faster; JAX/fused > 1 means JAX is faster;\n"
          " JAX jit runs on torchtpu's PJRT plugin, the same XLA CPU backend)")


if __name__ == "__main__":
    main()
