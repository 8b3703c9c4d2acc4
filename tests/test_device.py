"""The tpu device as PyTorch users meet it: device module, transfers,
printing, serialization, generators, storages and views."""
import io

import pytest
import torch

import torchtpu
from conftest import require_autoload, require_devices, run_python


def test_device_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    torch.tpu.synchronize()
    assert torch.device("tpu") == torch.device("tpu")
    assert torch.device("tpu:0").type == "tpu"


def test_accelerator():
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(0)
    torch.accelerator.synchronize()


def test_a_gpu_machine_keeps_cuda_until_torchtpu_is_imported():
    """On a machine with a CUDA GPU, `import torch` leaves torch as it is (one
    accelerator per process: tpu would take CUDA's place); `import torchtpu`
    asks for tpu, and CUDA is then refused with a clear error at its
    initialisation. The machine here has no GPU: NVML's count is faked."""
    out = run_python(
        "import torch, sys\n"
        "assert 'torchtpu' not in sys.modules\n"
        "assert torch._C._get_privateuse1_backend_name() == 'privateuseone'\n"
        "try:\n"
        "    torch.device('tpu')\n"
        "    raise AssertionError('tpu is a device without torchtpu')\n"
        "except RuntimeError:\n"
        "    pass\n"
        "import torchtpu\n"
        "assert torch.accelerator.current_accelerator().type == 'tpu'\n"
        "assert (torch.ones(2, device='tpu') * 3).tolist() == [3.0, 3.0]\n"
        "refuse = [call for call, _ in torch.cuda._queued_calls if call.__module__ == 'torchtpu']\n"
        "try:\n"
        "    refuse[0]()\n"
        "except RuntimeError as e:\n"
        "    print(e)\n",
        TORCHTPU_AUTOLOAD="0")
    assert "one accelerator per process" in out.stdout and "separate processes" in out.stdout

    import _torchtpu_autoload as autoload
    real = torch.cuda._device_count_nvml
    try:
        torch.cuda._device_count_nvml = lambda: 1
        assert autoload.gpu_machine(torch) == bool(torch.cuda._is_compiled() and not torch.version.hip)
        torch.cuda._device_count_nvml = lambda: 0
        assert not autoload.gpu_machine(torch)
    finally:
        torch.cuda._device_count_nvml = real


def test_plain_tensors_round_trip():
    x = torch.randn(3, 5)
    for t in (x.to("tpu"), x.tpu(), torch.tensor(x.tolist(), device="tpu")):
        assert type(t) is torch.Tensor
        assert t.device == torch.device("tpu:0") and t.is_tpu
        torch.testing.assert_close(t.cpu(), x)
    assert torch.zeros(2, device="tpu").tolist() == [0.0, 0.0]
    assert torch.ones(2, 2, device="tpu").sum().item() == 4.0


def test_non_blocking_and_pinned_transfers():
    """Non-blocking copies to the host allocate pinned memory (the hooks'
    pinned allocator)."""
    x = torch.randn(3, 5)
    t = x.to("tpu", non_blocking=True)
    torch.testing.assert_close(t.to("cpu", non_blocking=True), x)
    torch.testing.assert_close(t.to("cpu", torch.float64, True), x.double())
    torch.testing.assert_close(x.pin_memory().to("tpu").cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_dtypes_round_trip(dtype):
    x = (torch.randn(4, 3) * 10).to(dtype)
    t = x.to("tpu")
    assert t.dtype == dtype
    torch.testing.assert_close(t.cpu(), x)
    torch.testing.assert_close(t.to(torch.float32).cpu(), x.to(torch.float32))


def test_complex32_is_stored_and_computed_on_cpu():
    """XLA has no complex32: tpu stores it (copies and views move its bits),
    and its conversions and ops run on the CPU, counted as fallbacks."""
    x = torch.randn(3, 4)
    bits = torch.view_as_real  # CPU has no equal() for complex32
    torchtpu.reset_metrics()
    c = x.to("tpu").chalf()
    assert (c.dtype, c.device.type) == (torch.complex32, "tpu")
    assert torch.equal(bits(c.cpu()), bits(x.chalf()))
    assert torch.equal(bits(c[1:, ::2].cpu()), bits(x.chalf()[1:, ::2]))
    assert torch.equal(bits((c * c).cpu()), bits(x.chalf() * x.chalf()))
    assert torch.equal(c.real.cpu(), x.half())
    torch.testing.assert_close(c.cfloat().cpu(), x.chalf().cfloat())
    assert torchtpu.metrics()["fallbacks"] == {"aten::_copy_from": 2, "aten::mul.Tensor": 1}


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                   torch.float8_e5m2fnuz])
def test_float8_is_stored_and_computed_on_cpu(dtype):
    """float8 on tpu as complex32: its bytes move and view (a float8
    checkpoint loads onto the device), its conversions and ops run on the
    CPU (counted), and what CPU refuses raises CPU's error."""
    x = torch.randn(4, 5) * 3
    f = x.to(dtype)
    bits = lambda t: t.view(torch.uint8)  # noqa: E731  (CPU has no equal() for float8)
    torchtpu.reset_metrics()
    t = f.to("tpu")
    assert (t.dtype, t.device.type) == (dtype, "tpu")
    assert torch.equal(bits(t.cpu()), bits(f))
    assert torch.equal(bits(t[1:, ::2].cpu()), bits(f[1:, ::2]))
    assert torch.equal(t.view(torch.uint8).cpu(), bits(f))
    assert torch.equal(t.to(torch.bfloat16).cpu(), f.to(torch.bfloat16))
    assert torch.equal(bits(x.to("tpu").to(dtype).cpu()), bits(f))
    assert torch.equal(bits(torch.cat([t, t]).cpu()), bits(torch.cat([f, f])))
    assert torchtpu.metrics()["fallbacks"] == {"aten::_copy_from": 2, "aten::cat": 1}
    with pytest.raises(NotImplementedError, match="not implemented for 'Float8_"):
        t + 1


def test_nested_tensors_keep_views_on_tpu_and_compute_on_cpu():
    """torch.nested's strided layout on tpu: views share the tpu buffer (as
    on CPU, a write through one shows in its base), and ops run PyTorch's
    nested CPU kernels, counted as fallbacks."""
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    on_cpu = torch.nested.nested_tensor(parts)
    torchtpu.reset_metrics()
    nt = torch.nested.nested_tensor(parts, device="tpu")
    assert (nt.is_nested, nt.device.type) == (True, "tpu")
    first = nt.unbind()[0]
    first.add_(1)
    assert torch.equal(nt[0].cpu(), parts[0] + 1)
    on_cpu[0].add_(1)
    assert torch.equal(nt.transpose(1, 2)[1].cpu(), parts[1].t())
    assert torch.equal(nt.transpose(1, 2).contiguous()[1].cpu(), parts[1].t())
    assert torch.equal(nt.narrow(0, 1, 1)[0].cpu(), parts[1])
    padded = torch.nested.to_padded_tensor((nt * nt).softmax(-1), -1.0)
    assert padded.device.type == "tpu"
    assert torch.equal(padded.cpu(), torch.nested.to_padded_tensor((on_cpu * on_cpu).softmax(-1), -1.0))
    assert torchtpu.metrics()["fallbacks"] == {"aten::clone": 1, "aten::mul.Tensor": 1, "aten::_softmax": 1,
                                               "aten::to_padded_tensor": 1}


def test_transformer_encoder_packs_padded_batches():
    """nn.TransformerEncoder in eval mode without grad, given a padding mask,
    packs the batch into a nested tensor (its default enable_nested_tensor):
    the layers then run on the CPU, counted, with CPU's values (zeros at the
    padding)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 6, 16)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = padding[2, 2:] = True
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=padding)
        torchtpu.reset_metrics()
        got = encoder.to("tpu")(x.to("tpu"), src_key_padding_mask=padding.to("tpu"))
    assert got.device.type == "tpu"
    assert torch.equal(got.cpu(), expected)
    assert torchtpu.metrics()["fallbacks"]["aten::_transformer_encoder_layer_fwd"] == 2


def test_module_to():
    m = torch.nn.Linear(4, 3)
    m.to("tpu")
    assert all(p.device.type == "tpu" and type(p) is torch.nn.Parameter for p in m.parameters())
    x = torch.randn(2, 4)
    torch.testing.assert_close(m(x.to("tpu")).cpu(), m.cpu()(x))


def test_printing():
    x = torch.tensor([[1.5, -2.0], [3.25, 4.0]])
    assert repr(x.to("tpu")) == repr(x)[:-1] + ", device='tpu:0')"
    assert "device='tpu:0'" in repr(torch.arange(3, device="tpu"))
    assert str(torch.zeros(0, device="tpu")).startswith("tensor([]")


def test_item_tolist():
    x = torch.tensor([1.5, 2.5], device="tpu")
    assert x[1].item() == 2.5
    assert x.tolist() == [1.5, 2.5]
    assert torch.tensor(7, device="tpu").item() == 7
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to Scalar"):
        x.item()


def test_save_load():
    x = torch.randn(3, 4)
    buf = io.BytesIO()
    torch.save({"w": x.to("tpu")}, buf)
    for loc, dev in ((None, "tpu"), ("cpu", "cpu"), ("tpu", "tpu")):
        buf.seek(0)
        y = torch.load(buf, map_location=loc)["w"]
        assert y.device.type == dev
        torch.testing.assert_close(y.cpu(), x)
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    assert torch.load(buf, map_location="tpu").device.type == "tpu"


def test_generator_and_seed():
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(3)
    a = torch.empty(1000, device="tpu").uniform_(generator=g).cpu()
    g.manual_seed(3)
    b = torch.empty(1000, device="tpu").uniform_(generator=g).cpu()
    torch.testing.assert_close(a, b)
    torch.tpu.manual_seed(5)
    c = torch.randn(100, device="tpu").cpu()
    torch.manual_seed(5)
    d = torch.randn(100, device="tpu").cpu()
    torch.testing.assert_close(c, d)
    state = torch.tpu.get_rng_state()
    e = torch.rand(10, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    torch.testing.assert_close(torch.rand(10, device="tpu").cpu(), e)


def test_views_share_storage():
    base = torch.arange(12.0).reshape(3, 4)
    t = base.to("tpu")
    v = t[1]
    assert v._is_view() and v._base is t
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert v.data_ptr() == t.data_ptr() + 4 * 4
    v.mul_(10)
    base[1].mul_(10)
    torch.testing.assert_close(t.cpu(), base)
    t.t()[2].fill_(-1)
    base.t()[2].fill_(-1)
    torch.testing.assert_close(t.cpu(), base)


def test_as_strided_and_view_dtype():
    x = torch.arange(16.0)
    t = x.to("tpu")
    torch.testing.assert_close(t.as_strided((3, 3), (4, 1), 1).cpu(), x.as_strided((3, 3), (4, 1), 1))
    torch.testing.assert_close(t.as_strided((2, 2), (1, 2)).cpu(), x.as_strided((2, 2), (1, 2)))
    torch.testing.assert_close(t.view(torch.int32).cpu(), x.view(torch.int32))
    torch.testing.assert_close(t.view(torch.int16).cpu(), x.view(torch.int16))
    t.view(torch.int32)[3] = 7
    x.view(torch.int32)[3] = 7
    torch.testing.assert_close(t.cpu(), x)


def test_data_ptr_ranges_do_not_overlap():
    ts = [torch.empty(n, device="tpu") for n in (1, 7, 64, 1000)]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in ts)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert len({t.data_ptr() for t in ts}) == len(ts)


def test_untyped_storage_and_resize():
    t = torch.arange(4.0, device="tpu")
    s = t.untyped_storage()
    assert s.device.type == "tpu" and s.nbytes() == 16
    t.resize_(6)
    torch.testing.assert_close(t[:4].cpu(), torch.arange(4.0))
    u = torch.empty(0, device="tpu")
    u.set_(t.untyped_storage(), 1, (2,), (1,))
    torch.testing.assert_close(u.cpu(), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("imports", ["import torch", "import torchtpu, torch", "import torchtpu._plugin, torch"])
def test_import_orders(imports):
    """Autoload makes `import torch` enough; importing torchtpu first works too."""
    if imports == "import torch":
        require_autoload()
    code = f"{imports}; x = torch.ones(2, device='tpu'); print((x + 1).sum().item())"
    out = run_python(code)
    assert out.stdout.strip() == str((torch.ones(2) + 1).sum().item())


def test_metrics_report_fallbacks():
    torchtpu.reset_metrics()
    x = torch.tensor([[3.0, 1.0], [2.0, 5.0]])
    torch.testing.assert_close(torch.linalg.eigvals(x.to("tpu")).cpu(), torch.linalg.eigvals(x))
    # The general eigendecomposition has no lowering (XLA has no expander for
    # it): it ran on the CPU, once, and says so.
    assert torchtpu.metrics()["fallbacks"] == {"aten::_linalg_eigvals": 1}


def test_two_devices():
    """TORCHTPU_DEVICE_COUNT splits the CPU plugin; tensors live and compute on either."""
    require_devices(2)
    code = (
        "import torch, torchtpu\n"
        "assert torch.tpu.device_count() == 2\n"
        "x = torch.arange(6.0).reshape(2, 3)\n"
        "a = x.to('tpu:1')\n"
        "assert (a * 2).device == torch.device('tpu:1')\n"
        "torch.testing.assert_close((a * 2).to('tpu:0').cpu(), x * 2)\n"
        "with torch.tpu.device(1):\n"
        "    assert torch.zeros(1, device='tpu').device.index == 1\n"
        "try:\n    a + x.to('tpu:0')\nexcept RuntimeError as e:\n    print(e)\n"
    )
    out = run_python(code, TORCHTPU_DEVICE_COUNT="2")
    assert "Expected all tensors to be on the same device" in out.stdout


def test_fallback_warning_once_per_op():
    code = (
        "import torch, torchtpu\n"
        "x = torch.tensor([[3.0, 1.0], [2.0, 5.0]], device='tpu')\n"
        "for _ in range(3):\n    torch.linalg.eigvals(x)\n"
    )
    out = run_python(code, TORCHTPU_LOG="1")
    warnings = [l for l in out.stderr.splitlines() if "runs on the CPU" in l]
    assert warnings == ["torchtpu: aten::_linalg_eigvals has no tpu lowering; it runs on the CPU (copied there and back)"]


def test_lowerings_are_not_hidden_by_composites():
    """A CompositeImplicitAutograd kernel wins over the boxed fallback that
    reaches the op table. Where CPU runs an op with its own kernel, tpu must
    run its lowering too, not the composite's decomposition (which rounds
    differently in low precision, as silu_backward's did in bfloat16)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    lowered = set(torchtpu._C.lowered_ops())
    hidden = []
    for schema in torch._C._jit_get_all_schemas():
        namespace, _, name = schema.name.partition("::")
        qualified = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        if namespace != "aten" or name not in lowered or not torch._C._dispatch_has_kernel(qualified):
            continue
        if has(qualified, "CompositeImplicitAutograd") and has(qualified, "CPU") and not has(qualified, "PrivateUse1"):
            hidden.append(qualified)
    assert hidden == []


def test_structured_forms_are_direct():
    """add, add_, mul, ... are structured: their composite kernel would run the
    meta function, allocate an out tensor and call add.out, whose result the
    fallback writes back. The families whose lowerings check what the meta
    functions do go to the core directly; scatters and pools keep the meta
    function, and so do the in-place forms whose message is its own."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in ["aten::add.Tensor", "aten::add_.Tensor", "aten::mul.Tensor", "aten::sub_.Tensor",
               "aten::div.Tensor_mode", "aten::sigmoid_", "aten::pow.Tensor_Scalar", "aten::mm",
               "aten::addmm", "aten::bmm", "aten::_softmax", "aten::gelu_", "aten::cat", "aten::tril",
               "aten::mean.dim", "aten::sum.dim_IntList", "aten::argmax", "aten::cumsum"]:
        assert has(op, "PrivateUse1"), op
    for op in ["aten::addmm_", "aten::cumsum_", "aten::scatter.src", "aten::max_pool2d_with_indices"]:
        assert not has(op, "PrivateUse1"), op


def test_gpu_client_takes_memory_on_demand(monkeypatch):
    """The options a GPU plugin's client is created with: XLA's BFC allocator
    growing on demand up to a share of the GPU (no share taken at start, so
    that another process or PyTorch's CUDA allocator fits beside it), each
    setting a variable away; a CPU plugin's are its device count."""
    from torchtpu import _plugin

    for var in ["TORCHTPU_GPU_ALLOCATOR", "TORCHTPU_GPU_PREALLOCATE", "TORCHTPU_GPU_MEMORY_FRACTION"]:
        monkeypatch.delenv(var, raising=False)
    gpu = "/opt/jax_plugins/xla_cuda13/xla_cuda_plugin.so"
    monkeypatch.setenv("TORCHTPU_PJRT_PLUGIN", gpu)
    assert _plugin.client_options(gpu, False) == {"allocator": "bfc", "preallocate": False, "memory_fraction": 0.75}
    monkeypatch.setenv("TORCHTPU_GPU_ALLOCATOR", "platform")
    monkeypatch.setenv("TORCHTPU_GPU_PREALLOCATE", "1")
    monkeypatch.setenv("TORCHTPU_GPU_MEMORY_FRACTION", "0.4")
    assert _plugin.client_options(gpu, False) == {"allocator": "platform", "preallocate": True, "memory_fraction": 0.4}
    monkeypatch.setenv("TORCHTPU_GPU_MEMORY_FRACTION", "1.5")
    with pytest.warns(UserWarning, match="not a fraction in"):
        assert _plugin.client_options(gpu, False)["memory_fraction"] == 0.75
    libtpu = "/site-packages/libtpu/libtpu.so"
    monkeypatch.setenv("TORCHTPU_PJRT_PLUGIN", libtpu)
    assert _plugin.client_options(libtpu, False) == {}
    monkeypatch.setenv("TORCHTPU_DEVICE_COUNT", "3")
    assert _plugin.client_options("xla_cpu_pjrt.so", True) == {"cpu_device_count": 3}
