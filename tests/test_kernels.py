"""Custom JAX and Pallas kernels (torchtpu.pallas) against the same math in
torch on CPU: eager modes, autograd, torch.compile, fusion, errors."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchtpu

jax = pytest.importorskip("jax")
jnp = jax.numpy
import torchtpu.pallas as tp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from conftest import CPU_PLUGIN  # noqa: E402
from rms_norm import rms_norm, torch_rms_norm  # noqa: E402


@tp.custom_jax_kernel
def relu(x):
    return jax.nn.relu(x)


def _softmax_body(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


@tp.custom_jax_kernel
def softmax(x):
    return pl.pallas_call(_softmax_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_kernels_equal_torch_in_every_mode(mode):
    x = torch.randn(16, 128)
    assert torch.equal(relu(x.to("tpu")).cpu(), torch.relu(x))
    torch.testing.assert_close(softmax(x.to("tpu")).cpu(), torch.softmax(x, -1))
    w = torch.randn(128)
    torch.testing.assert_close(rms_norm(x.to("tpu"), w.to("tpu")).cpu(), torch_rms_norm(x, w))


def test_gradients_from_jax_vjp_and_from_custom_vjp(mode):
    x, w = torch.randn(8, 64), torch.randn(64)
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(8, 64)
    (rms_norm(xt, wt) * g.to("tpu") + relu(xt * wt)).sum().backward()
    (torch_rms_norm(xc, wc) * g + torch.relu(xc * wc)).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)


def test_gradcheck_in_float64():
    @tp.custom_jax_kernel
    def f(x, y):
        return jnp.sin(x) * y, jnp.exp(y).sum()

    x = torch.randn(5, dtype=torch.float64, device="tpu", requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, y))


def test_outputs_static_arguments_numbers_and_none():
    @tp.custom_jax_kernel(static_argnums=(2,))
    def f(x, bias, axis, scale, extra):
        assert extra is None
        y = (x + bias) * scale
        return y.sum(axis), (y.max(axis), jnp.argmax(y, axis))

    x, b = torch.randn(6, 7), torch.randn(7)
    for axis in (0, 1):
        total, (top, where) = f(x.to("tpu"), b.to("tpu"), axis, 0.5, None)
        y = (x + b) * 0.5
        torch.testing.assert_close(total.cpu(), y.sum(axis))
        torch.testing.assert_close(top.cpu(), y.amax(axis))
        assert where.dtype == torch.int32 and torch.equal(where.cpu().long(), y.argmax(axis))
    before = torchtpu.metrics()["kernels"]
    f(x.to("tpu"), b.to("tpu"), 1, 2.0, None)  # a new number is a runtime operand
    assert torchtpu.metrics()["kernels"] == before


def test_lowered_once_per_signature():
    @tp.custom_jax_kernel
    def double(x):
        return x * 2

    before = torchtpu.metrics()["kernels"]
    for _ in range(3):
        double(torch.ones(4, device="tpu"))
    assert torchtpu.metrics()["kernels"] == before + 1
    double(torch.ones(5, device="tpu"))
    double(torch.ones(4, dtype=torch.int64, device="tpu"))
    assert torchtpu.metrics()["kernels"] == before + 3


def test_later_calls_of_a_signature_take_the_fast_path_and_keep_its_rules():
    @tp.custom_jax_kernel
    def scaled(x, y):
        return x * 2 + y

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    first = scaled(x.to("tpu"), y.to("tpu"))  # lowers, records the signature

    def python_path(*args, **kwargs):
        raise AssertionError("the call took the Python path")

    scaled._run = python_path
    again = scaled(x.to("tpu"), y.to("tpu"))  # from C++ straight to the operator
    del scaled._run
    for out in (first, again):
        torch.testing.assert_close(out.cpu(), x * 2 + y)
    # What the fast path does not take still goes through the Python path's rules.
    w = x.to("tpu").requires_grad_()
    scaled(w, y.to("tpu")).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), torch.full((3, 4), 2.0))
    with pytest.raises(ValueError, match="argument 1 is on cpu"):
        scaled(x.to("tpu"), y)
    with pytest.raises(TypeError, match="argument 1 is a str"):
        scaled(x.to("tpu"), "y")


def test_in_place_kernel_aliases_its_input(mode):
    @tp.custom_jax_kernel(input_output_aliases={0: 0})
    def sgd(param, grad, lr):
        return param - lr * grad

    p, g = torch.randn(32), torch.randn(32)
    pt = p.to("tpu")
    view = pt[:4]
    out = sgd(pt, g.to("tpu"), 0.1)
    assert out is pt
    torch.testing.assert_close(pt.cpu(), p - 0.1 * g)
    torch.testing.assert_close(view.cpu(), (p - 0.1 * g)[:4])


def test_kernel_fuses_into_one_program(tmp_path, monkeypatch):
    """In fused mode a kernel adds no flush: the ops around it and the
    kernel are one program, which calls the kernel's private function."""
    monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))
    x = torch.randn(16, 128, device="tpu")
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    y = softmax(x * 3 + 1).exp().sum()
    y.item()
    m = torchtpu.metrics()
    assert m["executions"] == 1 and m["flushes"] == {"host_read": 1}
    dumped = [p.read_text() for p in tmp_path.glob("*.mlir")]
    # The Pallas body: interpreted (a loop) on the CPU plugin, Triton's custom call on a GPU.
    body = "stablehlo.while" if CPU_PLUGIN else "stablehlo.custom_call"
    assert any('"func.call"' in text and body in text for text in dumped)


def test_compiled_graph_holds_the_kernel():
    def step(x, w, g):
        return (rms_norm(x @ w, g) + softmax(x.detach())).sum()

    x, w, g = torch.randn(8, 32), torch.randn(32, 32), torch.randn(32)
    explain = torch._dynamo.explain(step)(x.to("tpu"), w.to("tpu"), g.to("tpu"))
    assert explain.graph_count == 1 and explain.graph_break_count == 0
    compiled = torch.compile(step)
    tpu = [t.to("tpu").requires_grad_() for t in (x, w, g)]
    cpu = [t.clone().requires_grad_() for t in (x, w, g)]
    compiled(*tpu).backward()
    (torch_rms_norm(cpu[0] @ cpu[1], cpu[2]) + torch.softmax(cpu[0].detach(), -1)).sum().backward()
    for t, c in zip(tpu, cpu):
        torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4)
    assert torchtpu.metrics()["eager_graphs"] == {}


def test_compiled_kernel_with_static_and_number_arguments():
    @tp.custom_jax_kernel(static_argnums=(1,))
    def scaled_sum(x, axis, s):
        return (x * s).sum(axis)

    def f(x, s):
        return scaled_sum(x, 1, s) + 1

    for dynamic in (False, True):
        compiled = torch.compile(f, dynamic=dynamic)
        for n, s in ((4, 2.5), (5, 3.5)):  # dynamic=True: symbolic sizes and numbers
            x = torch.randn(n, 6)
            torch.testing.assert_close(compiled(x.to("tpu"), s).cpu(), (x * s).sum(1) + 1)
    assert torchtpu.metrics()["eager_graphs"] == {}


def test_unsupported_constructs_name_the_kernel():
    @tp.custom_jax_kernel
    def chatty(x):
        jax.debug.print("x = {}", x)
        return x

    @tp.custom_jax_kernel
    def inverse(x):
        return jnp.linalg.inv(x)

    with pytest.raises(RuntimeError, match="kernel chatty calls back into Python"):
        chatty(torch.ones(3, device="tpu"))
    if CPU_PLUGIN:  # LAPACK's custom call; a GPU plugin has cuSOLVER's
        with pytest.raises(RuntimeError, match="kernel inverse needs the custom call"):
            inverse(torch.eye(3, device="tpu"))
    else:
        torch.testing.assert_close(inverse(2 * torch.eye(3, device="tpu")).cpu(), torch.eye(3) / 2)
    with pytest.raises(RuntimeError, match="kernel softmax .* JAX cannot differentiate it.*custom_vjp"):
        softmax(torch.ones(2, 8, device="tpu", requires_grad=True))
    with pytest.raises(ValueError, match="kernel relu: argument 0 is on cpu"):
        relu(torch.ones(3))
    assert torch.equal(relu(torch.ones(3, device="tpu")).cpu(), torch.ones(3))  # still usable


def test_jax_is_optional():
    code = (
        "import sys, torchtpu\n"
        "assert 'jax' not in sys.modules\n"
        "sys.modules['jax'] = None\n"
        "try:\n"
        "    import torchtpu.pallas\n"
        "except ImportError as e:\n"
        "    assert 'pip install jax' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('imported without jax')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TORCHTPU_CACHE_DIR": ""})


try:
    import helion
    import helion.language as hl
except ImportError:  # pragma: no cover - make test installs it
    helion = None

if helion is not None:  # Helion kernels read `hl` as a global: no closures
    _PALLAS = dict(backend="pallas", autotune_effort="none")

    @helion.kernel(**_PALLAS)
    def helion_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(out.size()):
            out[tile] = x[tile] + y[tile]
        return out

    @helion.kernel(**_PALLAS)
    def helion_softmax(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile_n in hl.tile(x.size(0)):
            out[tile_n, :] = torch.nn.functional.softmax(x[tile_n, :], dim=1)
        return out

    @helion.kernel(**_PALLAS)
    def helion_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty([x.size(0), y.size(1)], dtype=x.dtype, device=x.device)
        for tile_m, tile_n in hl.tile([x.size(0), y.size(1)]):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(x.size(1)):
                acc = torch.addmm(acc, x[tile_m, tile_k], y[tile_k, tile_n])
            out[tile_m, tile_n] = acc
        return out


@pytest.mark.skipif(helion is None, reason="helion is not installed")
def test_helion_pallas_kernels_run_on_tpu_tensors():
    """Helion's Pallas backend (interpret mode on this plugin) through
    torchtpu.pallas: results equal CPU and stay on the device."""
    x, y, w = torch.randn(64, 128), torch.randn(64, 128), torch.randn(128, 256)
    torchtpu.reset_metrics()
    for out, expected in (
        (helion_add(x.to("tpu"), y.to("tpu")), x + y),
        (helion_softmax(x.to("tpu")), torch.softmax(x, 1)),
        (helion_matmul(x.to("tpu"), w.to("tpu")), x @ w),
    ):
        assert out.device.type == "tpu"
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert torchtpu.metrics()["kernels"] == 3 and torchtpu.metrics()["fallbacks"] == {}
