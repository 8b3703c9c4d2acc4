//! Normalizations: batch, layer and group norm with their backward
//! operators.
//!
//! Each normalizes `x` by the mean and variance (biased) over some
//! dimensions, `xhat = (x - mean) rstd` with `rstd = 1 / sqrt(var + eps)`,
//! then scales and shifts per channel. Statistics are computed in the opmath
//! type; like CPU, they are returned in float32 when a float16/bfloat16
//! input comes with float32 parameters ("mixed type"), else in the input's
//! dtype. `eps` and `momentum` are runtime operands.
use super::elementwise::{not_implemented, round_to};
use super::nn::{add, div, mul, reduce_back, sub};
use super::{op, op_writes, Cx, Entry, Layout, UNDEFINED};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

/// Batch and group norm's results keep a channels-last input's layout (CPU's
/// kernels have channels-last loops); layer norm's are contiguous.
const INPUT: Layout = Layout::Suggested(&["input"]);

pub static ENTRIES: &[Entry] = &[
    // Its schema does not mark the running stats it updates.
    op_writes("native_batch_norm", batch_norm, &["running_mean", "running_var"]).laid_out(INPUT),
    op("_native_batch_norm_legit", batch_norm).laid_out(INPUT),
    op("_native_batch_norm_legit_no_training", batch_norm).laid_out(INPUT),
    op("native_batch_norm_backward", batch_norm_backward).laid_out(INPUT),
    op("native_layer_norm", layer_norm),
    op("native_layer_norm_backward", layer_norm_backward),
    op("native_group_norm", group_norm).laid_out(INPUT),
    op("native_group_norm_backward", group_norm_backward).laid_out(INPUT),
    op("_weight_norm_interface", weight_norm),
    op("_weight_norm_interface_backward", weight_norm_backward),
];

const RUNNING: [&str; 2] = ["running_mean", "running_var"];

/// The dtype of the saved statistics: float32 for a float16/bfloat16 input
/// with a float32 parameter among `params`, else the input's.
fn stats_dtype(cx: &Cx, input: DType, params: &[&str]) -> Result<DType> {
    let mixed = opmath(input) != input
        && params.iter().any(|p| cx.has(p) && !cx.is_none(p) && cx.meta(p).is_ok_and(|t| t.dtype == DType::F32));
    Ok(if mixed { DType::F32 } else { input })
}

/// The compute type of a normalization of `input`. CPU's `kernel` has no
/// integer or bool version; `empty_ok`: empty inputs never reach it.
fn compute_type(cx: &Cx, kernel: &str, empty_ok: bool) -> Result<DType> {
    let t = cx.meta("input")?;
    match t.dtype {
        d if d.is_float() => Ok(opmath(d)),
        d if !(empty_ok && t.numel() == 0) => Err(not_implemented(kernel, d)),
        _ => Ok(DType::F32),
    }
}

/// Tensor `name` in `ct`.
fn read(cx: &mut Cx, name: &str, ct: DType) -> Result<V> {
    let v = cx.tensor(name)?;
    Ok(cx.g.convert(v, ct))
}

/// An optional per-channel tensor in `ct` broadcast to `shape` along `dims`
/// (None when absent).
fn param(cx: &mut Cx, name: &str, ct: DType, shape: &[i64], dims: &[i64]) -> Result<Option<V>> {
    if cx.is_none(name) {
        return Ok(None);
    }
    let v = read(cx, name, ct)?;
    let v = cx.g.reshape(v, &dims.iter().map(|&d| shape[d as usize]).collect::<Vec<_>>());
    Ok(Some(cx.g.broadcast_in_dim(v, shape, dims)))
}

/// `1 / sqrt(var + eps)`, as CPU computes it.
fn rstd(cx: &mut Cx, var: V) -> Result<V> {
    let ty = cx.g.ty(var).clone();
    let eps = cx.scalar_like("eps", ty.dtype, &ty.shape)?.expect("eps");
    let v = add(cx, var, eps);
    let s = cx.g.unary("stablehlo.sqrt", v);
    let one = cx.g.full(1.0, ty.dtype, &ty.shape);
    Ok(cx.g.binary("stablehlo.divide", one, s))
}

/// `reduce_back` of a sum divided by the count of reduced elements.
fn mean_back(cx: &mut Cx, x: V, dims: &[usize]) -> V {
    let ty = cx.g.ty(x).clone();
    let n: i64 = dims.iter().map(|&d| ty.shape[d]).product();
    let s = reduce_back(cx, ReduceKind::Sum, x, dims);
    let n = cx.g.full(n as f64, ty.dtype, &ty.shape);
    cx.g.binary("stablehlo.divide", s, n)
}

/// Mean and biased variance of `x` over `dims`, broadcast back to x's shape.
fn moments(cx: &mut Cx, x: V, dims: &[usize]) -> (V, V) {
    let mean = mean_back(cx, x, dims);
    let centered = sub(cx, x, mean);
    let sq = mul(cx, centered, centered);
    (mean, mean_back(cx, sq, dims))
}

/// One element per group of a value broadcast over `dims` (the inverse of
/// the broadcast).
fn squeeze(cx: &mut Cx, x: V, dims: &[usize]) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let start = vec![0; shape.len()];
    let limit: Vec<i64> = shape.iter().enumerate().map(|(d, &s)| if dims.contains(&d) { 1 } else { s }).collect();
    let one = cx.g.slice(x, &start, &limit, &vec![1; shape.len()]);
    let kept: Vec<i64> = limit.iter().enumerate().filter(|(d, _)| !dims.contains(d)).map(|(_, &s)| s).collect();
    cx.g.reshape(one, &kept)
}

/// `xhat` as CPU's layer norm computes it, `x rstd - mean rstd`, with the
/// statistics broadcast to x's shape.
fn normalize(cx: &mut Cx, x: V, mean: V, rstd: V) -> V {
    let xs = mul(cx, x, rstd);
    let ms = mul(cx, mean, rstd);
    sub(cx, xs, ms)
}

/// `xhat w + b` as CPU's batch and group norms compute it: `x a + (b - mean a)`
/// with `a = rstd w`.
fn normalize_affine(cx: &mut Cx, x: V, mean: V, rstd: V, w: Option<V>, b: Option<V>) -> V {
    let a = match w {
        Some(w) => mul(cx, rstd, w),
        None => rstd,
    };
    let ma = mul(cx, mean, a);
    let shift = match b {
        Some(b) => sub(cx, b, ma),
        None => cx.g.unary("stablehlo.negate", ma),
    };
    let xa = mul(cx, x, a);
    add(cx, xa, shift)
}

/// `y w + b` for the parameters present.
fn scale_shift(cx: &mut Cx, mut y: V, w: Option<V>, b: Option<V>) -> V {
    if let Some(w) = w {
        y = mul(cx, y, w);
    }
    if let Some(b) = b {
        y = add(cx, y, b);
    }
    y
}

/// The input gradient of `xhat` (normalized over `dims` with batch
/// statistics) from its gradient `g`:
/// `rstd (g - mean(g) - xhat mean(g xhat))`.
fn normalized_grad(cx: &mut Cx, g: V, xhat: V, rstd: V, dims: &[usize]) -> V {
    let mean_g = mean_back(cx, g, dims);
    let gx = mul(cx, g, xhat);
    let mean_gx = mean_back(cx, gx, dims);
    let proj = mul(cx, xhat, mean_gx);
    let d = sub(cx, g, mean_g);
    let d = sub(cx, d, proj);
    mul(cx, d, rstd)
}

/// Sums `x` over `dims` and converts it to `dtype`.
fn sum_to(cx: &mut Cx, x: V, dims: &[usize], dtype: DType) -> V {
    let s = cx.g.reduce(ReduceKind::Sum, x, dims);
    cx.g.convert(s, dtype)
}

/// The dtype of a parameter's gradient: the parameter's, else `fallback`.
fn grad_dtype(cx: &Cx, name: &str, fallback: DType) -> Result<DType> {
    Ok(if cx.is_none(name) { fallback } else { cx.meta(name)?.dtype })
}

// ------------------------------------------------------------------ batch norm

/// Batch norm of `input` [N, C, ...] per channel: (output, save_mean,
/// save_invstd), then the running stats' next values where the overload
/// writes them. Training uses batch statistics and moves the running stats
/// toward them by `momentum` (the variance unbiased); evaluation uses the
/// running stats and saves empty statistics.
fn batch_norm(cx: &mut Cx) -> Result<Vec<V>> {
    let xt = cx.meta("input")?;
    let shape = xt.sizes;
    let dims: Vec<usize> = (0..shape.len()).filter(|&d| d != 1).collect();
    let training = cx.has("training") && cx.bool("training")?;
    let ct = compute_type(cx, "batch_norm", true)?;
    let sdt = stats_dtype(cx, xt.dtype, &["weight", "bias", "running_mean", "running_var"])?;
    let x = read(cx, "input", ct)?;
    let (mut outs, mut writes) = (Vec::new(), Vec::new());
    let (mean, rstd) = if training {
        let (mean, var) = moments(cx, x, &dims);
        // CPU normalizes with the statistics as saved (rounded to float16/bfloat16).
        let mean = round_to(cx, mean, sdt);
        let rstd = rstd(cx, var)?;
        let rstd = round_to(cx, rstd, sdt);
        let (m, v) = (squeeze(cx, mean, &dims), squeeze(cx, var, &dims));
        let r = squeeze(cx, rstd, &dims);
        outs.extend([cx.g.convert(m, sdt), cx.g.convert(r, sdt)]);
        let n = xt.numel() / shape[1];
        let c = [shape[1]];
        // n and n - 1 as constants of their own: a program bucketed over a
        // changing batch computes both from its size (`exec/bounded.rs`).
        let (count, less) = (cx.g.full(n as f64, ct, &c), cx.g.full((n - 1) as f64, ct, &c));
        let sum = mul(cx, v, count);
        let v = cx.g.binary("stablehlo.divide", sum, less);
        for (name, stat) in RUNNING.into_iter().zip([m, v]) {
            if cx.writes(name) {
                let old = read(cx, name, ct)?;
                let momentum = cx.scalar_like("momentum", ct, &c)?.expect("momentum");
                let one = cx.g.full(1.0, ct, &c);
                let keep = sub(cx, one, momentum);
                let kept = mul(cx, keep, old);
                let moved = mul(cx, momentum, stat);
                let next = add(cx, kept, moved);
                writes.push(cx.g.convert(next, cx.meta(name)?.dtype));
            }
        }
        (mean, rstd)
    } else {
        if cx.is_none("running_mean") || cx.is_none("running_var") {
            return Err(Error::runtime("running_mean must be defined in evaluation mode"));
        }
        let m = read(cx, "running_mean", ct)?;
        let v = read(cx, "running_var", ct)?;
        let r = rstd(cx, v)?;
        let mean = cx.g.broadcast_in_dim(m, shape, &[1]);
        let rstd = cx.g.broadcast_in_dim(r, shape, &[1]);
        outs.extend([cx.g.full(0.0, sdt, &[0]), cx.g.full(0.0, sdt, &[0])]);
        for name in RUNNING {
            if cx.writes(name) {
                writes.push(cx.tensor(name)?);
            }
        }
        (mean, rstd)
    };
    let w = param(cx, "weight", ct, shape, &[1])?;
    let b = param(cx, "bias", ct, shape, &[1])?;
    let y = normalize_affine(cx, x, mean, rstd, w, b);
    let mut results = vec![cx.g.convert(y, xt.dtype)];
    results.extend(outs);
    results.extend(writes);
    Ok(results)
}

/// (grad_input, grad_weight, grad_bias) of batch norm, as output_mask asks:
/// from the saved statistics in training, the running stats otherwise
/// (where the statistics are constants).
fn batch_norm_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let xt = cx.meta("input")?;
    let shape = xt.sizes;
    let dims: Vec<usize> = (0..shape.len()).filter(|&d| d != 1).collect();
    let mask = cx.bools("output_mask")?;
    let train = cx.bool("train")?;
    let ct = opmath(xt.dtype);
    let x = read(cx, "input", ct)?;
    let g = read(cx, "grad_out", ct)?;
    let (mean, rstd) = if train {
        (read(cx, "save_mean", ct)?, read(cx, "save_invstd", ct)?)
    } else {
        let v = read(cx, "running_var", ct)?;
        (read(cx, "running_mean", ct)?, rstd(cx, v)?)
    };
    let mean = cx.g.broadcast_in_dim(mean, shape, &[1]);
    let rstd = cx.g.broadcast_in_dim(rstd, shape, &[1]);
    let xhat = normalize(cx, x, mean, rstd);
    let mut out = vec![UNDEFINED; 3];
    if mask[0] {
        let gw = match param(cx, "weight", ct, shape, &[1])? {
            Some(w) => mul(cx, g, w),
            None => g,
        };
        let gi = if train { normalized_grad(cx, gw, xhat, rstd, &dims) } else { mul(cx, gw, rstd) };
        out[0] = cx.g.convert(gi, xt.dtype);
    }
    let pdt = grad_dtype(cx, "weight", stats_dtype(cx, xt.dtype, &["weight", "running_mean", "save_mean"])?)?;
    if mask[1] {
        let gx = mul(cx, g, xhat);
        out[1] = sum_to(cx, gx, &dims, pdt);
    }
    if mask[2] {
        out[2] = sum_to(cx, g, &dims, pdt);
    }
    Ok(out)
}

// ------------------------------------------------------------------ layer norm

/// The first normalized dimension, after PyTorch's checks of the shapes.
fn layer_norm_axis(cx: &Cx) -> Result<usize> {
    let xt = cx.meta("input")?;
    let ns = cx.ints("normalized_shape")?;
    if ns.is_empty() {
        return Err(Error::runtime(format!(
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = {ns:?}"
        )));
    }
    for name in ["weight", "bias"] {
        if !cx.is_none(name) && cx.meta(name)?.sizes != ns.as_slice() {
            return Err(Error::runtime(format!(
                "Expected {name} to be of same shape as normalized_shape, but got {name} of shape {:?} and normalized_shape = {ns:?}",
                cx.meta(name)?.sizes
            )));
        }
    }
    let rank = xt.sizes.len();
    if rank < ns.len() || xt.sizes[rank - ns.len()..] != ns[..] {
        let dims: String = ns.iter().map(|d| format!(", {d}")).collect();
        return Err(Error::runtime(format!(
            "Given normalized_shape={ns:?}, expected input with shape [*{dims}], but got input of size{:?}",
            xt.sizes
        )));
    }
    Ok(rank - ns.len())
}

/// (output, mean, rstd) over the trailing normalized_shape dimensions; the
/// statistics keep those dimensions as size 1.
fn layer_norm(cx: &mut Cx) -> Result<Vec<V>> {
    let axis = layer_norm_axis(cx)?;
    let xt = cx.meta("input")?;
    let shape = xt.sizes;
    let dims: Vec<usize> = (axis..shape.len()).collect();
    let trailing: Vec<i64> = (axis as i64..shape.len() as i64).collect();
    let ct = compute_type(cx, "LayerNormKernelImpl", false)?;
    let sdt = stats_dtype(cx, xt.dtype, &["weight", "bias"])?;
    let x = read(cx, "input", ct)?;
    let (mean, var) = moments(cx, x, &dims);
    let rstd = rstd(cx, var)?;
    let w = param(cx, "weight", ct, shape, &trailing)?;
    let b = param(cx, "bias", ct, shape, &trailing)?;
    let xhat = normalize(cx, x, mean, rstd);
    let y = scale_shift(cx, xhat, w, b);
    let stat_shape: Vec<i64> = shape.iter().enumerate().map(|(d, &s)| if d < axis { s } else { 1 }).collect();
    let mut results = vec![cx.g.convert(y, xt.dtype)];
    for s in [mean, rstd] {
        let s = squeeze(cx, s, &dims);
        let s = cx.g.reshape(s, &stat_shape);
        results.push(cx.g.convert(s, sdt));
    }
    Ok(results)
}

/// (grad_input, grad_weight, grad_bias) of layer norm, as output_mask asks
/// (absent parameters get no gradient).
fn layer_norm_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let axis = layer_norm_axis(cx)?;
    let xt = cx.meta("input")?;
    let shape = xt.sizes;
    let dims: Vec<usize> = (axis..shape.len()).collect();
    let leading: Vec<i64> = (0..axis as i64).collect();
    let trailing: Vec<i64> = (axis as i64..shape.len() as i64).collect();
    let mask = cx.bools("output_mask")?;
    let ct = opmath(xt.dtype);
    let x = read(cx, "input", ct)?;
    let g = read(cx, "grad_out", ct)?;
    let mut stats = Vec::new();
    for name in ["mean", "rstd"] {
        let s = read(cx, name, ct)?;
        let s = cx.g.reshape(s, &shape[..axis]);
        stats.push(cx.g.broadcast_in_dim(s, shape, &leading));
    }
    let xhat = normalize(cx, x, stats[0], stats[1]);
    let rows: Vec<usize> = (0..axis).collect();
    let mut out = vec![UNDEFINED; 3];
    if mask[0] {
        let gw = match param(cx, "weight", ct, shape, &trailing)? {
            Some(w) => mul(cx, g, w),
            None => g,
        };
        let gi = normalized_grad(cx, gw, xhat, stats[1], &dims);
        out[0] = cx.g.convert(gi, xt.dtype);
    }
    if mask[1] && !cx.is_none("weight") {
        let gx = mul(cx, g, xhat);
        out[1] = sum_to(cx, gx, &rows, cx.meta("weight")?.dtype);
    }
    if mask[2] && !cx.is_none("bias") {
        out[2] = sum_to(cx, g, &rows, cx.meta("bias")?.dtype);
    }
    Ok(out)
}

// ------------------------------------------------------------------ group norm

/// Group norm's shapes: the input viewed as [N, group, C / group * HxW] for
/// the statistics and as [N, C, HxW] for the per-channel parameters.
fn group_shapes(cx: &Cx) -> Result<([i64; 3], [i64; 3])> {
    let (n, c, hw, group) = (cx.int("N")?, cx.int("C")?, cx.int("HxW")?, cx.int("group")?);
    if group <= 0 || c % group != 0 {
        return Err(Error::runtime(format!(
            "Expected number of channels in input to be divisible by num_groups, but got input of shape {:?} and num_groups={group}",
            cx.meta("input")?.sizes
        )));
    }
    Ok(([n, group, c / group * hw], [n, c, hw]))
}

/// (output, mean, rstd) with statistics of shape [N, group].
fn group_norm(cx: &mut Cx) -> Result<Vec<V>> {
    let (grouped, channels) = group_shapes(cx)?;
    let xt = cx.meta("input")?;
    let ct = compute_type(cx, "GroupNormKernelImpl", true)?;
    let sdt = stats_dtype(cx, xt.dtype, &["weight", "bias"])?;
    let x = read(cx, "input", ct)?;
    let x = cx.g.reshape(x, &grouped);
    let (mean, var) = moments(cx, x, &[2]);
    let rstd = rstd(cx, var)?;
    let x = cx.g.reshape(x, &channels);
    let per_channel = |cx: &mut Cx, s: V| {
        let s = squeeze(cx, s, &[2]);
        let s = cx.g.broadcast_in_dim(s, &[grouped[0], grouped[1], channels[1] / grouped[1]], &[0, 1]);
        let s = cx.g.reshape(s, &channels[..2]);
        cx.g.broadcast_in_dim(s, &channels, &[0, 1])
    };
    let (m, r) = (per_channel(cx, mean), per_channel(cx, rstd));
    let w = param(cx, "weight", ct, &channels, &[1])?;
    let b = param(cx, "bias", ct, &channels, &[1])?;
    let y = normalize_affine(cx, x, m, r, w, b);
    let y = cx.g.reshape(y, xt.sizes);
    let mut results = vec![cx.g.convert(y, xt.dtype)];
    for s in [mean, rstd] {
        let s = squeeze(cx, s, &[2]);
        results.push(cx.g.convert(s, sdt));
    }
    Ok(results)
}

/// (grad_input, grad_weight, grad_bias) of group norm, as output_mask asks.
fn group_norm_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (grouped, channels) = group_shapes(cx)?;
    let xt = cx.meta("input")?;
    let mask = cx.bools("output_mask")?;
    let ct = opmath(xt.dtype);
    let x = read(cx, "input", ct)?;
    let x = cx.g.reshape(x, &grouped);
    let g = read(cx, "grad_out", ct)?;
    let g = cx.g.reshape(g, &channels);
    let mut stats = Vec::new();
    for name in ["mean", "rstd"] {
        let s = read(cx, name, ct)?;
        let s = cx.g.reshape(s, &grouped[..2]);
        stats.push(cx.g.broadcast_in_dim(s, &grouped, &[0, 1]));
    }
    let xhat = normalize(cx, x, stats[0], stats[1]);
    let mut out = vec![UNDEFINED; 3];
    if mask[0] {
        let gw = match param(cx, "weight", ct, &channels, &[1])? {
            Some(w) => mul(cx, g, w),
            None => g,
        };
        let gw = cx.g.reshape(gw, &grouped);
        let gi = normalized_grad(cx, gw, xhat, stats[1], &[2]);
        let gi = cx.g.reshape(gi, xt.sizes);
        out[0] = cx.g.convert(gi, xt.dtype);
    }
    let pdt = grad_dtype(cx, "weight", xt.dtype)?;
    if mask[1] {
        let xhat = cx.g.reshape(xhat, &channels);
        let gx = mul(cx, g, xhat);
        out[1] = sum_to(cx, gx, &[0, 2], pdt);
    }
    if mask[2] {
        out[2] = sum_to(cx, g, &[0, 2], pdt);
    }
    Ok(out)
}

/// `v`'s dimensions but `dim`, the one weight norm keeps, and the shape of
/// its norms (and `g`): `v`'s with 1 in every other dimension.
fn weight_norm_dims(cx: &Cx) -> Result<(Vec<usize>, Vec<i64>)> {
    let v = cx.meta("v").or_else(|_| cx.meta("saved_v"))?;
    let dim = super::wrap_dim(cx.int("dim")?, v.sizes.len())?;
    let others = (0..v.sizes.len()).filter(|&d| d != dim).collect();
    let kept = v.sizes.iter().enumerate().map(|(d, &n)| if d == dim { n } else { 1 }).collect();
    Ok((others, kept))
}

/// `_weight_norm_interface(v, g, dim)`: `w = v * g / ||v||` over every
/// dimension but `dim`, and the norms (in float for a half-precision `v`).
fn weight_norm(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("v")?;
    let ct = opmath(t.dtype);
    let (others, kept) = weight_norm_dims(cx)?;
    let v = read(cx, "v", ct)?;
    let g = read(cx, "g", ct)?;
    let g = cx.g.reshape(g, &kept);
    let squares = mul(cx, v, v);
    let sum = cx.g.reduce(ReduceKind::Sum, squares, &others);
    let norm = cx.g.unary("stablehlo.sqrt", sum);
    let norm = cx.g.reshape(norm, &kept);
    let scale = div(cx, g, norm);
    let scale = cx.g.broadcast_to(scale, t.sizes);
    let w = mul(cx, v, scale);
    Ok(vec![cx.g.convert(w, t.dtype), cx.g.convert(norm, opmath(cx.meta("g")?.dtype))])
}

/// Its gradients, as CPU's kernel: `grad_g = sum(grad_w * v) / norm` over
/// the other dimensions, `grad_v = g / norm * (grad_w - v * grad_g / norm)`.
fn weight_norm_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, tg) = (cx.meta("saved_v")?, cx.meta("saved_g")?);
    let ct = opmath(t.dtype);
    let (others, kept) = weight_norm_dims(cx)?;
    let grad = read(cx, "grad_w", ct)?;
    let v = read(cx, "saved_v", ct)?;
    let g = read(cx, "saved_g", ct)?;
    let g = cx.g.reshape(g, &kept);
    let norm = read(cx, "saved_norms", ct)?;
    let norm = cx.g.reshape(norm, &kept);
    let products = mul(cx, grad, v);
    let dot = cx.g.reduce(ReduceKind::Sum, products, &others);
    let dot = cx.g.reshape(dot, &kept);
    let grad_g = div(cx, dot, norm);
    let per = div(cx, grad_g, norm);
    let per = cx.g.broadcast_to(per, t.sizes);
    let along = mul(cx, v, per);
    let rest = sub(cx, grad, along);
    let scale = div(cx, g, norm);
    let scale = cx.g.broadcast_to(scale, t.sizes);
    let grad_v = mul(cx, scale, rest);
    let grad_g = cx.g.reshape(grad_g, tg.sizes);
    Ok(vec![cx.g.convert(grad_v, t.dtype), cx.g.convert(grad_g, tg.dtype)])
}
