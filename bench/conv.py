"""Training step time of torchvision's convolutional models: tpu fused vs
PyTorch CPU eager, side by side in one run (same weights, same batches).

    make bench          (runs it with the other benchmarks)
    python bench/conv.py [resnet18|convnext_tiny|mobilenet_v3_small ...]
    python bench/conv.py layers

Models are built from torchvision's code with random weights, images 64x64,
batch 4, SGD with momentum; the first steps (compilation) are not timed.
`layers`: each 3x3 convolution of examples/workloads.py's CNN (batch 32) alone,
forward, input gradient and weight gradient, each read back per call.
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


# (in channels, out channels, input size, stride) of the CNN's convolutions.
CNN_LAYERS = [(3, 32, 32, 1), (32, 32, 32, 1), (32, 64, 32, 2), (64, 64, 16, 1), (64, 128, 16, 2), (128, 128, 8, 1)]


def layer_time(device, part, cin, cout, size, stride, batch=32, calls=15):
    """Median ms of one convolution part, its result read back."""
    torch.manual_seed(0)
    w = torch.randn(cout, cin, 3, 3).to(device)
    x = torch.randn(batch, cin, size, size).to(device)
    out = (size - 1) // stride + 1
    g = torch.randn(batch, cout, out, out).to(device)
    mask = {"forward": None, "input grad": [True, False, False], "weight grad": [False, True, False]}[part]
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        if mask is None:
            y = torch.nn.functional.conv2d(x, w, stride=stride, padding=1)
        else:
            y = next(t for t in torch.ops.aten.convolution_backward(
                g, x, w, None, [stride] * 2, [1, 1], [1, 1], False, [0, 0], 1, mask) if t is not None)
        y.sum().item()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def layers():
    # Each shape alone: bucketing would run these same-structured programs
    # of other sizes as one bucketed program, which a model's step never is.
    os.environ["TORCHTPU_DYNAMIC"] = "0"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, tpu via {torchtpu._C.init()}; "
          f"the CNN's 3x3 convolutions, batch 32, ms per call")
    print(f"\n{'in-out, size, stride':<22} {'part':<12} {'CPU eager':>10} {'tpu fused':>10} {'CPU/tpu':>8}")
    for shape in CNN_LAYERS:
        for part in ("forward", "input grad", "weight grad"):
            cpu, tpu = layer_time("cpu", part, *shape), layer_time("tpu", part, *shape)
            name = f"{shape[0]}-{shape[1]}, {shape[2]}, s{shape[3]}"
            print(f"{name:<22} {part:<12} {cpu:>10.2f} {tpu:>10.2f} {cpu / tpu:>7.2f}x", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["layers"]:
        layers()
    else:
        main(sys.argv[1:] or MODELS)
