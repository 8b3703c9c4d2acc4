"""`torch.tpu`: the device module PyTorch looks up for the "tpu" device."""
import torch

from . import _C
from . import amp  # noqa: F401  (torch.tpu.amp)

_initialized = False


def _lazy_init():
    """Starts the PJRT runtime on first use, raising its error if it cannot."""
    global _initialized
    if not _initialized:
        _C.init()
        _initialized = True


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    """Whether the PJRT runtime has started (it starts on first use)."""
    return _C.is_initialized()


def init() -> None:
    _lazy_init()


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
    return _C.default_generator(index)


_ALL, _CURRENT = -1, -2  # devices of _C.seed_when_made


def _seed_value(seed) -> int:
    """`seed` as torch.Generator.manual_seed takes it: negative ones wrap."""
    seed = int(seed)
    if not -(2**63) <= seed < 2**64:
        raise ValueError("Overflow when unpacking long long")
    return seed % 2**64


def manual_seed(seed: int) -> None:
    # Before the generators are made, kept for them: seeding (torch.manual_seed)
    # starts no runtime, as on CUDA.
    seed = _seed_value(seed)
    if not _C.seed_when_made(_CURRENT, seed):
        _generator().manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    seed = _seed_value(seed)
    if not _C.seed_when_made(_ALL, seed):
        for i in range(device_count()):
            _generator(i).manual_seed(seed)


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


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---------------------------------------------------------------- properties


class _DeviceProperties:
    """What `get_device_properties` returns: the plugin's name of the device,
    its platform ("cpu", "cuda", "tpu") and total memory in bytes."""

    def __init__(self, index: int):
        self.name, self.platform = _C.device_name(index)
        self.total_memory = mem_get_info(index)[1]
        self.index = index

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"total_memory={self.total_memory // 2**20}MB)")


def get_device_properties(device=None) -> _DeviceProperties:
    return _DeviceProperties(_get_device_index(device))


def get_device_name(device=None) -> str:
    return _C.device_name(_get_device_index(device))[0]


# ---------------------------------------------------------------- memory
# The allocator's statistics (bytes held by live device buffers, peaks since
# the last reset), read through torch.accelerator as for any device.


def memory_stats(device=None) -> dict:
    return torch.accelerator.memory_stats(_get_device_index(device))


def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_get_device_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_get_device_index(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(_get_device_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_get_device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_get_device_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_get_device_index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    return torch.accelerator.get_memory_info(_get_device_index(device))


def empty_cache() -> None:
    torch.accelerator.empty_cache()


# ---------------------------------------------------------------- streams and events
# Every stream maps onto the device's one in-order queue (torchtpu's
# DeviceGuard), so their calls behave as on CUDA: work on any stream is
# ordered after the work issued before it.


class Stream(torch.Stream):
    """A tpu stream: `torch.tpu.Stream(device=None, priority=0)`."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # stream_id=, device_index=, device_type=: an existing stream
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, torch.device("tpu", _get_device_index(device)), priority=priority)


class Event(torch.Event):
    """A tpu event: `torch.tpu.Event(enable_timing=False, blocking=False, interprocess=False)`.

    Made a plain `torch.Event`: its `elapsed_time` accepts no subclass."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return torch.Event("tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def _as_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    return _as_stream(torch.accelerator.current_stream(_get_device_index(device)))


def default_stream(device=None) -> Stream:
    current = current_stream(device)
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes `stream` current in a block (and its device), as torch.cuda.stream."""

    def __init__(self, stream):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is None:
            return
        self.previous = torch.accelerator.current_stream(self.stream.device_index)
        self.device = device(self.stream.device_index)
        self.device.__enter__()
        torch.accelerator.set_stream(self.stream)

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        torch.accelerator.set_stream(self.previous)
        self.device.__exit__(*exc)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 runs natively on every PJRT platform torchtpu drives (XLA
    computes it in float32 where the hardware lacks it, as it does on CPUs):
    libraries ask this before choosing bf16 mixed precision."""
    return True
