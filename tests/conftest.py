import os

import pytest
import torch

import torchtpu


@pytest.fixture(params=["strict", "debug"])
def mode(request):
    """Runs a test in each eager mode."""
    with torchtpu.mode(request.param):
        yield request.param


def to_tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x
