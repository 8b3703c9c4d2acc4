"""Training step time of torchvision's convolutional models: tpu fused vs
PyTorch CPU eager, side by side in one run (same weights, same batches).

    make bench          (runs it with the other benchmarks)
    python bench/conv.py [resnet18|convnext_tiny|mobilenet_v3_small ...]

Models are built from torchvision's code with random weights, images 64x64,
batch 4, SGD with momentum; the first steps (compilation) are not timed.
"""
import copy
import os
import sys
import tempfile
import time

import torch

os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-bench-"))
import torchtpu  # noqa: E402
import torchvision  # noqa: E402

WARMUP, STEPS = 3, 5
MODELS = ["resnet18", "convnext_tiny", "mobilenet_v3_small"]


def step_time(model, device, batches):
    """Median seconds per training step after the warm-up steps."""
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    times = []
    for i, (x, y) in enumerate(batches):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # waits for the step, as a training loop's logging does
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(names):
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.get_num_threads()} CPU "
          f"threads, tpu via {torchtpu._C.init()}; images 64x64, batch 4")
    print(f"\n{'model':<20} {'CPU eager ms':>13} {'tpu fused ms':>13} {'CPU/tpu':>8} {'fallbacks':>10}")
    for name in names:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(num_classes=10)
        batches = [(torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))) for _ in range(WARMUP + STEPS)]
        cpu = step_time(model, "cpu", batches)
        torchtpu.reset_metrics()
        with torchtpu.mode("fused"):
            tpu = step_time(model, "tpu", batches)
        fallbacks = sum(torchtpu.metrics()["fallbacks"].values())
        print(f"{name:<20} {cpu * 1e3:>13.1f} {tpu * 1e3:>13.1f} {cpu / tpu:>7.2f}x {fallbacks:>10}")
    print("\n(CPU/tpu > 1 means tpu is faster)")


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
