//! Reductions. One rule for dims/keepdim/dtype; float16/bfloat16 accumulate
//! in float32.
use super::elementwise::{arith, cpp_name, no_bool, not_implemented};
use super::rules::{number, streamed};
use super::{op, op_complex, op_consts, op_measured, wrap_dim, Cx, Entry};
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op_consts("linalg_vector_norm", vector_norm, &["ord"]).takes_complex(),
    op_consts("norm", norm, &["p"]).takes_complex(),
    op_consts("renorm", renorm, &["p"]).ruled(renorm_rules),
    op_complex("sum", |cx| accumulate(cx, ReduceKind::Sum)),
    op_complex("prod", |cx| accumulate(cx, ReduceKind::Prod)),
    op_complex("mean", mean),
    op("amax", |cx| extreme(cx, ReduceKind::Max)),
    op("amin", |cx| extreme(cx, ReduceKind::Min)),
    op("max", |cx| max_min(cx, true)),
    op("min", |cx| max_min(cx, false)),
    op("argmax", |cx| arg(cx, true)),
    op("argmin", |cx| arg(cx, false)),
    op_complex("all", |cx| logical(cx, ReduceKind::And)),
    op_complex("any", |cx| logical(cx, ReduceKind::Or)),
    op_complex("var", |cx| moments(cx, false, false)),
    op_complex("std", |cx| moments(cx, true, false)),
    op_complex("var_mean", |cx| moments(cx, false, true)),
    op_complex("std_mean", |cx| moments(cx, true, true)),
    op("nansum", nansum),
    op_complex("count_nonzero", count_nonzero),
    op("aminmax", aminmax),
    op_complex("trace", trace),
    op_complex("cumsum", |cx| cumulative(cx, ReduceKind::Sum)),
    op_complex("cumprod", |cx| cumulative(cx, ReduceKind::Prod)),
    op("_cummax_helper", |cx| cumulative_extreme(cx, true)),
    op("_cummin_helper", |cx| cumulative_extreme(cx, false)),
    op("_logcumsumexp", logcumsumexp),
    op_consts("histc", histc, &["min", "max"]),
    op_measured("bincount", bincount, bincount_measure),
];

/// The reduced dimensions of a `dim` argument: absent, None or [] mean all.
pub fn reduced_dims(cx: &Cx, rank: usize) -> Result<Vec<usize>> {
    let dims = if cx.has("dim") { cx.opt_ints("dim")? } else { None };
    match dims {
        None => Ok((0..rank).collect()),
        Some(d) if d.is_empty() => Ok((0..rank).collect()),
        // PyTorch marks named dims in a 64-bit mask.
        Some(_) if rank > 64 => Err(Error::runtime("only tensors with up to 64 dims are supported")),
        Some(d) => dim_list(&d, rank),
    }
}

/// A list of dims wrapped, without repeats (a 0-dim tensor has none).
pub fn dim_list(dims: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for &x in dims {
        let w = wrap_dim(x, rank)?;
        if out.contains(&w) {
            return Err(Error::runtime(format!("dim {w} appears multiple times in the list of dims")));
        }
        if w < rank {
            out.push(w);
        }
    }
    Ok(out)
}

/// Reduces `x` over `dims`, restoring them as size 1 when `keepdim`.
pub fn reduce_keep(cx: &mut Cx, kind: ReduceKind, x: V, dims: &[usize], keepdim: bool) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let r = cx.g.reduce(kind, x, dims);
    if keepdim {
        let kept: Vec<i64> = shape.iter().enumerate().map(|(i, &s)| if dims.contains(&i) { 1 } else { s }).collect();
        cx.g.reshape(r, &kept)
    } else {
        r
    }
}

fn keepdim(cx: &Cx) -> Result<bool> {
    Ok(cx.has("keepdim") && cx.bool("keepdim")?)
}

/// The result dtype of sums and products: `dtype` if given, else int64 for
/// integral inputs.
fn accumulate_dtype(cx: &Cx) -> Result<DType> {
    let t = cx.meta("self")?;
    Ok(cx.dtype("dtype")?.unwrap_or(if t.dtype.has_float_values() { t.dtype } else { DType::I64 }))
}

fn accumulate(cx: &mut Cx, kind: ReduceKind) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dtype = accumulate_dtype(cx)?;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(dtype));
    let dims = reduced_dims(cx, t.sizes.len())?;
    let r = reduce_keep(cx, kind, x, &dims, keepdim(cx)?);
    Ok(vec![cx.g.convert(r, dtype)])
}

fn mean(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let given = cx.dtype("dtype")?;
    let dtype = given.unwrap_or(t.dtype);
    if !dtype.has_float_values() {
        let which = if given.is_some() { "Optional" } else { "Input" };
        return Err(Error::not_implemented(format!(
            "mean(): could not infer output dtype. {which} dtype must be either a floating point or complex dtype. Got: {}",
            dtype.torch_name()
        )));
    }
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(dtype));
    let dims = reduced_dims(cx, t.sizes.len())?;
    let count: i64 = dims.iter().map(|&d| t.sizes[d]).product();
    let s = reduce_keep(cx, ReduceKind::Sum, x, &dims, keepdim(cx)?);
    let shape = cx.g.ty(s).shape.clone();
    let n = cx.g.full(count as f64, opmath(dtype), &shape);
    let r = cx.g.binary("stablehlo.divide", s, n);
    Ok(vec![cx.g.convert(r, dtype)])
}

/// Where a reduction without an identity (`amax`, an inf norm) meets an
/// empty input: it reduces only along dims it names, none of them empty.
enum Empty {
    Unnamed,
    Dim(usize),
}

fn empty_reduction(cx: &Cx, t: &crate::lower::args::Tensor, dims: &[usize]) -> Result<Option<Empty>> {
    if t.numel() != 0 {
        return Ok(None);
    }
    if !(cx.has("dim") && cx.opt_ints("dim")?.is_some_and(|d| !d.is_empty())) {
        return Ok(Some(Empty::Unnamed));
    }
    Ok(dims.iter().find(|&&d| t.sizes[d] == 0).map(|&d| Empty::Dim(d)))
}

fn extreme(cx: &mut Cx, kind: ReduceKind) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dims = reduced_dims(cx, t.sizes.len())?;
    let what = if kind == ReduceKind::Max { "amax" } else { "amin" };
    match empty_reduction(cx, &t, &dims)? {
        Some(Empty::Unnamed) => return Err(Error::runtime(format!(
            "{what}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument."
        ))),
        Some(Empty::Dim(d)) => {
            return Err(Error::index(format!("{what}(): Expected reduction dim {d} to have non-zero size.")))
        }
        None => {}
    }
    if let Some(out) = cx.has("out").then(|| cx.meta("out")).transpose()? {
        if out.dtype != t.dtype {
            return Err(Error::runtime(format!(
                "Expected the dtype for input and out to match, but got {} for input's dtype and {} for out's dtype.",
                t.dtype.torch_name(),
                out.dtype.torch_name()
            )));
        }
    }
    let x = cx.tensor("self")?;
    let kind = if t.dtype == DType::Bool {
        if kind == ReduceKind::Max {
            ReduceKind::Or
        } else {
            ReduceKind::And
        }
    } else {
        kind
    };
    Ok(vec![reduce_extreme(cx, kind, x, &dims, keepdim(cx)?)])
}

/// A max/min reduction where any NaN gives NaN, as on CPU (XLA's CPU
/// max/min may drop it).
fn reduce_extreme(cx: &mut Cx, kind: ReduceKind, x: V, dims: &[usize], keep: bool) -> V {
    let r = reduce_keep(cx, kind, x, dims, keep);
    let ty = cx.g.ty(r).clone();
    if !ty.dtype.is_float() {
        return r;
    }
    let is_nan = cx.g.compare("NE", x, x);
    let any_nan = reduce_keep(cx, ReduceKind::Or, is_nan, dims, keep);
    let nan = cx.g.full(f64::NAN, ty.dtype, &ty.shape);
    cx.g.select(any_nan, nan, r)
}

/// max/min: over everything, or along `dim` returning (values, indices).
fn max_min(cx: &mut Cx, max: bool) -> Result<Vec<V>> {
    if cx.has("other") {
        // max.other / min.other are maximum / minimum.
        return arith(cx, if max { "stablehlo.maximum" } else { "stablehlo.minimum" });
    }
    let t = cx.meta("self")?;
    let kind = match (t.dtype == DType::Bool, max) {
        (true, true) => ReduceKind::Or,
        (true, false) => ReduceKind::And,
        (false, true) => ReduceKind::Max,
        (false, false) => ReduceKind::Min,
    };
    let x = cx.tensor("self")?;
    if !cx.has("dim") {
        if t.numel() == 0 {
            return Err(Error::runtime(format!(
                "{}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.",
                if max { "max" } else { "min" }
            )));
        }
        let all: Vec<usize> = (0..t.sizes.len()).collect();
        return Ok(vec![reduce_extreme(cx, kind, x, &all, false)]);
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    if t.sizes.get(dim) == Some(&0) {
        return Err(Error::index(format!(
            "{}(): Expected reduction dim {dim} to have non-zero size.",
            if max { "max" } else { "min" }
        )));
    }
    let keep = keepdim(cx)?;
    let dims = if t.sizes.is_empty() { vec![] } else { vec![dim] };
    let values = reduce_extreme(cx, kind, x, &dims, keep);
    let indices = arg_along(cx, x, &dims, max, keep);
    Ok(vec![values, indices])
}

fn arg_along(cx: &mut Cx, x: V, dims: &[usize], max: bool, keep: bool) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let Some(&dim) = dims.first() else {
        return cx.g.full(0.0, DType::I64, &shape);
    };
    let x = if cx.g.ty(x).dtype == DType::Bool { cx.g.convert(x, DType::U8) } else { x };
    let r = cx.g.arg_reduce(x, dim, max);
    if keep {
        let mut kept = shape;
        kept[dim] = 1;
        cx.g.reshape(r, &kept)
    } else {
        r
    }
}

fn arg(cx: &mut Cx, max: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let keep = keepdim(cx)?;
    let what = if max { "argmax" } else { "argmin" };
    // The meta function's checks, then the kernel's.
    let dim = cx.opt_int("dim")?.map(|d| wrap_dim(d, t.sizes.len())).transpose()?;
    match dim {
        None if t.numel() == 0 => {
            return Err(Error::index(format!(
                "{what}(): Expected reduction dim to be specified for input.numel() == 0."
            )))
        }
        Some(d) if t.sizes.get(d) == Some(&0) => {
            return Err(Error::index(format!("{what}(): Expected reduction dim {d} to have non-zero size.")))
        }
        _ => {}
    }
    if t.dtype == DType::Bool {
        return Err(Error::not_implemented(format!("{what}(): does not support bool input")));
    }
    match dim {
        None => {
            let flat = cx.g.reshape(x, &[t.numel()]);
            let r = arg_along(cx, flat, &[0], max, false);
            Ok(vec![if keep { cx.g.reshape(r, &vec![1; t.sizes.len()]) } else { r }])
        }
        Some(d) => {
            let dims = if t.sizes.is_empty() { vec![] } else { vec![d] };
            Ok(vec![arg_along(cx, x, &dims, max, keep)])
        }
    }
}

fn logical(cx: &mut Cx, kind: ReduceKind) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let b = if t.dtype == DType::Bool {
        x
    } else {
        let zero = cx.g.full(0.0, t.dtype, t.sizes);
        cx.g.compare("NE", x, zero)
    };
    let dims = reduced_dims(cx, t.sizes.len())?;
    let r = reduce_keep(cx, kind, b, &dims, keepdim(cx)?);
    // all/any keep uint8 inputs' dtype, everything else gives bool.
    Ok(vec![if t.dtype == DType::U8 { cx.g.convert(r, DType::U8) } else { r }])
}

/// var/std with Bessel's `correction` (a runtime operand, default 1).
/// var or std (`sqrt`), and with `with_mean` the mean beside it (var_mean, std_mean).
fn moments(cx: &mut Cx, sqrt: bool, with_mean: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if !t.dtype.has_float_values() {
        let what = match (sqrt, with_mean) {
            (_, false) => "std and var",
            (false, true) => "var_mean",
            (true, true) => "std_mean",
        };
        return Err(Error::not_implemented(format!("{what} only support floating point and complex dtypes")));
    }
    let ct = opmath(t.dtype);
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let dims = reduced_dims(cx, t.sizes.len())?;
    let keep = keepdim(cx)?;
    let count: i64 = dims.iter().map(|&d| t.sizes[d]).product();
    let sum = reduce_keep(cx, ReduceKind::Sum, x, &dims, true);
    let n = cx.g.full(count as f64, ct, &cx.g.ty(sum).shape.clone());
    let mean = cx.g.binary("stablehlo.divide", sum, n);
    let spread = cx.g.broadcast_in_dim(mean, t.sizes, &(0..t.sizes.len() as i64).collect::<Vec<_>>());
    let d = cx.g.binary("stablehlo.subtract", x, spread);
    // A complex spread's square is |d|²: the real and imaginary parts' sum.
    let sq = if ct.is_complex() {
        let (re, im) = (cx.g.part(d, false), cx.g.part(d, true));
        let (re2, im2) = (cx.g.binary("stablehlo.multiply", re, re), cx.g.binary("stablehlo.multiply", im, im));
        cx.g.binary("stablehlo.add", re2, im2)
    } else {
        cx.g.binary("stablehlo.multiply", d, d)
    };
    let ss = reduce_keep(cx, ReduceKind::Sum, sq, &dims, keep);
    // The spread (var, std) is real: complex values spread in their magnitudes.
    let (shape, real) = (cx.g.ty(ss).shape.clone(), ct.to_real());
    let correction = match cx.has("correction").then(|| cx.scalar("correction", real)).transpose()?.flatten() {
        Some(c) => cx.g.broadcast_in_dim(c, &shape, &[]),
        None => {
            let unbiased = !cx.has("unbiased") || cx.bool("unbiased")?;
            cx.g.full(unbiased as i64 as f64, real, &shape)
        }
    };
    let n = cx.g.full(count as f64, real, &shape);
    let denom = cx.g.binary("stablehlo.subtract", n, correction);
    let zero = cx.g.full(0.0, real, &shape);
    let denom = cx.g.binary("stablehlo.maximum", denom, zero);
    let mut r = cx.g.binary("stablehlo.divide", ss, denom);
    if sqrt {
        r = cx.g.unary("stablehlo.sqrt", r);
    }
    let mut results = vec![cx.g.convert(r, t.dtype.to_real())];
    if with_mean {
        let mean = cx.g.reshape(mean, &shape);
        results.push(cx.g.convert(mean, t.dtype));
    }
    Ok(results)
}

/// A sum with NaNs counted as zeros.
fn nansum(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dtype = accumulate_dtype(cx)?;
    let x = cx.tensor("self")?;
    let mut x = cx.g.convert(x, opmath(dtype));
    if t.dtype.is_float() {
        let nan = cx.g.compare("NE", x, x);
        let zero = cx.g.full(0.0, opmath(dtype), t.sizes);
        x = cx.g.select(nan, zero, x);
    }
    let dims = reduced_dims(cx, t.sizes.len())?;
    let r = reduce_keep(cx, ReduceKind::Sum, x, &dims, keepdim(cx)?);
    Ok(vec![cx.g.convert(r, dtype)])
}

/// The count (int64) of elements that are not zero (NaN counts).
fn count_nonzero(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    let nonzero = cx.g.compare("NE", x, zero);
    let ones = cx.g.convert(nonzero, DType::I64);
    let dims = reduced_dims(cx, t.sizes.len())?;
    Ok(vec![reduce_keep(cx, ReduceKind::Sum, ones, &dims, false)])
}

/// Whether two views of one storage reach a common element range.
fn shares_elements(a: &Tensor, b: &Tensor) -> bool {
    let (Some(sa), Some(sb)) = (a.storage, b.storage) else { return false };
    let span = |t: &Tensor| {
        let last: i64 = t.sizes.iter().zip(t.strides).map(|(&n, &s)| (n - 1).max(0) * s).sum();
        (t.offset, t.offset + last)
    };
    let ((a0, a1), (b0, b1)) = (span(a), span(b));
    std::ptr::addr_eq(sa, sb) && a.numel() > 0 && b.numel() > 0 && a0 <= b1 && b0 <= a1
}

/// (amin, amax) over one dim or all, NaN propagating as in each.
fn aminmax(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let rank = t.sizes.len();
    let dims: Vec<usize> = match cx.opt_int("dim")? {
        // PyTorch marks the reduced dim in a 64-bit mask.
        Some(_) if rank > 64 => return Err(Error::runtime("only tensors with up to 64 dims are supported")),
        Some(d) => {
            let w = wrap_dim(d, rank)?;
            if w < rank && t.sizes[w] == 0 {
                return Err(Error::index(format!("aminmax: Expected reduction dim {w} to have non-zero size.")));
            }
            (w < rank).then_some(w).into_iter().collect()
        }
        None if t.numel() == 0 => {
            return Err(Error::runtime(
                "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.",
            ))
        }
        None => (0..rank).collect(),
    };
    if cx.has("min") && cx.has("max") && shares_elements(&cx.meta("min")?, &cx.meta("max")?) {
        return Err(Error::value("aminmax(): the `min` and `max` out= tensors must not overlap."));
    }
    for out in ["min", "max"] {
        let dtype = if cx.has(out) { cx.meta(out)?.dtype } else { t.dtype };
        if dtype != t.dtype {
            return Err(Error::runtime(format!(
                "Expected out tensor to have dtype {}, but got {} instead",
                cpp_name(t.dtype),
                cpp_name(dtype)
            )));
        }
    }
    let keep = keepdim(cx)?;
    let x = cx.tensor("self")?;
    let (low, high) =
        if t.dtype == DType::Bool { (ReduceKind::And, ReduceKind::Or) } else { (ReduceKind::Min, ReduceKind::Max) };
    let min = reduce_extreme(cx, low, x, &dims, keep);
    let max = reduce_extreme(cx, high, x, &dims, keep);
    Ok(vec![min, max])
}

/// cumsum and cumprod, by `scan`.
fn cumulative(cx: &mut Cx, kind: ReduceKind) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dtype = accumulate_dtype(cx)?;
    no_bool(dtype, if kind == ReduceKind::Sum { "cumsum_out_cpu" } else { "cumprod_out_cpu" })?;
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(dtype));
    let combine = if kind == ReduceKind::Sum { "stablehlo.add" } else { "stablehlo.multiply" };
    let x = scan(cx, &[x], dim, &[kind], |cx, earlier, later| vec![cx.g.binary(combine, later[0], earlier[0])]);
    Ok(vec![cx.g.convert(x[0], dtype)])
}

/// An inclusive scan of several arrays together along `dim` in log2(n)
/// steps, each combining the values with themselves shifted by 1, 2, 4, ...
/// places (the gap filled with each array's `identities`' identity):
/// `combine(earlier, later)`.
pub fn scan(
    cx: &mut Cx,
    xs: &[V],
    dim: usize,
    identities: &[ReduceKind],
    combine: impl Fn(&mut Cx, &[V], &[V]) -> Vec<V>,
) -> Vec<V> {
    let shape = cx.g.ty(xs[0]).shape.clone();
    let n = shape.get(dim).copied().unwrap_or(1);
    let identities: Vec<V> = xs
        .iter()
        .zip(identities)
        .map(|(&x, &kind)| {
            let dtype = cx.g.ty(x).dtype;
            cx.g.identity(kind, dtype, &[])
        })
        .collect();
    let zeros = vec![0; shape.len()];
    let mut xs = xs.to_vec();
    let mut step = 1;
    while step < n {
        let mut low = zeros.clone();
        low[dim] = step;
        let shifted: Vec<V> = xs
            .iter()
            .zip(&identities)
            .map(|(&x, &identity)| {
                let head = cx.g.slice_dim(x, dim, 0, n - step, 1);
                cx.g.pad(head, identity, &low, &zeros, &zeros)
            })
            .collect();
        xs = combine(cx, &shifted, &xs);
        step *= 2;
    }
    xs
}

/// `_cummax_helper`/`_cummin_helper`: running extremes and the index of the
/// last one (CPU's `>=`); a NaN wins and every later NaN takes its place.
fn cumulative_extreme(cx: &mut Cx, max: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &super::index::as_vector(&t));
    let shape = cx.g.ty(x).shape.clone();
    let iota = cx.g.iota(DType::I64, &shape, dim);
    let kind = if max { ReduceKind::Max } else { ReduceKind::Min };
    let r = scan(cx, &[x, iota], dim, &[kind, ReduceKind::Sum], |cx, a, b| {
        let better = cx.g.compare(if max { "GE" } else { "LE" }, b[0], a[0]);
        let a_number = cx.g.compare("EQ", a[0], a[0]);
        let b_nan = cx.g.compare("NE", b[0], b[0]);
        let take = cx.g.binary("stablehlo.and", a_number, better);
        let take = cx.g.binary("stablehlo.or", b_nan, take);
        vec![cx.g.select(take, b[0], a[0]), cx.g.select(take, b[1], a[1])]
    });
    Ok(vec![cx.g.reshape(r[0], t.sizes), cx.g.reshape(r[1], t.sizes)])
}

/// `_logcumsumexp`: running log(sum(exp)), combined as CPU's
/// `_log_add_exp_helper` (equal infinities give themselves).
fn logcumsumexp(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let x = cx.tensor("self")?;
    if !t.dtype.is_float() {
        return Err(super::elementwise::not_implemented("logcumsumexp_out_cpu", t.dtype));
    }
    let x = cx.g.reshape(x, &super::index::as_vector(&t));
    let x = cx.g.convert(x, opmath(t.dtype));
    let r = scan(cx, &[x], dim, &[ReduceKind::Max], |cx, a, b| {
        let (hi, lo) = (cx.g.binary("stablehlo.maximum", a[0], b[0]), cx.g.binary("stablehlo.minimum", a[0], b[0]));
        let d = cx.g.binary("stablehlo.subtract", lo, hi);
        let e = cx.g.unary("stablehlo.exponential", d);
        let l = cx.g.unary("stablehlo.log_plus_one", e);
        let sum = cx.g.binary("stablehlo.add", hi, l);
        let same = cx.g.compare("EQ", lo, hi);
        // lo - lo is NaN exactly when lo is infinite (or NaN, which is never `same`).
        let z = cx.g.binary("stablehlo.subtract", lo, lo);
        let infinite = cx.g.compare("NE", z, z);
        let special = cx.g.binary("stablehlo.and", same, infinite);
        vec![cx.g.select(special, b[0], sum)]
    });
    let r = cx.g.convert(r[0], t.dtype);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `linalg.vector_norm`: `ord` picks the computation, so it is compile-time.
fn vector_norm(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if !t.dtype.has_float_values() {
        return Err(Error::not_implemented(format!(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
            t.dtype.torch_name()
        )));
    }
    let ord = cx.const_f64("ord")?;
    p_norm(cx, ord)
}

/// torch.norm's vector norms (`p` absent: 2), which CPU computes as
/// linalg.vector_norm.
fn norm(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if !t.dtype.has_float_values() {
        return Err(Error::not_implemented(format!(
            "norm(): input dtype should be either floating point or complex. Got {} instead.",
            t.dtype.torch_name()
        )));
    }
    let ord = if cx.is_none("p") { 2.0 } else { cx.const_f64("p")? };
    p_norm(cx, ord)
}

/// The `ord`-norm of `self` over `dim` (all if absent).
fn p_norm(cx: &mut Cx, ord: f64) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dtype = cx.dtype("dtype")?.unwrap_or(t.dtype);
    let ct = opmath(dtype);
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    // Norms of complex values are real: those of the magnitudes.
    let (a, dtype) =
        if ct.is_complex() { (cx.g.magnitude(x), dtype.to_real()) } else { (cx.g.unary("stablehlo.abs", x), dtype) };
    let dims = reduced_dims(cx, t.sizes.len())?;
    if ord < 0.0 || ord == f64::INFINITY {
        match empty_reduction(cx, &t, &dims)? {
            Some(Empty::Unnamed) => return Err(Error::runtime(format!(
                "linalg.vector_norm cannot compute the {ord} norm on an empty tensor because the operation does not have an identity"
            ))),
            Some(Empty::Dim(d)) => return Err(Error::runtime(format!(
                "linalg.vector_norm cannot compute the {ord} norm on the dimension {d}because this dimension is empty and the operation does not have an identity"
            ))),
            None => {}
        }
    }
    let keep = keepdim(cx)?;
    let r = norm_of(cx, a, ord, &dims, keep);
    Ok(vec![cx.g.convert(r, dtype)])
}

/// The `ord`-norm over `dims` of `a`, magnitudes in the compute type.
pub(super) fn norm_of(cx: &mut Cx, a: V, ord: f64, dims: &[usize], keep: bool) -> V {
    let ty = cx.g.ty(a).clone();
    if ord == f64::INFINITY || ord == f64::NEG_INFINITY {
        let kind = if ord > 0.0 { ReduceKind::Max } else { ReduceKind::Min };
        reduce_keep(cx, kind, a, dims, keep)
    } else if ord == 0.0 {
        let zero = cx.g.full(0.0, ty.dtype, &ty.shape);
        let nonzero = cx.g.compare("NE", a, zero);
        let ones = cx.g.convert(nonzero, ty.dtype);
        reduce_keep(cx, ReduceKind::Sum, ones, dims, keep)
    } else if ord == 1.0 {
        reduce_keep(cx, ReduceKind::Sum, a, dims, keep)
    } else if ord == 2.0 {
        let sq = cx.g.binary("stablehlo.multiply", a, a);
        let s = reduce_keep(cx, ReduceKind::Sum, sq, dims, keep);
        cx.g.unary("stablehlo.sqrt", s)
    } else {
        let p = cx.g.full(ord, ty.dtype, &ty.shape);
        let powered = cx.g.binary("stablehlo.power", a, p);
        let s = reduce_keep(cx, ReduceKind::Sum, powered, dims, keep);
        let shape = cx.g.ty(s).shape.clone();
        let inv = cx.g.full(1.0 / ord, ty.dtype, &shape);
        cx.g.binary("stablehlo.power", s, inv)
    }
}

/// `renorm`: each slice along `dim` whose `p`-norm exceeds `maxnorm` scaled
/// by maxnorm / (norm + 1e-7), as CPU's kernel (norms in float32 for half
/// types).
fn renorm(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let p = cx.const_f64("p")?;
    if !(p > 0.0) {
        return Err(Error::runtime("renorm: non-positive-norm not supported"));
    }
    if t.sizes.len() < 2 {
        return Err(Error::runtime(format!(
            "renorm: input needs at least 2 dimensions, got {} dimensions",
            t.sizes.len()
        )));
    }
    if !t.dtype.is_float() {
        return Err(Error::not_implemented(format!(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
            t.dtype.torch_name()
        )));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let ct = opmath(t.dtype);
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let a = cx.g.unary("stablehlo.abs", x);
    let dims: Vec<usize> = (0..t.sizes.len()).filter(|&d| d != dim).collect();
    let norm = norm_of(cx, a, p, &dims, true);
    let shape = cx.g.ty(norm).shape.clone();
    let maxnorm = cx.scalar_like("maxnorm", ct, &shape)?.expect("maxnorm");
    let eps = cx.g.full(1e-7, ct, &shape);
    let padded = cx.g.binary("stablehlo.add", norm, eps);
    let scale = cx.g.binary("stablehlo.divide", maxnorm, padded);
    let one = cx.g.full(1.0, ct, &shape);
    let over = cx.g.compare("GT", norm, maxnorm);
    let factor = cx.g.select(over, scale, one);
    let factor = cx.g.broadcast_to(factor, t.sizes);
    let r = cx.g.binary("stablehlo.multiply", x, factor);
    Ok(vec![cx.g.convert(r, t.dtype)])
}

/// renorm's `maxnorm`, a runtime number, is not negative.
fn renorm_rules(cx: &Cx) -> Result<()> {
    match number(cx, "maxnorm") {
        Some(m) if m < 0.0 => {
            Err(Error::runtime(format!("renorm: expected maxnorm to be >= 0 but got {}", streamed(m))))
        }
        _ => Ok(()),
    }
}

/// `histc`: counts of self's elements in `bins` equal bins over [min, max],
/// or over the data's range when min == max (widened by 1 on each side when
/// that is one value). Floating types follow CPU's kernel: edges in self's
/// dtype and positions computed in it. Integer types, which CPU rejects,
/// follow CUDA's (positions in int64): libraries call histc on integer
/// tensors on any accelerator (transformers' MoE routing).
fn histc(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let bins = cx.int("bins")?;
    if bins <= 0 {
        return Err(Error::runtime(format!("torch.histogram(): bins must be > 0, but got {bins} for dimension 0")));
    }
    let dtype = t.dtype;
    if dtype == DType::Bool || dtype.is_complex() {
        // CPU fails building the edges (linspace) before counting.
        return Err(not_implemented("linspace_cpu", dtype));
    }
    let float = dtype.is_float();
    // The range's type: CPU's double, CUDA's int64 for integer inputs.
    let rt = if float { DType::F64 } else { DType::I64 };
    let (min, max) = (cx.const_f64("min")?, cx.const_f64("max")?);
    let (min, max) = if float { (min, max) } else { (min.trunc(), max.trunc()) };
    let n = t.numel();
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &[n]);
    let (lo, hi) = if min == max && n > 0 {
        let data = cx.g.convert(x, rt);
        let lo = cx.g.reduce(ReduceKind::Min, data, &[0]);
        let hi = cx.g.reduce(ReduceKind::Max, data, &[0]);
        let one = cx.g.scalar(1.0, rt);
        let single = cx.g.compare("EQ", lo, hi);
        let (below, above) = (cx.g.binary("stablehlo.subtract", lo, one), cx.g.binary("stablehlo.add", hi, one));
        let (mut lo, mut hi) = (cx.g.select(single, below, lo), cx.g.select(single, above, hi));
        if float {
            // CPU's min and max of data holding NaN are x86's default NaN (negative).
            let nan = cx.g.compare("NE", data, data);
            let nan = cx.g.reduce(ReduceKind::Or, nan, &[0]);
            let default_nan = cx.g.scalar(-f64::NAN, rt);
            (lo, hi) = (cx.g.select(nan, default_nan, lo), cx.g.select(nan, default_nan, hi));
            let inf = cx.g.scalar(f64::INFINITY, rt);
            let finite = |cx: &mut Cx, v: V| {
                let a = cx.g.unary("stablehlo.abs", v);
                cx.g.compare("LT", a, inf)
            };
            let (lo_ok, hi_ok) = (finite(cx, lo), finite(cx, hi));
            let ok = cx.g.binary("stablehlo.and", lo_ok, hi_ok);
            let bad = cx.g.unary("stablehlo.not", ok);
            let range = [lo, hi].map(|v| cx.g.reshape(v, &[1]));
            let range = cx.g.concatenate(&range, 0);
            cx.check_floats(bad, range, Kind::Runtime, "torch.histc: range of [{f}, {f}] is not finite");
        }
        (lo, hi)
    } else {
        let (lo, hi) = if min == max { (min - 1.0, max + 1.0) } else { (min, max) };
        if float && !(lo.is_finite() && hi.is_finite()) {
            return Err(Error::runtime(format!(
                "torch.histc: range of [{}, {}] is not finite",
                streamed(lo),
                streamed(hi)
            )));
        }
        if lo >= hi {
            return Err(Error::runtime("torch.histc: max must be larger than min"));
        }
        (cx.g.scalar(lo, rt), cx.g.scalar(hi, rt))
    };
    // Positions in the compute type: self's dtype (CPU), int64 (CUDA).
    let ct = if float { dtype } else { DType::I64 };
    let (x, lo, hi) = (cx.g.convert(x, ct), cx.g.convert(lo, ct), cx.g.convert(hi, ct));
    let (lo, hi) = (cx.g.broadcast_in_dim(lo, &[n], &[]), cx.g.broadcast_in_dim(hi, &[n], &[]));
    let above_lo = cx.g.compare("GE", x, lo);
    let below_hi = cx.g.compare("LE", x, hi);
    let inside = cx.g.binary("stablehlo.and", above_lo, below_hi);
    let offset = cx.g.binary("stablehlo.subtract", x, lo);
    let width = cx.g.binary("stablehlo.subtract", hi, lo);
    let scale = cx.g.full(bins as f64, ct, &[n]);
    let scaled = cx.g.binary("stablehlo.multiply", offset, scale);
    let pos = cx.g.binary("stablehlo.divide", scaled, width);
    let pos = cx.g.convert(pos, DType::I64);
    // The last bin is closed: the maximum lands in it.
    let last = cx.g.full((bins - 1) as f64, DType::I64, &[n]);
    let pos = cx.g.binary("stablehlo.minimum", pos, last);
    let zero = cx.g.full(0.0, DType::I64, &[n]);
    let pos = cx.g.select(inside, pos, zero);
    let (one, none) = (cx.g.full(1.0, dtype, &[n]), cx.g.full(0.0, dtype, &[n]));
    let counts = cx.g.select(inside, one, none);
    let hist = cx.g.full(0.0, dtype, &[bins]);
    Ok(vec![cx.g.put(hist, pos, counts, 0, Some(ReduceKind::Sum))])
}

/// `bincount`'s checks, in CPU's order; the input's length, or None for an
/// empty input (CPU's int64 zeros of `minlength`, weights or not).
fn bincount_checks(cx: &Cx) -> Result<Option<i64>> {
    let t = cx.meta("self")?;
    if !matches!(t.dtype, DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64) {
        return Err(not_implemented("bincount_cpu", t.dtype));
    }
    if cx.int("minlength")? < 0 {
        return Err(Error::runtime("minlength should be >= 0"));
    }
    if t.sizes.len() == 1 && t.sizes[0] == 0 {
        return Ok(None);
    }
    if t.sizes.len() != 1 {
        return Err(Error::runtime("bincount only supports 1-d non-negative integral inputs."));
    }
    if !cx.is_none("weights") {
        let w = cx.meta("weights")?;
        if w.sizes.len() != 1 || w.sizes[0] != t.sizes[0] {
            return Err(Error::runtime("weights should be 1-d and have the same length as input"));
        }
    }
    Ok(Some(t.sizes[0]))
}

/// The result's length: the largest value + 1, at least `minlength`.
fn bincount_measure(cx: &mut Cx) -> Result<Vec<V>> {
    if bincount_checks(cx)?.is_none() {
        return Ok(vec![]);
    }
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, DType::I64);
    let top = cx.g.reduce(ReduceKind::Max, x, &[0]);
    let one = cx.g.scalar(1.0, DType::I64);
    let length = cx.g.binary("stablehlo.add", top, one);
    let least = cx.g.scalar(cx.int("minlength")? as f64, DType::I64);
    let length = cx.g.binary("stablehlo.maximum", length, least);
    Ok(vec![cx.g.reshape(length, &[1])])
}

/// Counts of each value (int64), or sums of their `weights` (float32 for
/// float32 weights, float64 for any other), as CPU's kernel computes them.
fn bincount(cx: &mut Cx) -> Result<Vec<V>> {
    let Some(n) = bincount_checks(cx)? else {
        let minlength = cx.int("minlength")?;
        return Ok(vec![cx.g.full(0.0, DType::I64, &[minlength])]);
    };
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, DType::I64);
    let zero = cx.g.full(0.0, DType::I64, &[n]);
    let negative = cx.g.compare("LT", x, zero);
    let any = cx.g.reduce(ReduceKind::Or, negative, &[0]);
    cx.check(any, None, Kind::Runtime, "bincount only supports 1-d non-negative integral inputs.");
    let (updates, dtype) = match cx.opt_tensor("weights")? {
        Some(w) => {
            let dtype = if cx.meta("weights")?.dtype == DType::F32 { DType::F32 } else { DType::F64 };
            (cx.g.convert(w, dtype), dtype)
        }
        None => (cx.g.full(1.0, DType::I64, &[n]), DType::I64),
    };
    let bins = cx.g.full(0.0, dtype, &[cx.sizes[0]]);
    Ok(vec![cx.g.put(bins, x, updates, 0, Some(ReduceKind::Sum))])
}

/// The sum of a matrix's diagonal (int64 for integers). Bool matrices count
/// their true diagonal elements as CUDA's kernel does (a diagonal's sum);
/// CPU's has no bool version.
fn trace(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if t.sizes.len() != 2 {
        return Err(Error::runtime(format!("trace: expected a matrix, but got tensor with dim {}", t.sizes.len())));
    }
    let dtype = if t.dtype.has_float_values() { t.dtype } else { DType::I64 };
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(dtype));
    let diagonal = super::linalg::diagonal_mask(&mut cx.g, t.sizes);
    let zero = cx.g.full(0.0, opmath(dtype), t.sizes);
    let x = cx.g.select(diagonal, x, zero);
    let r = cx.g.reduce(ReduceKind::Sum, x, &[0, 1]);
    Ok(vec![cx.g.convert(r, dtype)])
}
