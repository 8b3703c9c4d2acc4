"""Which PJRT plugin runs the device: chosen at start-up, never at build time.

TORCHTPU_PJRT_PLUGIN=/path/to/plugin.so wins; otherwise libtpu if installed
(a TPU VM), then XLA's CUDA plugin as JAX ships it (jax-cuda13-pjrt or
jax-cuda12-pjrt, on an NVIDIA GPU machine), otherwise XLA's own CPU plugin
(built from the XLA of jaxlib 0.11.2, packaged as lammps-jax-pjrt-cpu).
"""
import importlib.util
import mmap
import os
import warnings

from . import _C


def _package_file(package, name):
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], name)
    return path if os.path.exists(path) else None


def find_plugin():
    """(path, is_cpu_plugin), or (None, False) when no plugin is installed."""
    explicit = os.environ.get("TORCHTPU_PJRT_PLUGIN")
    if explicit:
        return explicit, "cpu" in os.path.basename(explicit)
    libtpu = _package_file("libtpu", "libtpu.so")
    if libtpu:
        return libtpu, False
    # Installed with JAX on machines without a GPU too: only where the driver is.
    for cuda in ("xla_cuda13", "xla_cuda12") if os.path.exists("/dev/nvidiactl") else ():
        path = _package_file(f"jax_plugins.{cuda}", "xla_cuda_plugin.so")
        if path:
            return path, False
    cpu = _package_file("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so")
    return cpu, cpu is not None


def spans_processes():
    """Whether the plugin's client is made for a torch.distributed group, each
    process holding its local rank's device: the GPU plugins (libtpu finds a
    TPU slice's hosts itself; XLA:CPU runs each process alone)."""
    path, is_cpu = find_plugin()
    return path is not None and not is_cpu and not os.path.basename(path).startswith("libtpu")


def _gpu_memory_fraction():
    value = os.environ.get("TORCHTPU_GPU_MEMORY_FRACTION", "0.75")
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if 0 < fraction <= 1:
        return fraction
    warnings.warn(f"torchtpu: TORCHTPU_GPU_MEMORY_FRACTION={value!r} is not a fraction in (0, 1]; using 0.75")
    return 0.75


def client_options(path, is_cpu):
    """The plugin's client options. On a GPU, memory is taken on demand (XLA's
    BFC allocator, growing up to TORCHTPU_GPU_MEMORY_FRACTION of the GPU,
    default 0.75) rather than XLA's default of preallocating that share at
    start, so that another process, or PyTorch's CUDA allocator, can share
    the GPU; TORCHTPU_GPU_PREALLOCATE=1 preallocates it, and
    TORCHTPU_GPU_ALLOCATOR picks XLA's allocator (bfc, platform: allocate and
    free each buffer exactly, cuda_async)."""
    if is_cpu:
        # The CPU plugin would split this machine into 4 devices by default.
        # Under torchrun each process gets as many as there are local ranks,
        # so that `tpu:<local rank>` exists in every one (each uses its own).
        default = os.environ.get("LOCAL_WORLD_SIZE", "1")
        return {"cpu_device_count": int(os.environ.get("TORCHTPU_DEVICE_COUNT", default))}
    if not spans_processes():
        return {}  # libtpu: a TPU host's memory is the process's own
    return {
        "allocator": os.environ.get("TORCHTPU_GPU_ALLOCATOR", "bfc"),
        "preallocate": os.environ.get("TORCHTPU_GPU_PREALLOCATE", "0") == "1",
        "memory_fraction": _gpu_memory_fraction(),
    }


def make_cpu_devices(n):
    """On the CPU plugin, before the device's first use, at least `n` devices
    here and in the processes this one starts (TORCHTPU_DEVICE_COUNT): for a
    launcher that asks for devices before it starts its processes. Another
    plugin has the devices the machine has."""
    path, is_cpu = find_plugin()
    if is_cpu and not _C.is_initialized() and n > client_options(path, is_cpu)["cpu_device_count"]:
        os.environ["TORCHTPU_DEVICE_COUNT"] = str(n)
        _C.configure(path, client_options(path, is_cpu))


def configure_plugin():
    path, is_cpu = find_plugin()
    if path is None:
        return  # every tpu operation will say how to install a plugin
    # XLA logs at INFO to stderr until absl is initialised, which no plugin
    # host does (the CPU plugin's "cpu_device_count set via create_options"
    # at every start); warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if is_cpu:
        _avoid_cpu_miscompilations(path)
    _C.configure(path, client_options(path, is_cpu))


# XLA:CPU settings that keep its library fusions from computing wrong numbers,
# set in XLA_FLAGS unless the user set them (the plugin reads them once, and
# the compilation cache keys on them):
# - XNNPACK's dot packs a right-hand side that is a program parameter once and
#   reuses the packed copy while the buffer's address is unchanged. Per-op
#   programs get a fresh buffer per call, often at a freed buffer's address,
#   and would multiply by stale weights.
# - YNNPACK's fusions of a product, a multiply or a sum with the ops around
#   them (the XLA of jaxlib 0.11.2) return wrong numbers, NaN or 1e200s, for a
#   batched product by a broadcast scalar multiplied and summed, as
#   `((E @ torch.full_like(E, c)) * E).sum(-1)` or an einsum of that form; the
#   products and convolutions alone still run in YNNPACK (bench/RESULTS.md,
#   2026-11-30).
_CPU_FLAGS = {
    "xla_cpu_use_xnnpack": "false",
    "xla_cpu_experimental_ynn_fusion_type": "individual_dot,individual_convolution",
}


def _avoid_cpu_miscompilations(path):
    flags = os.environ.get("XLA_FLAGS", "")
    # A flag the plugin's XLA does not know aborts the process at its first
    # compilation, so each is set only where the plugin names it.
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as plugin:
            extra = [f"--{flag}={value}" for flag, value in _CPU_FLAGS.items()
                     if flag not in flags and plugin.find(flag.encode()) >= 0]
    except (OSError, ValueError):
        return  # loading it will say what is wrong with the file
    os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
