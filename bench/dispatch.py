"""Per-op dispatch overhead and MLP step time: tpu (strict mode) against
PyTorch CPU eager, measured side by side in one run.

    .venv/bin/python bench/dispatch.py
"""
import sys
import time
from pathlib import Path

import torch

import torchtpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from workloads import mlp_batches, mlp_model  # noqa: E402


def per_op_us(fn, device, iters):
    for _ in range(200):
        fn()
    torch.accelerator.synchronize() if device == "tpu" else None
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if device == "tpu":
            torch.tpu.synchronize()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    return best


def tiny_ops():
    rows = []
    for name, make in (
        ("add(out=)", lambda a, b, c: (lambda: torch.add(a, b, out=c))),
        ("a + b", lambda a, b, c: (lambda: a + b)),
        ("a.add_(b)", lambda a, b, c: (lambda: a.add_(b))),
    ):
        times = {}
        for device in ("cpu", "tpu"):
            a, b, c = (torch.ones(4, device=device) for _ in range(3))
            times[device] = per_op_us(make(a, b, c), device, 20000)
        rows.append((name, times["cpu"], times["tpu"]))
    return rows


def mlp_step_ms(device, steps=30):
    torch.manual_seed(0)
    net = mlp_model().to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    xs, ys = mlp_batches(4)
    x, y = xs[0].to(device), ys[0].to(device)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    torchtpu.set_mode("strict")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, tpu via {torchtpu._C.init()}")
    print("\ntiny op (f32[4], cached program)     CPU eager    tpu strict    ratio")
    for name, cpu, tpu in tiny_ops():
        print(f"  {name:<34} {cpu:8.2f} us  {tpu:9.2f} us  {tpu / cpu:6.2f}x")
    cpu, tpu = mlp_step_ms("cpu"), mlp_step_ms("tpu")
    print("\nMLP 784-1024x3-10, batch 128, AdamW  CPU eager    tpu strict    speed-up")
    print(f"  train step (incl. loss.item())     {cpu:8.1f} ms  {tpu:9.1f} ms  {cpu / tpu:6.2f}x")


if __name__ == "__main__":
    main()
