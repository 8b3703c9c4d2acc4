"""Bad input gets PyTorch's own exception and message, and the process stays usable."""
import os

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import CPU_PLUGIN, run_python, synced


def raises_like_cpu(fn, *cpu_args):
    """fn raises on tpu exactly what it raises on CPU."""
    with pytest.raises(Exception) as cpu:
        fn(*cpu_args)
    with pytest.raises(type(cpu.value)) as tpu:
        synced(fn, *[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args])
    assert str(tpu.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    still_usable()


def still_usable():
    torch.testing.assert_close((torch.ones(3, device="tpu") * 2).cpu(), torch.full((3,), 2.0))


def test_shape_mismatch(mode):
    raises_like_cpu(torch.add, torch.ones(3), torch.ones(4))
    raises_like_cpu(torch.mm, torch.ones(2, 3), torch.ones(4, 5))
    raises_like_cpu(torch.cat, [torch.ones(2, 3), torch.ones(2, 4)], 0)
    raises_like_cpu(lambda a: a.view(5), torch.ones(6))


def test_out_of_range_indices(mode):
    raises_like_cpu(torch.index_select, torch.ones(4, 2), 0, torch.tensor([1, 4]))
    raises_like_cpu(torch.nn.functional.embedding, torch.tensor([0, 7]), torch.ones(5, 2))
    raises_like_cpu(lambda a: a.sum(3), torch.ones(2, 2))
    # index_select (so embedding) and index_add refuse negative indices, which indexing counts from the end.
    raises_like_cpu(torch.index_select, torch.ones(4, 2), 0, torch.tensor([-1]))
    raises_like_cpu(torch.nn.functional.embedding, torch.tensor([0, -1]), torch.ones(5, 2))
    raises_like_cpu(lambda a, i: a.index_add(0, i, torch.ones(1, device=a.device)), torch.zeros(3), torch.tensor([-1]))
    raises_like_cpu(lambda a, i: a.index_add(1, i, torch.ones(3, 1, device=a.device)), torch.zeros(3, 2), torch.tensor([-1]))


def test_bincount_rules(mode):
    """bincount's checks in CPU's order; a negative value is found on the device."""
    x = torch.tensor([1, 3, 0])
    raises_like_cpu(torch.bincount, x - 2)
    raises_like_cpu(torch.bincount, x.view(1, 3))
    raises_like_cpu(torch.bincount, x.float())
    raises_like_cpu(torch.bincount, x, torch.ones(2))
    raises_like_cpu(lambda a: torch.bincount(a, minlength=-1), x)


def test_histc_range_rules(mode):
    """histc's range from the data is checked on the device, and its message
    names the range's floats as CPU prints them."""
    raises_like_cpu(lambda a: torch.histc(a, bins=3), torch.tensor([1.0, float("inf")]))
    raises_like_cpu(lambda a: torch.histc(a, bins=3, min=0, max=float("inf")), torch.tensor([1.0, 2.0]))
    # CPU prints x86's default NaN as "-nan"; XLA's NaN prints as "nan".
    with pytest.raises(RuntimeError, match=r"torch.histc: range of \[-?nan, -?nan\] is not finite"):
        synced(lambda: torch.histc(torch.tensor([float("nan"), 0.5], device="tpu"), bins=2))
    still_usable()


def test_repeat_interleave_rules(mode):
    """repeat_interleave's repeats are checked on the device (its length measured)."""
    raises_like_cpu(torch.repeat_interleave, torch.tensor([-1, 2]))
    raises_like_cpu(lambda r: torch.repeat_interleave(r, output_size=5), torch.tensor([1, 2]))
    raises_like_cpu(torch.repeat_interleave, torch.tensor([[1, 2]]))
    raises_like_cpu(torch.repeat_interleave, torch.tensor([1.0]))


def test_dtype_rules(mode):
    raises_like_cpu(lambda a, b: torch.add(a, b, out=torch.empty(2, dtype=torch.long, device=a.device)),
                    torch.ones(2), torch.ones(2))
    raises_like_cpu(lambda a: a - a, torch.ones(2, dtype=torch.bool))


def test_elementwise_argument_rules(mode):
    """The structured elementwise forms (add, add_, mul_, ...) reach the core
    without PyTorch's meta function: the core checks its rules (alpha's kind,
    a written tensor's overlap with itself and with the inputs)."""
    raises_like_cpu(lambda a: torch.add(a, 1, alpha=1.5), torch.ones(3, dtype=torch.long))
    raises_like_cpu(lambda a: torch.rsub(a, 2, alpha=0.5), torch.ones(3, dtype=torch.int))
    raises_like_cpu(lambda a: torch.add(a, 1, alpha=True), torch.ones(3))
    raises_like_cpu(lambda a: a.expand(3).add_(1), torch.zeros(1))
    raises_like_cpu(lambda a: a[1:].mul_(a[:-1]), torch.arange(5.0))
    raises_like_cpu(lambda a: torch.add(a, a, out=a[1:]), torch.arange(5.0))


def test_number_argument_rules(mode):
    """CPU's rules on the values of number arguments, which plans do not
    carry (one plan serves every value): checked on each call."""
    raises_like_cpu(lambda a: a.fill_(300), torch.zeros(2, dtype=torch.uint8))
    raises_like_cpu(lambda a: a.fill_(-1.0), torch.zeros(2, dtype=torch.uint8))
    raises_like_cpu(lambda a: a.fill_(1e6), torch.zeros(2, dtype=torch.float16))
    raises_like_cpu(lambda a: a.fill_(float("nan")), torch.zeros(2, dtype=torch.int32))
    raises_like_cpu(lambda a: torch.full_like(a, 128), torch.zeros(2, dtype=torch.int8))
    raises_like_cpu(lambda a, m: a.masked_fill(m, 256), torch.zeros(2, dtype=torch.uint8), torch.tensor([True, False]))
    raises_like_cpu(lambda a, i: a.index_fill(0, i, -129), torch.zeros(2, dtype=torch.int8), torch.tensor([0]))
    raises_like_cpu(lambda a, i: a.scatter(0, i, 1e40), torch.zeros(2), torch.tensor([0]))
    raises_like_cpu(lambda a: a ** -2, torch.arange(3))
    # What CPU accepts: -1 wraps into uint8, infinities fill floats, a tensor of negative exponents computes.
    assert synced(lambda: torch.zeros(2, dtype=torch.uint8, device="tpu").fill_(-1)).tolist() == [255, 255]
    assert synced(lambda: torch.zeros(1, dtype=torch.float16, device="tpu").fill_(float("-inf"))).item() == float("-inf")
    assert synced(lambda: torch.arange(3, device="tpu") ** torch.tensor(-1, device="tpu")).tolist() == [0, 1, 0]


def test_ctc_loss_length_rules(mode):
    """CTC's lengths are data its programs do not carry: CPU's checks of
    their values run on each call (a call that fails them runs on the CPU,
    which raises its error)."""
    log_probs, targets = torch.randn(10, 3, 5).log_softmax(2), torch.randint(1, 5, (3, 4))
    for input_lengths, target_lengths in [([11, 3, 3], [2, 2, 2]), ([-1, 3, 3], [2, 2, 2]), ([3, 3, 3], [-2, 2, 2]),
                                          ([3, 3, 3], [5, 2, 2]), ([3, 3], [2, 2])]:
        raises_like_cpu(lambda x, t: F.ctc_loss(x, t, input_lengths, target_lengths), log_probs, targets)
    raises_like_cpu(lambda x, t: F.ctc_loss(x, t, [3, 3, 3], [2, 2, 2]), log_probs, targets.flatten()[:5])
    raises_like_cpu(lambda x, t: F.ctc_loss(x, t, [3, 3, 3], [2, 2, 2], blank=5), log_probs, targets)


def test_grid_sampler_shape_rules(mode):
    """CPU's checks of grid sampling's shapes (its kernels', which the
    lowerings make too)."""
    def sample(x, g):
        return F.grid_sample(x, g, align_corners=False)

    raises_like_cpu(sample, torch.ones(1, 2, 3, 3), torch.zeros(1, 2, 2, 3))
    raises_like_cpu(sample, torch.ones(2, 2, 3, 3), torch.zeros(1, 2, 2, 2))
    raises_like_cpu(sample, torch.ones(1, 2, 0, 3), torch.zeros(1, 2, 2, 2))
    raises_like_cpu(sample, torch.ones(1, 2, 3, 0, 3), torch.zeros(1, 2, 2, 2, 3))
    raises_like_cpu(lambda x, g: torch.grid_sampler_3d(x, g, 0, 0, False), torch.ones(1, 2, 3, 3, 3),
                    torch.zeros(1, 2, 2, 2, 2))
    raises_like_cpu(lambda x, g: torch.grid_sampler_2d(x, g, 0, 0, False), torch.ones(1, 2, 3, 3, 3),
                    torch.zeros(1, 2, 2, 2, 3))


def test_integer_division_by_zero(mode):
    """CPU's integer division raises for a zero divisor (CUDA's returns
    garbage): checked on the device, raised where the host next waits."""
    x = torch.tensor([7, -7])
    raises_like_cpu(lambda a: a // 0, x)
    raises_like_cpu(lambda a, b: a % b, x, torch.tensor([2, 0]))
    raises_like_cpu(lambda a: torch.fmod(a, 0), x.to(torch.uint8))
    raises_like_cpu(lambda a: torch.div(a, 0, rounding_mode="trunc"), x)
    assert synced(lambda: torch.tensor([-7, 7], device="tpu") // torch.tensor([2, -2], device="tpu")).tolist() == [-4, -4]


def test_mixing_devices(mode):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="tpu") + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device="tpu"), torch.ones(2, 2))
    still_usable()


def test_unsupported_dtype():
    with pytest.raises(TypeError, match="tpu does not support dtype UInt16"):
        torch.ones(2, dtype=torch.uint16).to("tpu") + 1
    still_usable()


def test_debug_nans_names_the_op():
    os.environ["TORCHTPU_DEBUG_NANS"] = "1"
    try:
        with torchtpu.mode("debug"):
            with pytest.raises(RuntimeError, match=r"aten::log.*produced NaN or Inf"):
                torch.log(torch.tensor([-1.0, 1.0], device="tpu"))
            still_usable()
    finally:
        del os.environ["TORCHTPU_DEBUG_NANS"]


# float32 elements of 1 TiB: more than any one device (or this machine) holds.
TOO_MANY = 2**38
# The bytes asked for, as XLA's CPU and GPU allocators write them.
TOO_MANY_BYTES = rf"({4 * TOO_MANY} bytes|1\.00TiB)"


def test_out_of_memory(mode):
    """PyTorch's OutOfMemoryError (a RuntimeError), naming the device and
    the bytes asked for, wherever the plugin reports it (at the launch on
    XLA:CPU; on a GPU when compiling or when a result is read); the process
    stays usable."""
    huge = None
    with pytest.raises(torch.OutOfMemoryError, match=f"out of memory on tpu:0 .*{TOO_MANY_BYTES}"):
        huge = torch.zeros(TOO_MANY, device="tpu")  # strict and debug fail here
        huge.sum().item()  # fused mode here: huge is alive, so it is materialized
    if huge is not None:  # its value was lost (XLA:CPU), or its buffer holds the failure (GPU)
        with pytest.raises(RuntimeError, match="out of memory on tpu:0"):
            huge[0].item()
        del huge
    still_usable()


def test_out_of_memory_at_a_step_end():
    """A step's flush fails on the flush thread (or, on a GPU, its program
    when it runs): its values are lost, and reading one raises the error."""
    with torchtpu.mode("fused"):
        huge = torch.zeros(TOO_MANY, device="tpu")
        torchtpu._C.flush("optimizer_step")
        with pytest.raises(RuntimeError, match="out of memory on tpu:0"):
            huge[0].item()
        del huge
        still_usable()
        assert torchtpu.metrics()["overlapped_flushes"] >= 1


def test_missing_plugin():
    code = (
        "import torch, torchtpu\n"
        "assert torch.tpu.device_count() == 0 and not torch.tpu.is_available()\n"
        "try:\n    torch.ones(2, device='tpu')\nexcept RuntimeError as e:\n    print(e)\n"
        "print(torch.ones(2).sum().item())\n"
    )
    out = run_python(code, TORCHTPU_PJRT_PLUGIN="/nonexistent/plugin.so")
    message, after = out.stdout.strip().splitlines()
    assert "cannot load PJRT plugin /nonexistent/plugin.so" in message
    assert "TORCHTPU_PJRT_PLUGIN" in message
    assert after == "2.0"


@pytest.mark.skipif(not CPU_PLUGIN, reason="XLA:CPU's JIT (a GPU plugin's client cannot start without mappings)")
def test_memory_mapping_limit():
    """Near the kernel's limit on memory mappings XLA's JIT fails and breaks
    the unwinder's tables (the next exception crashed the process): loading
    a program there is refused with a clear error instead."""
    code = (
        "import ctypes, mmap, os, torch, torchtpu\n"
        "libc = ctypes.CDLL(None); libc.mmap.restype = ctypes.c_void_p\n"
        "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
        "maps = lambda: sum(1 for _ in open(f'/proc/{os.getpid()}/maps'))\n"
        "limit = int(open('/proc/sys/vm/max_map_count').read())\n"
        "for i in range(limit - maps() - 40):  # alternate protections: regions never merge\n"
        "    libc.mmap(None, 4096, 1 + 2 * (i % 2), mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)\n"
        "try:\n    (torch.ones(5, device='tpu') * 3).cpu()\nexcept RuntimeError as e:\n    print(e)\n"
        "try:\n    torch.ones(2) + torch.ones(3)\nexcept RuntimeError:\n    print('usable')\n"
    )
    out = run_python(code, TORCHTPU_CACHE_DIR="", TORCHTPU_MODE="strict")
    message, after = out.stdout.strip().splitlines()
    assert "memory mappings (vm.max_map_count)" in message and "raise the limit" in message, out.stdout
    assert after == "usable"


def test_bad_mode():
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        torchtpu.set_mode("fast")
