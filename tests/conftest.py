import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

# Compiled programs persist in a directory of the test session's own (xdist's
# workers inherit it), removed when the process that made it exits: a run
# leaves ~300 MB of programs.
if "TORCHTPU_CACHE_DIR" not in os.environ:
    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-cache-")
    atexit.register(shutil.rmtree, os.environ["TORCHTPU_CACHE_DIR"], ignore_errors=True)
# One program per step on every plugin (the tests count them): parts of long
# steps, on by default off XLA:CPU, are tested where a test asks for them.
os.environ.setdefault("TORCHTPU_PART_OPS", "0")

import pytest
import torch

import torchtpu


# The XLA CPU plugin (every test here); the suite also runs on another plugin
# (TORCHTPU_PJRT_PLUGIN), skipping what only the CPU plugin can give.
CPU_PLUGIN = torchtpu._plugin.find_plugin()[1]


# torch 2.15 makes gloo groups through a registered creator, which torchtpu
# wraps so that gloo carries tpu tensors too; 2.11 has none to wrap.
GLOO_CARRIES_TPU = hasattr(torch.distributed.distributed_c10d, "_create_gloo_process_group")


def require_autoload():
    """Skips where `import torch` alone leaves tpu unregistered: on a machine
    with a CUDA/ROCm GPU, by design (python/_torchtpu_autoload)."""
    from _torchtpu_autoload import wanted

    if not wanted(torch):
        pytest.skip("import torch does not load torchtpu on a machine with a CUDA/ROCm GPU")


def require_devices(n):
    """Skips unless `n` devices can be had: the CPU plugin splits into as many
    as asked (TORCHTPU_DEVICE_COUNT, or one per local rank under torchrun);
    another plugin has the devices the machine has."""
    if not CPU_PLUGIN and torch.tpu.device_count() < n:
        pytest.skip(f"needs {n} devices; the plugin has {torch.tpu.device_count()}")


# A test marked `one_mode` checks lowerings, which are the same in every
# mode: each of its cases runs in fused or strict mode, in turn by a hash of
# the case (debug mode beside strict, on strict's programs), as test_ops.py
# splits OpInfo samples between the modes. TORCHTPU_TEST_ALL_MODES=1 runs
# every case in every mode.
ALL_MODES = os.environ.get("TORCHTPU_TEST_ALL_MODES") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "one_mode: each case runs in one mode, fused or strict in turn")


# `make test`'s workers take whole files in the order of collection: the
# longest first (test-seconds of a fresh-clone run, 2026-11-27: 517 to 62),
# so that the files left at the end are short and no worker waits long idle
# for the other. The order within a file stays.
LONGEST_FIRST = ["models/test_zoo.py", "test_distributed.py", "test_fused.py", "test_dynamic.py", "test_ops.py",
                 "test_op_values.py", "test_training.py", "test_nn.py", "models/test_training_libraries.py",
                 "test_conformance.py", "test_compile.py", "test_conv_norm.py", "test_warm_cache.py"]


def pytest_collection_modifyitems(items):
    here = os.path.dirname(os.path.abspath(__file__))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.relpath(str(item.path), here), len(rank)))


def case_mode(node):
    """The mode a `one_mode` case runs in."""
    case = [node.originalname] + [f"{k}={v}" for k, v in sorted(node.callspec.params.items()) if k != "mode"]
    return ("fused", "strict")[zlib.crc32(repr(case).encode()) % 2]


@pytest.fixture(params=["fused", "strict", "debug"])
def mode(request):
    """Runs a test in each eager mode (a `one_mode` test's case in its own)."""
    if request.node.get_closest_marker("one_mode") and not ALL_MODES:
        turn = case_mode(request.node)
        if request.param not in {"fused": ("fused",), "strict": ("strict", "debug")}[turn]:
            pytest.skip(f"this case runs in {turn} mode (TORCHTPU_TEST_ALL_MODES=1: every mode)")
    with torchtpu.mode(request.param):
        yield request.param


@pytest.fixture
def seeded_without_fallbacks():
    """Seeds torch's RNG and asserts the test ran nothing on the CPU."""
    torch.manual_seed(0)
    torchtpu.reset_metrics()
    yield
    assert torchtpu.metrics()["fallbacks"] == {}


def synced(fn, *args):
    """fn(*args), then waits for the device: in fused mode a data-dependent
    error (an index out of range) surfaces where the host waits, as on CUDA."""
    out = fn(*args)
    torch.tpu.synchronize()
    return out


def to_tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def run_python(code, **env):
    """Runs `code` in a fresh interpreter with extra environment variables;
    returns the finished process (asserting it exited cleanly)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, **env), timeout=120)
    assert out.returncode == 0, out.stderr
    return out
