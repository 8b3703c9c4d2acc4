"""Helion's Pallas kernels on tpu tensors.

Helion's Pallas launcher runs a kernel through Google's private `torch_tpu`
(`JaxCallable`), or, in interpret mode (`HELION_PALLAS_INTERPRET=1`), by
copying its tensors to the host, running JAX there and returning CPU tensors.
The smallest adapter: in interpret mode, a kernel whose inputs are tpu tensors
runs its jitted Pallas function through `custom_jax_kernel` instead, so it is
lowered once per signature, joins our programs and returns tpu tensors.
Compiled (Mosaic) Pallas needs `torch_tpu` and a TPU; on the CPU plugin
interpret mode is turned on by default.

Importing Helion takes seconds, so the adapter is applied when Helion's
launcher is first imported (or at once if it already is).
"""
import importlib.abc
import importlib.util
import os
import sys

_LAUNCHER = "helion.runtime.pallas.launcher"


def install(custom_jax_kernel, platform):
    if platform == "cpu":
        os.environ.setdefault("HELION_PALLAS_INTERPRET", "1")
    if _LAUNCHER in sys.modules:
        _adapt(sys.modules[_LAUNCHER], custom_jax_kernel)
    else:
        sys.meta_path.insert(0, _AfterImport(custom_jax_kernel))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Adapts Helion's launcher module right after it is executed."""

    def __init__(self, custom_jax_kernel):
        self.custom_jax_kernel = custom_jax_kernel

    def find_spec(self, name, path, target=None):
        if name != _LAUNCHER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _adapt(module, self.custom_jax_kernel)

        spec.loader.exec_module = exec_module
        return spec


def _adapt(launcher, custom_jax_kernel):
    base = launcher._PallasInterpretCallable
    if getattr(base, "_torchtpu", False):
        return

    class TpuInterpretCallable(base):
        _torchtpu = True

        def __call__(self, *input_tensors):
            if not any(t.device.type == "tpu" for t in input_tensors):
                return super().__call__(*input_tensors)
            kernel = self.__dict__.get("_kernel")
            if kernel is None:
                name = getattr(self._jit_fn, "__name__", "kernel")
                kernel = self._kernel = custom_jax_kernel(self._jit_fn, name=f"helion {name}")
            results = kernel(*input_tensors)
            results = tuple(results) if isinstance(results, (tuple, list)) else (results,)
            for out_idx, tensor_pos in self._inplace_output_mapping:
                input_tensors[tensor_pos].copy_(results[out_idx])
            return results

    launcher._PallasInterpretCallable = TpuInterpretCallable
