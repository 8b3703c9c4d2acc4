"""Hugging Face Accelerate (and so `transformers.Trainer`) on tpu.

Accelerate picks its device, its distributed type and its gradient scaler
from a list of vendors; tpu joins the list where CUDA stands:
- `PartialState.default_device`: tpu, unless the script asked for the CPU
  (`cpu=True`, `use_cpu=True`), which Accelerate checks before asking;
- under a launcher (`accelerate launch`, `torchrun`): DDP over torchtpu's
  c10d backend ("cpu:gloo,tpu:pjrt", gloo for what stays on the CPU), each
  process on `tpu:<local rank>`, as `DistributedType.MULTI_GPU` — the type
  under which Accelerate runs DDP on an accelerator;
- `mixed_precision="fp16"`: autocast to float16 with `torch.amp.GradScaler("tpu")`
  (Accelerate admits fp16 only for the devices it names);
- `accelerate launch --num_processes N`: N processes of DDP, as with N GPUs;
- `save_state`/`load_state`: the tpu generators' states beside CUDA's place;
- `clear_device_cache`/`release_memory`: `torch.tpu.empty_cache()`;
- `get_max_memory` (`device_map="auto"`): the tpu devices' free memory.
"""
import inspect
import os
from pathlib import Path

import torch

from . import after_import, replace, restore_rng_states, save_rng_states, tpu_wanted

TPU_BACKEND = "cpu:gloo,tpu:pjrt"
KEY = "torch_tpu_manual_seed"  # beside Accelerate's "torch_cuda_manual_seed"


def _patch_state(state):
    def default_device(original):
        def get(self):
            return torch.device("tpu") if tpu_wanted() else original(self)

        return get

    replace(state.PartialState, "default_device", default_device)

    def prepare_backend(original):
        def prepare(self, cpu=False, sagemaker_dp=False, backend=None):
            launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
            if launched and not cpu and not sagemaker_dp and tpu_wanted():
                return backend or TPU_BACKEND, state.DistributedType.MULTI_GPU
            return original(self, cpu, sagemaker_dp, backend)

        return prepare

    replace(state.PartialState, "_prepare_backend", prepare_backend)

    def set_device(original):
        def set_(self):
            if self.device is None and self.distributed_type == state.DistributedType.MULTI_GPU and tpu_wanted():
                self.device = torch.device("tpu", self.local_process_index % torch.tpu.device_count())
                torch.tpu.set_device(self.device)
                return
            original(self)

        return set_

    replace(state.PartialState, "set_device", set_device)


def _patch_accelerator(accelerator):
    def init(original):
        # fp16 is refused for a device Accelerate does not name: the state is
        # made with fp16 held back, then given it with tpu's scaler.
        def __init__(self, *args, **kwargs):
            from accelerate.state import AcceleratorState
            from accelerate.utils import PrecisionType

            requested = kwargs.get("mixed_precision") or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
            if str(requested).lower() != PrecisionType.FP16 or kwargs.get("cpu") or not tpu_wanted():
                return original(self, *args, **kwargs)
            kwargs["mixed_precision"] = "no"
            held = os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
            try:
                original(self, *args, **kwargs)
            finally:
                if held is not None:
                    os.environ["ACCELERATE_MIXED_PRECISION"] = held
            if self.device.type != "tpu":
                return
            AcceleratorState._shared_state["_mixed_precision"] = "fp16"
            self.native_amp = True
            handler = self.scaler_handler.to_kwargs() if self.scaler_handler is not None else {}
            self.scaler = torch.amp.GradScaler("tpu", **handler)

        return __init__

    replace(accelerator.Accelerator, "__init__", init)


def _patch_checkpointing(checkpointing):
    # The tpu generators' states join the file of random states each process
    # writes (`random_states_<process index>.pkl`).
    def path(function, args, kwargs):
        bound = inspect.signature(function).bind(*args, **kwargs).arguments
        directory = bound.get("output_dir", bound.get("input_dir"))
        return Path(directory) / f"{checkpointing.RNG_STATE_NAME}_{bound['process_index']}.pkl"

    def save(original):
        def save_accelerator_state(*args, **kwargs):
            written = original(*args, **kwargs)
            if tpu_wanted():
                save_rng_states(path(original, args, kwargs), KEY, checkpointing.load)
            return written

        return save_accelerator_state

    def restore(original):
        def load_accelerator_state(*args, **kwargs):
            loaded = original(*args, **kwargs)
            if tpu_wanted():
                restore_rng_states(path(original, args, kwargs), KEY, checkpointing.load)
            return loaded

        return load_accelerator_state

    replace(checkpointing, "save_accelerator_state", save)
    replace(checkpointing, "load_accelerator_state", restore)


def _patch_memory(memory):
    def clear(original):
        def clear_device_cache(garbage_collection=False):
            original(garbage_collection)
            if tpu_wanted() and torch.tpu.is_initialized():
                torch.tpu.empty_cache()

        return clear_device_cache

    replace(memory, "clear_device_cache", clear)


def _patch_modeling(modeling):
    # `device_map="auto"` places a model on the devices this lists first.
    def max_memory(original):
        def get_max_memory(max_memory=None):
            found = original(max_memory)
            if max_memory is None and tpu_wanted() and not any(isinstance(k, int) for k in found):
                found = {**{i: torch.tpu.mem_get_info(i)[0] for i in range(torch.tpu.device_count())}, **found}
            return found

        return get_max_memory

    replace(modeling, "get_max_memory", max_memory)


def _patch_launch(launch):
    # `accelerate launch --num_processes N` starts N DDP processes where CUDA
    # has several GPUs; on tpu, wherever N > 1 is asked for (the CPU plugin
    # makes one device per local process).
    def validate(original):
        def _validate_launch_command(args):
            args, *rest = original(args)
            if not (args.multi_gpu or args.cpu or args.tpu or args.use_deepspeed or args.use_fsdp) \
                    and (args.num_processes or 1) > 1 and tpu_wanted():
                args.multi_gpu = True
            return (args, *rest)

        return _validate_launch_command

    replace(launch, "_validate_launch_command", validate)


def install():
    after_import("accelerate.state", _patch_state)
    after_import("accelerate.accelerator", _patch_accelerator)
    after_import("accelerate.checkpointing", _patch_checkpointing)
    after_import("accelerate.utils.memory", _patch_memory)
    after_import("accelerate.commands.launch", _patch_launch)
    after_import("accelerate.utils.modeling", _patch_modeling)
