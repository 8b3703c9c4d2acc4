//! Pointwise losses beyond nn's (binary cross entropy, log-sigmoid, smooth
//! L1 and Huber) and their backward operators, with CPU's formulas in the
//! opmath type. Reductions and the gradient's mean factor are nn's.
use super::elementwise::{finish, float_only, full_like, promoted};
use super::nn::{add, div, loss_norm, mul, reduce_loss, sub};
use super::{op, op_consts, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[
    op("binary_cross_entropy", binary_cross_entropy),
    op("binary_cross_entropy_backward", binary_cross_entropy_backward),
    op("log_sigmoid_forward", log_sigmoid_forward),
    op("log_sigmoid_backward", log_sigmoid_backward),
    op_consts("smooth_l1_loss", |cx| robust_loss(cx, false), &["beta"]),
    op_consts("smooth_l1_loss_backward", |cx| robust_loss_backward(cx, false), &["beta"]),
    op_consts("huber_loss", |cx| robust_loss(cx, true), &["delta"]),
    op_consts("huber_loss_backward", |cx| robust_loss_backward(cx, true), &["delta"]),
];

/// `v` times the optional `weight` argument (broadcast to v's shape).
fn weighted(cx: &mut Cx, v: V) -> Result<V> {
    let Some(w) = cx.opt_tensor("weight")? else { return Ok(v) };
    let ty = cx.g.ty(v).clone();
    let w = cx.g.convert(w, ty.dtype);
    let w = cx.g.broadcast_to(w, &ty.shape);
    Ok(mul(cx, v, w))
}

/// `(t - 1) max(log(1 - x), -100) - t max(log x, -100)`, weighted, reduced.
fn binary_cross_entropy(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "target"])?;
    let (x, t) = (v[0], v[1]);
    cx.check_unit_interval(x, "all elements of input should be between 0 and 1");
    cx.check_unit_interval(t, "all elements of target should be between 0 and 1");
    let floor = full_like(cx, -100.0, x);
    let one = full_like(cx, 1.0, x);
    let nx = cx.g.unary("stablehlo.negate", x);
    let log1mx = cx.g.unary("stablehlo.log_plus_one", nx);
    let log1mx = cx.g.binary("stablehlo.maximum", log1mx, floor);
    let logx = cx.g.unary("stablehlo.log", x);
    let logx = cx.g.binary("stablehlo.maximum", logx, floor);
    let tm1 = sub(cx, t, one);
    let a = mul(cx, tm1, log1mx);
    let b = mul(cx, t, logx);
    let loss = sub(cx, a, b);
    let loss = weighted(cx, loss)?;
    let r = reduce_loss(cx, loss)?;
    finish(cx, r, dtype)
}

/// `g (x - t) / max((1 - x) x, 1e-12)`, weighted, divided by numel for mean.
fn binary_cross_entropy_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let numel = cx.meta("self")?.numel();
    let (v, dtype) = promoted(cx, &["grad_output", "self", "target"])?;
    let (g, x, t) = (v[0], v[1], v[2]);
    let one = full_like(cx, 1.0, x);
    let eps = full_like(cx, 1e-12, x);
    let omx = sub(cx, one, x);
    let d = mul(cx, omx, x);
    let d = cx.g.binary("stablehlo.maximum", d, eps);
    let xt = sub(cx, x, t);
    let q = div(cx, xt, d);
    let r = mul(cx, g, q);
    let r = weighted(cx, r)?;
    let norm = full_like(cx, loss_norm(cx, numel)?, r);
    let r = mul(cx, r, norm);
    finish(cx, r, dtype)
}

/// (output, buffer): `min(x, 0) - log1p(z)` and `z = exp(-|x|)`.
fn log_sigmoid_forward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self"])?;
    let x = v[0];
    float_only(dtype, "log_sigmoid_cpu")?;
    let zero = full_like(cx, 0.0, x);
    let min = cx.g.binary("stablehlo.minimum", x, zero);
    let a = cx.g.unary("stablehlo.abs", x);
    let na = cx.g.unary("stablehlo.negate", a);
    let z = cx.g.unary("stablehlo.exponential", na);
    let l = cx.g.unary("stablehlo.log_plus_one", z);
    let out = sub(cx, min, l);
    Ok(vec![cx.g.convert(out, dtype), cx.g.convert(z, dtype)])
}

/// `g (x < 0 ? 1 - s : s)` with `s = z / (1 + z)`, `z = exp(-|x|)`
/// (recomputed: the buffer is one of CPU's, possibly empty elsewhere).
fn log_sigmoid_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (g, x) = (v[0], v[1]);
    let a = cx.g.unary("stablehlo.abs", x);
    let na = cx.g.unary("stablehlo.negate", a);
    let z = cx.g.unary("stablehlo.exponential", na);
    let one = full_like(cx, 1.0, x);
    let zero = full_like(cx, 0.0, x);
    let z1 = add(cx, one, z);
    let s = div(cx, z, z1);
    let negative = cx.g.compare("LT", x, zero);
    let oms = sub(cx, one, s);
    let d = cx.g.select(negative, oms, s);
    let r = mul(cx, d, g);
    finish(cx, r, dtype)
}

/// smooth_l1's beta (>= 0) or huber's delta (> 0), checked as on CPU.
fn threshold(cx: &Cx, huber: bool) -> Result<f64> {
    if huber {
        let delta = cx.const_f64("delta")?;
        if delta <= 0.0 {
            return Err(Error::runtime("huber_loss does not support non-positive values for delta."));
        }
        Ok(delta)
    } else {
        let beta = cx.const_f64("beta")?;
        if beta < 0.0 {
            return Err(Error::runtime("smooth_l1_loss does not support negative values for beta."));
        }
        Ok(beta)
    }
}

/// With `z = |x - t|`: smooth L1 `z < beta ? 0.5 z^2 / beta : z - 0.5 beta`,
/// Huber `z < delta ? 0.5 z^2 : delta (z - 0.5 delta)`; reduced.
fn robust_loss(cx: &mut Cx, huber: bool) -> Result<Vec<V>> {
    let b = threshold(cx, huber)?;
    let (v, dtype) = promoted(cx, &["self", "target"])?;
    let d = sub(cx, v[0], v[1]);
    let z = cx.g.unary("stablehlo.abs", d);
    let beta = full_like(cx, b, z);
    let half = full_like(cx, 0.5, z);
    let hz = mul(cx, half, z);
    let quad = mul(cx, hz, z);
    let hb = full_like(cx, 0.5 * b, z);
    let lin = sub(cx, z, hb);
    let (quad, lin) = if huber { (quad, mul(cx, beta, lin)) } else { (div(cx, quad, beta), lin) };
    let small = cx.g.compare("LT", z, beta);
    let loss = cx.g.select(small, quad, lin);
    let r = reduce_loss(cx, loss)?;
    finish(cx, r, dtype)
}

/// With `x = self - target`: `-n`, `n` outside (-b, b) and `n x / beta`
/// (smooth L1) or `n x` (Huber) inside, where `n` is g times the mean norm
/// (and delta for Huber). beta 0 is L1, whose gradient at 0 is 0.
fn robust_loss_backward(cx: &mut Cx, huber: bool) -> Result<Vec<V>> {
    let b = threshold(cx, huber)?;
    let numel = cx.meta("self")?.numel();
    let (v, dtype) = promoted(cx, &["grad_output", "self", "target"])?;
    let (g, x) = (v[0], sub(cx, v[1], v[2]));
    let norm = full_like(cx, loss_norm(cx, numel)?, x);
    let ng = mul(cx, norm, g);
    let beta = full_like(cx, b, x);
    let outer = if huber { mul(cx, ng, beta) } else { ng };
    let nx = mul(cx, ng, x);
    let inner = if huber {
        nx
    } else if b == 0.0 {
        full_like(cx, 0.0, x)
    } else {
        div(cx, nx, beta)
    };
    let nbeta = cx.g.unary("stablehlo.negate", beta);
    let (lo, hi) = if b == 0.0 { ("LT", "GT") } else { ("LE", "GE") };
    let below = cx.g.compare(lo, x, nbeta);
    let above = cx.g.compare(hi, x, beta);
    let neg = cx.g.unary("stablehlo.negate", outer);
    let r = cx.g.select(above, outer, inner);
    let r = cx.g.select(below, neg, r);
    finish(cx, r, dtype)
}
