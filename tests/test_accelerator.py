"""What training libraries expect of an accelerator, as CUDA provides it:
shared parameters stay shared across moves, true memory statistics,
streams and events, pinned host memory, and CUDA's dtype support where CPU
has less (histc of integers)."""
import copy

import pytest
import torch
from torch import nn

import torchtpu
from conftest import CPU_PLUGIN


class Tied(nn.Module):
    """Tied input and output embeddings, as GPT-2 and T5 have."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.hidden = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.hidden(self.embed(ids))))


def assert_tied(m, weight):
    assert m.embed.weight is m.head.weight is weight
    assert len(list(m.parameters())) == 3


def test_moves_keep_parameters_shared():
    m = Tied()
    weight = m.embed.weight
    for move in (lambda m: m.to("tpu"), lambda m: m.to(torch.float64), lambda m: m.cpu(),
                 lambda m: m.tpu().float()):
        move(m)
        assert_tied(m, weight)
    assert weight.device.type == "tpu" and weight.dtype == torch.float32
    m.load_state_dict(Tied().state_dict())
    assert_tied(m, weight)
    # What nn.Module._apply and the FSDP wrapper do with a parameter.
    assert torch._has_compatible_shallow_copy_type(torch.zeros(1), torch.zeros(1, device="tpu"))
    p = nn.Parameter(torch.randn(3))
    p.data = torch.ones(3).to("tpu")
    assert p.device.type == "tpu" and p.tolist() == [1.0, 1.0, 1.0]


def test_tied_model_trains_as_on_cpu(mode):
    torch.manual_seed(0)
    cpu = Tied()
    tpu = copy.deepcopy(cpu).to("tpu")
    assert_tied(tpu, tpu.embed.weight)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, tpu)]
    assert len(opts[1].param_groups[0]["params"]) == 3
    torchtpu.reset_metrics()
    for _ in range(3):
        ids = torch.randint(0, 16, (4, 6))
        losses = []
        for model, opt, device in zip((cpu, tpu), opts, ("cpu", "tpu")):
            logits = model(ids.to(device))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten().to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tpu.head.weight.cpu(), cpu.head.weight, rtol=1e-4, atol=1e-5)
    assert torchtpu.metrics()["fallbacks"] == {}


def test_memory_statistics():
    def make():  # 2 MB, once its scalars (1 and 2) are uploaded and cached
        x = torch.ones(1000, 250, device="tpu")
        return x, x * 2

    make()
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    x, y = make()
    assert torch.tpu.memory_allocated() == base + 2_000_000
    assert torch.tpu.max_memory_allocated() >= base + 2_000_000
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + 2_000_000
    assert stats["allocation.all.current"] >= 2
    del x, y
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() >= base + 2_000_000
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base
    torch.tpu.empty_cache()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    props = torch.tpu.get_device_properties(0)
    assert props.total_memory == total and props.name == torch.tpu.get_device_name()
    assert isinstance(torch.tpu.get_device_name(), str) and torch.tpu.is_initialized()


def test_streams():
    default = torch.tpu.current_stream()
    assert default == torch.tpu.default_stream() and default.stream_id == 0
    s = torch.tpu.Stream()
    assert isinstance(s, torch.Stream) and s != default and s.device == torch.device("tpu:0")
    assert torch.Stream("tpu").device_type == s.device_type
    x = torch.arange(6.0, device="tpu")
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        y = x * 3
        y.record_stream(s)
    assert torch.tpu.current_stream() == default
    default.wait_stream(s)
    s.synchronize()
    assert s.query() and default.query()
    assert y.tolist() == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]


def test_events():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert start.query()  # never recorded
    with pytest.raises(ValueError, match="Both events must be recorded"):
        start.elapsed_time(end)
    x = torch.randn(256, 256, device="tpu")
    start.record()
    for _ in range(3):
        x = x @ x / 16
    end.record()
    torch.tpu.current_stream().wait_event(end)
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    untimed = torch.tpu.Event()
    untimed.record()
    untimed.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):
        start.elapsed_time(untimed)
    assert torch.isfinite(x).all()


def test_waits_cover_computations_whose_outputs_were_dropped():
    """A loop that discards its results (a benchmark's) is still waited for."""
    n = 1536 if CPU_PLUGIN else 8192  # ~19 GFLOP here, ~4 TFLOP on an accelerator
    x = torch.randn(n, n, device="tpu")
    with torchtpu.mode("strict"):  # fused mode would prune work nobody reads
        torch.tpu.synchronize()
        for _ in range(4):
            x @ x  # dropped at once
        end = torch.tpu.Event()
        end.record()
        assert not end.query()  # the products are still running
        torch.tpu.synchronize()
        assert end.query() and torch.tpu.current_stream().query()


def test_pinned_memory():
    x = torch.randn(4, 3)
    assert not x.is_pinned()
    pinned = x.pin_memory()
    assert pinned.is_pinned() and pinned[1:].is_pinned()
    torch.testing.assert_close(pinned.to("tpu", non_blocking=True).cpu(), x)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8))
    for batch, labels in torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True):
        assert batch.is_pinned() and labels.is_pinned()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_follows_cuda(dtype):
    """CPU has no integer histc; CUDA's counts positions in int64."""
    x = torch.randint(0, 9, (200,)).to(dtype)
    wide = x.long()
    for bins, lo, hi in ((8, 0, 7), (3, 2, 6), (5, 0, 0)):
        actual = torch.histc(x.to("tpu"), bins=bins, min=lo, max=hi)
        if lo == hi:  # the data's range
            lo, hi = int(wide.min()), int(wide.max())
        inside = (wide >= lo) & (wide <= hi)
        pos = ((wide[inside] - lo) * bins // (hi - lo)).clamp(max=bins - 1)
        assert actual.dtype == dtype
        assert torch.equal(actual.cpu(), torch.bincount(pos, minlength=bins).to(dtype))


def test_trace_of_bool_follows_cuda():
    """CPU has no bool trace; CUDA's sums the diagonal, counting in int64."""
    m = torch.tensor([[True, False, True], [False, False, True]])
    actual = torch.trace(m.to("tpu"))
    assert actual.dtype == torch.int64 and actual.item() == 1


def test_abs_of_bool_follows_cuda():
    """CPU's abs rejects bool; CUDA's keeps it as it is, and so `softsign`
    of bool (x / (1 + |x|)) runs there too."""
    x = torch.tensor([True, False, True])
    assert torch.equal(torch.abs(x.to("tpu")).cpu(), x)
    y = x.to("tpu")
    y.abs_()
    assert torch.equal(y.cpu(), x)
    torch.testing.assert_close(torch.nn.functional.softsign(x.to("tpu")).cpu(), x / (1 + x.long()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_antialiased_resize_of_half_types_follows_cuda(dtype):
    """CPU's antialiased resize takes float32 and float64 only; CUDA's also
    takes float16 and bfloat16 (computed in float32)."""
    x = torch.rand(1, 3, 20, 30).to(dtype)
    actual = torch.nn.functional.interpolate(x.to("tpu"), size=(7, 11), mode="bilinear", antialias=True)
    expected = torch.nn.functional.interpolate(x.float(), size=(7, 11), mode="bilinear", antialias=True)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.cpu(), expected.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_multi_margin_loss_of_half_types_follows_cuda(dtype):
    """CPU's multi-class margin loss takes float32 and float64 only; CUDA's
    also takes float16 and bfloat16 (accumulated in float32); its gradient too."""
    x = torch.randn(6, 5).to(dtype)
    y = torch.tensor([0, 4, 2, 1, 3, 2])
    w = torch.rand(5).to(dtype)
    tpu_x = x.to("tpu").requires_grad_()
    actual = torch.nn.functional.multi_margin_loss(tpu_x, y.to("tpu"), p=2, weight=w.to("tpu"))
    actual.backward()
    cpu_x = x.float().requires_grad_()
    expected = torch.nn.functional.multi_margin_loss(cpu_x, y, p=2, weight=w.float())
    expected.backward()
    assert actual.dtype == tpu_x.grad.dtype == dtype
    torch.testing.assert_close(actual.cpu(), expected.to(dtype))
    torch.testing.assert_close(tpu_x.grad.cpu(), cpu_x.grad.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_avg_pool3d_of_half_types_follows_cuda(dtype):
    """CPU's 3-d average pooling takes no float16 or bfloat16; CUDA's does
    (summed in float32); its gradient too."""
    x = torch.randn(2, 3, 5, 6, 7).to(dtype)
    tpu_x = x.to("tpu").requires_grad_()
    actual = torch.nn.functional.avg_pool3d(tpu_x, 3, stride=2, padding=1, count_include_pad=False)
    actual.backward(torch.ones_like(actual))
    cpu_x = x.float().requires_grad_()
    expected = torch.nn.functional.avg_pool3d(cpu_x, 3, stride=2, padding=1, count_include_pad=False)
    expected.backward(torch.ones_like(expected))
    assert actual.dtype == tpu_x.grad.dtype == dtype
    torch.testing.assert_close(actual.cpu(), expected.to(dtype))
    torch.testing.assert_close(tpu_x.grad.cpu(), cpu_x.grad.to(dtype))


def test_precision_probes():
    """What libraries ask a device module before choosing bf16 mixed precision
    (Accelerate, Lightning, transformers' `is_torch_bf16_gpu_available`-style checks)."""
    module = torch.get_device_module("tpu")
    assert module.is_bf16_supported() and module.is_bf16_supported(including_emulation=False)
    assert torch.bfloat16 in module.get_amp_supported_dtype()
    with torch.autocast("tpu"):
        assert (torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")).dtype == torch.bfloat16


def test_what_torchtitan_asks_of_the_device():
    """TorchTitan picks its device with `torch._utils`' accelerator probe, its
    backend from c10d's map, and calls these on the device's module (the full
    runs: `make titan`, tests/titan)."""
    import torch.distributed as dist
    from torch._utils import _get_available_device_type, _get_device_module

    assert _get_available_device_type() == "tpu"
    module = _get_device_module("tpu")
    assert module is torch.tpu and dist.Backend.default_device_backend_map["tpu"]
    module.set_device(module.current_device())
    assert module.device_count() >= 1 and module.get_device_name(torch.device("tpu", 0))
    assert module.get_device_properties(torch.device("tpu", 0)).total_memory > 0
    module.reset_peak_memory_stats()
    module.empty_cache()
    torch.ones(1024, device="tpu").sum().item()
    stats = module.memory_stats(torch.device("tpu", 0))
    assert stats["active_bytes.all.peak"] > 0 and "reserved_bytes.all.peak" in stats
    assert stats["num_alloc_retries"] == 0 and stats["num_ooms"] == 0
    module.synchronize()
