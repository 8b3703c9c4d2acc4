"""Comparison of an op on tpu with the same op on CPU, shared by
tests/test_ops.py (lowered ops, every check) and the OpInfo conformance
sweep (every op_db entry: values, shapes, dtypes and gradients).

Samples come from PyTorch's OpInfo database: each sample is built on CPU,
copied to tpu, and both copies run the op; results must agree (with the
tolerances of `tolerance`) or both must raise the same exception.
"""
import random
import re

import torch
import torch.testing._internal.common_utils as common_utils
import torch.testing._internal.opinfo.core as opinfo_core
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import DecorateInfo
from torch.utils._pytree import tree_leaves, tree_map

from conftest import synced, to_cpu
from conformance.exclusions import excluded_sample

# The dtypes samples are built in: the two floating types every model uses,
# and the integer and bool types (an op runs those among them CPU supports).
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]

# `sample_inputs` looks for a unittest.TestCase on the call stack (to name it
# in its reproducer hints) with inspect.stack(), which reads every frame's
# source: ~0.1 s a call under pytest. These tests are no TestCases; it would
# find None every time.
common_utils.extract_test_fn = opinfo_core.extract_test_fn = lambda: None


def _seed_cpu(seed=None):
    """`set_rng_seed`, which the sample iterator calls before each sample,
    for the generators samples are built with. torch.manual_seed also seeds
    CUDA, XPU and MTIA, and each of those not initialised queues the call
    with a formatted stack trace: ~1.5 ms a sample under pytest (a third of
    a test_ops subset's time) and a queue that never drains."""
    seed = common_utils.SEED if seed is None else seed
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    if common_utils.TEST_NUMPY:
        import numpy

        numpy.random.seed(seed)


common_utils.set_rng_seed = _seed_cpu

BY_NAME = {op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op for op in op_db}


def opinfo(name):
    return BY_NAME[name]


# entry -> {dtype: assert_close tolerances} where CPU's accumulation order
# cannot be reproduced; they win over OpInfo's own (`tolerance`).
CONV_FLOAT32 = dict(atol=1e-4, rtol=3e-5)
# CPU's bfloat16 transposed convolutions round partial sums to bfloat16;
# tpu sums in float32 and rounds once (about half CPU's error against a
# float32 reference). The two differ by under 1% of the output's largest
# magnitude (up to ~900 in the samples).
CONV_TRANSPOSE_BFLOAT16 = dict(atol=4.0, rtol=0.02)
# CPU's bfloat16 batch norm saves an invstd one bfloat16 ulp off the
# correctly rounded value in some samples (0.2236 for float32's 0.2242, where
# tpu gives 0.2246); outputs then differ by up to 2^-7 relative.
BATCH_NORM_BFLOAT16 = dict(atol=0.07, rtol=0.016)
TOLERANCES = {
    # Batched products of large-magnitude samples cancel in long sums.
    "matmul": {torch.float32: dict(atol=1e-4, rtol=1.3e-6)},
    # Gradients that sum products in another order: cancellation, as matmul.
    "kron": {torch.float32: dict(atol=1e-4, rtol=1.3e-6)},
    # Broadcast gradients reduced over the broadcast dimensions: fused, XLA
    # sums in another order (addcdiv: 3.6e-5 on a sum of 25 products of ~18).
    "addcdiv": {torch.float32: dict(atol=1e-4, rtol=1.3e-6)},
    # XLA's blocked Householder product accumulates in another order than
    # LAPACK's orgqr; its gradient formula cancels (up to ~2e-5 relative).
    "linalg.householder_product": {torch.float32: dict(atol=1e-4, rtol=5e-5)},
    # XLA's Jacobi eigh stops at an off-diagonal norm of 1e-6 relative and
    # LAPACK's tridiagonal QR at its own; eigenvectors agree to ~1e-6, and
    # the gradient divides their difference by eigenvalue gaps (pinv's
    # hermitian path is eigh's).
    **{name: {torch.float32: dict(atol=1e-4, rtol=5e-4)} for name in ("linalg.eigh", "linalg.pinv.hermitian")},
    # SVD's gradient divides by gaps between squared singular values: CPU's
    # own float32 gradient is up to 1.2e-5 (of its largest element) from a
    # float64 computation, tpu's 3.3e-6. CPU's singular values with vectors
    # (under autograd: cond's σ₁/σₙ) are 1.6e-6 off, tpu's 1e-7. lstsq's
    # gradient goes through pinv's SVD: both devices' float32 gradients are
    # ~1.3e-6 (of their largest element) from float64's, 1.3e-5 apart.
    **{name: {torch.float32: dict(atol=1e-4, rtol=5e-5)}
       for name in ("linalg.svd", "svd", "linalg.cond", "linalg.lstsq", "linalg.lstsq.grad_oriented")},
    # XLA's FFT (DUCC) and PyTorch's pocketfft factor non-power-of-two sizes
    # differently: multi-dimensional transforms (and stft's gradient, summed
    # over overlapping frames) differ by up to ~2e-5.
    **{name: {torch.float32: dict(atol=1e-4, rtol=3e-5)}
       for name in ["stft", *(f"fft.{k}{n}" for k in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
                              for n in ("", "2", "n"))]},
    # cdist's matrix-product path (p=2) computes |x1|² + |x2|² - 2 x1·x2,
    # which cancels for near points; its gradient divides by the result.
    "cdist": {torch.float32: dict(atol=1e-4, rtol=1.3e-6)},
    # Bicubic sampling's grid gradient sums 16 taps' products over channels
    # in another order than CPU's kernel.
    **{name: {torch.float32: dict(atol=1e-4, rtol=1.3e-6)} for name in ("grid_sampler_2d", "nn.functional.grid_sample")},
    # Fused programs let XLA evaluate x**(y-1) in the gradient as one fused
    # exp/log: a few ulp off on values near 1e5; likewise asin's gradient
    # 1/sqrt(1-x^2), ill-conditioned near |x| = 1.
    "pow": {torch.float32: dict(atol=1e-5, rtol=5e-6)},
    "asin": {torch.float32: dict(atol=1e-4, rtol=5e-6)},
    # XLA's blocked triangular solve sums in another order than LAPACK's trsm.
    "triangular_solve": {torch.float32: dict(atol=1e-4, rtol=2e-6)},
    # The gradient's formula cancels nearly equal exponential sums: CPU's
    # float32 result is itself ~1e-3 off a float64 computation there.
    "logcumsumexp": {torch.float32: dict(atol=1e-2, rtol=5e-3)},
    # CTC's gradient `exp(lp) - exp(log-sum + nll - lp)` cancels after 50 steps
    # of log-sums near -100: CPU's float32 gradient is itself 2-3e-5 from a
    # float64 computation, tpu's as far, elsewhere.
    "nn.functional.ctc_loss": {torch.float32: dict(atol=1e-4, rtol=1.3e-6)},
    # OpInfo's matrices (entries up to 9) have exponentials up to ~1e5: the
    # scaled polynomial is squared 4-5 times, and CPU's own float32 value and
    # gradient are up to 5e-2 from a float64 computation (tpu's likewise).
    **{name: {torch.float32: dict(atol=5e-2, rtol=1e-4)} for name in ("matrix_exp", "linalg.matrix_exp")},
    # Gradients that cancel in float32, found by the full float32 sweep (not
    # at CI's or LIMIT=8's samples): cov's weighted-mean correction (up to 7
    # ulp of values near 18) and masked cumprod's division by running
    # products (2 ulp near 1500; 1.5e-5 on values near 0.5); attention's
    # gradient (1e-5 of its largest element: 1.2e-4 where gradients reach 11,
    # as CPU's own math kernel differs from its flash kernel by 1e-5).
    "cov": {torch.float32: dict(atol=5e-5, rtol=1.3e-6)},
    "masked.cumprod": {torch.float32: dict(atol=5e-5, rtol=1.3e-6)},
    "nn.functional.scaled_dot_product_attention": {torch.float32: dict(atol=2e-4, rtol=2e-5)},
    # Convolutions of large-magnitude samples sum in another order than CPU's kernels.
    **{f"nn.functional.conv{d}d": {torch.float32: CONV_FLOAT32} for d in (1, 2, 3)},
    **{f"nn.functional.conv_transpose{d}d": {torch.float32: CONV_FLOAT32, torch.bfloat16: CONV_TRANSPOSE_BFLOAT16}
       for d in (1, 2, 3)},
    **{name: {torch.bfloat16: BATCH_NORM_BFLOAT16}
       for name in ("nn.functional.batch_norm", "native_batch_norm", "_native_batch_norm_legit")},
}


def opinfo_tolerance(op, dtype):
    """The loosest tolerance PyTorch's own OpInfo tests give `op` for `dtype`
    (its `toleranceOverride`s and `precisionOverride`s, on all tests or on
    TestCommon's, which holds test_compare_cpu), never below assert_close's
    defaults; {} when there is none."""
    overrides = []
    for info in op.decorators:
        if isinstance(info, DecorateInfo):
            if info.cls_name in (None, "TestCommon"):
                overrides += info.decorators
        else:
            overrides.append(info)
    rtol, atol = torch.testing._comparison.default_tolerances(dtype)
    found = False
    for d in overrides:
        if isinstance(d, (toleranceOverride, precisionOverride)) and dtype in d.d:
            found = True
            # precisionOverride gives an absolute tolerance alone.
            t = d.d[dtype]
            atol = max(atol, t.atol if isinstance(d, toleranceOverride) else t)
            rtol = max(rtol, t.rtol if isinstance(d, toleranceOverride) else rtol)
    return dict(atol=atol, rtol=rtol) if found else {}


def tolerance(name, dtype):
    """assert_close's tolerances for `name`'s results of `dtype` (None: no
    tensor results)."""
    if dtype is None:
        return {}
    if dtype in TOLERANCES.get(name, {}):
        return TOLERANCES[name][dtype]
    return opinfo_tolerance(opinfo(name), dtype)


def samples(name, dtype, limit=None, requires_grad=False):
    """The op's CPU samples but those exclusions.py leaves out; a fixed,
    seeded subset of `limit` of them if given."""
    op = opinfo(name)
    found = [s for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
             if not excluded_sample(name, s)]
    if limit is not None and len(found) > limit:
        found = random.Random(f"{op.name}.{op.variant_test_name}.{dtype}").sample(found, limit)
    return found


# Entries whose OpInfo samples build their `args` tensors on CPU whatever the
# device (the op reads them on the host, as on CUDA): they stay on CPU.
HOST_ARGS = {"tensor_split"}


def copy_sample(sample, device, name=None):
    """A copy of `sample` on `device` (factories' `device=` included, the
    host tensors of HOST_ARGS entries left on CPU); a tensor used twice
    stays one tensor."""
    host = {id(t) for t in tree_leaves(sample.args)} if name in HOST_ARGS else set()
    memo = {}

    def move(t):
        if not isinstance(t, torch.Tensor) or id(t) in host:
            return t
        if id(t) not in memo:
            memo[id(t)] = t.detach().to(device, copy=True).requires_grad_(t.requires_grad)
        return memo[id(t)]

    copy = sample.transform(move)
    if "device" in copy.kwargs:
        copy.kwargs["device"] = device
    return copy


def eigenvector_signs(result):
    """eigh's results with each eigenvector (defined up to sign: LAPACK and
    XLA's Jacobi algorithm pick differently) scaled so that its component of
    largest magnitude is positive."""
    values, vectors = result
    if vectors.numel() == 0:
        return values, vectors
    largest = vectors.gather(-2, vectors.abs().argmax(-2, keepdim=True))
    return values, vectors * largest.sign()


def singular_vector_signs(result, vh=True):
    """An SVD's results with each pair of singular vectors (defined up to a
    common sign) signed so that the left one's component of largest
    magnitude is positive, and the columns of a full U or V past min(m, n)
    (any orthonormal completion) as the projection onto them."""
    u, s, v = result
    if s.numel() == 0:
        return result
    k = s.shape[-1]
    v = v.mH if vh else v
    uk, vk = u[..., :k], v[..., :k]
    largest = uk.gather(-2, uk.abs().argmax(-2, keepdim=True)).sign()
    uk, vk = uk * largest, vk * largest
    rest = [w[..., k:] @ w[..., k:].mH for w in (u, v) if w.shape[-1] > k]
    return (uk, s, vk.mH if vh else vk, *rest)


# Entries whose results are unique only up to a choice each backend makes its
# own way: both devices' results are put in one form before they are compared
# and before gradients are taken (so that cotangents meet the same outputs).
CANONICAL = {"linalg.eigh": eigenvector_signs, "linalg.svd": singular_vector_signs,
             "svd": lambda result: singular_vector_signs(result, vh=False)}


def call(fn, sample, **extra):
    result = fn(sample.input, *sample.args, **sample.kwargs, **extra)
    canonical = None if extra else CANONICAL.get(getattr(fn, "name", None))
    return canonical(result) if canonical else result


LOW_PRECISION = (torch.bfloat16, torch.float16)


def to_float64(sample):
    """`sample` with its bfloat16/float16 tensors in float64: a reference run."""
    def up(t):
        if isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION:
            return t.detach().double().requires_grad_(t.requires_grad)
        return t

    return sample.transform(up)


def closer_than_cpu(actual, expected, reference):
    """PyTorch's test_decomp rule for low-precision results: against a
    float64 run of the same sample, tpu's largest error is at most CPU's
    (+1e-7); everything else (integers, NaNs, infinities) as on CPU."""
    leaves = [tree_leaves(x) for x in (to_cpu(actual), expected, reference)]
    if len({len(x) for x in leaves}) != 1:
        return False
    for a, e, r in zip(*leaves):
        if not isinstance(e, torch.Tensor) or not e.is_floating_point():
            if not same(a, e):
                return False
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype or r.shape != e.shape:
            return False
        a, e, r = a.double(), e.double(), r.double()
        finite = e.isfinite()
        if not same(a[~finite], e[~finite]) or not a[finite].isfinite().all():
            return False
        compared = finite & r.isfinite()
        if compared.any() and (a - r)[compared].abs().max() > (e - r)[compared].abs().max() + 1e-7:
            return False
    return True


def same(a, e):
    try:
        torch.testing.assert_close(a, e, equal_nan=True, atol=0, rtol=0)
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def assert_close(name, actual, expected, reference=None):
    """Values, shapes and dtypes as on CPU. A low-precision result outside
    the tolerance passes if `reference()`, the float64 result, shows it
    is no farther from the exact value than CPU's (`closer_than_cpu`)."""
    dtype = next((t.dtype for t in tree_leaves(expected) if isinstance(t, torch.Tensor)), None)
    try:
        torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True, **tolerance(name, dtype))
    except AssertionError:
        if reference is None or dtype not in LOW_PRECISION or not closer_than_cpu(actual, expected, reference()):
            raise


def expect_same_error(error, fn, *args):
    """fn(*args) raises `error`'s type with its message (first line)."""
    first_line = str(error).split("\n")[0]
    try:
        synced(fn, *args)
    except type(error) as e:
        assert re.search(re.escape(first_line), str(e)), f"CPU raised {first_line!r}, tpu {str(e)!r}"
        return
    except Exception as e:
        raise AssertionError(f"CPU raised {type(error).__name__}({first_line!r}), tpu {type(e).__name__}({e})")
    raise AssertionError(f"CPU raised {type(error).__name__}({first_line!r}), tpu did not raise")


# Entries and dtypes CPU rejects but CUDA accepts: tpu follows CUDA, as the
# libraries that treat every accelerator like CUDA expect (histc of integers:
# transformers' MoE routing). The call must succeed; test_accelerator.py
# checks the values against CUDA's formula.
CUDA_DTYPES = {"histc": (torch.int64,), "trace": (torch.bool,), "abs": (torch.bool,),
               "nn.functional.softsign": (torch.bool,),
               "_upsample_bilinear2d_aa": (torch.bfloat16, torch.float16),
               "nn.functional.multi_margin_loss": (torch.bfloat16, torch.float16),
               "nn.functional.avg_pool3d": (torch.bfloat16, torch.float16)}


def expect_same(name, fn, sample, on_tpu=call):
    """Runs fn on the CPU sample and on its tpu copy (through `on_tpu`); they
    must agree in results, or raise the same exception. Returns the (cpu,
    tpu) samples as fn left them and the (cpu, tpu) results, or None when
    both raised."""
    cpu_sample, tpu_sample = copy_sample(sample, "cpu", name), copy_sample(sample, "tpu", name)
    try:
        expected = call(fn, cpu_sample)
    except Exception as e:
        if getattr(sample.input, "dtype", None) in CUDA_DTYPES.get(name, ()):
            on_tpu(fn, tpu_sample)
        else:
            expect_same_error(e, call, fn, tpu_sample)
        return None
    actual = on_tpu(fn, tpu_sample)
    assert_close(name, actual, expected, lambda: call(fn, to_float64(copy_sample(sample, "cpu", name))))
    return (cpu_sample, tpu_sample), (expected, actual)


def grads(op, sample, result=None, cotangent_dtype=None):
    """Gradients of the op's outputs (`result` of calling it on `sample`, or
    a fresh call) against fixed random cotangents (drawn in `cotangent_dtype`
    if given, else each output's), with respect to the sample's tensors that
    require grad; None if there are none."""
    inputs = [t for t in tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    result = call(op, sample) if result is None else result
    outputs = [t for t in tree_leaves(sample.output_process_fn_grad(result))
               if isinstance(t, torch.Tensor) and t.requires_grad]
    if not inputs or not outputs:
        return None
    gen = torch.Generator().manual_seed(0)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=cotangent_dtype or t.dtype).to(t.device, t.dtype)
                  for t in outputs]
    found = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(found, inputs)]


def describe(sample):
    return repr(tree_map(lambda t: (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else t,
                         (sample.input, sample.args, sample.kwargs)))


def for_each_sample(name, samples_, check):
    """Runs check(sample) on each sample, naming the sample on failure."""
    for s in samples_:
        try:
            check(s)
        except AssertionError as e:
            raise AssertionError(f"{name} sample {describe(s)}: {e}") from None
