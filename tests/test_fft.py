"""Complex tensors and Fourier transforms on tpu, against CPU: storage and
views of complex values, conjugate views, OpInfo's complex samples of the
ops lowered for them, the counted CPU fallback of complex operands an op has
no lowering for, and spectral models trained without fallbacks. (The OpInfo
entries of torch.fft run in test_ops.py.)"""
import copy

import pytest
import torch
import torchtpu

from conftest import to_cpu
from conformance import compare


def test_complex_values_round_trip_and_convert(mode):
    z = torch.randn(3, 4, dtype=torch.complex64)
    assert torch.equal(z.to("tpu").cpu(), z)
    x = torch.randn(5)
    assert torch.equal(x.to("tpu").to(torch.complex64).cpu(), x.to(torch.complex64))
    # complex to real keeps the real part, as on CPU (with its warning)
    assert torch.equal(z.to("tpu").real.contiguous().cpu(), z.real.contiguous())


def test_view_as_real_aliases_the_complex_storage(mode):
    z = torch.randn(4, 3, dtype=torch.complex64)
    t = z.to("tpu")
    parts = torch.view_as_real(t)
    assert parts.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    parts[:, 1:, 1] = 0.5  # writes imaginary parts through the real view
    expected = z.clone()
    torch.view_as_real(expected)[:, 1:, 1] = 0.5
    assert torch.equal(t.cpu(), expected)
    back = torch.view_as_complex(parts)
    assert torch.equal(back.cpu(), expected)


def test_conjugate_views_are_resolved_by_copies(mode):
    z = torch.randn(6, dtype=torch.complex64)
    t = z.to("tpu").conj()
    assert t.is_conj()
    assert torch.equal(t.cpu(), z.conj())
    assert torch.equal(t.clone().cpu(), z.conj())
    assert torch.equal(t.resolve_conj().cpu(), z.conj_physical())


def test_writes_through_conjugate_and_negative_views(mode):
    """copy_ and out= into a view with the conjugate or negative bit store
    the values that read back, through the bit, as the result (as on CPU)."""
    a = torch.randn(3, 4, dtype=torch.complex64)
    b = torch.randn(3, 4, dtype=torch.complex64)

    def writes(device):
        a_, b_ = a.to(device), b.to(device)
        outs = [torch.zeros(3, 4, dtype=torch.complex64, device=device) for _ in range(5)]
        outs[0].conj().copy_(a_)
        outs[1].conj()[:, 1::2].copy_(a_.conj()[:, ::2])
        torch.add(a_, b_, out=outs[2].conj())
        torch.mul(a_.conj(), b_, out=outs[3][1:].conj())
        outs[4].copy_(a_.conj())
        reals = [torch.zeros(3, 4, device=device) for _ in range(2)]
        torch._neg_view(reals[0]).copy_(a_.real)
        torch.add(a_.real, 1, out=torch._neg_view(reals[1])[::2])
        return [t.cpu() for t in outs + reals]

    for got, expected in zip(writes("tpu"), writes("cpu")):
        torch.testing.assert_close(got, expected)  # mul rounds as XLA's complex product does


def test_complex_operands_without_lowering_fall_back_counted(mode):
    z = torch.randn(4, 8, dtype=torch.complex64)
    torchtpu.reset_metrics()
    got = torch.fft.fft(z.to("tpu")).sigmoid()
    torch.testing.assert_close(got.cpu(), torch.fft.fft(z).sigmoid())
    # A complex power of a tensor of exponents overflows otherwise than CPU's.
    got = z.to("tpu").pow(z.to("tpu").flip(0))
    torch.testing.assert_close(got.cpu(), z.pow(z.flip(0)))
    fallbacks = torchtpu.metrics()["fallbacks"]
    assert set(fallbacks) == {"aten::sigmoid", "aten::pow.Tensor_Tensor"}, fallbacks


def test_complex_numbers_as_arguments(mode):
    """A complex number where an op takes a `Scalar` (a fill, `alpha`,
    `beta`, `value`) is a runtime operand of the device's program when the
    op's first tensor is complex; into a real tensor CPU's conversion
    raises its error (counted fallback), and powers stay CPU's."""
    a, b = torch.randn(3, 3, dtype=torch.complex64), torch.randn(3, 3, dtype=torch.complex64)
    c = torch.randn(3, 3, dtype=torch.complex64)
    c[0, 0] = complex(float("nan"), 0)  # beta = 0 ignores self, NaN included
    mask = torch.tensor([True, False, True])

    def calls(device):
        a_, b_, c_ = a.to(device), b.to(device), c.to(device)
        return [
            torch.full((2, 3), 1 - 2j, device=device),
            torch.zeros(3, dtype=torch.complex128, device=device).fill_(3j),
            a_.masked_fill(mask.to(device)[:, None], 2 - 1j),
            a_.index_fill(0, torch.tensor([0, 2]).to(device), 5j),
            torch.where(a_.real > 0, a_, 1j),
            torch.add(a_, b_, alpha=1j),
            torch.addmm(c_, a_, b_, beta=1j, alpha=2 - 1j),
            torch.addmm(c_, a_, b_, beta=0j, alpha=1j),
            torch.addcmul(c_, a_, b_, value=-1j),
            a_.eq(a[1, 1].item()),
        ]

    torchtpu.reset_metrics()
    for got, expected in zip(calls("tpu"), calls("cpu")):
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    assert not torchtpu.metrics()["fallbacks"]
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        torch.full((3,), 1 + 2j, dtype=torch.float32, device="tpu")
    got = a.to("tpu") ** (0.5 + 1j)
    torch.testing.assert_close(got.cpu(), a ** (0.5 + 1j))
    assert set(torchtpu.metrics()["fallbacks"]) == {"aten::fill_.Scalar", "aten::pow.Tensor_Scalar"}


def test_spectral_loss_trains_as_on_cpu_without_fallbacks(mode):
    torch.manual_seed(0)
    signal = torch.randn(8, 64)
    target = torch.randn(8, 33, 2)

    def train(device):
        weight = torch.nn.Parameter(torch.eye(64, device=device))

        def loss():
            spectrum = torch.view_as_real(torch.fft.rfft(signal.to(device) @ weight, norm="ortho"))
            return (spectrum - target.to(device)).pow(2).mean()

        return losses_of(loss, torch.optim.SGD([weight], lr=0.01), 5)

    trains_as_on_cpu(train)


def losses_of(loss, opt, steps):
    """The losses of `steps` optimizer steps on `loss()`."""
    losses = []
    for _ in range(steps):
        value = loss()
        opt.zero_grad()
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses


def trains_as_on_cpu(train):
    """train(device)'s losses on tpu, with no fallback, are CPU's."""
    expected = train("cpu")
    torchtpu.reset_metrics()
    got = train("tpu")
    assert not torchtpu.metrics()["fallbacks"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_spectrogram_magnitude_and_phase_on_the_device(mode):
    """What audio front ends do with a short-time Fourier transform: its
    magnitude and phase, and a complex value rebuilt from them."""
    signal = torch.randn(2, 400)
    window = torch.hann_window(64)

    def spectrogram(device):
        spec = torch.stft(signal.to(device), 64, hop_length=16, window=window.to(device), return_complex=True)
        power = spec.abs().pow(2)
        phase = spec.angle()
        rebuilt = torch.polar(spec.abs(), phase)
        parts = torch.complex(spec.real, spec.imag)
        # The phase as a point on the circle: at ±π, rounding picks a side.
        return power, phase.cos(), phase.sin(), rebuilt, parts

    expected = spectrogram("cpu")
    torchtpu.reset_metrics()
    got = spectrogram("tpu")
    assert not torchtpu.metrics()["fallbacks"]
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-4)


def test_window_functions_match_cpu_on_the_device(mode):
    """The windows stft takes, made on tpu: kaiser_window's composite would
    call a CPU/CUDA kernel stub (PyTorch's internal assert on other devices)."""
    windows = [
        lambda d: torch.kaiser_window(16, device=d),
        lambda d: torch.kaiser_window(9, False, device=d, dtype=torch.float64),
        lambda d: torch.kaiser_window(12, True, 5.0, device=d, dtype=torch.bfloat16),
        lambda d: torch.kaiser_window(1, device=d),
        lambda d: torch.signal.windows.kaiser(10, beta=8.0, device=d),
        lambda d: torch.hann_window(16, device=d),
        lambda d: torch.hamming_window(16, device=d),
        lambda d: torch.blackman_window(16, device=d),
        lambda d: torch.bartlett_window(16, device=d),
    ]
    torchtpu.reset_metrics()
    for make in windows:
        got = make("tpu")
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.cpu(), make("cpu"), rtol=1e-6, atol=1e-6)
    assert not torchtpu.metrics()["fallbacks"]


# Entries lowered for complex tensors (the rest take the counted fallback).
COMPLEX_OPS = [
    "abs", "angle", "sgn", "neg", "reciprocal", "square", "exp", "expm1", "log", "log1p", "log2", "log10",
    "sqrt", "rsqrt", "tanh", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "asinh", "acosh",
    "atanh", "sum", "prod", "mean", "var", "std",
    "cumsum", "cumprod", "trace", "norm", "linalg.vector_norm", "mm", "bmm", "addmv", "matmul", "dot",
    "vdot", "einsum", "linalg.cross", "cat", "flip", "roll", "tril", "triu", "index_select", "take",
    "put", "gather", "index_add", "index_copy", "scatter_add", "masked_scatter", "masked_select",
    "__getitem__", "index_put", "nonzero", "where", "eq", "ne", "equal", "isnan", "nan_to_num", "rsub",
    "addcmul", "addcdiv", "logical_and", "logical_not", "all", "any", "count_nonzero",
]


@pytest.mark.one_mode
@pytest.mark.parametrize("name", COMPLEX_OPS)
def test_complex_samples_follow_opinfo(name, mode):
    """OpInfo's complex64 samples (test_ops.py runs real dtypes only):
    values and gradients as on CPU, with no fallback."""
    op = compare.opinfo(name)

    def check(sample):
        torchtpu.reset_metrics()
        done = compare.expect_same(name, op, sample)
        if done and op.supports_autograd and name != "angle":  # angle's gradient is zero almost everywhere
            (_, tpu_sample), _ = done
            expected = compare.grads(op, sample)
            torch.testing.assert_close(to_cpu(compare.grads(op, tpu_sample)), expected, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{name} grad: {m}")
        assert not torchtpu.metrics()["fallbacks"]

    samples = compare.samples(name, torch.complex64, limit=8, requires_grad=True)
    compare.for_each_sample(name, samples, check)


def test_branch_cuts_and_the_real_axis_follow_cpu(mode):
    """A zero part's sign picks the side of a branch cut (sqrt(-4 - 0i) is
    -2i on CPU; XLA's complex forms ignore it), and sin/cos/sinh/cosh of a
    value on an axis keep the other part zero (cosh(inf + 0i) is inf + 0i)."""
    inf = float("inf")
    parts = [(-4.0, 0.0), (-4.0, -0.0), (-0.5, -0.0), (2.0, -0.0), (-0.0, 2.0), (-0.0, -4.0), (0.0, -4.0),
             (inf, 0.0), (-inf, 0.0), (0.0, inf), (1.5, -0.0), (-0.0, -0.0)]
    z = torch.complex(torch.tensor([p[0] for p in parts]), torch.tensor([p[1] for p in parts]))
    torchtpu.reset_metrics()
    for name in ["sqrt", "asin", "acos", "asinh", "acosh", "atanh", "sin", "cos", "sinh", "cosh", "log"]:
        f = getattr(torch, name)
        finite = z.isfinite() if name in ("sqrt", "asin", "acos", "asinh", "acosh", "atanh") else slice(None)
        got, expected = f(z.to("tpu")).cpu()[finite], f(z)[finite]
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"{name}: {m}")
        # (C99 leaves the sign of a zero beside a NaN unspecified.)
        signed = expected.real.isfinite()
        assert torch.equal(got.imag.signbit()[signed], expected.imag.signbit()[signed]), (name, got, expected)
    assert not torchtpu.metrics()["fallbacks"]


def test_linear_algebra_reads_conjugate_and_negative_views(mode):
    """Products and solves take operands with the conjugate or negative bit
    set (PyTorch's math-bit fallbacks let them through, as BLAS conjugates):
    they compute with the values the views read as."""
    z = torch.randn(3, 3, dtype=torch.complex64)
    y = torch.randn(3, 3)
    upper = torch.randn(3, 3).triu() + 3 * torch.eye(3)

    def products(device):
        z_, y_, u_ = z.to(device), y.to(device), upper.to(device)
        negative = z_.conj().imag  # a real view with the negative bit
        assert negative.is_neg()
        return [
            z_.conj() @ z_, torch.dot(z_[0].conj(), z_[1]), torch.vdot(z_[0], z_[1].conj()),
            negative @ y_, torch.addmm(y_, negative, y_), torch.dot(negative[0], y_[0]),
            torch.linalg.solve_triangular(u_, negative, upper=True),
        ]

    torchtpu.reset_metrics()
    for got, expected in zip(products("tpu"), products("cpu")):
        torch.testing.assert_close(got.cpu(), expected)
    assert not torchtpu.metrics()["fallbacks"]


def test_fourier_neural_operator_trains_as_on_cpu_without_fallbacks(mode):
    """A Fourier neural operator's spectral convolution (neuraloperator's
    SpectralConv2d): rfft2, complex weights mixed by einsum on the kept
    modes, irfft2; Adam on the complex parameters."""
    torch.manual_seed(0)

    class SpectralConv2d(torch.nn.Module):
        def __init__(self, channels, modes):
            super().__init__()
            self.modes = modes
            shape = (channels, channels, modes, modes)
            self.w1 = torch.nn.Parameter(torch.rand(shape, dtype=torch.cfloat) / channels**2)
            self.w2 = torch.nn.Parameter(torch.rand(shape, dtype=torch.cfloat) / channels**2)

        def forward(self, x):
            m = self.modes
            x_ft = torch.fft.rfft2(x)
            out = torch.zeros(x.shape[0], x.shape[1], x.size(-2), x.size(-1) // 2 + 1, dtype=torch.cfloat,
                              device=x.device)
            out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m, :m], self.w1)
            out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m:, :m], self.w2)
            return torch.fft.irfft2(out, s=(x.size(-2), x.size(-1)))

    model = torch.nn.Sequential(torch.nn.Conv2d(2, 8, 1), SpectralConv2d(8, 4), torch.nn.GELU(),
                                torch.nn.Conv2d(8, 1, 1))
    x, target = torch.randn(4, 2, 16, 16), torch.randn(4, 1, 16, 16)

    def train(device):
        m = copy.deepcopy(model).to(device)

        def loss():
            return (m(x.to(device)) - target.to(device)).pow(2).mean()

        return losses_of(loss, torch.optim.Adam(m.parameters(), lr=1e-2), 3)

    trains_as_on_cpu(train)
