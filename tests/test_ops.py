"""Conformance of the lowered operators with PyTorch on CPU.

Every check of tests/conformance/compare.py on the lowered entries of
PyTorch's OpInfo database: results (values, dtype, shape; in
test_op_values.py, so that `make test`'s workers share the suite),
gradients, out= and in-place variants, error inputs, and strided views. A
lowered op must not fall back to CPU. The conformance sweep
(test_conformance.py) covers every other entry's values and gradients.
"""
import copy
import random
import re

import pytest
import torch
import torchtpu
from torch.utils._pytree import tree_leaves, tree_map

from conftest import synced, to_cpu
from conformance import compare
from conformance.compare import (DTYPES, assert_close, call, copy_sample, expect_same_error, for_each_sample, grads,
                                 opinfo, to_float64)

# OpInfo entries ("name" or "name.variant") whose computation is lowered.
OPS = [
    # arithmetic
    "add", "sub", "rsub", "mul", "div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding",
    "true_divide", "floor_divide", "remainder", "fmod", "maximum", "minimum", "max.binary", "min.binary",
    "pow", "square", "atan2", "lerp", "addcmul", "addcdiv",
    # comparisons and logic
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift",
    "isnan", "isinf", "isfinite",
    "where", "clamp", "clamp_min", "clamp_max", "masked_fill",
    # unary math
    "neg", "abs", "sign", "sgn", "floor", "ceil", "trunc", "round", "round.decimals_0",
    "round.decimals_3", "round.decimals_neg_3", "exp", "expm1", "log", "log1p", "log2", "log10",
    "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "tan", "erf", "reciprocal", "erfc", "erfinv", "lgamma",
    "digamma", "frexp", "gcd", "lcm", "exp2", "sinc", "i0", "special.i0e", "special.i1", "special.i1e",
    "logaddexp", "logaddexp2", "signbit", "angle", "complex", "polar", "trace", "xlogy", "special.xlog1py", "special.entr", "nextafter", "fmax", "fmin", "frac", "logit", "nan_to_num", "hypot", "copysign", "heaviside",
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    # reductions
    "sum", "prod", "mean", "linalg.vector_norm", "amax", "amin", "max.reduction_no_dim", "max.reduction_with_dim",
    "min.reduction_no_dim", "min.reduction_with_dim", "argmax", "argmin", "all", "any", "histc", "bincount",
    "var", "var.unbiased", "std", "std.unbiased", "var_mean", "var_mean.unbiased", "std_mean", "std_mean.unbiased",
    "nansum", "nanmean", "count_nonzero", "aminmax", "cumsum", "cumprod", "renorm",
    # matrix products
    "mm", "bmm", "addmm", "addmm.decomposed", "baddbmm", "addbmm", "linalg.cross", "cross", "matmul", "mv", "dot", "vdot", "linalg.vecdot", "addmv",
    # shapes, indexing, factories
    "linspace", "linspace.tensor_overload", "logspace", "logspace.tensor_overload", "tril_indices", "triu_indices",
    "_upsample_bilinear2d_aa", "nn.functional.channel_shuffle", "nn.functional.max_unpool1d", "nn.functional.max_unpool2d", "nn.functional.max_unpool3d",
    "nn.functional.max_unpool1d.grad", "nn.functional.max_unpool2d.grad", "nn.functional.max_unpool3d.grad",
    "cat", "stack", "hstack", "vstack", "flip", "roll", "unfold", "index_select", "index_add", "index_copy", "gather", "take_along_dim",
    "scatter", "scatter_add", "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean",
    "scatter_reduce.amax", "scatter_reduce.amin", "index_reduce.prod", "index_reduce.mean", "index_reduce.amax",
    "index_reduce.amin", "index_fill", "__getitem__", "index_put", "nonzero", "argwhere", "repeat_interleave", "take", "put", "searchsorted", "bucketize",
    "masked_select", "masked_scatter", "combinations", "nonzero_static", "unique", "unique_consecutive", "fill", "zero_", "zeros", "ones", "full",
    "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "arange", "eye",
    "tril", "triu", "isposinf", "isneginf",
    # sorting and order statistics
    "isin", "sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin", "logcumsumexp",
    # linear algebra
    "einsum", "linalg.norm", "linalg.matrix_norm", "norm", "norm.fro", "linalg.cholesky", "linalg.cholesky_ex",
    "linalg.solve_triangular", "triangular_solve", "cholesky_solve", "cholesky_inverse",
    *(FACTORIZATIONS := [
        "linalg.lu_factor", "linalg.lu_factor_ex", "linalg.lu", "lu", "lu_unpack", "linalg.lu_solve", "lu_solve",
        "linalg.solve", "linalg.solve_ex", "linalg.inv", "linalg.inv_ex", "linalg.det", "linalg.slogdet", "logdet",
        "linalg.matrix_power", "linalg.tensorinv", "linalg.tensorsolve", "geqrf", "linalg.householder_product",
        "linalg.qr", "linalg.eigh", "linalg.eigvalsh", "linalg.svd", "linalg.svdvals", "linalg.pinv", "linalg.lstsq"]),
    "matrix_exp",
    "cdist", "nn.functional.pdist", "norm", "norm.fro", "norm.inf", "dist", "nn.functional.pairwise_distance",
    "nn.functional.triplet_margin_loss", "nn.functional.multi_margin_loss",
    # Fourier transforms (complex results)
    *(f"fft.{k}{n}" for k in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft") for n in ("", "2", "n")),
    "nn.functional.unfold", "nn.functional.embedding_bag", "nn.functional.embedding",
    "grid_sampler_2d", "nn.functional.grid_sample",
    # activations
    "nn.functional.mish", "nn.functional.glu", "nn.functional.prelu", "nn.functional.threshold",
    "nn.functional.hardshrink", "nn.functional.softshrink",
    # convolutions and norms
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d",
    "nn.functional.batch_norm", "native_batch_norm", "_native_batch_norm_legit",
    "nn.functional.layer_norm", "native_layer_norm", "nn.functional.group_norm", "native_group_norm",
    # attention (samples with dropout take PyTorch's math kernel)
    "nn.functional.scaled_dot_product_attention",
    # pooling, padding, interpolation
    "nn.functional.max_pool1d", "nn.functional.max_pool2d", "nn.functional.max_pool3d",
    "max_pool2d_with_indices_backward",
    "nn.functional.avg_pool1d", "nn.functional.avg_pool2d", "nn.functional.avg_pool3d",
    "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d", "nn.functional.adaptive_avg_pool3d",
    "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d", "nn.functional.adaptive_max_pool3d",
    "nn.functional.pad.constant", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
    "nn.functional.pad.replicate_negative", "nn.functional.pad.circular", "constant_pad_nd",
    "nn.functional.interpolate.nearest", "nn.functional.interpolate.nearest-exact",
    "nn.functional.interpolate.linear", "nn.functional.interpolate.bilinear", "nn.functional.interpolate.bicubic",
    "nn.functional.interpolate.trilinear", "nn.functional.interpolate.area",
    "nn.functional.upsample_nearest", "nn.functional.upsample_bilinear",
]

# (entry, check) -> CPU fallbacks that check accepts: (op names, why).
ALLOWED_FALLBACKS = {
    **{("linalg.lstsq", check): (("aten::linalg_lstsq.out",),
                                 "gelsd and gelss return residuals of a tall matrix only where every matrix has "
                                 "full rank, a shape the data decides; and empty inputs: CPU's kernel")
       for check in ("values", "out", "grad")},
    **{("matrix_exp", check): (("aten::linalg_matrix_exp",),
                               "half precisions run CPU's kernel, which reads its double coefficients as "
                               "halves (NaN for these samples); float32/float64 are lowered")
       for check in ("values", "grad")},
}

# Known bugs outside the lowerings, each failing at least one sample:
# (entry or view case, check) -> what is missing. Expected failures, strict
# in strict mode, so that a fix shows up (XPASS) to remove its entry.
KNOWN_GAPS = {
    ("gather", "errors"): "adapter: out= aliasing self gets the broadcast-shape error; CPU's gather raises its overlap error first",
    ("cat", "errors"): "adapter: cat(out=) must reject an out tensor that is one of the inputs",
    ("masked_select", "errors"): "adapter: out= aliasing an input gets the broadcast-shape error; CPU raises its overlap error first",
    **{(name, "out"): "PyTorch's out= path (r2c into out over some dims, then conj_physical in place) leaves "
                      "part of out unwritten on CPU too: CPU's own out= result differs from its functional one"
       for name in ("fft.ihfft2", "fft.ihfftn")},
    ("kthvalue", "errors"): "adapter: out= aliasing an input gets the broadcast-shape error; CPU raises its overlap error first",
    ("addbmm", "inplace"): "CPU's addbmm_ resizes a self smaller than the product to its shape; the adapter's "
                           "in-place write-back refuses it with TensorIterator's broadcast-shape error",
    ("take", "errors"): "adapter: out= aliasing an input gets the broadcast-shape error; CPU raises its overlap error first",
}

# Debug mode runs this many samples per (op, dtype), fused and strict at
# most MODE_SAMPLES each, SLOW_SAMPLES of the entries slow to compile, and
# out= and in-place forms WRITE_SAMPLES of a mode's (the adapter's write-back
# after the lowering test_values checks). `make conformance`: every sample in
# every mode.
DEBUG_SAMPLES = 1
MODE_SAMPLES = 2
SLOW_SAMPLES = 1
WRITE_SAMPLES = 1

# Entries whose programs take seconds each to compile (a strided slice or a
# gather per window offset; LU's step per column, XLA's QR and eigh
# expansions; unique_consecutive's sizes are measured by a program of their
# own per sample).
SLOW_TO_COMPILE = {name for name in OPS if "pool" in name or "interpolate" in name or "upsample" in name}
SLOW_TO_COMPILE |= {*FACTORIZATIONS, "unique_consecutive"}


def mark_known_gap(request, name, check):
    reason = KNOWN_GAPS.get((name, check))
    if reason:
        # A mode's share of the samples may miss the failing one; error
        # inputs and view cases run whole in every mode.
        strict = check in ("errors", "views")
        request.applymarker(pytest.mark.xfail(reason=reason, strict=strict))


def samples(name, dtype, mode, requires_grad=False):
    """The op's CPU samples one mode runs. A lowering is the same in every
    mode, so fused and strict split the samples (alternate ones of a seeded
    shuffle): together they run each sample once, at half the compilations.
    Gradients are fused mode's (strict mode compiles each backward op on its
    own, ~4x the time per sample): fused runs its count, strict the next one.
    Debug mode runs DEBUG_SAMPLES of strict's (it shares strict's compiled
    programs); the entries slow to compile run SLOW_SAMPLES. `make
    conformance` runs every sample in every mode."""
    found = compare.samples(name, dtype, None, requires_grad)
    random.Random(f"{name}.{dtype}").shuffle(found)
    per_mode = SLOW_SAMPLES if name in SLOW_TO_COMPILE else MODE_SAMPLES
    count = DEBUG_SAMPLES if mode == "debug" else per_mode
    if requires_grad:
        if mode == "fused":
            return found[:per_mode]
        return found[per_mode:per_mode + DEBUG_SAMPLES] or found[:DEBUG_SAMPLES]
    if len(found) > 1:
        found = found[0::2] if mode == "fused" else found[1::2]
    return found[:count]


def left_to_strict(mode, dtype, check):
    """Skips what a mode leaves to strict mode. Debug mode runs strict's
    programs (waited on and checked for NaNs): its values and gradients in
    float32, its out= and in-place forms not at all (the adapter's write-back
    is strict's). Fused mode's out= and in-place forms compile programs of
    their own while the write-back does not depend on the dtype: float32."""
    if mode == "debug" and check in ("out", "inplace"):
        pytest.skip(f"debug mode runs strict's {check} programs and write-back")
    if dtype != torch.float32 and (mode == "debug" or (mode == "fused" and check in ("out", "inplace"))):
        pytest.skip(f"{mode} mode runs {check} in float32 (strict mode runs every dtype)")


def assert_no_fallbacks(name, check):
    allowed = ALLOWED_FALLBACKS.get((name, check), ((), ""))[0]
    fallbacks = {op: n for op, n in torchtpu.metrics()["fallbacks"].items() if op not in allowed}
    assert not fallbacks, f"CPU fallbacks: {fallbacks}"


def run_on_tpu(name, check, fn, sample, **extra):
    """Calls fn on tpu and checks that nothing fell back to CPU."""
    torchtpu.reset_metrics()
    result = call(fn, sample, **extra)
    assert_no_fallbacks(name, check)
    return result


def expect_same(name, check, fn, sample):
    return compare.expect_same(name, fn, sample, on_tpu=lambda fn, s: run_on_tpu(name, check, fn, s))


def supported(op, dtype):
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{op.name} does not support {dtype} on CPU")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_out(request, name, dtype, mode):
    mark_known_gap(request, name, "out")
    left_to_strict(mode, dtype, "out")
    op = opinfo(name)
    if not op.supports_out:
        pytest.skip("no out= variant")
    supported(op, dtype)

    canonical = compare.CANONICAL.get(name, lambda result: result)

    def check(s):
        cpu = copy_sample(s, "cpu")
        try:
            expected = op(cpu.input, *cpu.args, **cpu.kwargs)
        except Exception:
            return  # test_values compares the error
        out = tree_map(lambda t: torch.empty_like(t, device="tpu"), expected)
        result = run_on_tpu(name, "out", op, copy_sample(s, "tpu"), out=out)
        assert all(r is o for r, o in zip(tree_leaves(result), tree_leaves(out)))
        assert_close(name, canonical(out), canonical(expected), lambda: call(op, to_float64(copy_sample(s, "cpu"))))

    for_each_sample(name, samples(name, dtype, mode)[:WRITE_SAMPLES], check)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_inplace(request, name, dtype, mode):
    mark_known_gap(request, name, "inplace")
    left_to_strict(mode, dtype, "inplace")
    op = opinfo(name)
    if op.inplace_variant is None:
        pytest.skip("no in-place variant")
    supported(op, dtype)

    def check(s):
        found = expect_same(name, "inplace", op.inplace_variant, s)
        if found is not None:
            (cpu_sample, tpu_sample), _ = found

            def reference():  # the float64 run's input, written in place
                exact = to_float64(copy_sample(s, "cpu"))
                call(op.inplace_variant, exact)
                return exact.input

            assert_close(name, tpu_sample.input, cpu_sample.input, reference)

    for_each_sample(name, samples(name, dtype, mode)[:WRITE_SAMPLES], check)


@pytest.mark.parametrize("name", OPS)
def test_errors(request, name, mode):
    """OpInfo's invalid inputs raise CPU's exception and message."""
    mark_known_gap(request, name, "errors")
    op = opinfo(name)
    if op.error_inputs_func is None:
        pytest.skip("no error inputs")
    for e in op.error_inputs("cpu"):
        s = e.sample_input
        try:
            call(op, copy_sample(s, "cpu"))
        except Exception as cpu_error:
            expect_same_error(cpu_error, call, op, copy_sample(s, "tpu"))


@pytest.mark.parametrize("name", OPS)
def test_grad(request, name, mode):
    mark_known_gap(request, name, "grad")
    op = opinfo(name)
    if not op.supports_autograd or torch.float32 not in op.supported_backward_dtypes("cpu"):
        pytest.skip("no autograd")

    def check(s):
        expected = grads(op, copy_sample(s, "cpu"))
        torchtpu.reset_metrics()
        actual = grads(op, copy_sample(s, "tpu"))
        assert_no_fallbacks(name, "grad")
        assert_close(name, actual, expected)

    for_each_sample(name, samples(name, torch.float32, mode, requires_grad=True), check)


# Strided views as operands, and in-place ops writing through views into
# their base. Each case maps a base tensor to a result; the case runs on a
# CPU base and a tpu copy of it, and results and bases must agree.
VIEW_CASES = {
    "transposed": lambda x: x.t() * 2 + x.t().exp(),
    "sliced_step": lambda x: x[::2, 1::3] - x[1::2, ::3],
    "offset": lambda x: x[2:, 3:].sum(0),
    "expanded": lambda x: x[0].expand(4, 6, 8) + x,
    "diagonal": lambda x: x.diagonal() + x[:, 2:].diagonal(),
    "transposed_mm": lambda x: x.t() @ x[:, :6],
    "noncontiguous_reduce": lambda x: x.t()[1::2].amax(1),
    "noncontiguous_cat": lambda x: torch.cat([x.t(), x[::2].t()], 1),
    "noncontiguous_where": lambda x: torch.where(x[:, ::2] > 0, x[:, ::2], x[:, 1::2]),
    "index_select_view": lambda x: x.t().index_select(1, torch.tensor([0, 5, 2], device=x.device)),
    "contiguous": lambda x: x.t()[::3].contiguous(),
    "bitcast_int32": lambda x: x.view(torch.int32) & 0x7FFFFF,
    "bitcast_slice": lambda x: x[1:3].view(torch.int32).t() >> 3,
    "bitcast_bfloat16": lambda x: x.view(torch.bfloat16)[:, 1::2] * 3,
    "bitcast_write": lambda x: x.view(torch.int32)[:, 0].bitwise_xor_(1 << 31),
    "column_add_": lambda x: x[:, 1].add_(1),
    "transposed_mul_": lambda x: x.t().mul_(2),
    "step_zero_": lambda x: x[::2].zero_(),
    "offset_copy_": lambda x: x[1:3, 2:5].copy_(x[::3, 5:]),
    "copy_broadcast_": lambda x: x[1:3, 2:5].copy_(x[5, :3]),
    "copy_shape_mismatch": lambda x: x[1:3, 2:5].copy_(x[4:, :2]),
    "diagonal_fill_": lambda x: x.diagonal().fill_(5),
    "flat_step_neg_": lambda x: x.view(-1)[::3].neg_(),
    "unsqueezed_clamp_": lambda x: x.unsqueeze(0)[:, 1:4].clamp_(-0.5, 0.5),
    "out_into_view": lambda x: torch.add(x[0], x[1], out=x[2]),
    "expanded_write_": lambda x: x[0].expand(3, 8).add_(1),
    "unfold_windows": lambda x: x.unfold(1, 3, 2).sum(-1) + x.unfold(0, 2, 2).amax(-1)[:, :3].repeat(2, 1),
    "unfold_write_": lambda x: x.unfold(1, 4, 2)[:, 1].mul_(3),
}


@pytest.mark.parametrize("case", VIEW_CASES)
def test_views(request, case, mode):
    mark_known_gap(request, case, "views")
    fn = VIEW_CASES[case]
    base = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    cpu, tpu = base.clone(), base.to("tpu")
    try:
        expected = fn(cpu)
    except Exception as e:
        with pytest.raises(type(e), match=re.escape(str(e).split("\n")[0])):
            synced(fn, tpu)
        return
    torchtpu.reset_metrics()
    actual = fn(tpu)
    assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True)
    torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True)


LAYOUT_CASES = {
    "relu": lambda x, y: x.relu(),
    "add_broadcast": lambda x, y: x + y,
    "broadcast_first": lambda x, y: y * x,
    "scalar": lambda x, y: x * 2 + 1,
    "where": lambda x, y: torch.where(x > 0, x, y),
    "gelu_backward": lambda x, y: torch.ops.aten.gelu_backward(x, x.sigmoid()),
    "inplace": lambda x, y: x.clone().add_(y).sigmoid_(),
    "mixed": lambda x, y: x + x.contiguous(),
}


@pytest.mark.one_mode
@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_elementwise_results_keep_their_operands_layout(case, layout, mode):
    """An elementwise result is laid out as TensorIterator lays it out on CPU
    and CUDA: a channels-last or transposed operand keeps its order."""
    g = torch.Generator().manual_seed(0)
    if layout == "channels_last":
        x, y = torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last), torch.randn(5, generator=g)
    else:
        x, y = torch.randn(5, 6, generator=g).t(), torch.randn(1, 5, generator=g)
    expected = LAYOUT_CASES[case](x, y)
    torchtpu.reset_metrics()
    actual = LAYOUT_CASES[case](x.to("tpu"), y.to("tpu"))
    assert torchtpu.metrics()["fallbacks"] == {}
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)
    assert actual.cpu().stride() == expected.stride()


def test_lu_of_a_larger_order_as_on_cpu():
    """LU runs as loops over blocks of columns and the columns left inside
    the program (its size does not grow with the order: `lower/factor.rs`'s
    test), so a solve, an inverse and a determinant of order 90 compile in
    under a second (unrolled, order 64 took XLA:CPU 11 s and order 256
    nearly 3 minutes)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 90, 90, generator=g, dtype=torch.float64), torch.randn(2, 90, 4, generator=g, dtype=torch.float64)
    torchtpu.reset_metrics()
    x, inv, (sign, logdet) = (torch.linalg.solve(a.to("tpu"), b.to("tpu")), torch.linalg.inv(a.to("tpu")),
                              torch.linalg.slogdet(a.to("tpu")))
    torch.testing.assert_close(x.cpu(), torch.linalg.solve(a, b))
    torch.testing.assert_close(inv.cpu(), torch.linalg.inv(a))
    torch.testing.assert_close((sign.cpu(), logdet.cpu()), tuple(torch.linalg.slogdet(a)))
    assert torchtpu.metrics()["fallbacks"] == {}


@pytest.mark.one_mode
def test_matrix_exp_of_every_norm_as_on_cpu(mode):
    """One batch whose 1-norms pick each of CPU's forms (Taylor degrees 1, 2,
    4, 8, 12, and 18 scaled and squared up to 7 times), values and gradients
    in float64; and the orthogonal parametrization, whose default map is the
    exponential, trains as on CPU."""
    torchtpu.reset_metrics()
    g = torch.Generator().manual_seed(0)
    scales = [1e-17, 1e-9, 1e-5, 0.02, 0.2, 0.8, 3.0, 200.0]
    a = torch.stack([torch.randn(4, 4, generator=g, dtype=torch.float64) * s / 4 for s in scales])
    x = a.clone().requires_grad_()
    expected = torch.linalg.matrix_exp(x)
    cotangent = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    (expected_grad,) = torch.autograd.grad(expected, x, cotangent)
    xt = a.to("tpu").requires_grad_()
    actual = torch.linalg.matrix_exp(xt)
    (grad,) = torch.autograd.grad(actual, xt, cotangent.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad.cpu(), expected_grad, rtol=1e-11, atol=1e-11)

    from torch.nn.utils.parametrizations import orthogonal
    torch.manual_seed(0)
    layer = orthogonal(torch.nn.Linear(6, 6))
    losses = {}
    for device in ("cpu", "tpu"):
        net = copy.deepcopy(layer).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        inputs = torch.randn(3, 8, 6, generator=torch.Generator().manual_seed(1))
        losses[device] = []
        for batch in inputs:
            loss = (net(batch.to(device)) - 1).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[device].append(loss.item())
    torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-5, atol=1e-6)
    assert torchtpu.metrics()["fallbacks"] == {}


@pytest.mark.one_mode
def test_svd_and_eigh_in_float64_as_on_cpu(mode):
    """float64 SVDs (QDWH and eigh) and eigendecompositions as exact as
    LAPACK's: XLA's Jacobi eigh alone left float64 vectors ~1e-8 off. Tall,
    wide, full and reduced, rank-deficient and zero matrices (whose vectors
    are the identity, as LAPACK's), singular values only; the solutions
    built on them; and CPU's errors."""
    torchtpu.reset_metrics()
    g = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(2, 6, 6, generator=g, dtype=torch.float64)).Q
    deficient = (q[0] * torch.tensor([3.0, 2, 1, 1e-3, 0, 0], dtype=torch.float64)) @ q[1].mT
    for a in (torch.randn(3, 7, 4, generator=g, dtype=torch.float64), torch.randn(4, 9, generator=g, dtype=torch.float64),
              deficient, torch.zeros(2, 3, 3, dtype=torch.float64)):
        for full in (False, True):
            u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=full)
            u, s, vh = u.cpu(), s.cpu(), vh.cpu()
            k = s.shape[-1]
            torch.testing.assert_close(s, torch.linalg.svdvals(a), rtol=1e-13, atol=1e-13)
            torch.testing.assert_close((u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :], a, rtol=1e-13, atol=1e-13)
            for gram in (u.mT @ u, vh @ vh.mT):  # orthonormal columns of U, rows of Vh
                eye = torch.eye(gram.shape[-1], dtype=gram.dtype)
                torch.testing.assert_close(gram, eye.expand_as(gram), rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(torch.linalg.pinv(a.to("tpu")).cpu(), torch.linalg.pinv(a), rtol=1e-10, atol=1e-10)
        assert torch.equal(torch.linalg.matrix_rank(a.to("tpu")).cpu(), torch.linalg.matrix_rank(a))
    zero = torch.linalg.svd(torch.zeros(3, 2, device="tpu", dtype=torch.float64))
    for actual, expected in zip(zero, torch.linalg.svd(torch.zeros(3, 2, dtype=torch.float64))):
        assert torch.equal(actual.cpu(), expected)
    h = deficient + deficient.mT
    w, v = torch.linalg.eigh(h.to("tpu"))
    torch.testing.assert_close(w.cpu(), torch.linalg.eigvalsh(h), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(((v * w.unsqueeze(-2)) @ v.mT).cpu(), h, rtol=1e-13, atol=1e-13)
    assert torchtpu.metrics()["fallbacks"] == {}
    # Past order 64 XLA's Jacobi sweeps cost more than LAPACK on the host: counted fallbacks.
    big = torch.randn(80, 70, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.linalg.svdvals(big.to("tpu")).cpu(), torch.linalg.svdvals(big))
    torch.testing.assert_close(torch.linalg.eigvalsh(big[:70].to("tpu")).cpu(), torch.linalg.eigvalsh(big[:70]))
    assert sorted(torchtpu.metrics()["fallbacks"]) == ["aten::_linalg_eigh.eigenvalues", "aten::_linalg_svd.U"]

    with pytest.raises(torch.linalg.LinAlgError, match="input matrix contained non-finite values"):
        torch.linalg.svdvals(torch.full((3, 3), float("nan"), device="tpu"))
        torch.tpu.synchronize()
    batch = torch.stack([torch.eye(3), torch.full((3, 3), float("inf"))])
    assert torch.linalg.svdvals(batch.to("tpu")).cpu()[1].isnan().all()  # as CPU: a batch is not checked
    # CUDA's drivers (CPU refuses any): the same decomposition.
    torch.testing.assert_close(torch.linalg.svdvals(q[0].to("tpu"), driver="gesvdj").cpu(), torch.ones(6, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="unknown svd driver qr"):
        torch.linalg.svd(q[0].to("tpu"), driver="qr")


@pytest.mark.one_mode
def test_lstsq_drivers_as_on_cpu(mode):
    """Each driver's solution (least norm where the rank is short) and the
    outputs CPU gives it: rank but for gels, singular values for gelsd and
    gelss, residuals for gels of a tall matrix; broadcast batches and
    vectors; the gradient. gelsd's residuals of a tall matrix exist only at
    full rank: a counted fallback."""
    g = torch.Generator().manual_seed(0)
    tall = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    deficient = torch.randn(6, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 4, generator=g, dtype=torch.float64)
    cases = [(tall, torch.randn(1, 6, 2, generator=g, dtype=torch.float64), None),
             (tall, torch.randn(2, 6, generator=g, dtype=torch.float64), "gels"),
             (tall.mT, torch.randn(1, 4, 3, generator=g, dtype=torch.float64), "gels"),
             (deficient, torch.randn(6, 2, generator=g, dtype=torch.float64), "gelsy"),
             (deficient.mT, torch.randn(4, 2, generator=g, dtype=torch.float64), "gelsd")]
    torchtpu.reset_metrics()
    for a, b, driver in cases:
        expected = torch.linalg.lstsq(a, b, driver=driver)
        actual = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver)
        for x, y in zip(actual, expected):
            torch.testing.assert_close(x.cpu(), y, rtol=1e-10, atol=1e-10)
    assert torchtpu.metrics()["fallbacks"] == {}
    a, b = tall[0], cases[0][1][0]
    x = a.clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch.linalg.lstsq(x, b).solution.sum(), x)
    xt = a.to("tpu").requires_grad_()
    (actual,) = torch.autograd.grad(torch.linalg.lstsq(xt, b.to("tpu")).solution.sum(), xt)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-10, atol=1e-10)
    assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver="gelsd").residuals.cpu(),
                               torch.linalg.lstsq(a, b, driver="gelsd").residuals)
    assert torchtpu.metrics()["fallbacks"] == {"aten::linalg_lstsq.out": 1}


@pytest.mark.one_mode
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_names_the_first_leading_minor_that_fails(upper, mode):
    """`cholesky_ex`'s info and `cholesky`'s error name the first leading
    minor that is not positive-definite, as CPU's LAPACK does (XLA's factor
    is NaN throughout when it fails), reading one triangle only."""
    g = torch.Generator().manual_seed(0)

    def failing_at(n, k):
        q = torch.randn(n, n, generator=g, dtype=torch.float64)
        a = q @ q.T + n * torch.eye(n, dtype=torch.float64)
        a[k - 1:, k - 1:] -= 100 * torch.eye(n - k + 1, dtype=torch.float64)
        # What LAPACK does not read may hold anything.
        return a + (torch.tril if upper else torch.triu)(torch.randn(n, n, generator=g, dtype=torch.float64), 1) * 50

    good = failing_at(4, 4)
    good = good @ good.mT
    torchtpu.reset_metrics()
    for a in (failing_at(4, 3), failing_at(6, 6), failing_at(5, 1), torch.stack([failing_at(4, 2), good, failing_at(4, 4)])):
        factor, info = torch.linalg.cholesky_ex(a, upper=upper)
        actual, actual_info = torch.linalg.cholesky_ex(a.to("tpu"), upper=upper)
        assert actual_info.cpu().tolist() == info.tolist()
        torch.testing.assert_close(actual.cpu()[info == 0], factor[info == 0])
        with pytest.raises(torch.linalg.LinAlgError) as cpu:
            torch.linalg.cholesky(a, upper=upper)
        expect_same_error(cpu.value, lambda t: torch.linalg.cholesky(t, upper=upper), a.to("tpu"))
    assert torchtpu.metrics()["fallbacks"] == {}
