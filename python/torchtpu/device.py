"""`torch.tpu`: the device module PyTorch looks up for the "tpu" device."""
import torch

from . import _C

_initialized = False


def _lazy_init():
    """Starts the PJRT runtime on first use, raising its error if it cannot."""
    global _initialized
    if not _initialized:
        _C.init()
        _initialized = True


def is_available() -> bool:
    return _C.device_count() > 0


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return torch.accelerator.current_device_index()


def set_device(device) -> None:
    torch.accelerator.set_device_index(_get_device_index(device))


def synchronize(device=None) -> None:
    """Waits for all work issued to the tpu so far."""
    _C.synchronize()


def _get_device_index(device, optional=False) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.index is not None:
        return device.index
    return current_device()


class device:
    """Context manager that makes `index` the current tpu device."""

    def __init__(self, device):
        self.index = _get_device_index(device)
        self.previous = -1

    def __enter__(self):
        self.previous = current_device()
        torch.accelerator.set_device_index(self.index)

    def __exit__(self, *exc):
        torch.accelerator.set_device_index(self.previous)
        return False


def _generator(device=None):
    index = current_device() if device is None else _get_device_index(device)
    return torch._C._accelerator_getDefaultGenerator(index)


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        _generator(i).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _generator(device).set_state(new_state)


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]
