"""Complex tensors and Fourier transforms on tpu, against CPU: storage and
views of complex values, conjugate views, the counted CPU fallback of
complex operands an op has no lowering for, and a spectral loss trained
without fallbacks. (The OpInfo entries of torch.fft run in test_ops.py.)"""
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
    got = torch.fft.fft(z.to("tpu")).sqrt()
    torch.testing.assert_close(got.cpu(), torch.fft.fft(z).sqrt())
    fallbacks = torchtpu.metrics()["fallbacks"]
    assert set(fallbacks) == {"aten::sqrt"}, fallbacks


def test_spectral_loss_trains_as_on_cpu_without_fallbacks(mode):
    torch.manual_seed(0)
    signal = torch.randn(8, 64)
    target = torch.randn(8, 33, 2)

    def train(device):
        weight = torch.nn.Parameter(torch.eye(64, device=device))
        opt = torch.optim.SGD([weight], lr=0.01)
        losses = []
        for _ in range(5):
            spectrum = torch.view_as_real(torch.fft.rfft(signal.to(device) @ weight, norm="ortho"))
            loss = (spectrum - target.to(device)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

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


@pytest.mark.parametrize("name", ["abs", "angle", "sgn"])
def test_complex_magnitude_phase_and_sign_follow_opinfo(name, mode):
    """OpInfo's complex64 samples (test_ops.py runs real dtypes only):
    values and gradients as on CPU, with no fallback."""
    op = compare.opinfo(name)

    def check(sample):
        torchtpu.reset_metrics()
        (_, tpu_sample), _ = compare.expect_same(name, op, sample)
        if name != "angle":  # angle's gradient is zero almost everywhere
            expected = compare.grads(op, sample)
            torch.testing.assert_close(to_cpu(compare.grads(op, tpu_sample)), expected, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{name} grad: {m}")
        assert not torchtpu.metrics()["fallbacks"]

    compare.for_each_sample(name, compare.samples(name, torch.complex64, requires_grad=True), check)
