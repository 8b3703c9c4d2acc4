"""torchtpu: "tpu" as an ordinary PyTorch device, run by XLA through PJRT.

Importing this package registers the device (so does `import torch` on a
machine without a CUDA/ROCm GPU: see `_torchtpu_autoload`). Everything per-op
happens in the native extension; this module is set-up glue.
"""
import atexit
import contextlib
import os
import time

import torch

from . import _C
from . import cache  # noqa: F401
from ._plugin import configure_plugin

_ONE_ACCELERATOR = (
    "PyTorch holds one accelerator per process, and a registered tpu takes CUDA's place "
    "(CUDA's autograd then fails: pytorch/pytorch#161129). Run the CUDA work and the tpu "
    "work in separate processes; on a machine with a GPU, `import torch` alone leaves CUDA "
    "as the accelerator and `import torchtpu` is what asks for tpu."
)


def _refuse_cuda():
    raise RuntimeError(f"torchtpu: CUDA is being initialised in a process that uses tpu. {_ONE_ACCELERATOR}")


if torch.cuda._is_compiled():
    if torch.cuda.is_initialized():
        raise RuntimeError(f"torchtpu: tpu cannot join a process that already uses CUDA. {_ONE_ACCELERATOR}")
    torch.cuda._lazy_call(_refuse_cuda)
    # Code that asks first is told CUDA is not this process's: Dynamo, for one,
    # saves CUDA's RNG state around every frame it compiles where CUDA is
    # available, which would initialise CUDA only to be refused.
    torch.cuda.is_available = lambda: False

configure_plugin()

from . import device as _device_module  # noqa: E402

torch.utils.rename_privateuse1_backend("tpu")
torch._register_device_module("tpu", _device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
# torch.autocast("tpu") without a dtype uses bfloat16, as on CPU (PyTorch's
# default for PrivateUse1 is float16). The setting is per thread in PyTorch:
# threads other than the importing one keep float16 unless they set it.
torch.set_autocast_dtype("tpu", torch.bfloat16)


def set_mode(mode: str) -> None:
    """Selects the eager mode: "fused" (the default: ops fused into XLA
    programs), "strict" (one asynchronous op at a time) or "debug" (each op
    synchronous and checked)."""
    _C.set_mode(mode)


def get_mode() -> str:
    return _C.get_mode()


@contextlib.contextmanager
def mode(name: str):
    """Runs a block in another eager mode: `with torchtpu.mode("debug"): ...`."""
    previous = get_mode()
    set_mode(name)
    try:
        yield
    finally:
        set_mode(previous)


def metrics() -> dict:
    """Counters of the runtime: ops, program executions, compilations, cache
    hits and misses (per-op plans, programs in memory and on disk, fused
    programs), time compiling and executing, CPU fallbacks by op name
    ("fallbacks"), fused-mode flushes by reason ("flushes"), why recent fused
    programs were compiled ("recompile_reasons"), live storages and buffers."""
    return _C.metrics()


def reset_metrics() -> None:
    _C.reset_metrics()


from .advice import advise  # noqa: E402,F401


from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402


def _after_optimizer_step(optimizer, args, kwargs):
    # One fused program per training step, with no call in the user's loop.
    # A compiled step of a tpu optimizer holds an op that flushes there.
    if not torch.compiler.is_compiling():
        _C.flush("optimizer_step")
    elif any(p.device.type == "tpu" for group in optimizer.param_groups for p in group["params"]):
        torch.ops.torchtpu.step_end()


register_optimizer_step_post_hook(_after_optimizer_step)


def _route_inductor():
    """Plain `torch.compile` (Inductor) of a graph on tpu uses our backend.

    Inductor maps the device name "tpu" to its Pallas code generator, written
    for another TPU stack; PyTorch has no per-device default backend, so the
    wrapper `torch.compile` builds for Inductor hands tpu graphs over to
    `torchtpu.compiler` and keeps every other graph.
    """
    wrapper = torch._TorchCompileInductorWrapper
    inductor_init, inductor = wrapper.__init__, wrapper.__call__

    def __init__(self, *args, **kwargs):
        # Before Dynamo traces anything: the backend adjusts how it traces
        # optimizers (see torchtpu.compiler).
        from . import compiler  # noqa: F401

        inductor_init(self, *args, **kwargs)

    def __call__(self, model_, inputs_):
        if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs_):
            from .compiler import backend

            return backend(model_, inputs_, options=self.config)
        return inductor(self, model_, inputs_)

    wrapper.__init__, wrapper.__call__ = __init__, __call__


_route_inductor()


def _distributed_backend(options, backend_options):
    """The c10d backend "pjrt" of tpu tensors, imported on first use."""
    from .distributed import create

    return create(options, backend_options)


def _gloo_backend(options, backend_options):
    """A gloo group, which carries tpu tensors too (torchtpu.distributed)."""
    from .distributed import create_gloo

    return create_gloo(torch.distributed.distributed_c10d._create_gloo_process_group, options, backend_options)


def _nccl_backend(options, backend_options):
    from .distributed import refuse_nccl

    refuse_nccl(options, backend_options)


def _register_distributed_backends():
    """"pjrt" for tpu tensors; "gloo" and "nccl" wrapped where this torch makes
    them through registered creators (2.15: gloo carries tpu tensors, nccl
    names the backends that do)."""
    backend = torch.distributed.Backend
    backend.register_backend("pjrt", _distributed_backend, extended_api=True, devices=["tpu"])
    if hasattr(torch.distributed.distributed_c10d, "_create_gloo_process_group"):
        for name, creator, kind in [("gloo", _gloo_backend, "GLOO"), ("nccl", _nccl_backend, "NCCL")]:
            backend.register_backend(name, creator, extended_api=True, devices=backend.backend_capability[name],
                                     _backend_type=getattr(torch.distributed.ProcessGroup.BackendType, kind))


if torch.distributed.is_available():
    _register_distributed_backends()

def _release_autograd_threads():
    """PyTorch's autograd thread for tpu drops a finished graph task after
    its caller has the result. Where that holds the last references to
    Python objects (the gradients `torch.autograd.grad` returned, once
    Python dropped its own), the thread waits for the GIL to release them;
    taking it once the interpreter is finalizing aborts the process
    ("terminate called without an active exception", the race of PyTorch's
    issue #190489). A moment without the GIL at exit lets it finish first."""
    time.sleep(0.005)


atexit.register(_release_autograd_threads)

# Accelerate, transformers' Trainer, Lightning: tpu where they name CUDA.
from . import integrations  # noqa: E402

integrations.install()

if "TORCHTPU_MODE" in os.environ:
    set_mode(os.environ["TORCHTPU_MODE"])

if os.environ.get("TORCHTPU_ADVISE") == "1":
    atexit.register(advise)
