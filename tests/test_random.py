"""Random numbers on tpu: distributions (moments and ranges of large
samples against the distribution's own), dtypes, seeding, explicit
generators, and seeds as runtime inputs (no recompilation)."""
import math
import os
import re

import pytest
import torch
import torchtpu

from conftest import require_autoload, require_devices

N = 200_000


@pytest.fixture(autouse=True)
def no_fallbacks():
    """Every test here must run without CPU fallbacks."""
    torchtpu.reset_metrics()
    yield
    assert torchtpu.metrics()["fallbacks"] == {}


def assert_moments(x, mean, std):
    """Sample mean and variance of `x` match the distribution's, within 6
    standard errors (that of the variance estimated from the sample)."""
    x = x.cpu().double()
    n = x.numel()
    var = x.var().item()
    fourth = ((x - x.mean()) ** 4).mean().item()
    assert abs(x.mean().item() - mean) < 6 * std / math.sqrt(n)
    assert abs(var - std**2) < 6 * math.sqrt((fourth - var**2) / n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_uniform(dtype, mode):
    low, high = -2.0, 3.0
    x = torch.empty(N, device="tpu", dtype=dtype).uniform_(low, high)
    assert x.dtype == dtype and x.device.type == "tpu" and x.shape == (N,)
    c = x.cpu()
    # bfloat16 rounds values near `high` up to it.
    assert c.min() >= low and (c.max() < high if dtype == torch.float32 else c.max() <= high)
    assert_moments(c, (low + high) / 2, (high - low) / math.sqrt(12))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_normal(dtype, mode):
    x = torch.empty(N, device="tpu", dtype=dtype).normal_(1.5, 2.0)
    assert x.dtype == dtype and x.shape == (N,)
    assert torch.isfinite(x.cpu()).all()
    assert_moments(x, 1.5, 2.0)


def test_normal_of_tensor_mean_or_std(mode):
    """torch.normal with a tensor mean and/or std: their broadcast shape, the
    tensor's dtype, each element its own mean and std."""
    means = torch.tensor([[-3.0], [10.0]], device="tpu")
    both = torch.normal(means, torch.full((N,), 2.0, device="tpu", dtype=torch.float64))
    assert both.shape == (2, N) and both.dtype == torch.float32 and both.device.type == "tpu"
    assert_moments(both[0], -3.0, 2.0)
    assert_moments(both[1], 10.0, 2.0)
    assert_moments(torch.normal(torch.full((N,), 1.5, device="tpu"), 0.5), 1.5, 0.5)
    std_only = torch.normal(4.0, torch.full((N,), 3.0, device="tpu", dtype=torch.float64))
    assert std_only.dtype == torch.float64
    assert_moments(std_only, 4.0, 3.0)


@pytest.mark.parametrize("alpha", [0.05, 0.7, 1.0, 3.5, 60.0])
def test_gamma_samples(alpha, mode):
    """torch.distributions.Gamma's sampler (`_standard_gamma`): Gamma(alpha, 1)
    has mean and variance alpha; shapes below 1 take CPU's boost."""
    x = torch.distributions.Gamma(torch.full((N,), alpha, device="tpu"), torch.ones(N, device="tpu")).sample()
    assert x.device.type == "tpu" and x.dtype == torch.float32
    assert x.cpu().min() > 0
    assert_moments(x, alpha, math.sqrt(alpha))


def test_dirichlet_and_beta_samples(mode):
    """Dirichlet(alpha) (`_sample_dirichlet`): on the simplex, component i with
    mean alpha_i / sum and variance m_i (1 - m_i) / (sum + 1); Beta samples
    through it."""
    alpha = torch.tensor([0.5, 1.0, 3.0])
    x = torch.distributions.Dirichlet(alpha.to("tpu")).sample((N,)).cpu()
    torch.testing.assert_close(x.sum(1), torch.ones(N), rtol=0, atol=1e-6)
    total = alpha.sum().item()
    for i, a in enumerate(alpha.tolist()):
        m = a / total
        assert_moments(x[:, i], m, math.sqrt(m * (1 - m) / (total + 1)))
    b = torch.distributions.Beta(torch.tensor(2.0, device="tpu"), torch.tensor(5.0, device="tpu")).sample((N,))
    assert_moments(b, 2 / 7, math.sqrt(2 * 5 / (7**2 * 8)))


def test_rand_randn(mode):
    u = torch.rand(300, 700, device="tpu")
    z = torch.randn(300, 700, device="tpu")
    assert u.shape == z.shape == (300, 700) and u.dtype == z.dtype == torch.float32
    assert u.device.type == z.device.type == "tpu"
    assert 0 <= u.cpu().min() and u.cpu().max() < 1
    assert_moments(u, 0.5, 1 / math.sqrt(12))
    assert_moments(z, 0.0, 1.0)
    # Every element draws its own number: no repeated rows.
    assert not torch.equal(u[0].cpu(), u[1].cpu()) and not torch.equal(z[0].cpu(), z[1].cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_bernoulli_float_p(dtype, mode):
    p = 0.3
    x = torch.empty(N, device="tpu", dtype=dtype).bernoulli_(p)
    assert x.dtype == dtype
    c = x.cpu()
    assert ((c == 0) | (c == 1)).all()
    assert_moments(c, p, math.sqrt(p * (1 - p)))


def test_bernoulli_tensor_p(mode):
    # Half the elements with p = 0.1, half with p = 0.8.
    p = torch.cat([torch.full((N // 2,), 0.1), torch.full((N // 2,), 0.8)]).to("tpu")
    x = torch.empty(N, device="tpu").bernoulli_(p).cpu()
    y = torch.bernoulli(p).cpu()
    for r in (x, y):
        assert ((r == 0) | (r == 1)).all()
        assert_moments(r[: N // 2], 0.1, math.sqrt(0.1 * 0.9))
        assert_moments(r[N // 2 :], 0.8, math.sqrt(0.8 * 0.2))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32], ids=str)
def test_randint(dtype, mode):
    low, high = -3, 12
    x = torch.randint(low, high, (N,), device="tpu", dtype=dtype).cpu()
    assert x.dtype == dtype and x.min() == low and x.max() == high - 1
    n = high - low
    assert_moments(x, (low + high - 1) / 2, math.sqrt((n * n - 1) / 12))
    # Without bounds: every value the dtype holds from 0 (floats: exactly).
    for dtype, top in [(torch.int8, 127), (torch.bool, 1), (torch.float16, 2**11)]:
        y = torch.empty(N, device="tpu", dtype=dtype).random_().cpu()
        assert y.min() == 0 and y.max() <= top and y.float().mean() > top / 2 * 0.9
    wide = torch.randint(-(2**63), 2**63 - 1, (N,), device="tpu").cpu()
    assert (wide < 0).any() and (wide > 2**62).any()


def test_exponential(mode):
    x = torch.empty(N, device="tpu").exponential_(2.0).cpu()
    assert x.min() >= 0
    assert_moments(x, 0.5, 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_cauchy_log_normal_geometric(dtype, mode):
    """The in-place samplers of torch.distributions' Cauchy, LogNormal and
    Geometric, against the distributions' quantiles and moments; geometric
    also into integers, as on CPU."""
    if dtype.is_floating_point:
        x = torch.empty(N, device="tpu").cauchy_(1.0, 2.0).cpu().double()
        quartiles = torch.quantile(x[:100_000], torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
        torch.testing.assert_close(quartiles, torch.tensor([-1.0, 1.0, 3.0], dtype=torch.float64), atol=0.06, rtol=0)
        x = torch.empty(N, device="tpu").log_normal_(0.5, 0.3).cpu()
        assert_moments(x.log(), 0.5, 0.3)
    x = torch.empty(N, dtype=dtype, device="tpu").geometric_(0.3).cpu()
    assert x.dtype == dtype and x.min() == 1
    assert_moments(x, 1 / 0.3, math.sqrt(0.7) / 0.3)


@pytest.mark.one_mode
def test_gamma_rsample_gradient_as_on_cpu(mode):
    """`Gamma.rsample()`'s backward (`_standard_gamma_grad`) equals CPU's
    approximation in each of its branches: small samples, large shapes
    (within 10% of alpha and beyond), and the rational fit between."""
    g = torch.Generator().manual_seed(0)
    alpha = torch.cat([torch.tensor([0.05, 0.3, 1.0, 2.5, 7.9, 8.5, 20.0, 1e3], dtype=torch.float64),
                       torch.rand(100, generator=g, dtype=torch.float64) * 30]).repeat(10)
    x = torch._standard_gamma(alpha, generator=g)
    expected = torch._standard_gamma_grad(alpha, x)
    torch.testing.assert_close(torch._standard_gamma_grad(alpha.to("tpu"), x.to("tpu")).cpu(), expected,
                               rtol=1e-12, atol=0)
    concentration = torch.tensor([0.5, 2.0, 12.0], device="tpu", requires_grad=True)
    (grad,) = torch.autograd.grad(torch.distributions.Gamma(concentration, 1.0).rsample((2000,)).mean(0).sum(),
                                  concentration)
    torch.testing.assert_close(grad.cpu(), torch.ones(3), atol=0.1, rtol=0)  # E[dx/dalpha] = 1 at rate 1


@pytest.mark.one_mode
def test_beta_and_dirichlet_rsample_gradients_as_on_cpu(mode):
    """`Beta` and `Dirichlet.rsample()`'s backward (`_dirichlet_grad`) equals
    CPU's approximation in each branch: samples near 0 and near 1, both
    parameters above 6, and the rational correction between."""
    g = torch.Generator().manual_seed(0)
    concentration = torch.cat([torch.tensor([[0.1, 0.2], [0.5, 3.0], [7.0, 9.0], [2.0, 2.0], [30.0, 0.3]],
                                            dtype=torch.float64),
                               torch.rand(100, 2, generator=g, dtype=torch.float64) * 15 + 0.05]).repeat(10, 1)
    x = torch._sample_dirichlet(concentration, generator=g)[:, 0]
    alpha, total = concentration[:, 0], concentration.sum(1)
    expected = torch._dirichlet_grad(x, alpha, total)
    actual = torch._dirichlet_grad(*(t.to("tpu") for t in (x, alpha, total))).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-11, atol=0)
    a, b = torch.tensor([2.0, 0.5], device="tpu", requires_grad=True), torch.tensor([3.0, 0.5], device="tpu")
    (grad,) = torch.autograd.grad(torch.distributions.Beta(a, b).rsample((4000,)).mean(0).sum(), a)
    # d E[x] / d alpha of Beta(alpha, beta) is beta / (alpha + beta)^2.
    torch.testing.assert_close(grad.cpu(), torch.tensor([0.12, 0.5]), atol=0.03, rtol=0)


@pytest.mark.parametrize("rate", [0.3, 9.9, 10.0, 1e5])
def test_poisson(rate, mode):
    """Poisson samples by inversion below rate 10 and CPU's transformed
    rejection from 10 on: whole numbers with the distribution's moments."""
    x = torch.poisson(torch.full((N,), rate, device="tpu")).cpu()
    assert (x == x.round()).all() and x.min() >= 0
    assert_moments(x, rate, math.sqrt(rate))


@pytest.mark.parametrize("count, prob", [(20, 0.3), (100, 0.1), (40, 0.8), (1e6, 0.5)])
def test_binomial(count, prob, mode):
    """Binomial samples by inversion below a mean of 10 and CPU's BTRS from
    10 on (the larger chance counted down from `count`): whole numbers in
    [0, count] with the distribution's moments."""
    x = torch.binomial(torch.full((N,), float(count), device="tpu"), torch.full((N,), prob, device="tpu")).cpu()
    assert (x == x.round()).all() and x.min() >= 0 and x.max() <= count
    assert_moments(x, count * prob, math.sqrt(count * prob * (1 - prob)))


def test_binomial_edges_and_errors_as_on_cpu():
    count = torch.tensor([5.0, -1.0, 0.0, 7.0, 7.0, 3.0, 5.0, 5.0, 0.0])
    prob = torch.tensor([0.0, 0.5, 0.5, 0.0, 1.0, float("nan"), 1.5, -0.5, float("nan")])
    expected = torch.binomial(count, prob)
    torch.testing.assert_close(torch.binomial(count.to("tpu"), prob.to("tpu")).cpu(), expected, equal_nan=True)
    with pytest.raises(ValueError) as on_cpu:
        torch.binomial(torch.ones(2, dtype=torch.long), torch.ones(2))
    with pytest.raises(ValueError, match=re.escape(str(on_cpu.value))):
        torch.binomial(torch.ones(2, dtype=torch.long, device="tpu"), torch.ones(2, device="tpu"))


def test_rrelu_draws_its_slopes(mode):
    """RReLU in training: each non-positive input times a slope uniform in
    [lower, upper], recorded in `noise` (1 where the input is positive) and
    the gradient; in evaluation the slopes' mean, `noise` untouched."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(0))
    xt = x.to("tpu").requires_grad_()
    noise = torch.full((N,), 7.0, device="tpu")
    y = torch.ops.aten.rrelu_with_noise(xt, noise, 0.1, 0.3, True)
    (grad,) = torch.autograd.grad(torch.nn.functional.rrelu(xt, 0.1, 0.3, training=True).sum(), xt)
    y, noise, grad, negative = y.detach().cpu(), noise.cpu(), grad.cpu(), x <= 0
    torch.testing.assert_close(y[negative], x[negative] * noise[negative])
    assert torch.equal(y[~negative], x[~negative]) and (noise[~negative] == 1).all() and (grad[~negative] == 1).all()
    assert noise[negative].min() >= 0.1 and noise[negative].max() <= 0.3
    assert_moments(noise[negative], 0.2, 0.2 / math.sqrt(12))
    assert_moments(grad[negative], 0.2, 0.2 / math.sqrt(12))
    kept = torch.full((N,), 7.0, device="tpu")
    y = torch.ops.aten.rrelu_with_noise(x.to("tpu"), kept, 0.1, 0.3, False).cpu()
    torch.testing.assert_close(y, torch.nn.functional.leaky_relu(x, 0.2))
    assert (kept.cpu() == 7).all()
    # CPU checks the slopes' range only where it draws one: a positive input takes any.
    torch.ops.aten.rrelu_with_noise(torch.ones(4, device="tpu"), kept[:4], 0.5, 0.3, True).cpu()


def test_randperm(mode):
    firsts = torch.stack([torch.randperm(10, device="tpu").cpu() for _ in range(2000)])
    assert all(sorted(row.tolist()) == list(range(10)) for row in firsts)
    assert_moments(firsts[:, 0], 4.5, math.sqrt(99 / 12))  # the first element is uniform
    assert torch.randperm(5, device="tpu", dtype=torch.float32).dtype == torch.float32


def test_multinomial(mode):
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 1.0, 1.0]])
    with_replacement = torch.multinomial(p.to("tpu"), N, replacement=True).cpu()
    assert with_replacement.shape == (2, N) and with_replacement.dtype == torch.int64
    assert not (with_replacement[0] == 1).any()
    for row, probs in zip(with_replacement, p / p.sum(1, keepdim=True)):
        for k, q in enumerate(probs.tolist()):
            if q > 0:
                assert_moments((row == k).double(), q, math.sqrt(q * (1 - q)))
    # Without replacement: distinct categories, never one of probability 0;
    # the first draw follows p.
    draws_ = torch.stack([torch.multinomial(p[0].to("tpu"), 3).cpu() for _ in range(2000)])
    assert all(len(set(row.tolist())) == 3 and 1 not in row.tolist() for row in draws_)
    for k, q in enumerate(p[0].tolist()):
        if q > 0:
            assert_moments((draws_[:, 0] == k).double(), q, math.sqrt(q * (1 - q)))


@pytest.mark.parametrize("call", [
    lambda d: torch.empty(3, device=d).random_(5, 5),
    lambda d: torch.empty(3, dtype=torch.int8, device=d).random_(0, 300),
    lambda d: torch.empty(3, device=d).exponential_(-1),
    lambda d: torch.multinomial(torch.tensor([0.0, 0.0], device=d), 1),
    lambda d: torch.multinomial(torch.tensor([1.0, -1.0], device=d), 1),
    lambda d: torch.multinomial(torch.tensor([1.0, float("nan")], device=d), 1),
    lambda d: torch.multinomial(torch.ones(2, device=d), 3),
    lambda d: torch.multinomial(torch.ones(2, 2, 2, device=d), 1),
    lambda d: torch.multinomial(torch.ones(2, device=d), 0),
    # Rules on numbers, checked per call: a plan serves every value.
    lambda d: torch.empty(3, device=d).uniform_(1, 0),
    lambda d: torch.empty(3, dtype=torch.float16, device=d).uniform_(-70000, 0),
    lambda d: torch.empty(3, dtype=torch.long, device=d).uniform_(),
    lambda d: torch.empty(3, device=d).normal_(0, -1.5),
    lambda d: torch.normal(torch.zeros(3, device=d), -1.0),
    lambda d: torch.normal(torch.zeros(3, dtype=torch.long, device=d), 1.0),
    lambda d: torch.empty(3, device=d).bernoulli_(2.0),
    lambda d: torch.empty(3, device=d).cauchy_(sigma=0.0),
    lambda d: torch.empty(3, dtype=torch.long, device=d).cauchy_(),
    lambda d: torch.empty(3, device=d).log_normal_(std=-1.5),
    lambda d: torch.empty(3, device=d).geometric_(1.0),
    lambda d: torch.empty(3, dtype=torch.int32, device=d).log_normal_(),
    lambda d: torch.empty(3, dtype=torch.bool, device=d).geometric_(0.5),
    lambda d: torch.ops.aten.rrelu_with_noise(torch.ones(4, device=d), torch.ones(3, device=d), 0.1, 0.3, True),
    lambda d: torch.poisson(torch.tensor([1.0, -1.0], device=d)),
    lambda d: torch.poisson(torch.tensor([3], device=d)),
    lambda d: torch.ops.aten.rrelu_with_noise(-torch.ones(4, device=d), torch.ones(4, device=d), 0.5, 0.3, True),
    # Tensor arguments' values, checked on the device.
    lambda d: torch.normal(torch.zeros(3, device=d), torch.tensor([1.0, -1.0, 1.0], device=d)),
    lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d)),
    lambda d: torch._standard_gamma(torch.ones(2, dtype=torch.long, device=d)),
    lambda d: torch._sample_dirichlet(torch.ones(1, 2, dtype=torch.long, device=d)),
])
def test_errors_are_cpus(call, mode):
    with pytest.raises(RuntimeError) as on_cpu:
        call("cpu")
    with pytest.raises(RuntimeError, match=re.escape(str(on_cpu.value))):
        call("tpu").cpu()


def draws():
    """One of each random op on tpu, as CPU tensors."""
    return [
        torch.rand(1000, device="tpu").cpu(),
        torch.randn(1000, device="tpu").cpu(),
        torch.empty(1000, device="tpu").bernoulli_(0.5).cpu(),
        torch.randint(0, 1000, (1000,), device="tpu").cpu(),
        torch.empty(1000, device="tpu").exponential_().cpu(),
        torch.randperm(1000, device="tpu").cpu(),
        torch.multinomial(torch.ones(2, 1000, device="tpu"), 500).cpu(),
    ]


def test_manual_seed_reproducible(mode):
    torch.manual_seed(1234)
    first = draws()
    torch.manual_seed(1234)
    again = draws()
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    # Later draws move on; another seed gives another stream.
    later = draws()
    torch.manual_seed(4321)
    other = draws()
    for a, b, c in zip(first, later, other):
        assert not torch.equal(a, b) and not torch.equal(a, c)


def test_generator_streams(mode):
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(7)
    a1 = torch.rand(1000, device="tpu", generator=g).cpu()
    a2 = torch.randn(1000, device="tpu", generator=g).cpu()
    # Reseeding replays the stream, whatever the default generator does
    # in between.
    g.manual_seed(7)
    torch.manual_seed(99)
    torch.rand(1000, device="tpu")
    b1 = torch.rand(1000, device="tpu", generator=g).cpu()
    torch.randn(1000, device="tpu")
    b2 = torch.randn(1000, device="tpu", generator=g).cpu()
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    # The default generator's stream does not depend on g's use.
    torch.manual_seed(99)
    d1 = torch.rand(1000, device="tpu").cpu()
    torch.manual_seed(99)
    torch.rand(1000, device="tpu", generator=g)
    d2 = torch.rand(1000, device="tpu").cpu()
    assert torch.equal(d1, d2)
    # Explicit generators also drive in-place ops.
    g.manual_seed(3)
    x = torch.empty(1000, device="tpu").normal_(generator=g).cpu()
    g.manual_seed(3)
    y = torch.empty(1000, device="tpu").normal_(generator=g).cpu()
    assert torch.equal(x, y)


def test_generator_state_is_seed_and_offset(mode):
    """CUDA's layout: 16 bytes, seed then offset; each draw moves the offset,
    a seed resets it, and an op drawn at a given offset repeats its values
    (DTensor moves the offset per shard through exactly this state)."""
    g = torch.Generator(device="tpu").manual_seed(11)
    assert g.get_offset() == 0
    first = torch.rand(100, device="tpu", generator=g).cpu()
    assert g.get_offset() > 0
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert state[:8].view(torch.int64).item() == 11 and state[8:].view(torch.int64).item() == g.get_offset()
    second = torch.rand(100, device="tpu", generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(100, device="tpu", generator=g).cpu(), second)
    g.set_offset(0)
    assert torch.equal(torch.rand(100, device="tpu", generator=g).cpu(), first)
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(5056, dtype=torch.uint8))


def test_new_seed_does_not_recompile(mode):
    torch.manual_seed(1)
    first = draws()
    compilations = torchtpu.metrics()["compilations"]
    torch.manual_seed(2)
    second = draws()
    assert torchtpu.metrics()["compilations"] == compilations
    for a, b in zip(first, second):
        assert not torch.equal(a, b)


def test_seeding_starts_no_runtime():
    """As CUDA defers seeds until its initialisation, seeds set before the
    generators exist wait for them: `torch.manual_seed` before
    `init_process_group` (which must start the runtime on GPUs) or before a
    launcher picks the CPU plugin's device count."""
    import subprocess
    import sys

    require_autoload()
    require_devices(2)
    program = """
import torch
torch.tpu.manual_seed_all(1)
torch.tpu.manual_seed(2)  # the current device only, after the seed of all
assert not torch.tpu.is_initialized()
assert [torch.tpu.initial_seed(), torch.tpu._generator(1).initial_seed()] == [2, 1]
torch.manual_seed(3)
a = torch.rand(4, device="tpu:1").cpu()
torch.manual_seed(3)
assert torch.equal(a, torch.rand(4, device="tpu:1").cpu())
"""
    env = {**os.environ, "TORCHTPU_DEVICE_COUNT": "2"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
