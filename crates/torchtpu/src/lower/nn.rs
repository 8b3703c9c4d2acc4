//! Neural-network operators: activations, softmax, losses, dropout and
//! embedding, with the backward operators autograd calls.
//!
//! Formulas follow PyTorch's CPU kernels, computed in the opmath type
//! (float16/bfloat16 in float32, rounded once). Scalar arguments (slopes,
//! `alpha`, `beta`, `p`, ...) are runtime operands.
use super::distance::Norm;
use super::elementwise::{finish, float_only, full_like, not_implemented, promoted, round_to};
use super::index::checked_indices;
use super::random::uniform01;
use super::{op, op_consts, op_writes, wrap_dim, Cx, Entry};
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};
use crate::lower::args::Tensor;

/// Activations and their gradients: elementwise, their results laid out as
/// their operands ([`super::result_layout`]).
pub static ACTIVATIONS: &[Entry] = &[
    op("relu", relu),
    op("threshold_backward", threshold_backward),
    op("gelu", gelu),
    op("gelu_backward", gelu_backward),
    op("silu", silu),
    op("silu_backward", silu_backward),
    op("leaky_relu", leaky_relu),
    op_writes("rrelu_with_noise", rrelu_with_noise, &["noise"]).ruled(rrelu_rules),
    op("leaky_relu_backward", leaky_relu_backward),
    op("elu", elu),
    op("elu_backward", elu_backward),
    op("hardtanh", hardtanh),
    op("hardtanh_backward", hardtanh_backward),
    op("hardsigmoid", hardsigmoid),
    op("hardsigmoid_backward", hardsigmoid_backward),
    op("hardswish", hardswish),
    op("hardswish_backward", hardswish_backward),
    op("softplus", softplus),
    op("softplus_backward", softplus_backward),
    op("mish", mish),
    op("mish_backward", mish_backward),
    op("threshold", threshold),
    op("hardshrink", hardshrink),
    op("hardshrink_backward", |cx| shrink_backward(cx, "grad_out")),
    op_consts("softshrink", softshrink, &["lambd"]),
    op("softshrink_backward", |cx| shrink_backward(cx, "grad_output")),
    op("_prelu_kernel", prelu),
    op("_prelu_kernel_backward", prelu_backward),
];

pub static ENTRIES: &[Entry] = &[
    op("_softmax", |cx| softmax(cx, false)),
    op("_log_softmax", |cx| softmax(cx, true)),
    op("_softmax_backward_data", |cx| softmax_backward(cx, false)),
    op("_log_softmax_backward_data", |cx| softmax_backward(cx, true)),
    op("nll_loss_forward", |cx| nll_loss_forward(cx, false)),
    op("nll_loss2d_forward", |cx| nll_loss_forward(cx, true)),
    op("nll_loss_backward", |cx| nll_loss_backward(cx, false)),
    op("nll_loss2d_backward", |cx| nll_loss_backward(cx, true)),
    op("mse_loss", mse_loss),
    op("mse_loss_backward", mse_loss_backward),
    op("native_dropout", native_dropout),
    op("native_dropout_backward", native_dropout_backward),
    op("embedding_dense_backward", embedding_dense_backward),
    op_consts("embedding_renorm", embedding_renorm, &["norm_type"]),
    op("glu", glu),
    op("glu_backward", glu_backward),
];

// ------------------------------------------------------------------ helpers

pub(super) fn add(cx: &mut Cx, a: V, b: V) -> V {
    cx.g.binary("stablehlo.add", a, b)
}

pub(super) fn sub(cx: &mut Cx, a: V, b: V) -> V {
    cx.g.binary("stablehlo.subtract", a, b)
}

pub(super) fn mul(cx: &mut Cx, a: V, b: V) -> V {
    cx.g.binary("stablehlo.multiply", a, b)
}

pub(super) fn div(cx: &mut Cx, a: V, b: V) -> V {
    cx.g.binary("stablehlo.divide", a, b)
}

/// The runtime scalar argument `name`, splat to `like`'s type.
pub(super) fn scalar_as(cx: &mut Cx, name: &str, like: V) -> Result<V> {
    let ty = cx.g.ty(like).clone();
    Ok(cx.scalar_like(name, ty.dtype, &ty.shape)?.expect("required scalar argument"))
}

/// `x > 0 ? pos : neg`.
fn where_positive(cx: &mut Cx, x: V, pos: V, neg: V) -> V {
    let zero = full_like(cx, 0.0, x);
    let positive = cx.g.compare("GT", x, zero);
    cx.g.select(positive, pos, neg)
}

/// `self` in its compute type, for kernels PyTorch defines on floating types
/// only (`kernel` names the CPU kernel in the error): (value, result dtype).
fn float_self(cx: &mut Cx, kernel: &str) -> Result<(V, DType)> {
    let dtype = cx.meta("self")?.dtype;
    float_only(dtype, kernel)?;
    let x = cx.tensor("self")?;
    Ok((cx.g.convert(x, opmath(dtype)), dtype))
}

/// Reduces `x` over `dims` and broadcasts the result back to x's shape.
pub(super) fn reduce_back(cx: &mut Cx, kind: ReduceKind, x: V, dims: &[usize]) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let r = cx.g.reduce(kind, x, dims);
    let kept: Vec<i64> = (0..shape.len()).filter(|d| !dims.contains(d)).map(|d| d as i64).collect();
    cx.g.broadcast_in_dim(r, &shape, &kept)
}

// ------------------------------------------------------------------ activations

fn relu(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    Ok(vec![cx.g.binary("stablehlo.maximum", x, zero)])
}

/// `grad_output` where `self > threshold`, else 0.
fn threshold_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let ct = opmath(t.dtype);
    let g = cx.tensor("grad_output")?;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let th = cx.scalar_like("threshold", ct, t.sizes)?.expect("threshold");
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    let keep = cx.g.compare("GT", x, th);
    Ok(vec![cx.g.select(keep, g, zero)])
}

/// Whether `approximate` selects the tanh form of GELU.
fn gelu_tanh(cx: &Cx) -> Result<bool> {
    match cx.str("approximate")? {
        "none" => Ok(false),
        "tanh" => Ok(true),
        _ => Err(Error::runtime("approximate argument must be either none or tanh.")),
    }
}

/// The tanh form's `tanh(sqrt(2/pi) * (x + 0.044715 x^3))`.
fn gelu_inner_tanh(cx: &mut Cx, x: V) -> V {
    let beta = full_like(cx, (2.0 / std::f64::consts::PI).sqrt(), x);
    let kappa = full_like(cx, 0.044715, x);
    let x2 = mul(cx, x, x);
    let x3 = mul(cx, x2, x);
    let k = mul(cx, kappa, x3);
    let s = add(cx, x, k);
    let inner = mul(cx, beta, s);
    cx.g.unary("stablehlo.tanh", inner)
}

/// The normal CDF `0.5 (1 + erf(x / sqrt 2))`.
fn normal_cdf(cx: &mut Cx, x: V) -> V {
    let r = full_like(cx, std::f64::consts::FRAC_1_SQRT_2, x);
    let xr = mul(cx, x, r);
    let e = cx.g.unary("chlo.erf", xr);
    let one = full_like(cx, 1.0, x);
    let s = add(cx, one, e);
    let half = full_like(cx, 0.5, x);
    mul(cx, half, s)
}

fn gelu(cx: &mut Cx) -> Result<Vec<V>> {
    let tanh = gelu_tanh(cx)?;
    let (x, dtype) = float_self(cx, "GeluKernelImpl")?;
    let r = if tanh {
        let t = gelu_inner_tanh(cx, x);
        let one = full_like(cx, 1.0, x);
        let s = add(cx, one, t);
        let half = full_like(cx, 0.5, x);
        let hx = mul(cx, half, x);
        mul(cx, hx, s)
    } else {
        gelu_exact(cx, x)
    };
    finish(cx, r, dtype)
}

/// `x Φ(x)`, GELU without approximation.
pub(super) fn gelu_exact(cx: &mut Cx, x: V) -> V {
    let cdf = normal_cdf(cx, x);
    mul(cx, x, cdf)
}

fn gelu_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let tanh = gelu_tanh(cx)?;
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let half = full_like(cx, 0.5, x);
    let one = full_like(cx, 1.0, x);
    let d = if tanh {
        // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) inner'(x)
        let t = gelu_inner_tanh(cx, x);
        let right = add(cx, one, t);
        let left_d = mul(cx, half, right);
        let t2 = mul(cx, t, t);
        let tanh_d = sub(cx, one, t2);
        let c = full_like(cx, 3.0 * 0.044715, x);
        let x2 = mul(cx, x, x);
        let cx2 = mul(cx, c, x2);
        let s = add(cx, one, cx2);
        let beta = full_like(cx, (2.0 / std::f64::consts::PI).sqrt(), x);
        let inner_d = mul(cx, beta, s);
        let left = mul(cx, half, x);
        let right_d = mul(cx, left, tanh_d);
        let right_d = mul(cx, right_d, inner_d);
        add(cx, left_d, right_d)
    } else {
        // cdf(x) + x pdf(x)
        let cdf = normal_cdf(cx, x);
        let x2 = mul(cx, x, x);
        let mhalf = full_like(cx, -0.5, x);
        let e = mul(cx, x2, mhalf);
        let e = cx.g.unary("stablehlo.exponential", e);
        let k = full_like(cx, 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2, x);
        let pdf = mul(cx, k, e);
        let xpdf = mul(cx, x, pdf);
        add(cx, cdf, xpdf)
    };
    let r = mul(cx, g, d);
    finish(cx, r, dtype)
}

/// `1 + exp(-x)`, the denominator of sigmoid and silu.
fn one_plus_exp_neg(cx: &mut Cx, x: V) -> V {
    let n = cx.g.unary("stablehlo.negate", x);
    let e = cx.g.unary("stablehlo.exponential", n);
    let one = full_like(cx, 1.0, x);
    add(cx, one, e)
}

/// `1 / (1 + exp(-x))`.
fn sigmoid_of(cx: &mut Cx, x: V) -> V {
    let d = one_plus_exp_neg(cx, x);
    let one = full_like(cx, 1.0, x);
    div(cx, one, d)
}

/// `x / (1 + exp(-x))`.
fn silu(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "silu_cpu")?;
    let d = one_plus_exp_neg(cx, x);
    let r = div(cx, x, d);
    finish(cx, r, dtype)
}

/// `g s (1 + x (1 - s))` with `s = sigmoid(x)`.
fn silu_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let s = sigmoid_of(cx, x);
    let one = full_like(cx, 1.0, x);
    let oms = sub(cx, one, s);
    let xo = mul(cx, x, oms);
    let f = add(cx, one, xo);
    let gs = mul(cx, g, s);
    let r = mul(cx, gs, f);
    finish(cx, r, dtype)
}

fn leaky_relu(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "leaky_relu_cpu")?;
    let slope = scalar_as(cx, "negative_slope", x)?;
    let neg = mul(cx, x, slope);
    let r = where_positive(cx, x, x, neg);
    finish(cx, r, dtype)
}

/// CPU's check of `rrelu_with_noise`: `noise` of `self`'s shape.
fn rrelu_rules(cx: &Cx) -> Result<()> {
    let (xt, nt) = (cx.meta("self")?, cx.meta("noise")?);
    if xt.sizes != nt.sizes {
        return Err(Error::runtime(format!(
            "noise tensor shape must match self tensor shape. Got self.shape = {:?} noise.shape = {:?}",
            xt.sizes, nt.sizes
        )));
    }
    Ok(())
}

/// Randomized leaky ReLU: in training each non-positive x times a slope
/// drawn uniformly from [lower, upper], which `noise` records (1 where x is
/// positive); in evaluation leaky_relu with the slopes' mean, `noise` kept.
fn rrelu_with_noise(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "rrelu_with_noise_out_cpu")?;
    let noise_dtype = cx.meta("noise")?.dtype;
    let (lower, upper) = (scalar_as(cx, "lower", x)?, scalar_as(cx, "upper", x)?);
    if !cx.bool("training")? {
        let sum = add(cx, lower, upper);
        let half = full_like(cx, 0.5, x);
        let slope = mul(cx, sum, half);
        let neg = mul(cx, x, slope);
        let r = where_positive(cx, x, x, neg);
        let noise = cx.tensor("noise")?;
        return Ok(vec![cx.g.convert(r, dtype), noise]);
    }
    let shape = cx.g.ty(x).shape.clone();
    let u = uniform01(cx, &shape, Some("generator"))?;
    let u = cx.g.convert(u, cx.g.ty(x).dtype);
    let span = sub(cx, upper, lower);
    let scaled = mul(cx, u, span);
    let slope = add(cx, lower, scaled);
    let zero = full_like(cx, 0.0, x);
    let non_positive = cx.g.compare("LE", x, zero);
    // CPU draws a slope only for a non-positive input, and checks its range then.
    let reversed = cx.g.compare("GT", lower, upper);
    let drawn = cx.g.binary("stablehlo.and", non_positive, reversed);
    cx.check_any(
        drawn,
        Kind::Runtime,
        "Expected from <= to to be true, but got false.  (Could this error message be improved?  If so, please report an enhancement request to PyTorch.)",
    );
    let neg = mul(cx, x, slope);
    let r = cx.g.select(non_positive, neg, x);
    let one = full_like(cx, 1.0, x);
    let noise = cx.g.select(non_positive, slope, one);
    Ok(vec![cx.g.convert(r, dtype), cx.g.convert(noise, noise_dtype)])
}

fn leaky_relu_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let slope = scalar_as(cx, "negative_slope", x)?;
    let neg = mul(cx, g, slope);
    let r = where_positive(cx, x, g, neg);
    finish(cx, r, dtype)
}

/// elu's runtime coefficients splat like `like`: (alpha * scale, scale, input_scale).
fn elu_coefficients(cx: &mut Cx, like: V) -> Result<(V, V, V)> {
    let alpha = scalar_as(cx, "alpha", like)?;
    let scale = scalar_as(cx, "scale", like)?;
    let input_scale = scalar_as(cx, "input_scale", like)?;
    Ok((mul(cx, alpha, scale), scale, input_scale))
}

/// `x > 0 ? x scale : alpha scale (exp(x input_scale) - 1)`.
fn elu(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "elu_cpu")?;
    let (negcoef, scale, input_scale) = elu_coefficients(cx, x)?;
    let xi = mul(cx, x, input_scale);
    let e = cx.g.unary("stablehlo.exponential_minus_one", xi);
    let neg = mul(cx, e, negcoef);
    let pos = mul(cx, x, scale);
    let r = where_positive(cx, x, pos, neg);
    finish(cx, r, dtype)
}

/// The derivative from the input, or from the result `y` after an in-place
/// elu (`is_result`), where it is `input_scale (y + alpha scale)`.
fn elu_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self_or_result"])?;
    let (g, y) = (v[0], v[1]);
    let (negcoef, scale, input_scale) = elu_coefficients(cx, y)?;
    let gi = mul(cx, g, input_scale);
    let neg = if cx.bool("is_result")? {
        let s = add(cx, y, negcoef);
        mul(cx, gi, s)
    } else {
        let yi = mul(cx, y, input_scale);
        let e = cx.g.unary("stablehlo.exponential", yi);
        let gn = mul(cx, gi, negcoef);
        mul(cx, gn, e)
    };
    let pos = mul(cx, g, scale);
    let r = where_positive(cx, y, pos, neg);
    finish(cx, r, dtype)
}

/// clamp to [min_val, max_val]; the bounds take self's type (integer
/// inputs truncate them), as on CPU.
fn hardtanh(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if t.dtype == DType::Bool {
        return Err(Error::not_implemented("Bool inputs not supported for hardtanh"));
    }
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(t.dtype));
    let lo = scalar_as(cx, "min_val", x)?;
    let hi = scalar_as(cx, "max_val", x)?;
    let r = cx.g.binary("stablehlo.maximum", x, lo);
    let r = cx.g.binary("stablehlo.minimum", r, hi);
    finish(cx, r, t.dtype)
}

/// 0 where `self <= min_val` or `self >= max_val`, else `grad_output`.
fn hardtanh_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let lo = scalar_as(cx, "min_val", x)?;
    let hi = scalar_as(cx, "max_val", x)?;
    let below = cx.g.compare("LE", x, lo);
    let above = cx.g.compare("GE", x, hi);
    let out = cx.g.binary("stablehlo.or", below, above);
    let zero = full_like(cx, 0.0, g);
    let r = cx.g.select(out, zero, g);
    finish(cx, r, dtype)
}

/// `min(max(x + 3, 0), 6)`, shared by hardsigmoid and hardswish.
fn shifted_relu6(cx: &mut Cx, x: V) -> V {
    let (zero, three, six) = (full_like(cx, 0.0, x), full_like(cx, 3.0, x), full_like(cx, 6.0, x));
    let r = add(cx, x, three);
    let r = cx.g.binary("stablehlo.maximum", r, zero);
    cx.g.binary("stablehlo.minimum", r, six)
}

/// `min(max(x + 3, 0), 6) / 6`.
fn hardsigmoid(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "hardsigmoid_cpu")?;
    let r = shifted_relu6(cx, x);
    let six = full_like(cx, 6.0, x);
    let r = div(cx, r, six);
    finish(cx, r, dtype)
}

/// `g / 6` inside (-3, 3), else 0.
fn hardsigmoid_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let (three, mthree, sixth) = (full_like(cx, 3.0, x), full_like(cx, -3.0, x), full_like(cx, 1.0 / 6.0, x));
    let above = cx.g.compare("GT", x, mthree);
    let below = cx.g.compare("LT", x, three);
    let inside = cx.g.binary("stablehlo.and", above, below);
    let gs = mul(cx, g, sixth);
    let zero = full_like(cx, 0.0, g);
    let r = cx.g.select(inside, gs, zero);
    finish(cx, r, dtype)
}

/// `x min(max(x + 3, 0), 6) / 6`, multiplied before dividing as CPU does.
fn hardswish(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "hardswish_cpu")?;
    let r = shifted_relu6(cx, x);
    let r = mul(cx, x, r);
    let six = full_like(cx, 6.0, x);
    let r = div(cx, r, six);
    finish(cx, r, dtype)
}

/// 0 below -3, `g (x / 3 + 1/2)` up to 3, `g` above.
fn hardswish_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let (three, mthree, half) = (full_like(cx, 3.0, x), full_like(cx, -3.0, x), full_like(cx, 0.5, x));
    let slope = div(cx, x, three);
    let slope = add(cx, slope, half);
    let middle = mul(cx, g, slope);
    let upper = cx.g.compare("LE", x, three);
    let r = cx.g.select(upper, middle, g);
    let lower = cx.g.compare("LT", x, mthree);
    let zero = full_like(cx, 0.0, g);
    let r = cx.g.select(lower, zero, r);
    finish(cx, r, dtype)
}

/// `tanh(log1p(exp(x)))`, mish's gate.
fn mish_gate(cx: &mut Cx, x: V) -> V {
    let e = cx.g.unary("stablehlo.exponential", x);
    let softplus = cx.g.unary("stablehlo.log_plus_one", e);
    cx.g.unary("stablehlo.tanh", softplus)
}

/// `x tanh(softplus(x))`.
fn mish(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "mish_cpu")?;
    let gate = mish_gate(cx, x);
    let r = mul(cx, x, gate);
    finish(cx, r, dtype)
}

/// `g (t + x sigmoid(x) (1 - t²))` with `t` the gate.
fn mish_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let t = mish_gate(cx, x);
    let sigmoid = sigmoid_of(cx, x);
    let one = full_like(cx, 1.0, x);
    let t2 = mul(cx, t, t);
    let rest = sub(cx, one, t2);
    let xs = mul(cx, x, sigmoid);
    let slope = mul(cx, xs, rest);
    let slope = add(cx, t, slope);
    let r = mul(cx, g, slope);
    finish(cx, r, dtype)
}

/// `value` where `self <= threshold`, else self; the scalars in self's dtype.
fn threshold(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if t.dtype == DType::Bool {
        return Err(not_implemented("threshold_cpu", t.dtype));
    }
    let x = cx.tensor("self")?;
    let th = scalar_as(cx, "threshold", x)?;
    let value = scalar_as(cx, "value", x)?;
    let below = cx.g.compare("LE", x, th);
    Ok(vec![cx.g.select(below, value, x)])
}

/// Whether `x` lies in [-lambd, lambd] (the shrink functions' zero band).
fn in_band(cx: &mut Cx, x: V) -> Result<V> {
    let lambd = scalar_as(cx, "lambd", x)?;
    let low = cx.g.unary("stablehlo.negate", lambd);
    let above = cx.g.compare("GE", x, low);
    let below = cx.g.compare("LE", x, lambd);
    Ok(cx.g.binary("stablehlo.and", above, below))
}

/// 0 inside [-lambd, lambd], else x.
fn hardshrink(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "hardshrink_cpu")?;
    let band = in_band(cx, x)?;
    let zero = full_like(cx, 0.0, x);
    let r = cx.g.select(band, zero, x);
    finish(cx, r, dtype)
}

/// The gradient of both shrink functions: 0 inside [-lambd, lambd].
fn shrink_backward(cx: &mut Cx, grad: &str) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &[grad, "self"])?;
    let (g, x) = (v[0], v[1]);
    let band = in_band(cx, x)?;
    let zero = full_like(cx, 0.0, g);
    let r = cx.g.select(band, zero, g);
    finish(cx, r, dtype)
}

/// x ∓ lambd outside [-lambd, lambd], 0 inside; lambd must fit the dtype.
fn softshrink(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (x, dtype) = float_self(cx, "softshrink_check")?;
    let lambd = cx.const_f64("lambd")?;
    let (max, shown) = match dtype {
        DType::F16 => (65504.0, "65504"),
        DType::BF16 => (3.389_531_389_251_535_5e38, "3.38953e+38"),
        DType::F32 => (f32::MAX as f64, "3.40282e+38"),
        _ => (f64::MAX, "1.79769e+308"),
    };
    if !(0.0..=max).contains(&lambd) {
        return Err(Error::runtime(format!(
            "lambda must be in range [0, {shown}] for input dtype {}, but found {lambd}",
            t.dtype.torch_name()
        )));
    }
    let l = full_like(cx, lambd, x);
    let ml = full_like(cx, -lambd, x);
    let zero = full_like(cx, 0.0, x);
    let down = sub(cx, x, l);
    let up = add(cx, x, l);
    let above = cx.g.compare("GT", x, l);
    let below = cx.g.compare("LT", x, ml);
    let r = cx.g.select(below, up, zero);
    let r = cx.g.select(above, down, r);
    finish(cx, r, dtype)
}

/// `x` where positive, else `weight x` (weight broadcast by prelu's composite).
fn prelu(cx: &mut Cx) -> Result<Vec<V>> {
    float_only(cx.meta("self")?.dtype, "prelu_cpu")?;
    let (v, dtype) = promoted(cx, &["self", "weight"])?;
    let (x, w) = (v[0], v[1]);
    let wx = mul(cx, w, x);
    let r = where_positive(cx, x, x, wx);
    finish(cx, r, dtype)
}

/// (`g` or `weight g`, 0 or `x g`) by the sign of x, at the broadcast shape
/// (autograd sums the weight's part to its shape).
fn prelu_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self", "weight"])?;
    let (g, x, w) = (v[0], v[1], v[2]);
    let wg = mul(cx, w, g);
    let grad_self = where_positive(cx, x, g, wg);
    let xg = mul(cx, x, g);
    let zero = full_like(cx, 0.0, x);
    let grad_weight = where_positive(cx, x, zero, xg);
    Ok(vec![cx.g.convert(grad_self, dtype), cx.g.convert(grad_weight, dtype)])
}

/// softplus's `(x beta, x beta > threshold, beta)`: above the threshold it is linear.
fn softplus_parts(cx: &mut Cx, x: V) -> Result<(V, V, V)> {
    let beta = scalar_as(cx, "beta", x)?;
    let threshold = scalar_as(cx, "threshold", x)?;
    let xb = mul(cx, x, beta);
    let linear = cx.g.compare("GT", xb, threshold);
    Ok((xb, linear, beta))
}

/// `log(1 + exp(x beta)) / beta`, or x above the threshold.
fn softplus(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_self(cx, "softplus_cpu")?;
    let (xb, linear, beta) = softplus_parts(cx, x)?;
    let e = cx.g.unary("stablehlo.exponential", xb);
    let l = cx.g.unary("stablehlo.log_plus_one", e);
    let soft = div(cx, l, beta);
    let r = cx.g.select(linear, x, soft);
    finish(cx, r, dtype)
}

/// `g z / (z + 1)` with `z = exp(x beta)`, or g above the threshold.
fn softplus_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let (xb, linear, _) = softplus_parts(cx, x)?;
    let z = cx.g.unary("stablehlo.exponential", xb);
    let one = full_like(cx, 1.0, z);
    let z1 = add(cx, z, one);
    let gz = mul(cx, g, z);
    let soft = div(cx, gz, z1);
    let r = cx.g.select(linear, g, soft);
    finish(cx, r, dtype)
}

// ------------------------------------------------------------------ softmax

/// The softmax dimension as a reduction list (none for a 0-d tensor, whose
/// softmax is over its single element).
fn softmax_dims(cx: &Cx, rank: usize) -> Result<Vec<usize>> {
    let dim = wrap_dim(cx.int("dim")?, rank)?;
    Ok(if rank == 0 { vec![] } else { vec![dim] })
}

/// `x - max`, its exponential, and their sum over `dims` (broadcast back):
/// softmax is `e / sum`, log_softmax `shifted - log(sum)`, numerically stable.
pub(super) fn exp_shifted(cx: &mut Cx, x: V, dims: &[usize]) -> (V, V, V) {
    let max = reduce_back(cx, ReduceKind::Max, x, dims);
    let shifted = sub(cx, x, max);
    let e = cx.g.unary("stablehlo.exponential", shifted);
    let sum = reduce_back(cx, ReduceKind::Sum, e, dims);
    (shifted, e, sum)
}

/// Numerically stable: `exp(x - max) / sum` and `x - max - log(sum)`.
/// `half_to_float` makes a float16/bfloat16 input give a float32 result.
fn softmax(cx: &mut Cx, log: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let rank = t.sizes.len();
    let dims = softmax_dims(cx, rank)?;
    if !t.dtype.is_float() {
        let last = dims.first().map_or(true, |&d| d + 1 == rank);
        let kernel =
            format!("{}softmax{}_kernel_impl", if log { "log_" } else { "" }, if last { "_lastdim" } else { "" });
        return Err(not_implemented(&kernel, t.dtype));
    }
    let ct = opmath(t.dtype);
    let dtype = if cx.bool("half_to_float")? { ct } else { t.dtype };
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let (shifted, e, sum) = exp_shifted(cx, x, &dims);
    let r = if log {
        let l = cx.g.unary("stablehlo.log", sum);
        sub(cx, shifted, l)
    } else {
        div(cx, e, sum)
    };
    finish(cx, r, dtype)
}

/// From the forward's output y: softmax `y (g - sum(g y))`, log_softmax
/// `g - exp(y) sum(g)`.
fn softmax_backward(cx: &mut Cx, log: bool) -> Result<Vec<V>> {
    let (gt, yt) = (cx.meta("grad_output")?, cx.meta("output")?);
    if gt.sizes != yt.sizes {
        return Err(Error::runtime(format!(
            "Expected tensor for argument #1 'grad' to have same size as tensor for argument #2 'output'; but {:?} does not equal {:?} (while checking arguments for {}softmax_backward)",
            gt.sizes,
            yt.sizes,
            if log { "log_" } else { "" }
        )));
    }
    let dims = softmax_dims(cx, gt.sizes.len())?;
    // Float32 grads of a half_to_float softmax give the input's dtype back.
    let input = cx.dtype("input_dtype")?.unwrap_or(gt.dtype);
    let dtype = if gt.dtype == DType::F32 && matches!(input, DType::F16 | DType::BF16) { input } else { gt.dtype };
    let ct = opmath(gt.dtype);
    let g = cx.tensor("grad_output")?;
    let y = cx.tensor("output")?;
    let (g, y) = (cx.g.convert(g, ct), cx.g.convert(y, ct));
    let r = if log {
        let sum = reduce_back(cx, ReduceKind::Sum, g, &dims);
        let e = cx.g.unary("stablehlo.exponential", y);
        let es = mul(cx, e, sum);
        sub(cx, g, es)
    } else {
        let gy = mul(cx, g, y);
        let sum = reduce_back(cx, ReduceKind::Sum, gy, &dims);
        let d = sub(cx, g, sum);
        mul(cx, y, d)
    };
    finish(cx, r, dtype)
}

// ------------------------------------------------------------------ losses

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reduction {
    None,
    Mean,
    Sum,
}

pub(super) fn reduction(cx: &Cx) -> Result<Reduction> {
    match cx.int("reduction")? {
        0 => Ok(Reduction::None),
        1 => Ok(Reduction::Mean),
        2 => Ok(Reduction::Sum),
        r => Err(Error::value(format!("{r} is not a valid value for reduction"))),
    }
}

/// The class dimension of an nll_loss input: 0 for one sample `(C)`, else 1.
fn class_dim(rank: usize) -> usize {
    if rank == 1 {
        0
    } else {
        1
    }
}

/// The dimensions of an nll_loss input other than the class dimension,
/// which are the target's.
fn target_dims(rank: usize) -> Vec<i64> {
    (0..rank).filter(|&d| d != class_dim(rank)).map(|d| d as i64).collect()
}

/// Whether nll_loss gives one loss per target (else a scalar).
fn per_target(cx: &Cx) -> Result<bool> {
    Ok(reduction(cx)? == Reduction::None && cx.meta("self")?.sizes.len() > 1)
}

/// PyTorch's argument checks of nll_loss (`(C)`/`(N, C)` input) and
/// nll_loss2d (`(N, C, H, W)`).
fn check_nll(cx: &Cx, spatial: bool) -> Result<()> {
    let (x, t) = (cx.meta("self")?, cx.meta("target")?);
    let (xr, tr) = (x.sizes.len(), t.sizes.len());
    if spatial {
        if tr != 3 {
            return Err(Error::runtime(format!(
                "only batches of spatial targets supported (3D tensors) but got targets of dimension: {tr}"
            )));
        }
        if xr != 4 {
            return Err(Error::runtime(format!(
                "only batches of spatial inputs supported (4D tensors), but got input of dimension: {xr}"
            )));
        }
        if x.sizes[0] != t.sizes[0] || x.sizes[2..] != t.sizes[1..] {
            return Err(Error::runtime(format!("size mismatch (got input: {:?} , target: {:?}", x.sizes, t.sizes)));
        }
    } else {
        if !(1..=2).contains(&xr) {
            return Err(Error::runtime("input tensor should be 1D or 2D"));
        }
        if tr > 1 {
            return Err(Error::runtime("0D or 1D target tensor expected, multi-target not supported"));
        }
        if xr == 1 && tr == 1 && t.sizes[0] != 1 {
            return Err(Error::value(format!(
                "For 1D input, 1D target must have size 1, but got target size: {}",
                t.sizes[0]
            )));
        }
        if xr == 2 && (tr == 0 || x.sizes[0] != t.sizes[0]) {
            return Err(Error::runtime(format!("size mismatch (got input: {:?}, target: {:?})", x.sizes, t.sizes)));
        }
    }
    let classes = x.sizes[class_dim(xr)];
    if !cx.is_none("weight") {
        let w = cx.meta("weight")?;
        if w.sizes.len() != 1 || w.sizes[0] != classes {
            return Err(Error::runtime(if spatial {
                "weight tensor should be defined either for all or no classes".to_string()
            } else {
                format!(
                    "weight tensor should be defined either for all {classes} classes or no classes but got weight tensor of shape: {:?}",
                    w.sizes
                )
            }));
        }
        if w.dtype != x.dtype {
            return Err(Error::runtime(format!(
                "expected scalar type {} but found {}",
                x.dtype.torch_name(),
                w.dtype.torch_name()
            )));
        }
    }
    match t.dtype {
        DType::I64 => {}
        DType::U8 if spatial => return Err(Error::runtime("expected scalar type Long but found Byte")),
        DType::U8 => {}
        d => {
            return Err(Error::runtime(format!("expected target dtype to be Long or Byte, but got {}", d.torch_name())))
        }
    }
    if !x.dtype.is_float() {
        let kernel = if spatial { "nll_loss2d_forward_out_frame" } else { "nll_loss_out_frame" };
        return Err(not_implemented(kernel, x.dtype));
    }
    Ok(())
}

/// Raises IndexError if a target other than ignore_index is not a class.
fn check_targets(cx: &mut Cx, target: V, counted: V, classes: i64) {
    let shape = cx.g.ty(target).shape.clone();
    let zero = cx.g.full(0.0, DType::I64, &shape);
    let n = cx.g.full(classes as f64, DType::I64, &shape);
    let low = cx.g.compare("LT", target, zero);
    let high = cx.g.compare("GE", target, n);
    let out = cx.g.binary("stablehlo.or", low, high);
    let bad = cx.g.binary("stablehlo.and", out, counted);
    let all: Vec<usize> = (0..shape.len()).collect();
    let any = cx.g.reduce(ReduceKind::Or, bad, &all);
    let value = super::index::first_where(cx, bad, target);
    cx.check(any, Some(value), Kind::Index, "Target {} is out of bounds.");
}

/// What each target picks from `self`: a one-hot bool mask of self's shape
/// (all false where the target is ignore_index), and the class weights
/// broadcast to self's shape in `ct`.
fn nll_pick(cx: &mut Cx, ct: DType) -> Result<(V, V)> {
    let shape = cx.meta("self")?.sizes;
    let cdim = class_dim(shape.len());
    let target = cx.tensor("target")?;
    let target = cx.g.convert(target, DType::I64);
    // One sample `(C)` may come with a 1-element 1-D target.
    let target = if shape.len() == 1 { cx.g.reshape(target, &[]) } else { target };
    let tshape = cx.g.ty(target).shape.clone();
    let ignore = cx.g.full(cx.int("ignore_index")? as f64, DType::I64, &tshape);
    let counted = cx.g.compare("NE", target, ignore);
    check_targets(cx, target, counted, shape[cdim]);
    let dims = target_dims(shape.len());
    let target = cx.g.broadcast_in_dim(target, shape, &dims);
    let counted = cx.g.broadcast_in_dim(counted, shape, &dims);
    let classes = cx.g.iota(DType::I64, shape, cdim);
    let is_target = cx.g.compare("EQ", classes, target);
    let hit = cx.g.binary("stablehlo.and", is_target, counted);
    let weight = match cx.opt_tensor("weight")? {
        Some(w) => {
            let w = cx.g.convert(w, ct);
            cx.g.broadcast_in_dim(w, shape, &[cdim as i64])
        }
        None => cx.g.full(1.0, ct, shape),
    };
    Ok((hit, weight))
}

/// `-w[t] x[t]` per target: returned as is for reduction none on a batch
/// (total_weight 0, as on CPU), else summed, with total_weight the sum of
/// the counted targets' weights, and divided by it for mean.
fn nll_loss_forward(cx: &mut Cx, spatial: bool) -> Result<Vec<V>> {
    check_nll(cx, spatial)?;
    let x = cx.meta("self")?;
    let ct = opmath(x.dtype);
    let (hit, weight) = nll_pick(cx, ct)?;
    let input = cx.tensor("self")?;
    let input = cx.g.convert(input, ct);
    let zero = cx.g.full(0.0, ct, x.sizes);
    let wx = mul(cx, weight, input);
    let picked = cx.g.select(hit, wx, zero);
    let loss = cx.g.reduce(ReduceKind::Sum, picked, &[class_dim(x.sizes.len())]);
    let loss = cx.g.unary("stablehlo.negate", loss);
    if per_target(cx)? {
        let total = cx.g.full(0.0, x.dtype, &[]);
        return Ok(vec![cx.g.convert(loss, x.dtype), total]);
    }
    let all: Vec<usize> = (0..x.sizes.len()).collect();
    let w = cx.g.select(hit, weight, zero);
    let total = cx.g.reduce(ReduceKind::Sum, w, &all);
    let rank = cx.g.ty(loss).rank();
    let mut out = cx.g.reduce(ReduceKind::Sum, loss, &all[..rank]);
    if reduction(cx)? == Reduction::Mean {
        out = div(cx, out, total);
    }
    Ok(vec![cx.g.convert(out, x.dtype), cx.g.convert(total, x.dtype)])
}

/// PyTorch's checks of nll_loss_backward's grad_output and total_weight.
fn check_nll_grad(cx: &Cx, spatial: bool) -> Result<()> {
    let (g, t, tw) = (cx.meta("grad_output")?, cx.meta("target")?, cx.meta("total_weight")?);
    if tw.numel() != 1 {
        let gap = if spatial { " " } else { "  " };
        return Err(Error::runtime(format!(
            "expected total_weight to be a{gap}single element tensor, got: {:?} ({} elements)",
            tw.sizes,
            tw.numel()
        )));
    }
    if !per_target(cx)? {
        if g.numel() != 1 {
            return Err(Error::runtime(format!(
                "Expected a single element grad_output tensor, but got: {:?}",
                g.sizes
            )));
        }
    } else if g.sizes != t.sizes {
        return Err(Error::runtime(if spatial {
            format!("size mismatch (got grad_output: {:?} target: {:?}", g.sizes, t.sizes)
        } else {
            format!(
                "Expected a tensor of dimension 1 and tensor.size[0] == {} but got: dimension {} and tensor.size[0] = {}",
                t.sizes[0],
                g.sizes.len(),
                g.sizes.first().unwrap_or(&1)
            )
        }));
    }
    Ok(())
}

/// `-w[t] g` at each target's class, 0 elsewhere; a scalar g is divided by
/// total_weight for mean.
fn nll_loss_backward(cx: &mut Cx, spatial: bool) -> Result<Vec<V>> {
    check_nll(cx, spatial)?;
    check_nll_grad(cx, spatial)?;
    let x = cx.meta("self")?;
    let ct = opmath(x.dtype);
    let (hit, weight) = nll_pick(cx, ct)?;
    let g = cx.tensor("grad_output")?;
    let g = cx.g.convert(g, ct);
    let g = if per_target(cx)? {
        cx.g.broadcast_in_dim(g, x.sizes, &target_dims(x.sizes.len()))
    } else {
        let mut g = cx.g.reshape(g, &[]);
        if reduction(cx)? == Reduction::Mean {
            let total = cx.tensor("total_weight")?;
            let total = cx.g.reshape(total, &[]);
            let total = cx.g.convert(total, ct);
            g = div(cx, g, total);
        }
        cx.g.broadcast_in_dim(g, x.sizes, &[])
    };
    let neg = cx.g.unary("stablehlo.negate", g);
    let grad = mul(cx, weight, neg);
    let zero = cx.g.full(0.0, ct, x.sizes);
    let r = cx.g.select(hit, grad, zero);
    finish(cx, r, x.dtype)
}

/// `(self - target)^2`, reduced.
fn mse_loss(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "target"])?;
    float_only(dtype, "mse_cpu")?;
    let d = sub(cx, v[0], v[1]);
    let sq = mul(cx, d, d);
    let r = reduce_loss(cx, sq)?;
    finish(cx, r, dtype)
}

/// A pointwise loss reduced as the `reduction` argument says.
pub(super) fn reduce_loss(cx: &mut Cx, loss: V) -> Result<V> {
    let shape = cx.g.ty(loss).shape.clone();
    let all: Vec<usize> = (0..shape.len()).collect();
    Ok(match reduction(cx)? {
        Reduction::None => loss,
        Reduction::Sum => cx.g.reduce(ReduceKind::Sum, loss, &all),
        Reduction::Mean => {
            let s = cx.g.reduce(ReduceKind::Sum, loss, &all);
            let n = full_like(cx, shape.iter().product::<i64>() as f64, s);
            div(cx, s, n)
        }
    })
}

/// The factor a pointwise loss's gradient carries: 1 / numel for mean.
pub(super) fn loss_norm(cx: &Cx, numel: i64) -> Result<f64> {
    Ok(if reduction(cx)? == Reduction::Mean { 1.0 / numel as f64 } else { 1.0 })
}

/// `norm (self - target) g` with norm 2 (2 / numel for mean), in self's dtype.
fn mse_loss_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let x = cx.meta("self")?;
    let norm = 2.0 * loss_norm(cx, x.numel())?;
    let (v, _) = promoted(cx, &["grad_output", "self", "target"])?;
    let (g, input, target) = (v[0], v[1], v[2]);
    let d = sub(cx, input, target);
    let norm = full_like(cx, norm, d);
    let nd = mul(cx, norm, d);
    let r = mul(cx, nd, g);
    finish(cx, r, x.dtype)
}

// ------------------------------------------------------------------ dropout, embedding

/// (output, mask): elements kept with probability `1 - p` (from the default
/// generator) and scaled by `1 / (1 - p)`; identity when not training.
fn native_dropout(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("input")?;
    if !t.dtype.is_float() {
        return Err(Error::runtime(format!(
            "result type Float can't be cast to the desired output type {}",
            t.dtype.torch_name()
        )));
    }
    let x = cx.tensor("input")?;
    if !cx.opt_bool("train")?.unwrap_or(true) {
        return Ok(vec![x, cx.g.full(1.0, DType::Bool, t.sizes)]);
    }
    let u = uniform01(cx, t.sizes, None)?;
    let p = scalar_as(cx, "p", u)?;
    let one = full_like(cx, 1.0, u);
    let keep_p = sub(cx, one, p);
    let mask = cx.g.compare("LT", u, keep_p);
    let ct = opmath(t.dtype);
    let x = cx.g.convert(x, ct);
    let keep_p = cx.g.convert(keep_p, ct);
    // p = 1 keeps nothing: scale 0 rather than inf.
    let zero = full_like(cx, 0.0, x);
    let one = full_like(cx, 1.0, x);
    let inv = div(cx, one, keep_p);
    let none_kept = cx.g.compare("EQ", keep_p, zero);
    let scale = cx.g.select(none_kept, zero, inv);
    let m = cx.g.convert(mask, ct);
    let xm = mul(cx, x, m);
    let out = mul(cx, xm, scale);
    Ok(vec![cx.g.convert(out, t.dtype), mask])
}

/// `grad_output * mask * scale`.
fn native_dropout_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "mask", "scale"])?;
    let gm = mul(cx, v[0], v[1]);
    let r = mul(cx, gm, v[2]);
    finish(cx, r, dtype)
}

/// `checkScalarTypes`'s error unless `ok`: `arg` is "#n 'name'".
pub(super) fn expect_types(t: &Tensor, arg: &str, names: &str, ok: bool, op: &str) -> Result<()> {
    // The legacy type name CPU prints; bool has none of the torch.*Tensor form.
    let found = match t.dtype {
        DType::Bool => "CPUBoolType".to_string(),
        d => format!("torch.{}Tensor", d.torch_name()),
    };
    if !ok {
        return Err(Error::runtime(format!(
            "Expected tensor for argument {arg} to have one of the following scalar types: {names}; but got {found} instead (while checking arguments for {op})"
        )));
    }
    Ok(())
}

/// `embedding_renorm_`: each row `indices` names (once, however often) whose
/// p-norm exceeds max_norm is scaled by max_norm / (norm + 1e-7).
fn embedding_renorm(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it) = (cx.meta("self")?, cx.meta("indices")?);
    expect_types(&it, "#2 'indices'", "Long, Int", matches!(it.dtype, DType::I64 | DType::I32), "embedding_renorm_")?;
    if !t.dtype.is_float() {
        return Err(Error::not_implemented(format!(
            "norm(): input dtype should be either floating point or complex. Got {} instead.",
            t.dtype.torch_name()
        )));
    }
    let p = cx.const_f64("norm_type")?;
    let (rows, n) = (t.sizes[0], it.numel());
    let shape = t.sizes.to_vec();
    let ct = opmath(t.dtype);
    let idx = cx.tensor("indices")?;
    let idx = cx.g.reshape(idx, &[n]);
    let message = format!("select(): index {{}} out of range for tensor of size {shape:?} at dimension 0");
    let idx = checked_indices(cx, idx, rows, true, Kind::Index, message);
    let none = cx.g.full(0.0, DType::I64, &[rows]);
    let ones = cx.g.full(1.0, DType::I64, &[n]);
    let named = cx.g.put(none, idx, ones, 0, Some(ReduceKind::Max));
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let a = cx.g.unary("stablehlo.abs", x);
    let norm = Norm::of(p).reduce(cx, a, false);
    // CPU's norm is a tensor of self's dtype; its scale is computed from it.
    let norm = round_to(cx, norm, t.dtype);
    // The norm and the scale are C++ doubles on CPU.
    let norm = cx.g.convert(norm, DType::F64);
    let max = cx.scalar_like("max_norm", DType::F64, &[rows])?.expect("max_norm");
    let over = cx.g.compare("GT", norm, max);
    let zero = cx.g.full(0.0, DType::I64, &[rows]);
    let named = cx.g.compare("GT", named, zero);
    let scale = cx.g.binary("stablehlo.and", over, named);
    let eps = cx.g.full(1e-7, DType::F64, &[rows]);
    let denom = add(cx, norm, eps);
    let factor = div(cx, max, denom);
    let one = cx.g.full(1.0, DType::F64, &[rows]);
    let factor = cx.g.select(scale, factor, one);
    let factor = cx.g.convert(factor, ct);
    let factor = cx.g.broadcast_in_dim(factor, &shape, &[0]);
    let r = mul(cx, x, factor);
    finish(cx, r, t.dtype)
}

/// The weight gradient of an embedding: grad_output rows summed into the
/// rows their indices name (padding_idx's row stays zero), each divided by
/// its index's count when `scale_grad_by_freq`.
fn embedding_dense_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (gt, it) = (cx.meta("grad_output")?, cx.meta("indices")?);
    expect_types(&it, "#2 'indices'", "Long, Int", matches!(it.dtype, DType::I64 | DType::I32), "embedding_backward")?;
    let (n, d) = (it.numel(), *gt.sizes.last().unwrap_or(&1));
    let rows = cx.int("num_weights")?;
    let ct = opmath(gt.dtype);
    let g = cx.tensor("grad_output")?;
    let g = cx.g.reshape(g, &[n, d]);
    let mut g = cx.g.convert(g, ct);
    let idx = cx.tensor("indices")?;
    let idx = cx.g.reshape(idx, &[n]);
    let idx = cx.g.convert(idx, DType::I64);
    if cx.bool("scale_grad_by_freq")? {
        let zeros = cx.g.full(0.0, ct, &[rows]);
        let ones = cx.g.full(1.0, ct, &[n]);
        let counts = cx.g.put(zeros, idx, ones, 0, Some(ReduceKind::Sum));
        let count = cx.g.take(counts, idx, 0);
        let count = cx.g.broadcast_in_dim(count, &[n, d], &[0]);
        g = div(cx, g, count);
    }
    let pad = cx.g.full(cx.int("padding_idx")? as f64, DType::I64, &[n]);
    let padded = cx.g.compare("EQ", idx, pad);
    let padded = cx.g.broadcast_in_dim(padded, &[n, d], &[0]);
    let zero = cx.g.full(0.0, ct, &[n, d]);
    let g = cx.g.select(padded, zero, g);
    let zeros = cx.g.full(0.0, ct, &[rows, d]);
    let r = cx.g.put(zeros, idx, g, 0, Some(ReduceKind::Sum));
    finish(cx, r, gt.dtype)
}

/// glu's halves of `self` along `dim`: (a, b, dim).
fn glu_halves(cx: &mut Cx, x: V) -> Result<(V, V, usize)> {
    let t = cx.meta("self")?;
    if t.sizes.is_empty() {
        return Err(Error::runtime("glu does not support scalars because halving size must be even"));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let n = t.sizes[dim];
    if n % 2 != 0 {
        return Err(Error::runtime(format!("Halving dimension must be even, but dimension {dim} is size {n}")));
    }
    let mut start = vec![0; t.sizes.len()];
    let mut limit = t.sizes.to_vec();
    let strides = vec![1; t.sizes.len()];
    limit[dim] = n / 2;
    let a = cx.g.slice(x, &start, &limit, &strides);
    start[dim] = n / 2;
    limit[dim] = n;
    let b = cx.g.slice(x, &start, &limit, &strides);
    Ok((a, b, dim))
}

/// `a sigmoid(b)` of self's two halves along `dim`.
fn glu(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = cx.meta("self")?.dtype;
    let x = cx.tensor("self")?;
    let (a, b, _) = glu_halves(cx, x)?;
    float_only(dtype, "glu_cpu")?;
    let (a, b) = (cx.g.convert(a, opmath(dtype)), cx.g.convert(b, opmath(dtype)));
    let d = one_plus_exp_neg(cx, b);
    let r = div(cx, a, d);
    finish(cx, r, dtype)
}

/// (g s, g a s (1 - s)) with `s = sigmoid(b)`, joined along `dim`.
fn glu_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = cx.meta("self")?.dtype;
    let (g, x) = (cx.tensor("grad_output")?, cx.tensor("self")?);
    let (g, x) = (cx.g.convert(g, opmath(dtype)), cx.g.convert(x, opmath(dtype)));
    let (a, b, dim) = glu_halves(cx, x)?;
    let s = sigmoid_of(cx, b);
    let one = full_like(cx, 1.0, b);
    let grad_a = mul(cx, g, s);
    let oms = sub(cx, one, s);
    let ga = mul(cx, grad_a, a);
    let grad_b = mul(cx, ga, oms);
    let r = cx.g.concatenate(&[grad_a, grad_b], dim);
    finish(cx, r, dtype)
}
