"""The first training step of a fresh process: empty compilation cache vs a
cache bundle from an earlier run (`torchtpu.cache.export` / `import_`), for the
three workloads of examples/workloads.py, side by side in one run.

    python bench/warm_cache.py

Each number comes from its own fresh process with its own empty cache
directory; the warm one imports the bundle the cold one exported. The step
is timed from its first tpu op to reading its loss (model, optimizer and data
are made before). An import loads the bundle's programs in a background thread
while the model is made, so the last column times the whole of it too: from
the import (or, cold, the same point) to the first loss.
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _worker(workload, bundle, role):
    import torch

    import torchtpu
    from workloads import WORKLOADS, _flat_cross_entropy

    imported = 0.0
    begin = time.perf_counter()
    if role == "warm":
        torchtpu.cache.import_(bundle)
        imported = time.perf_counter() - begin
    w = WORKLOADS[workload]
    torch.manual_seed(0)
    model = w.model().to("tpu")
    opt = w.optimizer(model.parameters(), w.lr)
    xs, ys = w.batches(1)
    # The step as examples/workloads.py's train() runs it, until its loss is read.
    start = time.perf_counter()
    x, y = xs[0].to("tpu"), ys[0].to("tpu")
    opt.zero_grad()
    loss = _flat_cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    loss.item()
    torch.tpu.synchronize()
    first = time.perf_counter() - start
    whole = time.perf_counter() - begin
    if role == "cold":
        torchtpu.cache.export(bundle)
    print(first, imported, whole, torchtpu.metrics()["compilations"])


def _run(workload, bundle, role, cache):
    out = subprocess.run([sys.executable, __file__, workload, bundle, role], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(EXAMPLES), "TORCHTPU_CACHE_DIR": cache}, check=True)
    first, imported, whole, compiled = out.stdout.split()
    return float(first), float(imported), float(whole), int(compiled)


def main():
    print("first training step, fresh process   cold cache         imported bundle             warm / cold"
          "   import to loss: cold   warm   warm / cold")
    for workload in ("mlp", "transformer", "cnn"):
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "warm.ttc")
            cold, _, cold_whole, cold_compiled = _run(workload, bundle, "cold", os.path.join(tmp, "cold"))
            warm, imported, warm_whole, warm_compiled = _run(workload, bundle, "warm", os.path.join(tmp, "warm"))
        print(f"  {workload:12s}                    {cold:6.2f} s ({cold_compiled} compiled)   "
              f"{warm:6.2f} s + {imported:.2f} s import ({warm_compiled} compiled)   {warm / cold:5.2f}x"
              f"             {cold_whole:6.2f} s {warm_whole:6.2f} s   {warm_whole / cold_whole:5.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _worker(*sys.argv[1:])
    else:
        main()
