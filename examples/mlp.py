"""The MLP workload shared by the demo, the tests and the benchmarks: an
ordinary PyTorch training loop in which only the device changes.

The data is a fixed synthetic classification task (no download): inputs are
random 784-vectors, labels come from a random linear teacher.
"""
import torch
import torch.nn as nn


def model():
    return nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )


def batches(steps, batch=128):
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(784, 10, generator=g)
    x = torch.randn(steps, batch, 784, generator=g)
    return x, (x @ teacher).argmax(-1)


def train(device, steps, lr, on_step=None):
    """Trains from a fixed seed; returns the losses. `on_step(step, model,
    optimizer, (x, y, loss))` runs after each step."""
    torch.manual_seed(0)
    net = model().to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    xs, ys = batches(steps)
    losses = []
    for step in range(steps):
        x, y = xs[step].to(device), ys[step].to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if on_step:
            on_step(step, net, opt, (x, y, loss))
    return losses
