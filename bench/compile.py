"""torch.compile on tpu, side by side in one run: the GPT of
examples/workloads.py in inference at batch 1 (eval, 128 tokens) and the
three training steps, each as CPU eager, CPU Inductor, tpu fused eager and
tpu compiled; and the per-call overhead of a compiled graph beyond its PJRT
execute, on a tiny graph.

    python bench/compile.py [--steps N] [--no-inductor]
"""
import argparse
import sys
import time
from pathlib import Path

import torch

import torchtpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from workloads import GPT, WORKLOADS, _flat_cross_entropy  # noqa: E402


def timed(fn, steps, sync):
    fn()
    fn()  # warm: compiled, cached
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - start) / steps * 1e3


def sync_for(device):
    return torch.tpu.synchronize if device == "tpu" else (lambda: None)


def inference(device, compile_, steps):
    torch.manual_seed(0)
    net = GPT().eval().to(device)
    idx = torch.randint(0, 4096, (1, 128)).to(device)
    model = torch.compile(net) if compile_ else net

    def run():
        with torch.no_grad():
            out = model(idx)
        if device == "tpu":
            torchtpu._C.flush("host_read")
        return out

    return timed(run, steps, sync_for(device))


def training(name, device, compile_, steps):
    w = WORKLOADS[name]
    torch.manual_seed(0)
    net = w.model(**(dict(dropout=0.0) if name == "transformer" else {})).to(device)
    opt = w.optimizer(net.parameters(), w.lr)
    xs, ys = w.batches(1)
    x, y = xs[0].to(device), ys[0].to(device)
    model, step = (torch.compile(net), torch.compile(opt.step)) if compile_ else (net, opt.step)

    def run():
        opt.zero_grad()
        _flat_cross_entropy(model(x), y).backward()
        step()

    return timed(run, steps, sync_for(device))


def call_overhead(calls=2000):
    """A compiled 2-input add in strict mode: wall time per call minus the
    time PJRT's execute took (metrics), i.e. what the backend adds."""
    f = torch.compile(lambda a, b: a + b)
    a, b = torch.ones(4, device="tpu"), torch.ones(4, device="tpu")
    with torchtpu.mode("strict"):
        for _ in range(3):
            f(a, b)
        torch.tpu.synchronize()
        before = torchtpu.metrics()["execute_ns"]
        start = time.perf_counter()
        for _ in range(calls):
            f(a, b)
        wall = time.perf_counter() - start
        torch.tpu.synchronize()
        execute = (torchtpu.metrics()["execute_ns"] - before) / 1e9
    return wall / calls * 1e6, (wall - execute) / calls * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-inductor", action="store_true", help="skip CPU Inductor (its C++ builds are slow)")
    args = p.parse_args()
    variants = [("cpu eager", "cpu", False), ("cpu inductor", "cpu", True), ("tpu fused", "tpu", False),
                ("tpu compiled", "tpu", True)]
    if args.no_inductor:
        variants.pop(1)
    rows = [("gpt inference b1", lambda d, c: inference(d, c, args.steps))]
    rows += [(f"{n} training step", lambda d, c, n=n: training(n, d, c, args.steps)) for n in WORKLOADS]
    print(f"{'ms per call':24}" + "".join(f"{v[0]:>14}" for v in variants) + f"{'compiled/cpu':>14}")
    for name, fn in rows:
        times = [fn(device, compile_) for _, device, compile_ in variants]
        print(f"{name:24}" + "".join(f"{t:14.2f}" for t in times) + f"{times[-1] / times[0]:14.2f}", flush=True)
        torch._dynamo.reset()
    total, beyond = call_overhead()
    print(f"compiled call of a tiny graph: {total:.1f} us per call, {beyond:.1f} us beyond PJRT's execute")


if __name__ == "__main__":
    main()
