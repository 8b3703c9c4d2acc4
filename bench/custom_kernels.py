"""Custom kernels, side by side in one run:

1. a fused training step of a small RMSNorm network whose norms are the
   Pallas kernel of examples/rms_norm.py, vs the same step with torch ops
   (tpu fused), vs PyTorch CPU eager;
2. the host cost of one kernel call after the first vs a native op of the
   same arity (two inputs, one output), strict mode, tiny tensors.

    python bench/custom_kernels.py [--steps N]
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-bench-"))
import torchtpu  # noqa: E402
import torchtpu.pallas as tp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from rms_norm import rms_norm, torch_rms_norm  # noqa: E402


class Net(nn.Module):
    """Linear -> RMSNorm -> GELU blocks, residual, then a classifier."""

    def __init__(self, norm, d=512, blocks=4, classes=10):
        super().__init__()
        self.norm = norm
        self.linears = nn.ModuleList(nn.Linear(d, d) for _ in range(blocks))
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(d)) for _ in range(blocks))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        for linear, scale in zip(self.linears, self.scales):
            x = x + nn.functional.gelu(self.norm(linear(x), scale))
        return self.head(x)


def step_ms(norm, device, steps):
    torch.manual_seed(0)
    net = Net(norm).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512).to(device), torch.randint(0, 10, (256,)).to(device)

    def step():
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    step(), step()  # compiled, cached
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


@tp.custom_jax_kernel
def add_kernel(a, b):
    return a + b


def per_call_us(fns, a, b, calls=2000, rounds=10):
    """Host time per call of each of `fns`: the best of `rounds` rounds, the
    functions alternating (the machine is shared)."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            fn(a, b)
            torch.tpu.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(a, b)
            best[i] = min(best[i], (time.perf_counter() - start) / calls * 1e6)
            torch.tpu.synchronize()
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    cpu = step_ms(torch_rms_norm, "cpu", args.steps)
    fused_torch = step_ms(torch_rms_norm, "tpu", args.steps)
    fused_kernel = step_ms(rms_norm, "tpu", args.steps)
    print("training step, 4 x (Linear 512 -> RMSNorm -> GELU), batch 256, AdamW (ms)")
    print(f"  CPU eager (torch ops)        {cpu:8.2f}")
    print(f"  tpu fused, torch ops         {fused_torch:8.2f}   {fused_torch / cpu:5.2f}x CPU")
    print(f"  tpu fused, Pallas kernel     {fused_kernel:8.2f}   {fused_kernel / cpu:5.2f}x CPU"
          f"   {fused_kernel / fused_torch:5.2f}x torch ops")
    a, b = torch.randn(4, device="tpu"), torch.randn(4, device="tpu")
    with torchtpu.mode("strict"):
        native, kernel = per_call_us([torch.add, add_kernel], a, b)
    print("host time per call, strict mode, f32[4] + f32[4] (us, best of 10 rounds)")
    print(f"  native torch.add             {native:8.2f}")
    print(f"  custom_jax_kernel            {kernel:8.2f}   {kernel / native:5.2f}x native")


if __name__ == "__main__":
    main()
