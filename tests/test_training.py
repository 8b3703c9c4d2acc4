"""Real training loops on tpu against the same loop on CPU."""
import gc

import pytest
import sys
from pathlib import Path

import torch

import torchtpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from workloads import WORKLOADS, train  # noqa: E402

STEPS = 20
# Rounding differences of the two matmul libraries (~1e-7 at step 1) are
# amplified by Adam's normalised updates; at lr 1e-3 they reach ~5e-4 by step
# 20, at 1e-4 they stay near 1e-6 (see docs/ARCHITECTURE.md, "Numerics").
LR = 1e-4


# Adam's at LR (above). The CNN fits random labels with batch norm and
# momentum: at its benchmark rate (0.05) step-1 rounding differences (1e-7,
# convolutions summing in another order) grow to 1e-3 by step 20; at 0.005
# they stay near 1e-5.
LEARNING_RATES = {"mlp": LR, "transformer": LR, "cnn": 0.005}
CPU_LOSSES = {}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_training_matches_cpu(workload, mode):
    """20 unmodified steps (dropout off, so both devices compute the same
    function) give CPU's losses, with nothing run on the CPU."""
    lr = LEARNING_RATES[workload]
    options = dict(dropout=0.0) if workload == "transformer" else {}
    if workload not in CPU_LOSSES:
        CPU_LOSSES[workload] = train(workload, "cpu", STEPS, lr, **options)
    torchtpu.reset_metrics()
    losses = train(workload, "tpu", STEPS, lr, **options)
    assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(CPU_LOSSES[workload]), rtol=1e-4, atol=0)


def storages_held(model, opt, batch):
    """Distinct tpu storages the model, optimizer and current batch keep alive."""
    tensors = list(batch) + list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return len({t.untyped_storage().data_ptr() for t in tensors if t.device.type == "tpu"})


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.parametrize("eager", ["strict", "fused"])
def test_no_leaks(eager):
    seen = {}
    gc.collect()
    torch.tpu.synchronize()
    # What earlier tests in this worker keep: Helion's caches, and device
    # buffers without a storage (CI once met 2 here after other files).
    m = torchtpu.metrics()
    before, buffers_before = m["live_storages"], m["live_buffers"] - m["cached_scalars"]

    def on_step(step, model, opt, batch):
        if step in (50, 150, 299):
            gc.collect()
            torch.tpu.synchronize()
            m = torchtpu.metrics()
            seen[step] = (m["live_storages"], m["live_buffers"] - m["cached_scalars"], storages_held(model, opt, batch), rss_mib())

    with torchtpu.mode(eager):
        train("mlp", "tpu", 300, LR, on_step=on_step)
    for step, (live, buffers, held, _) in seen.items():
        assert live - before == held, f"step {step}: {live - before} new live storages, model and optimizer hold {held}"
        assert buffers - buffers_before <= live - before, \
            f"step {step}: {buffers - buffers_before} new buffers for {live - before} new storages"
    growth = seen[299][3] - seen[150][3]
    assert growth < 64, f"resident memory grew by {growth:.0f} MiB over 150 steps"


def test_fresh_weights_are_never_stale(mode):
    """Each matmul sees its own right-hand side, even when a new buffer takes a
    freed one's address (XLA:CPU's XNNPACK dot would reuse a stale packing)."""
    g = torch.Generator().manual_seed(0)
    lhs = torch.randn(128, 1024, generator=g)
    lhs_tpu = lhs.to("tpu")
    for _ in range(40):
        w = torch.randn(1024, 1024, generator=g)
        torch.testing.assert_close(lhs_tpu.mm(w.to("tpu")).cpu(), lhs @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_product_by_a_broadcast_scalar_summed_is_right(dtype, mode):
    """A batched product by a broadcast scalar, multiplied and summed (the
    backward of a sum through a product has this form): XLA:CPU's YNNPACK
    fusions of it returned 1e200s or NaN, eagerly and compiled."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 60, 60, generator=g, dtype=dtype)
    e = a @ a.mT

    def f(e):
        return ((e @ torch.full_like(e, 0.37)) * e).sum(-1), torch.einsum("bij,bjk,bik->bi", e, torch.full_like(e, 0.37), e)

    tol = 1e-5 if dtype == torch.float32 else 1e-12  # of the largest value
    for got, want in zip(f(e.to("tpu")) + torch.compile(f, backend="tpu")(e.to("tpu")), f(e) * 2):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("name, options", [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)),
    ("Adam", dict(lr=1e-3)),
    ("Adam", dict(lr=1e-3, foreach=False)),
    ("AdamW", dict(lr=1e-3, amsgrad=True)),
    # The fused kernels (Hugging Face Trainer's default is AdamW's).
    ("AdamW", dict(lr=1e-3, weight_decay=0.1, fused=True)),
    ("Adam", dict(lr=1e-3, weight_decay=0.1, amsgrad=True, maximize=True, fused=True)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=1e-4, fused=True)),
    ("RMSprop", dict(lr=1e-3)),
    ("Adagrad", dict(lr=1e-2)),
    ("Adagrad", dict(lr=1e-2, lr_decay=0.1, weight_decay=1e-3, initial_accumulator_value=0.1, fused=True)),
])
def test_optimizers_match_cpu(name, options, mode):
    """torch.optim's default code paths, with an LR scheduler and gradient
    clipping, give CPU's parameters and run nothing on the CPU."""
    params = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
        opt = getattr(torch.optim, name)(net.parameters(), **options)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.9)
        x, y = torch.randn(32, 8).to(device), torch.randint(0, 4, (32,)).to(device)
        torchtpu.reset_metrics()
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
        params[device] = [p.detach().cpu() for p in net.parameters()]
        assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(params["tpu"], params["cpu"])


@pytest.mark.parametrize("fused", [True, False])
def test_grad_scaler_matches_cpu(fused):
    """torch.amp.GradScaler("tpu") with a fused AdamW (unscaled inside the
    kernel) or SGD after `unscale_` and clipping: a step whose gradients
    overflow is skipped and backs the scale off, two good ones grow it; CPU's
    scales and parameters, nothing on the CPU, nothing compiled after the
    third step."""
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
        opt = (torch.optim.AdamW(net.parameters(), lr=1e-2, fused=True) if fused
               else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
        scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=2)
        x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
        torchtpu.reset_metrics()
        scales, compiled = [], []
        for step in range(6):
            opt.zero_grad()
            inputs = x.clone()
            if step == 1:
                inputs[0, 0] = float("inf")
            loss = torch.nn.functional.cross_entropy(net(inputs.to(device)), y.to(device))
            scaler.scale(loss).backward()
            if not fused:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
            compiled.append(torchtpu.metrics()["compilations"])
        results[device] = scales, [p.detach().cpu() for p in net.parameters()]
        if device == "tpu":
            assert torchtpu.metrics()["fallbacks"] == {}
            assert compiled[2] == compiled[-1], compiled
    assert results["tpu"][0] == results["cpu"][0] == [2.0**12, 2.0**11, 2.0**11, 2.0**12, 2.0**12, 2.0**13]
    torch.testing.assert_close(results["tpu"][1], results["cpu"][1])


def test_new_scalars_never_recompile():
    """Learning rates, alphas and seeds are program inputs: a schedule that
    changes them every step compiles nothing after the first step."""
    with torchtpu.mode("strict"):
        compiled = []

        def on_step(step, net, opt, batch):
            for group in opt.param_groups:
                group["lr"] *= 0.7
            compiled.append(torchtpu.metrics()["compilations"])

        train("mlp", "tpu", 6, LR, on_step=on_step)
    assert compiled[1] == compiled[-1], compiled


def test_dirichlet_and_beta_gradients_match_cpu(mode):
    """Gradients through digamma (KL between Dirichlets, a Beta's entropy:
    variational models' priors) need trigamma, polygamma(1, x): CPU's values,
    over both sides of its reflection at 1/2, with nothing on the CPU."""
    x = torch.cat([torch.linspace(-4.7, 12.0, 41), torch.tensor([0.5, 0.4999, 1e-3])])

    def run(device):
        a = torch.tensor([[1.5, 2.0, 0.7], [3.0, 0.2, 1.0]], device=device, requires_grad=True)
        prior = torch.distributions.Dirichlet(torch.ones(3, device=device))
        loss = torch.distributions.kl_divergence(torch.distributions.Dirichlet(a), prior).sum()
        loss = loss + torch.distributions.Beta(a[:, 0], a[:, 1]).entropy().sum()
        loss.backward()
        return loss.detach().cpu(), a.grad.cpu(), torch.polygamma(1, x.to(device)).cpu()

    expected = run("cpu")
    torchtpu.reset_metrics()
    got = run("tpu")
    assert not torchtpu.metrics()["fallbacks"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
