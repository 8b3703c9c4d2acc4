"""The training workloads shared by the demo, the tests and the benchmarks:
ordinary PyTorch training loops in which only the device changes.

Each workload is a model, an optimizer and fixed synthetic data (no
download): an MLP classifier, a small decoder-only transformer language
model and a small ResNet-style CNN.
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def _generator():
    return torch.Generator().manual_seed(0)


# ------------------------------------------------------------------ MLP

def mlp_model():
    return nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )


def mlp_batches(steps, batch=128):
    """Random 784-vectors labelled by a random linear teacher."""
    g = _generator()
    teacher = torch.randn(784, 10, generator=g)
    x = torch.randn(steps, batch, 784, generator=g)
    return list(x), list((x @ teacher).argmax(-1))


# ------------------------------------------------------------------ transformer

class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, vocab=4096, seq=128, d=256, heads=4, layers=4, dropout=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(Block(d, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.drop = nn.Dropout(dropout)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        return self.head(self.ln(self.blocks(x)))


def gpt_batches(steps, batch=8, seq=128, vocab=4096):
    """Random token streams; the target is the next token."""
    tokens = torch.randint(0, vocab, (steps, batch, seq + 1), generator=_generator())
    return list(tokens[..., :-1]), list(tokens[..., 1:])


# ------------------------------------------------------------------ CNN

def _conv_bn_relu(cin, cout, stride):
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def cnn_model():
    """Three conv-batchnorm-relu stages (32/64/128 channels) on 32x32x3."""
    return nn.Sequential(
        *_conv_bn_relu(3, 32, 1), *_conv_bn_relu(32, 32, 1),
        *_conv_bn_relu(32, 64, 2), *_conv_bn_relu(64, 64, 1),
        *_conv_bn_relu(64, 128, 2), *_conv_bn_relu(128, 128, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )


def cnn_batches(steps, batch=32):
    g = _generator()
    return list(torch.randn(steps, batch, 3, 32, 32, generator=g)), list(torch.randint(0, 10, (steps, batch), generator=g))


# ------------------------------------------------------------------ loop

@dataclass
class Workload:
    name: str
    model: Callable[..., nn.Module]
    optimizer: Callable
    batches: Callable
    lr: float


def _flat_cross_entropy(out, y):
    return F.cross_entropy(out.flatten(0, -2), y.flatten())


WORKLOADS = {
    "mlp": Workload("mlp", mlp_model, torch.optim.AdamW, mlp_batches, 1e-3),
    "transformer": Workload("transformer", GPT, torch.optim.AdamW, gpt_batches, 1e-3),
    "cnn": Workload("cnn", cnn_model, lambda p, lr: torch.optim.SGD(p, lr, momentum=0.9), cnn_batches, 0.05),
}


def train(workload, device, steps, lr=None, on_step=None, read_loss_before_step=False, schedule=False,
          batches=None, compile=False, **model_args):
    """Trains `workload` (a name of WORKLOADS) from a fixed seed for `steps`
    steps; returns the losses. `on_step(step, model, optimizer, (x, y, loss))`
    runs after each step. `schedule` changes the learning rate every step
    (a tensor learning rate, as compiled optimizers want); `batches` replaces
    the workload's data; `compile` compiles the model and the optimizer's
    step with torch.compile; `model_args` go to its model."""
    w = WORKLOADS[workload]
    torch.manual_seed(0)
    net = w.model(**model_args).to(device)
    lr = lr or w.lr
    opt = w.optimizer(net.parameters(), torch.tensor(lr) if schedule and compile else lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if schedule else None
    model, step_fn = (torch.compile(net), torch.compile(opt.step)) if compile else (net, opt.step)
    xs, ys = batches or w.batches(steps)
    losses = []
    for step in range(steps):
        x, y = xs[step].to(device), ys[step].to(device)
        opt.zero_grad()
        loss = _flat_cross_entropy(model(x), y)
        loss.backward()
        if read_loss_before_step:
            losses.append(loss.item())
        step_fn()
        if sched:
            sched.step()
        if not read_loss_before_step:
            losses.append(loss.item())
        if on_step:
            on_step(step, net, opt, (x, y, loss))
    return losses
