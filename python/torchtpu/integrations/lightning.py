"""Lightning on tpu: `Trainer(accelerator="torchtpu")`.

Lightning's own "tpu" accelerator means torch_xla, so torchtpu registers its
accelerator under the name "torchtpu" (in `lightning.pytorch` and in the
standalone `pytorch_lightning`, whichever the script imports). Where
Lightning's connector maps every device but CUDA and MPS to the CPU, the
accelerator's devices are kept:
- one device: `SingleDeviceStrategy(tpu:<index>)`; several: DDP, one process
  per device over torchtpu's c10d backend ("pjrt", PyTorch's default for tpu
  tensors), DDP made without the CUDA stream Lightning wraps it in;
- `precision="16-mixed"`/`"bf16-mixed"`: autocast on tpu (and
  `torch.amp.GradScaler("tpu")` for float16) rather than on "cuda".
On the CPU plugin, `devices=N` asked before the device is first used makes N
devices (TORCHTPU_DEVICE_COUNT, which the processes Lightning launches inherit).
"""
import torch

from .. import _plugin
from . import after_import, replace, tpu_wanted

NAME = "torchtpu"
_accelerator = {}  # Lightning package -> torchtpu's Accelerator class in it


def _parse(devices):
    """`devices` as Lightning takes it (3, -1, "3", "0,2", [0, 2]): indices."""
    if isinstance(devices, str):
        devices = devices.strip()
        devices = [int(d) for d in devices.split(",") if d.strip()] if "," in devices else int(devices)
    if isinstance(devices, int):
        count = devices if devices >= 0 else torch.tpu.device_count()
        devices = list(range(count))
    return list(devices)


def _define_accelerator(package, accelerators):
    from importlib import import_module

    MisconfigurationException = import_module(f"{package}.utilities.exceptions").MisconfigurationException

    class TorchTPUAccelerator(accelerators.Accelerator):
        """torchtpu's tpu device, one per process."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != "tpu":
                raise MisconfigurationException(f"Device should be tpu, got {device} instead.")
            torch.tpu.set_device(device)

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices):
            indices = _parse(devices)
            if not indices:
                raise MisconfigurationException(f"`devices={devices!r}` selects no tpu device.")
            _plugin.make_cpu_devices(max(indices) + 1)
            if max(indices) >= torch.tpu.device_count():
                raise MisconfigurationException(
                    f"`devices={devices!r}` asks for tpu:{max(indices)}, but this process has "
                    f"{torch.tpu.device_count()} tpu device(s). On the CPU plugin, create the Trainer before "
                    "the first use of the device (or set TORCHTPU_DEVICE_COUNT).")
            return indices

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("tpu", i) for i in _parse(devices)]

        @staticmethod
        def auto_device_count() -> int:
            return torch.tpu.device_count()

        @staticmethod
        def is_available() -> bool:
            return tpu_wanted()

        @staticmethod
        def name() -> str:
            return NAME

        def get_device_stats(self, device):
            return torch.tpu.memory_stats(device)

        @classmethod
        def register_accelerators(cls, accelerator_registry) -> None:
            accelerator_registry.register(NAME, cls, description="torchtpu: the tpu device, run by XLA through PJRT")

    TorchTPUAccelerator.__module__ = __name__
    _accelerator[package] = TorchTPUAccelerator
    TorchTPUAccelerator.register_accelerators(accelerators.AcceleratorRegistry)


def _patch_connector(package, connector):
    from importlib import import_module

    strategies = import_module(f"{package}.strategies")
    MixedPrecision = import_module(f"{package}.plugins.precision").MixedPrecision

    def ours(self):
        return isinstance(self.accelerator, _accelerator[package])

    def choose_strategy(original):
        def _choose_strategy(self):
            if ours(self) and self._num_nodes_flag <= 1 and len(self._parallel_devices) <= 1:
                return strategies.SingleDeviceStrategy(device=self._parallel_devices[0])
            return original(self)

        return _choose_strategy

    def precision(original):
        def _check_and_init_precision(self):
            mixed = self._precision_flag in ("16-mixed", "bf16-mixed")
            if ours(self) and mixed and self._precision_plugin_flag is None:
                self._validate_precision_choice()
                return MixedPrecision(self._precision_flag, "tpu")
            return original(self)

        return _check_and_init_precision

    replace(connector._AcceleratorConnector, "_choose_strategy", choose_strategy)
    replace(connector._AcceleratorConnector, "_check_and_init_precision", precision)


def _patch_ddp(ddp):
    def setup_model(original):
        # Lightning makes DDP inside a new CUDA stream; tpu has one queue.
        def _setup_model(self, model):
            if self.root_device.type != "tpu":
                return original(self, model)
            device_ids = self.determine_ddp_device_ids()
            return ddp.DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)

        return _setup_model

    replace(ddp.DDPStrategy, "_setup_model", setup_model)


def install():
    for package in ("lightning.pytorch", "pytorch_lightning"):
        after_import(f"{package}.accelerators", lambda m, p=package: _define_accelerator(p, m))
        after_import(f"{package}.trainer.connectors.accelerator_connector", lambda m, p=package: _patch_connector(p, m))
        after_import(f"{package}.strategies.ddp", _patch_ddp)
