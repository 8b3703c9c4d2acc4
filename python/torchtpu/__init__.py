"""torchtpu: "tpu" as an ordinary PyTorch device, run by XLA through PJRT.

Importing this package (or just `import torch`, through PyTorch's backend
autoload entry point) registers the device. Everything per-op happens in the
native extension; this module is set-up glue.
"""
import contextlib
import os


def _autoload():
    """Entry point of `torch.backends`: importing this package does the work.

    Defined before `import torch`, which calls it while this module is still
    initialising when the user imports torchtpu first.
    """


import torch  # noqa: E402

from . import _C  # noqa: E402
from ._plugin import configure_plugin  # noqa: E402

configure_plugin()

from . import device as _device_module  # noqa: E402

torch.utils.rename_privateuse1_backend("tpu")
torch._register_device_module("tpu", _device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)


def set_mode(mode: str) -> None:
    """Selects the eager mode: "debug" (synchronous, checked) or "strict"."""
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
    """Counters of the runtime: ops, executions, compilations, cache hits,
    CPU fallbacks by op name (under "fallbacks"), live storages and buffers."""
    return _C.metrics()


def reset_metrics() -> None:
    _C.reset_metrics()


if "TORCHTPU_MODE" in os.environ:
    set_mode(os.environ["TORCHTPU_MODE"])
