"""Neural-network operators (lower/nn.rs) against PyTorch on CPU.

Every test runs the same computation on CPU and on tpu and compares values,
dtype and shape (and gradients, through autograd, which exercises the
*_backward operators). No test may fall back to CPU.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
import torchtpu

from conftest import synced, to_tpu


pytestmark = pytest.mark.usefixtures("seeded_without_fallbacks")


def assert_same(tpu, cpu, **tol):
    """tpu result(s) equal CPU's: values, dtype and shape."""
    if isinstance(cpu, (tuple, list)):
        assert len(tpu) == len(cpu)
        for a, b in zip(tpu, cpu):
            assert_same(a, b, **tol)
        return
    assert tpu.device.type == "tpu"
    torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True, **tol)


def compare(fn, *args, grad=False, **tol):
    """Runs fn on CPU tensors and on their tpu copies; with `grad`, also
    backpropagates one random cotangent and compares the float inputs' grads."""
    wants = [grad and isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]
    cpu_args = [a.detach().clone().requires_grad_() if w else a for a, w in zip(args, wants)]
    tpu_args = [a.detach().to("tpu").requires_grad_() if w else to_tpu(a) for a, w in zip(args, wants)]
    expected = fn(*cpu_args)
    actual = fn(*tpu_args)
    assert_same(actual, expected, **tol)
    if grad:
        cotangent = torch.randn_like(expected)
        expected.backward(cotangent)
        actual.backward(cotangent.to("tpu"))
        for a, c, w in zip(tpu_args, cpu_args, wants):
            if w:
                assert_same(a.grad, c.grad, **tol)


def error_of(fn):
    with pytest.raises(Exception) as info:
        synced(fn)
    return info.value


def compare_error(fn, *args):
    """fn raises the same exception type and message on tpu as on CPU."""
    expected = error_of(lambda: fn(*args))
    actual = error_of(lambda: fn(*[to_tpu(a) for a in args]))
    assert type(actual) is type(expected)
    assert str(actual) == str(expected)


def to_dev(t, like):
    """An optional tensor on `like`'s device."""
    return None if t is None else t.to(like.device)


def randn(*shape, scale=3.0):
    return torch.randn(*shape) * scale


# ------------------------------------------------------------------ activations

# name -> (functional form, in-place form or None, out= overload)
ACTIVATIONS = {
    "relu": (F.relu, torch.relu_, torch.ops.aten.relu.out),
    "gelu": (F.gelu, torch.ops.aten.gelu_, torch.ops.aten.gelu.out),
    "gelu_tanh": (
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
        lambda x, out: torch.ops.aten.gelu.out(x, approximate="tanh", out=out),
    ),
    "silu": (F.silu, lambda x: F.silu(x, inplace=True), torch.ops.aten.silu.out),
    "leaky_relu": (
        lambda x: F.leaky_relu(x, 0.2),
        lambda x: F.leaky_relu_(x, 0.2),
        lambda x, out: torch.ops.aten.leaky_relu.out(x, 0.2, out=out),
    ),
    "elu": (lambda x: F.elu(x, 1.5), lambda x: F.elu_(x, 1.5), lambda x, out: torch.ops.aten.elu.out(x, 1.5, out=out)),
    "selu": (F.selu, lambda x: F.selu(x, inplace=True), None),
    "hardtanh": (
        lambda x: F.hardtanh(x, -0.5, 0.7),
        lambda x: F.hardtanh_(x, -0.5, 0.7),
        lambda x, out: torch.ops.aten.hardtanh.out(x, -0.5, 0.7, out=out),
    ),
    "relu6": (F.relu6, lambda x: F.relu6(x, inplace=True), None),
    "hardsigmoid": (F.hardsigmoid, lambda x: F.hardsigmoid(x, inplace=True), torch.ops.aten.hardsigmoid.out),
    "hardswish": (F.hardswish, lambda x: F.hardswish(x, inplace=True), torch.ops.aten.hardswish.out),
    "softplus": (
        lambda x: F.softplus(x, beta=2.0, threshold=1.5),
        None,
        lambda x, out: torch.ops.aten.softplus.out(x, 2.0, 1.5, out=out),
    ),
    "sigmoid": (torch.sigmoid, torch.sigmoid_, torch.ops.aten.sigmoid.out),
    "tanh": (torch.tanh, torch.tanh_, torch.ops.aten.tanh.out),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(name, mode):
    fn = ACTIVATIONS[name][0]
    compare(fn, randn(6, 5), grad=True)
    # A transposed (non-contiguous) view.
    compare(lambda x: fn(x.t()), randn(5, 6), grad=True)
    compare(fn, randn(6, 5).bfloat16())


@pytest.mark.one_mode
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_out_and_inplace(name, mode):
    _, inplace, out = ACTIVATIONS[name]
    x = randn(4, 3)
    if out is not None:
        compare(lambda x: out(x, out=torch.empty_like(x)), x)
    if inplace is not None:
        compare(lambda x: inplace(x.clone()), x)
        # Autograd through the in-place form (backward from the result).
        compare(lambda x: inplace(x * 1.0), x, grad=True)


def test_activation_scalars_are_runtime_operands(mode):
    x = randn(4, 3)
    compare(lambda x: F.leaky_relu(x, 0.1), x)
    compare(lambda x: F.softplus(x, beta=0.5, threshold=3.0), x)
    before = torchtpu.metrics()["plan_cache_misses"]
    compare(lambda x: F.leaky_relu(x, 0.3), x)
    compare(lambda x: F.softplus(x, beta=1.5, threshold=2.0), x)
    # New scalar values reuse the compiled programs.
    assert torchtpu.metrics()["plan_cache_misses"] == before


@pytest.mark.parametrize("name", ["gelu", "silu", "elu", "leaky_relu", "softplus", "hardtanh", "hardsigmoid",
                                  "hardswish"])
def test_activation_bad_dtype(name):
    # hardtanh takes integers but not bool; the others floating types only.
    x = torch.tensor([True]) if name == "hardtanh" else torch.arange(3)
    compare_error(getattr(F, name), x)


def test_gelu_bad_approximate():
    compare_error(lambda x: F.gelu(x, approximate="exact"), randn(3))


# ------------------------------------------------------------------ softmax


@pytest.mark.one_mode
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(fn, dim, mode):
    compare(lambda x: fn(x, dim), randn(4, 5, 3), grad=True)


@pytest.mark.one_mode
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_variants(fn, mode):
    # Large logits: the max is subtracted before exp.
    compare(lambda x: fn(x, 1), randn(3, 6, scale=1000.0), grad=True)
    compare(lambda x: fn(x.t(), 1), randn(5, 4), grad=True)
    compare(lambda x: fn(x, 0), randn(()), grad=True)
    # bfloat16: CPU rounds intermediates, up to 0.004 off the correctly
    # rounded result (ours), which backward through a cancellation would
    # amplify, so backward is compared from the same y.
    x = randn(3, 7).bfloat16()
    compare(lambda x: fn(x, 1), x, atol=1e-2, rtol=1.6e-2)
    backward = torch.ops.aten._softmax_backward_data if fn is F.softmax else torch.ops.aten._log_softmax_backward_data
    compare(lambda g, y: backward(g, y, 1, torch.bfloat16), randn(3, 7).bfloat16(), fn(x, 1))
    # dtype= converts first.
    compare(lambda x: fn(x, 1, dtype=torch.float32), randn(3, 7).bfloat16())


@pytest.mark.parametrize("op", ["_softmax", "_log_softmax"])
def test_softmax_out_and_half_to_float(op, mode):
    aten = getattr(torch.ops.aten, op)
    compare(lambda x: aten.out(x, 1, False, out=torch.empty_like(x)), randn(3, 4))
    # half_to_float: a float16 input gives float32 (CUDA's behaviour; CPU
    # refuses it, so the reference converts first).
    x = randn(3, 4).half()
    assert_same(aten(x.to("tpu"), 1, True), aten(x.float(), 1, False))
    backward = getattr(torch.ops.aten, op + "_backward_data")
    g, y = randn(3, 4), aten(x.float(), 1, False)
    assert_same(backward(g.to("tpu"), y.to("tpu"), 1, torch.half), backward(g, y, 1, torch.float).half())


def test_softmax_errors():
    compare_error(lambda x: torch.softmax(x, 1), torch.arange(6).view(2, 3))
    compare_error(lambda x: torch.log_softmax(x, 0), torch.arange(6).view(2, 3))
    compare_error(lambda x: torch.softmax(x, 2), randn(2, 3))
    compare_error(lambda g, y: torch.ops.aten._softmax_backward_data(g, y, 1, torch.float), randn(3, 4), randn(2, 4))


# ------------------------------------------------------------------ nll_loss, cross_entropy


@pytest.mark.one_mode
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_nll_loss(reduction, weighted, mode):
    x, t = randn(6, 4).log_softmax(1), torch.tensor([0, 3, 1, 2, 3, 1])
    w = torch.rand(4) if weighted else None
    compare(lambda x: F.nll_loss(x, t.to(x.device), to_dev(w, x), reduction=reduction), x, grad=True)
    # ignore_index, a class or not
    for ignore in (3, -1):
        t2 = torch.tensor([0, 3, 1, ignore, 2, ignore])
        compare(
            lambda x: F.nll_loss(x, t2.to(x.device), to_dev(w, x), ignore_index=ignore, reduction=reduction), x, grad=True
        )
    # One sample (C) with a 0-d target.
    compare(lambda x: F.nll_loss(x, torch.tensor(2, device=x.device), to_dev(w, x), reduction=reduction), randn(4), grad=True)


def test_nll_loss_forward_output_pair(mode):
    x, t = randn(5, 3).t(), torch.tensor([0, 2, 4])  # a transposed input
    w = torch.rand(5)
    for reduction in (0, 1, 2):
        compare(lambda x, t, w: torch.ops.aten.nll_loss_forward(x, t, w, reduction, -100), x, t, w)
    # All targets ignored: mean is 0/0.
    compare(lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, 1, 0), x, torch.zeros(3, dtype=torch.long))
    # out= overload
    compare(
        lambda x, t: torch.ops.aten.nll_loss_forward.output(
            x, t, None, 1, -100, output=x.new_empty(()), total_weight=x.new_empty(())
        ),
        x,
        t,
    )
    # uint8 targets and bfloat16 input
    compare(lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, 2, -100), x.bfloat16(), t.to(torch.uint8))


@pytest.mark.one_mode
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss2d(reduction, mode):
    x, t = randn(2, 3, 4, 5).log_softmax(1), torch.randint(0, 3, (2, 4, 5))
    t[0, 0] = -100
    w = torch.rand(3)
    compare(lambda x: F.nll_loss(x, t.to(x.device), w.to(x.device), reduction=reduction), x, grad=True)


def test_nll_loss_errors():
    x = randn(3, 4)
    nll = torch.ops.aten.nll_loss_forward
    compare_error(lambda x, t: nll(x, t, None, 1, -100), x, torch.tensor([0, 1]))
    compare_error(lambda x, t: nll(x, t, None, 1, -100), x, torch.tensor([0, 1, 2], dtype=torch.int32))
    compare_error(lambda x, t, w: nll(x, t, w, 1, -100), x, torch.tensor([0, 1, 2]), torch.ones(3))
    compare_error(lambda x, t: nll(x, t, None, 1, -100), x[None], torch.tensor([0, 1, 2]))
    compare_error(lambda x, t: nll(x, t, None, 1, -100), randn(4), torch.tensor([1, 2]))
    compare_error(lambda x, t: nll(x, t, None, 1, -100), x.long(), torch.tensor([0, 1, 2]))
    x4 = randn(2, 3, 4, 5)
    nll2d = torch.ops.aten.nll_loss2d_forward
    compare_error(lambda x, t: nll2d(x, t, None, 1, -100), x4, torch.zeros(2, 4, 6, dtype=torch.long))
    compare_error(lambda x, t: nll2d(x, t, None, 1, -100), x4[0], torch.zeros(2, 4, 5, dtype=torch.long))
    compare_error(lambda x, t, w: nll2d(x, t, w, 1, -100), x4, torch.zeros(2, 4, 5, dtype=torch.long), torch.ones(2))


@pytest.mark.parametrize("target", [[0, 1, 10], [0, -5, 2]], ids=["high", "negative"])
def test_nll_loss_target_out_of_bounds(target):
    x, t = randn(3, 4), torch.tensor(target)
    expected = error_of(lambda: F.nll_loss(x, t))
    actual = error_of(lambda: F.nll_loss(x.to("tpu"), t.to("tpu")))
    assert type(actual) is type(expected) is IndexError
    assert str(actual).startswith("Target") and str(actual).endswith("is out of bounds.")


def test_nll_loss_target_out_of_bounds_message():
    compare_error(lambda x, t: F.nll_loss(x, t), randn(3, 4), torch.tensor([0, 1, 10]))


@pytest.mark.one_mode
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(label_smoothing, reduction, mode):
    t = torch.tensor([0, 3, 1, 2, 3])
    w = torch.rand(4)
    for weight in (None, w):
        compare(
            lambda x: F.cross_entropy(
                x, t.to(x.device), to_dev(weight, x), reduction=reduction, label_smoothing=label_smoothing
            ),
            randn(5, 4),
            grad=True,
        )
    # (N, C, d) inputs go through nll_loss2d.
    t3 = torch.randint(0, 4, (2, 3))
    compare(
        lambda x: F.cross_entropy(x, t3.to(x.device), reduction=reduction, label_smoothing=label_smoothing),
        randn(2, 4, 3),
        grad=True,
    )


# ------------------------------------------------------------------ mse_loss


@pytest.mark.one_mode
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_mse_loss(reduction, mode):
    compare(lambda x, y: F.mse_loss(x, y, reduction=reduction), randn(4, 5), randn(4, 5), grad=True)
    compare(lambda x, y: F.mse_loss(x.t(), y, reduction=reduction), randn(5, 4), randn(4, 5), grad=True)
    compare(lambda x, y: F.mse_loss(x, y, reduction=reduction), randn(4, 5).bfloat16(), randn(4, 5).bfloat16())


def test_mse_loss_out_and_broadcast(mode):
    x, y = randn(3, 4), randn(4)
    compare(lambda x, y: torch.ops.aten.mse_loss.out(x, y, 1, out=x.new_empty(0)), x, y)
    # The aten op broadcasts and promotes like a binary op.
    compare(lambda x, y: torch.ops.aten.mse_loss(x, y, 0), x, y.double())


def test_mse_loss_errors():
    compare_error(lambda x, y: F.mse_loss(x, y), torch.arange(3), torch.arange(3))
    compare_error(lambda x, y: torch.ops.aten.mse_loss(x, y, 1), randn(3, 4), randn(5))


# ------------------------------------------------------------------ CTC loss

# (input lengths, target lengths, targets flat, blank, repeated labels): full
# and short inputs, empty inputs and targets, targets longer than their input
# (an infinite loss; under zero_infinity a zero), labels repeated (no skip
# between equal labels), a blank other than 0.
CTC_CASES = {
    "padded": ([20, 15, 8], [5, 3, 2], False, 0, False),
    "concatenated": ([20, 15, 8], [5, 3, 2], True, 0, False),
    "blank_3": ([20, 15, 8], [5, 3, 2], False, 3, False),
    "repeats": ([20, 15, 8], [5, 3, 2], True, 0, True),
    "empty": ([20, 0, 3, 2], [0, 0, 3, 4], False, 0, False),
    "too_long": ([4, 4], [6, 2], True, 0, False),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("case", CTC_CASES)
@pytest.mark.parametrize("zero_infinity", [False, True], ids=["inf", "zero_inf"])
def test_ctc_loss_as_on_cpu(case, zero_infinity, mode):
    """Values and gradients of every reduction, float64 (float32 and int32
    targets once), against CPU's kernel: no fallback."""
    input_lengths, target_lengths, flat, blank, repeats = CTC_CASES[case]
    n, classes = len(input_lengths), 6
    log_probs = torch.randn(20, n, classes, dtype=torch.float64).log_softmax(2)
    labels = torch.tensor([c for c in range(classes) if c != blank])
    targets = labels[torch.randint(0, len(labels), (n, 8))]
    if repeats:
        targets[:, 1::2] = targets[:, 0::2]
    if flat:
        targets = torch.cat([targets[i, :length] for i, length in enumerate(target_lengths)])
    for reduction in ("none", "sum", "mean"):
        compare(lambda x, t: F.ctc_loss(x, t, input_lengths, target_lengths, blank=blank, reduction=reduction,
                                        zero_infinity=zero_infinity), log_probs, targets, grad=True)
    if case == "padded":
        compare(lambda x, t: F.ctc_loss(x, t, torch.tensor(input_lengths), torch.tensor(target_lengths)),
                log_probs.float(), targets.int(), grad=True)


def test_ctc_loss_with_new_lengths_compiles_nothing():
    """The lengths are the program's data: a training step of new lengths
    (same shapes) runs the program the first one compiled."""
    layer = torch.nn.Linear(8, 10).to("tpu")
    targets = torch.randint(1, 10, (4, 12), device="tpu")

    def step(input_lengths, target_lengths):
        loss = F.ctc_loss(layer(torch.randn(40, 4, 8, device="tpu")).log_softmax(2), targets, input_lengths, target_lengths)
        loss.backward()
        return loss.item()

    for _ in range(2):  # the second step accumulates into the first's gradients
        step(torch.tensor([40, 30, 20, 10]), torch.tensor([9, 5, 4, 3]))
    compiled = torchtpu.metrics()["compilations"]
    for _ in range(3):
        step(torch.randint(20, 41, (4,)), torch.randint(1, 12, (4,)))
    assert torchtpu.metrics()["compilations"] == compiled


# ------------------------------------------------------------------ grid sampling


@pytest.mark.one_mode
@pytest.mark.parametrize("interpolation,padding",
                         [(i, p) for i in ("bilinear", "nearest") for p in ("zeros", "border", "reflection")]
                         + [("bicubic", "reflection")])  # 64 taps: slow to compile, one case
def test_grid_sample_3d_as_on_cpu(interpolation, padding, mode):
    """5-d grid sampling (trilinear, nearest or tricubic) and both gradients, float64,
    points inside and past the input, corners aligned or not."""
    x = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64)
    grid = torch.rand(2, 3, 4, 2, 3, dtype=torch.float64) * 2.4 - 1.2
    if interpolation == "bicubic" and torch.__version__ < "2.15":
        with pytest.raises(RuntimeError, match="bicubic interpolation only supports 4D input"):
            F.grid_sample(x.to("tpu"), grid.to("tpu"), mode="bicubic", align_corners=False)
        return
    for align_corners in (False, True):
        compare(lambda x, g: F.grid_sample(x, g, mode=interpolation, padding_mode=padding,
                                           align_corners=align_corners), x, grid, grad=True)


# ------------------------------------------------------------------ dropout


def test_dropout_statistics(mode):
    p = 0.3
    x = torch.rand(200, 300, device="tpu") + 1.0
    out, mask = torch.ops.aten.native_dropout(x, p, True)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert mask.dtype == torch.bool and mask.shape == x.shape
    out, mask, x = out.cpu(), mask.cpu(), x.cpu()
    # 60000 Bernoulli draws: the zeroed fraction is within 5 sigma of p.
    assert abs((~mask).float().mean().item() - p) < 5 * (p * (1 - p) / mask.numel()) ** 0.5
    torch.testing.assert_close(out, torch.where(mask, x / (1 - p), torch.zeros(())))


def test_dropout_reproducible_and_fresh(mode):
    x = torch.ones(64, 64, device="tpu")
    torch.manual_seed(7)
    a = F.dropout(x, 0.5).cpu()
    b = F.dropout(x, 0.5).cpu()
    torch.manual_seed(7)
    assert torch.equal(F.dropout(x, 0.5).cpu(), a)
    assert not torch.equal(a, b)


def test_dropout_eval_and_edges(mode):
    x = randn(5, 6)
    compare(lambda x: torch.ops.aten.native_dropout(x, 0.4, False), x)
    compare(lambda x: F.dropout(x, 0.4, training=False), x)
    compare(lambda x: torch.ops.aten.native_dropout(x, 0.0, True), x)
    compare(lambda x: torch.ops.aten.native_dropout(x, 1.0, True), x)
    compare(lambda x: torch.ops.aten.native_dropout(x.bfloat16(), 0.0, True), x)
    compare_error(lambda x: torch.ops.aten.native_dropout(x, 0.5, True), torch.arange(3))


def test_dropout_backward_uses_mask(mode):
    x = randn(40, 50).to("tpu").requires_grad_()
    y = F.dropout(x, 0.25)
    g = torch.randn(40, 50)
    y.backward(g.to("tpu"))
    kept = (y != 0).cpu()
    torch.testing.assert_close(x.grad.cpu(), torch.where(kept, g / 0.75, torch.zeros(())))
    mask = torch.rand(3, 4) < 0.5
    compare(lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 2.0), g[:3, :4], mask)
    compare(
        lambda g, m: torch.ops.aten.native_dropout_backward.out(g, m, 2.0, out=torch.empty_like(g)), g[:3, :4], mask
    )


# ------------------------------------------------------------------ embedding


@pytest.mark.one_mode
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True], ids=["plain", "freq"])
def test_embedding(padding_idx, scale_grad_by_freq, mode):
    idx = torch.tensor([[1, 2, 1, 7], [0, 9, 2, 1]])
    compare(
        lambda w: F.embedding(idx.to(w.device), w, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq),
        randn(10, 3),
        grad=True,
    )


def test_embedding_dense_backward(mode):
    g, idx = randn(2, 4, 3), torch.tensor([[1, 2, 1, 7], [0, 9, 2, 1]])
    backward = torch.ops.aten.embedding_dense_backward
    compare(lambda g, i: backward(g, i, 10, 1, True), g, idx.int())
    compare(lambda g, i: backward(g, i, 12, -1, False), g.bfloat16(), idx)
    compare(lambda g, i: backward.out(g, i, 10, 2, False, out=g.new_empty(0)), g, idx)
    compare_error(lambda g, i: backward(g, i, 10, -1, False), g, idx.float())


# ------------------------------------------------------------------ a model


def test_mlp_cross_entropy(mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    on_tpu = copy.deepcopy(model).to("tpu")
    x, t = torch.randn(12, 8), torch.randint(0, 4, (12,))
    loss = F.cross_entropy(model(x), t)
    loss.backward()
    tpu_loss = F.cross_entropy(on_tpu(x.to("tpu")), t.to("tpu"))
    tpu_loss.backward()
    assert_same(tpu_loss, loss.detach())
    for p, q in zip(model.parameters(), on_tpu.parameters()):
        assert_same(q.grad, p.grad)


# OpInfo's multi_head_attention_forward samples all use dropout in training,
# so the sweep compares none of them: nn.MultiheadAttention is compared here.
MHA_CASES = {  # batch_first, need_weights, key padding mask, attention mask, kdim/vdim
    "self": (False, True, False, None, None),
    "batch_first_padded": (True, False, True, None, None),
    "causal_bool_mask": (True, True, False, "bool", None),
    "float_mask_unaveraged": (False, "per_head", False, "float", None),
    "cross_kdim_vdim": (True, True, False, None, (6, 5)),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention(case, mode):
    batch_first, need_weights, padded, mask, kv_dims = MHA_CASES[case]
    L, S, N, E = 4, 5, 3, 8
    kdim, vdim = kv_dims or (E, E)
    module = torch.nn.MultiheadAttention(E, 2, batch_first=batch_first, kdim=kdim, vdim=vdim, bias=True)
    on_tpu = copy.deepcopy(module).to("tpu")
    shape = (lambda n, d: (N, n, d)) if batch_first else (lambda n, d: (n, N, d))
    q = torch.randn(shape(L, E))
    k, v = (torch.randn(shape(S, kdim)), torch.randn(shape(S, vdim))) if kv_dims else (q, q)
    kwargs = {"need_weights": bool(need_weights), "average_attn_weights": need_weights != "per_head"}
    if padded:
        kwargs["key_padding_mask"] = torch.tensor([[False] * 4 + [True]] * N)[:, : k.shape[1 if batch_first else 0]]
    if mask == "bool":
        kwargs["attn_mask"] = torch.ones(L, L, dtype=torch.bool).triu(1)
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(L, L)

    def run(m, device):
        inputs = [t.detach().to(device).requires_grad_() for t in ((q,) if k is q else (q, k, v))]
        query, key, value = inputs if len(inputs) == 3 else inputs * 3
        out, weights = m(query, key, value, **{n: to_tpu(t) if device == "tpu" else t for n, t in kwargs.items()})
        out.sum().backward()
        return [out, weights] + [t.grad for t in inputs] + [p.grad for p in m.parameters()]

    for got, expected in zip(run(on_tpu, "tpu"), run(module, "cpu")):
        if expected is None:
            assert got is None
        else:
            assert_same(got, expected.detach(), atol=1e-5, rtol=1e-4)


def operators_run(fn, *args):
    """The operators fn(*args) dispatches (without autograd), and its result."""
    with torch.no_grad(), torch.profiler.profile() as prof:
        out = fn(*args)
    return [e.name for e in prof.events()], out


SDPA_CASES = {  # query heads, key heads, L, S, mask, is_causal
    "causal": (4, 4, 6, 6, None, True),
    "causal_longer_queries": (4, 4, 7, 5, None, True),
    "grouped_heads": (4, 2, 5, 7, None, False),
    "float_mask_with_grad": (2, 2, 5, 7, "float", False),
    "bool_mask_a_row_left_out": (2, 1, 5, 7, "bool", False),
}


@pytest.mark.parametrize("case", SDPA_CASES)
def test_scaled_dot_product_attention_is_one_fused_op(case, mode):
    """F.scaled_dot_product_attention takes tpu's fused kernel: one op
    forward and one backward, with CPU's values and gradients (a mask's
    too), its output laid out in the query's dimension order as PyTorch's
    meta function says, and a row whose every key is masked out giving 0."""
    hq, hk, L, S, mask, causal = SDPA_CASES[case]
    x = torch.randn(2, L, hq * 8)
    k, v = torch.randn(2, hk, S, 8), torch.randn(2, hk, S, 6)
    m = None
    if mask == "float":
        m = torch.randn(1, hq, L, S)
    elif mask == "bool":
        m = torch.rand(L, S) > 0.3
        m[1] = False

    def attend(x, k, v, m):
        q = x.view(2, L, hq, 8).transpose(1, 2)  # the layout a projection leaves
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=hq != hk)

    ran, out = operators_run(attend, *(to_tpu(t) for t in (x, k, v, m)))
    assert ran.count("torchtpu::attention") == 1 and not {"aten::bmm", "aten::_softmax"} & set(ran)
    with torch.no_grad():
        q = x.to("meta").view(2, L, hq, 8).transpose(1, 2)
        meta = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k.to("meta"), v.to("meta"))[0]
        assert out.stride() == meta.stride()
    compare(attend, x, k, v, m, grad=True, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_scaled_dot_product_attention_dropout_is_fused(compiled, mode):
    """Dropout takes the fused kernel too. With the identity as values the
    output is the dropped probabilities themselves: about 1 - p of them
    kept, each CPU's probability over 1 - p, and the gradients are CPU's
    for that same mask (the backward draws it again from the forward's
    key), eager and compiled."""
    p, S = 0.3, 64
    q, k, eye = torch.randn(2, 2, 8, 16), torch.randn(2, 2, S, 16), torch.eye(S).expand(2, 2, S, S)
    ran, _ = operators_run(F.scaled_dot_product_attention, *(t.to("tpu") for t in (q, k, eye)), None, p)
    assert ran.count("torchtpu::attention") == 1 and "aten::_softmax" not in ran

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)

    w = torch.randn(2, 2, 8, S)
    inputs = [t.to("tpu").requires_grad_() for t in (q, k, eye)]
    out = (torch.compile(attend, backend="tpu") if compiled else attend)(*inputs)
    (out * w.to("tpu")).sum().backward()
    kept = out.detach().cpu() != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.05
    expected_inputs = [t.clone().requires_grad_() for t in (q, k, eye)]
    qe, ke, ve = expected_inputs
    expected = (torch.softmax(qe @ ke.transpose(-1, -2) / 4, -1) * kept / (1 - p)) @ ve
    (expected * w).sum().backward()
    for got, want in zip([out] + [t.grad for t in inputs], [expected] + [t.grad for t in expected_inputs]):
        assert_same(got, want.detach(), atol=1e-5, rtol=1e-4)


def test_scaled_dot_product_attention_math_kernel_when_chosen_or_needed(mode):
    """A dropout that keeps nothing and sdpa_kernel(SDPBackend.MATH) take
    PyTorch's math composite, which tpu runs op by op."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(2, 2, 5, 8, device="tpu") for _ in range(3))
    ran, out = operators_run(F.scaled_dot_product_attention, q, k, v, None, 1.0)
    assert "aten::_softmax" in ran and "torchtpu::attention" not in ran
    assert_same(out, torch.zeros(2, 2, 5, 8))
    with sdpa_kernel(SDPBackend.MATH):
        ran, _ = operators_run(F.scaled_dot_product_attention, q, k, v)
        assert "aten::_softmax" in ran and "torchtpu::attention" not in ran
    with sdpa_kernel(SDPBackend.MATH):
        compare(F.scaled_dot_product_attention, q.cpu(), k.cpu(), v.cpu(), grad=True, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_attention(compiled):
    """FlexAttention with a block mask and a score modifier, forward and
    backward, equals the same attention written out on CPU (whose own
    FlexAttention has no backward)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b, h, q, kv):
        return q >= kv

    def relative_bias(score, b, h, q, kv):
        return score + (q - kv) * 0.05

    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    position = torch.arange(64.0)
    expected_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    qe, ke, ve = expected_inputs
    scores = qe @ ke.transpose(-1, -2) / 4 + (position[:, None] - position[None, :]) * 0.05
    expected = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ ve
    expected.sum().backward()

    inputs = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    block_mask = create_block_mask(causal, 2, 4, 64, 64, device="tpu")
    attend = torch.compile(flex_attention) if compiled else flex_attention
    out = attend(*inputs, score_mod=relative_bias, block_mask=block_mask)
    out.sum().backward()
    for got, want in zip([out] + [t.grad for t in inputs], [expected] + [t.grad for t in expected_inputs]):
        assert_same(got, want.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.one_mode
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_multihead_attention_inference_fast_path(masks, mode):
    """In eval mode without grad, batch_first self-attention takes PyTorch's
    fused path (_native_multi_head_attention, _masked_softmax)."""
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    on_tpu = copy.deepcopy(module).to("tpu")
    x = torch.randn(3, 4, 8)
    kwargs = {}
    if masks in ("padding", "both"):
        kwargs["key_padding_mask"] = torch.tensor([[False, False, False, True]] * 3)
    if masks in ("causal", "both"):
        kwargs["attn_mask"] = torch.ones(4, 4, dtype=torch.bool).triu(1)
    with torch.inference_mode():
        expected = module(x, x, x, **kwargs)
        got = on_tpu(*[x.to("tpu")] * 3, **{n: m.to("tpu") for n, m in kwargs.items()})
    for a, b in zip(got, expected):
        assert_same(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.one_mode
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_inference_fast_path(norm_first, activation, mode):
    """nn.TransformerEncoder in eval mode without grad runs PyTorch's
    _transformer_encoder_layer_fwd (its feed-forward: _addmm_activation)."""
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                             norm_first=norm_first)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    on_tpu = copy.deepcopy(encoder).to("tpu")
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.inference_mode():
        expected = encoder(x, src_key_padding_mask=padding)
        got = on_tpu(x.to("tpu"), src_key_padding_mask=padding.to("tpu"))
    assert_same(got, expected, atol=1e-5, rtol=1e-4)


RNNS = {  # module, extra input (initial state) or None
    "lstm": lambda: torch.nn.LSTM(6, 8, num_layers=2, batch_first=True),
    "lstm_bidirectional_no_bias": lambda: torch.nn.LSTM(6, 8, bidirectional=True, bias=False),
    "lstm_proj": lambda: torch.nn.LSTM(6, 8, proj_size=4, batch_first=True),
    "gru": lambda: torch.nn.GRU(6, 8, num_layers=2, batch_first=True),
    "gru_bidirectional_no_bias": lambda: torch.nn.GRU(6, 8, bidirectional=True, bias=False),
    "lstm_cell": lambda: torch.nn.LSTMCell(6, 8),
    "gru_cell": lambda: torch.nn.GRUCell(6, 8),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("name", RNNS)
def test_recurrent_layers(name, mode):
    """nn.LSTM/GRU and their cells run PyTorch's fused cells on tpu
    (_thnn_fused_lstm_cell, _thnn_fused_gru_cell), which CPU lacks."""
    module = RNNS[name]()
    on_tpu = copy.deepcopy(module).to("tpu")
    x = torch.randn(3, 5, 6) if "cell" not in name else torch.randn(3, 6)

    def run(m, device):
        inp = x.to(device).requires_grad_()
        out = m(inp)
        outs = [out] if isinstance(out, torch.Tensor) else [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]
        sum(o.sin().sum() for o in outs).backward()
        return outs + [inp.grad] + [p.grad for p in m.parameters()]

    for got, expected in zip(run(on_tpu, "tpu"), run(module, "cpu")):
        assert_same(got, expected.detach(), atol=1e-5, rtol=1e-4)


def test_lstm_packed_sequence(mode):
    module = torch.nn.LSTM(4, 5, batch_first=True)
    on_tpu = copy.deepcopy(module).to("tpu")
    x, lengths = torch.randn(3, 6, 4), torch.tensor([6, 4, 2])

    def run(m, device):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x.to(device), lengths, batch_first=True)
        out, (h, c) = m(packed)
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        padded.sum().backward()
        return [padded, h, c] + [p.grad for p in m.parameters()]

    for got, expected in zip(run(on_tpu, "tpu"), run(module, "cpu")):
        assert_same(got, expected.detach(), atol=1e-5, rtol=1e-4)


MASKED_SOFTMAX = {  # input shape, mask shape, mask_type, dim
    "padding": ((2, 3, 4, 4), (2, 4), 1, 3),
    "attention": ((2, 3, 4, 4), (4, 4), 0, 3),
    "attention_other_dim": ((2, 3, 4, 4), (4, 4), 0, 2),
    "general": ((2, 3, 5), (2, 3, 5), 2, 1),
    "scalar": ((), (), None, None),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("case", MASKED_SOFTMAX)
def test_masked_softmax(case, mode):
    shape, mask_shape, mask_type, dim = MASKED_SOFTMAX[case]
    mask = torch.rand(mask_shape) > 0.6
    if mask.dim():
        mask.view(-1, mask.shape[-1])[0] = True  # a row left out entirely is NaN, as on CPU
    # CPU's backward takes only a mask of the input's shape.
    compare(lambda x: torch._masked_softmax(x, mask.to(x.device), dim, mask_type),
            torch.randn(shape), grad=shape == mask_shape)


def test_masked_softmax_errors():
    x = torch.randn(2, 3, 4, 4)
    compare_error(lambda x, m: torch._masked_softmax(x, m, 3, 1), x, torch.zeros(2, 4))
    compare_error(lambda x, m: torch._masked_softmax(x, m, 3, 1), x, torch.zeros(3, 4, dtype=torch.bool))
    compare_error(lambda x, m: torch._masked_softmax(x, m, 3, 0), x, torch.zeros(4, 3, dtype=torch.bool))
    compare_error(lambda x, m: torch._masked_softmax(x, m, 3, 2), x, torch.zeros(2, 4, dtype=torch.bool))
    compare_error(lambda x, m: torch._masked_softmax(x, m, 3, 2), x.long(), torch.zeros_like(x, dtype=torch.bool))


# F.fold (col2im) has no OpInfo; F.unfold's entry in test_ops covers im2col
# and, through its gradient, col2im on float32.
FOLDS = {  # image size, kernel_size, dilation, padding, stride
    "plain": ((6, 7), (2, 3), 1, 0, 1),
    "strided": ((6, 7), 2, (2, 1), 1, (2, 3)),
    "overlapping": ((5, 5), 3, 2, 2, 2),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("case", FOLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool], ids=str)
def test_fold(case, dtype, mode):
    size, *args = FOLDS[case]
    blocks = F.unfold(torch.zeros(1, 2, *size), *args).shape
    for shape in (blocks, blocks[1:], (0, *blocks[1:])):  # batched, unbatched, empty batch
        x = (torch.randn(shape) * 3).to(dtype)
        compare(lambda a: F.fold(a, size, *args), x, grad=dtype == torch.float32)


@pytest.mark.parametrize("shape, size", [((16,), (5, 5)), ((1, 7, 16), (5, 5)), ((1, 8, 15), (5, 5)),
                                         ((1, 8, 16), (0, 0)), ((1, 8, 1), (1, 1))])
def test_fold_errors(shape, size):
    compare_error(lambda a: F.fold(a, size, 2), torch.randn(shape))
    compare_error(lambda a: F.fold(a, (5, 5), 2), torch.ones(1, 8, 16, dtype=torch.int64))
    compare_error(lambda a: F.fold(a, (5, 5), 2, stride=0), torch.ones(1, 8, 16))


@pytest.mark.one_mode
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op", ["_embedding_bag", "_embedding_bag_forward_only"])
def test_embedding_bag_outputs(op, dtype, mode):
    """All four results as on CPU (offset2bag, bag_size and max_indices have
    CPU's layout, which differs per mode, dtype and operator); max over a
    NaN as CPU's float32 and float64 kernels take it."""
    weight = torch.randn(10, 3, dtype=dtype)
    weight[7, 1] = float("nan")
    indices = torch.tensor([1, 7, 7, 2, 3, 4, 8, 9, 7, 0])
    fn = getattr(torch.ops.aten, op)
    for bag_mode in (0, 1, 2):
        for padding_idx in (-1, 7):
            for include_last, offsets in ((False, [0, 4, 4, 7]), (True, [0, 4, 4, 7, 10])):
                compare(lambda w, i, o: fn(w, i, o, False, bag_mode, False, None, include_last, padding_idx),
                        weight, indices, torch.tensor(offsets))


def test_embedding_bag_errors():
    w, i, o = torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0]), torch.tensor([0, 4, 4, 7])
    bag = torch.ops.aten._embedding_bag
    compare_error(lambda w, i, o: bag(w, i, o + 1), w, i, o)
    compare_error(lambda w, i, o: bag(w, i, torch.tensor([0, 4, 10], device=o.device)), w, i, o)
    compare_error(lambda w, i, o: bag(w, i, o, mode=1, per_sample_weights=torch.ones(9, device=w.device)), w, i, o)
    compare_error(lambda w, i, o: bag(w.long(), i, o), w, i, o)
    compare_error(lambda w, i, o: bag(w, i.float(), o), w, i, o)
    # CPU's float64 kernel; its float32 one names the index differently.
    compare_error(lambda w, i, o: bag(w, i + 1, o), w.double(), i, o)


@pytest.mark.one_mode
@pytest.mark.parametrize("norm_type", [1.0, 2.0, float("inf")])
def test_embedding_renorm(norm_type, mode):
    compare(lambda w, i: torch.embedding_renorm_(w, i, 1.0, norm_type), torch.randn(6, 4),
            torch.tensor([[1, 1], [3, 0]]))


# ------------------------------------------------------------------ grouped products (MoE)


@pytest.mark.parametrize("ends", [[3, 7, 10], [0, 6, 9]], ids=["full", "empty_group_and_tail"])
def test_grouped_mm(ends, mode):
    """transformers' MoE experts: rows grouped by expert (2-d x 3-d); the
    weight gradient groups the contracted dimension (2-d x 2-d)."""
    offs = torch.tensor(ends, dtype=torch.int32)
    x, w = randn(ends[-1], 8), randn(3, 8, 4)

    def experts(x, w):
        # Rows past the last group (and their gradients) are unspecified.
        padded = torch.cat([x, x.new_zeros(10 - ends[-1], 8)])
        return torch._grouped_mm(padded, w, offs=offs.to(x.device))[:ends[-1]]

    compare(experts, x, w, grad=True, rtol=1e-5, atol=1e-4)
    compare(lambda a, b: torch._grouped_mm(a, b), randn(3, 5, 8), randn(3, 8, 4), rtol=1e-5, atol=1e-4)


@pytest.mark.one_mode
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm(dtype, dim, mode):
    """nn.utils.weight_norm as wav2vec2's positional convolution uses it
    (`_weight_norm_interface` and its backward, kept dimension first or
    last): weights, norms and both gradients as on CPU, no fallback."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(6, 4, 3, generator=g).to(dtype)
    norm = torch.randn(*([6, 1, 1] if dim == 0 else [1, 1, 3]), generator=g).to(dtype)
    cot = torch.randn(6, 4, 3, generator=g).to(dtype)
    results = {}
    torchtpu.reset_metrics()
    for device in ("cpu", "tpu"):
        leaves = [v.to(device).detach().requires_grad_(), norm.to(device).detach().requires_grad_()]
        w, norms = torch._weight_norm_interface(*leaves, dim)
        (w * cot.to(device)).sum().backward()
        results[device] = [x.detach().cpu() for x in (w, norms, leaves[0].grad, leaves[1].grad)]
    assert torchtpu.metrics()["fallbacks"] == {}
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    for got, expected in zip(results["tpu"], results["cpu"]):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, **tol)
