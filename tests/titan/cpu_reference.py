"""TorchTitan's training entry point on the CPU with gloo: the reference that
tpu runs are compared with. TorchTitan runs only on accelerators, so this
gives it a CPU that answers the questions it asks of a device module (memory
figures are zero), and lets FlexAttention, its language models' only
attention, run its dense implementation with a backward on the CPU (its
compiled CPU kernels have none, hence its refusal there). FSDP2 divides
gradients after gloo sums them (gloo has no PREMUL_SUM, which FSDP2 asks of
NCCL and tpu's backend)."""
import runpy
import types

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_collectives
import torch.nn.attention.flex_attention as flex

import torchtitan.tools.utils as utils

utils.device_type = "cpu"
utils.device_module = types.SimpleNamespace(
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: 0,
    set_device=lambda device: None,
    synchronize=lambda device=None: None,
    empty_cache=lambda: None,
    get_device_name=lambda device=None: "cpu",
    get_device_properties=lambda device=None: types.SimpleNamespace(name="cpu", total_memory=1 << 34),
    memory_stats=lambda device=None: {},
    reset_peak_memory_stats=lambda device=None: None,
)
flex._validate_device = lambda query, key, value: None
divide_factors = fsdp_collectives._get_gradient_divide_factors
fsdp_collectives._get_gradient_divide_factors = (
    lambda reduce_scatter_group, all_reduce_group, reduce_dtype, device_type="", factor=None, force=False:
    divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type, factor, True))

from torchtitan.models.common.attention import FlexAttention  # noqa: E402

FlexAttention._compiled_flex_attn = staticmethod(flex.flex_attention)
assert not torch.accelerator.is_available()
runpy.run_module("torchtitan.train", run_name="__main__")
