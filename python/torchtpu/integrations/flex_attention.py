"""FlexAttention (`torch.nn.attention.flex_attention`) on tpu.

Its front door names the devices it accepts (CUDA, CPU, XPU, HPU, MPS) and
refuses the rest before anything runs. On tpu it works as on CUDA, forward
and backward: eagerly through its dense implementation (aten ops, fused into
the step's program), and under `torch.compile` as one XLA program with the
rest of the graph (its higher-order op reaches `torchtpu.compiler` like any
other). TorchTitan's language models, for one, attend only through it.
"""
from . import after_import, replace


def _patch(module):
    def validate_device(original):
        def wrapper(query, key, value):
            if query.device.type != "tpu":
                original(query, key, value)

        return wrapper

    replace(module, "_validate_device", validate_device)


def install():
    after_import("torch.nn.attention.flex_attention", _patch)
