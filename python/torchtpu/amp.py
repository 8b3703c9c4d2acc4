"""`torch.tpu.amp`: what `torch.cuda.amp` offers, for tpu — older training
code and libraries write `torch.<device>.amp.autocast(...)` and
`torch.<device>.amp.GradScaler()`. Each is `torch.amp`'s, on "tpu"."""
import functools

import torch


class autocast(torch.amp.autocast):
    """`torch.autocast("tpu", ...)`; without a dtype, tpu's autocast dtype
    (bfloat16 unless `torch.set_autocast_dtype("tpu", ...)` changed it)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True):
        super().__init__("tpu", enabled=enabled, dtype=dtype or torch.get_autocast_dtype("tpu"),
                         cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler("tpu", ...)`."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="tpu")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="tpu")
