"""Trains an MLP on "tpu" — an ordinary PyTorch loop with only the device
changed — in each eager mode, and prints its losses and steps/s.

The data is a fixed synthetic classification task (no download): inputs are
random 784-vectors, labels come from a random linear teacher.
"""
import time

import torch
import torch.nn as nn

import torchtpu

STEPS = 20
LR = 1e-3


def make_model():
    return nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )


def make_data(batch=128):
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(784, 10, generator=g)
    x = torch.randn(STEPS, batch, 784, generator=g)
    return x, (x @ teacher).argmax(-1)


def train(device, mode=None):
    torch.manual_seed(0)
    model = make_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    xs, ys = make_data()
    losses, start = [], None
    for step in range(STEPS):
        if step == 2:  # the first steps compile; time the rest
            start = time.perf_counter()
        x, y = xs[step].to(device), ys[step].to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    rate = (STEPS - 2) / (time.perf_counter() - start)
    return losses, rate


def main():
    results = {"cpu": train("cpu")}
    for mode in ("debug", "strict"):
        with torchtpu.mode(mode):
            torchtpu.reset_metrics()
            results[f"tpu/{mode}"] = train("tpu")
            fallbacks = torchtpu.metrics()["fallbacks"]
            if fallbacks:
                print(f"tpu/{mode}: CPU fallbacks {fallbacks}")
    for name, (losses, rate) in results.items():
        print(f"{name:>11}: {rate:6.1f} steps/s  losses " + " ".join(f"{l:.4f}" for l in losses[::4]))
    ref = results["cpu"][0]
    for name, (losses, _) in results.items():
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        print(f"{name:>11}: max relative loss difference to CPU {worst:.2e}")


if __name__ == "__main__":
    main()
