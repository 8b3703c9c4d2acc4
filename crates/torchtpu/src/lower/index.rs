//! Indexing operators. Out-of-range indices raise CPU's exception and
//! message after the program ran. Operators whose result shape depends on
//! values (`nonzero`, `masked_select`, indexing with boolean masks) count
//! first, in a `measure` lowering the host reads, then run with that size.
use super::elementwise::{cpp_name, not_implemented};
use super::reduce::scan;
use super::sort::sorted;
use super::{op, op_complex, op_measured, rules, wrap_dim, Cx, Entry};
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::view::contiguous_strides;
use crate::ir::{ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op_complex("index_select", index_select),
    op_complex("take", take),
    op_complex("put", put),
    op_complex("index_add", index_add),
    op_complex("index_copy", index_copy),
    op_complex("gather", gather),
    op("scatter", |cx| scatter(cx, "scatter")).ruled(rules::value_fits),
    op_complex("scatter_add", |cx| scatter(cx, "scatter_add")),
    op("scatter_reduce", scatter_reduce),
    op("index_reduce", index_reduce),
    op_complex("index_fill", index_fill).ruled(rules::value_fits),
    op_measured("index", index, index_measure).takes_complex(),
    op_measured("index_put", index_put, index_measure).takes_complex(),
    op_measured("_index_put_impl", index_put, index_measure).takes_complex(),
    op_measured("nonzero", nonzero, nonzero_measure).takes_complex(),
    op("nonzero_static", nonzero_static),
    op_measured("_unique2", |cx| unique(cx, true), |cx| unique_measure(cx, false, true)),
    op_measured("_unique", |cx| unique(cx, false), |cx| unique_measure(cx, false, true)),
    op_measured("unique_dim", unique_dim, |cx| unique_measure(cx, true, true)),
    op_measured("unique_consecutive", unique_consecutive, |cx| {
        let by_dim = !cx.is_none("dim");
        unique_measure(cx, by_dim, false)
    }),
    op_measured("masked_select", masked_select, masked_measure).takes_complex(),
    op_measured("repeat_interleave", repeat_interleave, repeat_measure),
    op_complex("masked_scatter", masked_scatter),
];

/// Indices as i64, negatives wrapped when `wrap`, plus a check of their
/// range raising `kind`; `{}` in the message names the first offending index.
pub fn checked_indices(cx: &mut Cx, idx: V, size: i64, wrap: bool, kind: Kind, message: String) -> V {
    let ty = cx.g.ty(idx).clone();
    let given = cx.g.convert(idx, DType::I64);
    let mut idx = given;
    let zero = cx.g.full(0.0, DType::I64, &ty.shape);
    let n = cx.g.full(size as f64, DType::I64, &ty.shape);
    if wrap {
        let neg = cx.g.compare("LT", idx, zero);
        let shifted = cx.g.binary("stablehlo.add", idx, n);
        idx = cx.g.select(neg, shifted, idx);
    }
    let low = cx.g.compare("LT", idx, zero);
    let high = cx.g.compare("GE", idx, n);
    let bad = cx.g.binary("stablehlo.or", low, high);
    let dims: Vec<usize> = (0..ty.rank()).collect();
    let any = cx.g.reduce(ReduceKind::Or, bad, &dims);
    let first = message.contains("{}").then(|| first_where(cx, bad, given));
    cx.check(any, first, kind, message);
    idx
}

/// The element of `values` at the first true `flags` (row-major order), as
/// CPU error messages name it.
pub fn first_where(cx: &mut Cx, flags: V, values: V) -> V {
    let n = cx.g.ty(flags).numel();
    let flags = cx.g.reshape(flags, &[n]);
    let flags = cx.g.convert(flags, DType::U8);
    let first = cx.g.arg_reduce(flags, 0, true);
    let values = cx.g.reshape(values, &[n]);
    cx.g.take(values, first, 0)
}

fn is_index_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::I64 | DType::I32)
}

fn index_select(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let it = cx.meta("index")?;
    if it.sizes.len() > 1 {
        return Err(Error::index("index_select(): Index is supposed to be a vector"));
    }
    if !is_index_dtype(it.dtype) {
        return Err(Error::runtime("index_select(): Expected dtype int32 or int64 for index"));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let x = cx.tensor("self")?;
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    if t.sizes.is_empty() {
        let idx = checked_indices(cx, idx, 1, false, Kind::Index, "index out of range in self".into());
        let x = cx.g.reshape(x, &[1]);
        let r = cx.g.take(x, idx, 0);
        return Ok(vec![cx.g.reshape(r, &[])]);
    }
    // CPU refuses negative indices here (it counts them from the end in indexing).
    let idx = checked_indices(cx, idx, t.sizes[dim], false, Kind::Index, "index out of range in self".into());
    Ok(vec![cx.g.take(x, idx, dim)])
}

/// Elements of the flattened `self` at `index` (negatives from the end),
/// shaped as `index`.
fn take(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    if it.dtype != DType::I64 {
        return Err(Error::runtime(format!(
            "take(): Expected a long tensor for index, but got {}",
            it.dtype.torch_name()
        )));
    }
    let (n, k) = (t.numel(), it.numel());
    if n == 0 && k > 0 {
        return Err(Error::index("take(): tried to take from an empty tensor"));
    }
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &[n]);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[k]);
    let message = format!("out of range: tried to access index {{}} on a tensor of {n} elements.");
    let idx = checked_indices(cx, idx, n, true, Kind::Index, message);
    let r = cx.g.take(x, idx, 0);
    Ok(vec![cx.g.reshape(r, it.sizes)])
}

/// `self` with `source` written (or, with `accumulate`, added) at `index`
/// of its flattened elements.
fn put(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it, st) = (cx.meta("self")?, cx.meta("index")?, cx.meta("source")?);
    if it.dtype != DType::I64 {
        return Err(Error::runtime(format!(
            "put_(): Expected a long tensor for index, but got {}",
            it.dtype.torch_name()
        )));
    }
    if t.dtype != st.dtype {
        return Err(Error::runtime(format!(
            "put_(): self and source expected to have the same dtype, but got self.dtype = {} and source.dtype = {}",
            t.dtype.torch_name(),
            st.dtype.torch_name()
        )));
    }
    let (n, k) = (t.numel(), it.numel());
    if st.numel() != k {
        return Err(Error::index(format!(
            "put_(): Expected source and index to have the same number of elements, but got source.numel() = {}, index.numel() = {k}",
            st.numel()
        )));
    }
    if n == 0 && k > 0 {
        return Err(Error::index("put_(): Tried to put elements into an empty tensor"));
    }
    let x = cx.tensor("self")?;
    if k == 0 {
        return Ok(vec![x]);
    }
    let x = cx.g.reshape(x, &[n]);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[k]);
    let message = format!("out of range: tried to access index {{}} on a tensor of {n} elements.");
    let idx = checked_indices(cx, idx, n, true, Kind::Index, message);
    let src = cx.tensor("source")?;
    let src = cx.g.reshape(src, &[k]);
    let combine = cx.bool("accumulate")?.then_some(ReduceKind::Sum);
    let r = cx.g.put(x, idx, src, 0, combine);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `self` with `alpha * source` slices added at `index` along `dim`.
fn index_add(cx: &mut Cx) -> Result<Vec<V>> {
    let (dim, sizes, ssizes) = index_source(cx, "index_add_", Kind::Index)?;
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    let ct = opmath(t.dtype);
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &sizes);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    // CPU's kernels for vectors and for higher ranks word it differently.
    let idx = match t.sizes.len() {
        0 | 1 => checked_indices(cx, idx, sizes[dim], false, Kind::Index, "index out of range in self".into()),
        _ => checked_indices(cx, idx, sizes[dim], false, Kind::Runtime, out_of_bounds(dim, sizes[dim])),
    };
    let src = cx.tensor("source")?;
    let src = cx.g.reshape(src, &ssizes);
    let src = cx.g.convert(src, ct);
    let alpha = cx.scalar_like("alpha", ct, &ssizes)?.expect("alpha");
    let src = cx.g.binary("stablehlo.multiply", src, alpha);
    let src = cx.g.convert(src, t.dtype);
    let r = cx.g.put(x, idx, src, dim, Some(ReduceKind::Sum));
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `self` with its slices at `index` along `dim` replaced by `source`'s
/// (a static KV cache's update), with CPU's checks in CPU's order.
fn index_copy(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it, st) = (cx.meta("self")?, cx.meta("index")?, cx.meta("source")?);
    if it.sizes.len() > 1 {
        return Err(Error::index(format!(
            "index_copy_(): Index should have dimension 1 or 0 (got {})",
            it.sizes.len()
        )));
    }
    if it.dtype != DType::I64 {
        let got = it.dtype.torch_name();
        return Err(Error::runtime(format!("index_copy_(): Expected a long tensor for index, but got {got}")));
    }
    if t.dtype != st.dtype {
        return Err(Error::runtime(format!(
            "index_copy_(): self and source expected to have the same dtype, but got (self) {} and (source) {}",
            t.dtype.torch_name(),
            st.dtype.torch_name()
        )));
    }
    if !t.sizes.is_empty() && !st.sizes.is_empty() && t.sizes.len() != st.sizes.len() {
        return Err(Error::index(format!(
            "index_copy_(): When source and destination are not scalars, their dimensionality must match. \
             Source dimensionality ({}), destination dimensionality ({})",
            st.sizes.len(),
            t.sizes.len()
        )));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let (sizes, ssizes) = (as_vector(&t), as_vector(&st));
    let slice =
        |s: &[i64]| s.iter().enumerate().filter(|&(d, _)| d != dim).map(|(_, n)| n.to_string()).collect::<Vec<_>>();
    if slice(&sizes) != slice(&ssizes) {
        return Err(Error::runtime(format!(
            "index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: {} at \
             dimension {dim} and source slice shape: {} at dimension 0.",
            slice(&sizes).join(" "),
            slice(&ssizes).join(" ")
        )));
    }
    if ssizes[dim] != it.numel() {
        return Err(Error::index(format!(
            "index_copy_(): Number of indices ({}) should be equal to source.size(dim) ({})",
            it.numel(),
            ssizes[dim]
        )));
    }
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &sizes);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    let message = format!("index_copy_(): {}", out_of_bounds(dim, sizes[dim]));
    let idx = checked_indices(cx, idx, sizes[dim], false, Kind::Index, message);
    let src = cx.tensor("source")?;
    let src = cx.g.reshape(src, &ssizes);
    let r = cx.g.put(x, idx, src, dim, None);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `self` with the slices at `index` along `dim` set to `value`.
fn index_fill(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    if it.sizes.len() > 1 {
        return Err(Error::runtime("Index has to be a vector/scalar"));
    }
    if it.dtype != DType::I64 {
        return Err(Error::index("index_fill_(): Expected dtype int64 for index."));
    }
    if let Ok(v) = cx.meta("value") {
        if !v.sizes.is_empty() {
            return Err(Error::runtime(format!(
                "index_fill_ only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
                v.sizes.len()
            )));
        }
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let sizes = as_vector(&t);
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &sizes);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    let idx = checked_indices(cx, idx, sizes[dim], true, Kind::Index, out_of_bounds(dim, sizes[dim]));
    let mut shape = sizes.clone();
    shape[dim] = it.numel();
    let value = cx.scalar_like("value", t.dtype, &shape)?.expect("value");
    let r = cx.g.put(x, idx, value, dim, None);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `index_reduce`: prod, mean, amax or amin of the source slices each
/// index receives along `dim`, with self's (include_self) or not.
fn index_reduce(cx: &mut Cx) -> Result<Vec<V>> {
    let reduce = cx.str("reduce")?;
    let kind = match reduce {
        "prod" => ReduceKind::Prod,
        "mean" => ReduceKind::Sum,
        "amax" => ReduceKind::Max,
        "amin" => ReduceKind::Min,
        _ => {
            return Err(Error::runtime(format!(
                "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}."
            )))
        }
    };
    let (dim, sizes, ssizes) = index_source(cx, "index_reduce_", Kind::Runtime)?;
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    let include_self = cx.bool("include_self")?;
    if t.dtype == DType::Bool {
        let kernel = if include_self { "index_func_" } else { "index_reduce_func_exclude_input_init" };
        return Err(not_implemented(kernel, t.dtype));
    }
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &sizes);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    let idx = checked_indices(cx, idx, sizes[dim], false, Kind::Index, "index out of range in self".into());
    let src = cx.tensor("source")?;
    let src = cx.g.reshape(src, &ssizes);
    let how = Reduction { kind, include_self, mean: reduce == "mean" };
    let r = reduce_into(cx, x, idx, src, dim, how);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// The checks index_add and index_reduce (`what`) share; CPU raises a
/// count mismatch as `count_kind`. Returns dim and the sizes of self and
/// source (0-dim tensors act as vectors of one element).
fn index_source(cx: &Cx, what: &str, count_kind: Kind) -> Result<(usize, Vec<i64>, Vec<i64>)> {
    let (t, it, st) = (cx.meta("self")?, cx.meta("index")?, cx.meta("source")?);
    if it.sizes.len() > 1 {
        return Err(Error::index(format!(
            "{what}(): Index is supposed to be a vector, but got dim: {} with type: {} and size: {:?}",
            it.sizes.len(),
            it.dtype.torch_name(),
            it.sizes
        )));
    }
    if !is_index_dtype(it.dtype) {
        return Err(Error::runtime(format!(
            "{what}(): Expected dtype int32/int64 for index but got: {}",
            it.dtype.torch_name()
        )));
    }
    if t.dtype != st.dtype {
        return Err(Error::runtime(format!(
            "{what}(): self ({}) and source ({}) must have the same scalar type",
            t.dtype.torch_name(),
            st.dtype.torch_name()
        )));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let (sizes, ssizes) = (as_vector(&t), as_vector(&st));
    let mut expected = sizes.clone();
    expected[dim] = ssizes.get(dim).copied().unwrap_or(1);
    if ssizes != expected {
        return Err(Error::runtime(format!(
            "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = {:?} source.shape = {:?}",
            t.sizes, st.sizes
        )));
    }
    if ssizes[dim] != it.numel() {
        return Err(Error {
            kind: count_kind,
            message: format!(
                "{what}(): Number of indices ({}) should be equal to source.size(dim): ({}), for dim: {dim}",
                it.numel(),
                ssizes[dim]
            ),
        });
    }
    Ok((dim, sizes, ssizes))
}

/// A tensor's sizes with 0-dim tensors read as one element vectors.
pub fn as_vector(t: &Tensor) -> Vec<i64> {
    if t.sizes.is_empty() {
        vec![1]
    } else {
        t.sizes.to_vec()
    }
}

/// The flat positions in a tensor of `sizes` that gather/scatter address:
/// `index` (shape of the result) gives the coordinate along `dim`, the
/// element's own position the others.
fn flat_positions(cx: &mut Cx, index: V, sizes: &[i64], dim: usize) -> V {
    let shape = cx.g.ty(index).shape.clone();
    let strides = contiguous_strides(sizes);
    let mut pos = cx.g.full(0.0, DType::I64, &shape);
    for (d, &stride) in strides.iter().enumerate() {
        let coord = if d == dim { index } else { cx.g.iota(DType::I64, &shape, d) };
        let s = cx.g.full(stride as f64, DType::I64, &shape);
        let term = cx.g.binary("stablehlo.multiply", coord, s);
        pos = cx.g.binary("stablehlo.add", pos, term);
    }
    let n: i64 = shape.iter().product();
    cx.g.reshape(pos, &[n])
}

/// The flat positions in self (of `sizes`) that gather/scatter's checked
/// `index` addresses.
fn gather_positions(cx: &mut Cx, sizes: &[i64], dim: usize) -> Result<V> {
    let it = cx.meta("index")?;
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &as_vector(&it));
    let idx = checked_indices(cx, idx, sizes[dim], false, Kind::Runtime, out_of_bounds(dim, sizes[dim]));
    Ok(flat_positions(cx, idx, sizes, dim))
}

/// CPU's message for an index out of range (a RuntimeError there).
fn out_of_bounds(dim: usize, size: i64) -> String {
    format!("index {{}} is out of bounds for dimension {dim} with size {size}")
}

fn check_index_dtype(t: &Tensor, what: &str) -> Result<()> {
    if !is_index_dtype(t.dtype) {
        return Err(Error::runtime(format!("{what}(): Expected dtype int32/int64 for index")));
    }
    Ok(())
}

/// `out[p] = self[p with index[p] along dim]`.
fn gather(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    if let Some(out) = cx.has("out").then(|| cx.meta("out")).transpose()? {
        if out.dtype != t.dtype {
            return Err(Error::runtime(format!(
                "Expected out tensor to have dtype {}, but got {} instead",
                cpp_name(t.dtype),
                cpp_name(out.dtype)
            )));
        }
    }
    // CPU checks nothing more of an empty index.
    if it.numel() == 0 {
        return Ok(vec![cx.g.full(0.0, t.dtype, it.sizes)]);
    }
    let (sizes, isizes) = (as_vector(&t), as_vector(&it));
    if isizes.len() != sizes.len() {
        return Err(Error::runtime("Index tensor must have the same number of dimensions as input tensor"));
    }
    let dim = wrap_dim(cx.int("dim")?, sizes.len())?;
    check_index_dtype(&it, "gather")?;
    if let Some(d) = (0..sizes.len()).find(|&d| d != dim && isizes[d] > sizes[d]) {
        return Err(Error::runtime(format!(
            "Size does not match at dimension {d} expected index {:?} to be no larger than self {:?} apart from dimension {dim}",
            it.sizes, t.sizes
        )));
    }
    let pos = gather_positions(cx, &sizes, dim)?;
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &[t.numel()]);
    let r = cx.g.take(x, pos, 0);
    Ok(vec![cx.g.reshape(r, it.sizes)])
}

/// scatter (src tensor or value, optional reduce "add"/"multiply") and
/// scatter_add: `out[p with index[p] along dim] = src[p]` (or `+=`, `*=`).
fn scatter(cx: &mut Cx, what: &str) -> Result<Vec<V>> {
    let combine = match cx.has("reduce").then(|| cx.str("reduce")).transpose()? {
        None => (what == "scatter_add").then_some(ReduceKind::Sum),
        Some("add") => Some(ReduceKind::Sum),
        Some("multiply") => Some(ReduceKind::Prod),
        Some(_) => return Err(Error::runtime("reduce argument must be either add or multiply.")),
    };
    let x = cx.tensor("self")?;
    let Some((pos, updates)) = scatter_operands(cx, what)? else { return Ok(vec![x]) };
    let t = cx.meta("self")?;
    let x = cx.g.reshape(x, &[t.numel()]);
    let r = cx.g.put(x, pos, updates, 0, combine);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `scatter_reduce.two`: sum, prod, mean, amax or amin of the src values
/// each position receives, with self's value or (include_self=False) not.
fn scatter_reduce(cx: &mut Cx) -> Result<Vec<V>> {
    let reduce = cx.str("reduce")?;
    let kind = match reduce {
        "sum" | "mean" => ReduceKind::Sum,
        "prod" => ReduceKind::Prod,
        "amax" => ReduceKind::Max,
        "amin" => ReduceKind::Min,
        _ => {
            return Err(Error::runtime(format!(
                "reduce argument must be either sum, prod, mean, amax or amin, got {reduce}"
            )))
        }
    };
    let dtype = cx.meta("self")?.dtype;
    if reduce == "mean" && dtype == DType::Bool {
        return Err(not_implemented("scatter_gather_tensor_cpu_reduce_mean", dtype));
    }
    let x = cx.tensor("self")?;
    let Some((pos, updates)) = scatter_operands(cx, "scatter_reduce")? else { return Ok(vec![x]) };
    let t = cx.meta("self")?;
    let x = cx.g.reshape(x, &[t.numel()]);
    let how = Reduction { kind, include_self: cx.bool("include_self")?, mean: reduce == "mean" };
    let r = reduce_into(cx, x, pos, updates, 0, how);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// How scatter_reduce and index_reduce combine values.
#[derive(Clone, Copy)]
struct Reduction {
    kind: ReduceKind,
    include_self: bool,
    /// Sums become means.
    mean: bool,
}

/// `x` with `updates` combined into positions `pos` along `axis` by `kind`;
/// without `include_self` a position's old value takes no part (positions
/// nothing reaches keep it). `mean` divides sums by their counts (flooring
/// integers, as CPU).
fn reduce_into(cx: &mut Cx, x: V, pos: V, updates: V, axis: usize, how: Reduction) -> V {
    let Reduction { kind, include_self, mean } = how;
    let dtype = cx.g.ty(x).dtype;
    // A mean of float16/bfloat16 values divides their float32 sum and rounds once.
    let (x, updates) =
        if mean { (cx.g.convert(x, opmath(dtype)), cx.g.convert(updates, opmath(dtype))) } else { (x, updates) };
    let (xt, ut) = (cx.g.ty(x).clone(), cx.g.ty(updates).clone());
    let base = if include_self {
        x
    } else {
        let fill = cx.g.identity(kind, xt.dtype, &ut.shape);
        cx.g.put(x, pos, fill, axis, None)
    };
    let r = cx.g.put(base, pos, updates, axis, Some(kind));
    if !mean {
        return r;
    }
    let ct = opmath(xt.dtype);
    let start = cx.g.full(include_self as i64 as f64, ct, &xt.shape);
    let ones = cx.g.full(1.0, ct, &ut.shape);
    let count = cx.g.put(start, pos, ones, axis, Some(ReduceKind::Sum));
    let zero = cx.g.full(0.0, ct, &xt.shape);
    let none = cx.g.compare("EQ", count, zero);
    let one = cx.g.full(1.0, ct, &xt.shape);
    let count = cx.g.select(none, one, count);
    let sum = cx.g.convert(r, ct);
    let mut q = cx.g.binary("stablehlo.divide", sum, count);
    if !ct.is_float() {
        // Floor division of integers: truncation rounds negative quotients up.
        let back = cx.g.binary("stablehlo.multiply", q, count);
        let inexact = cx.g.compare("NE", back, sum);
        let negative = cx.g.compare("LT", sum, zero);
        let fix = cx.g.binary("stablehlo.and", inexact, negative);
        let less = cx.g.binary("stablehlo.subtract", q, one);
        q = cx.g.select(fix, less, q);
    }
    cx.g.convert(q, dtype)
}

/// The checked flat positions a scatter writes and its flat updates (src
/// or value), or None for an empty index (CPU checks nothing more then).
fn scatter_operands(cx: &mut Cx, what: &str) -> Result<Option<(V, V)>> {
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    if it.numel() == 0 {
        return Ok(None);
    }
    let (sizes, isizes) = (as_vector(&t), as_vector(&it));
    if isizes.len() != sizes.len() {
        return Err(Error::runtime("Index tensor must have the same number of dimensions as self tensor"));
    }
    let dim = wrap_dim(cx.int("dim")?, sizes.len())?;
    check_index_dtype(&it, what)?;
    let src_meta = if cx.has("src") { Some(cx.meta("src")?) } else { None };
    if let Some(s) = &src_meta {
        if s.dtype != t.dtype {
            return Err(Error::runtime(format!("{what}(): Expected self.dtype to be equal to src.dtype")));
        }
        let ssizes = as_vector(s);
        let fits = (0..sizes.len()).all(|d| (d == dim || isizes[d] <= sizes[d]) && isizes[d] <= ssizes[d]);
        if !fits {
            return Err(Error::runtime(format!(
                "Expected index {:?} to be no larger than self {:?} apart from dimension {dim} and to be no larger size than src {:?}",
                it.sizes, t.sizes, s.sizes
            )));
        }
    }
    let pos = gather_positions(cx, &sizes, dim)?;
    let updates = match src_meta {
        Some(s) => {
            let src = cx.tensor("src")?;
            let src = cx.g.reshape(src, &as_vector(&s));
            let zeros = vec![0; isizes.len()];
            let ones = vec![1; isizes.len()];
            cx.g.slice(src, &zeros, &isizes, &ones)
        }
        None => cx.scalar_like("value", t.dtype, &isizes)?.expect("value"),
    };
    Ok(Some((pos, cx.g.reshape(updates, &[it.numel()]))))
}

// ------------------------------------------------------------------ data-dependent shapes

/// The number of true elements of a bool array, as an i64 scalar.
fn count_true(cx: &mut Cx, mask: V) -> V {
    let ones = cx.g.convert(mask, DType::I64);
    let dims: Vec<usize> = (0..cx.g.ty(ones).rank()).collect();
    cx.g.reduce(ReduceKind::Sum, ones, &dims)
}

/// Several counts as the one i64 vector a `measure` lowering returns.
fn sizes_vector(cx: &mut Cx, counts: &[V]) -> Vec<V> {
    if counts.is_empty() {
        return vec![];
    }
    let parts: Vec<V> = counts.iter().map(|&c| cx.g.reshape(c, &[1])).collect();
    vec![cx.g.concatenate(&parts, 0)]
}

/// The row-major flat positions (i64[k]) of the `k` true elements of a
/// bool array: a stable sort puts them first, in order.
fn true_positions(cx: &mut Cx, mask: V, k: i64) -> V {
    let n = cx.g.ty(mask).numel();
    let flat = cx.g.reshape(mask, &[n]);
    let (_, positions) = sorted(cx, flat, 0, true);
    cx.g.slice(positions, &[0], &[k], &[1])
}

/// The coordinates (one i64[k] per dimension) of flat positions in an
/// array of `sizes`.
fn coordinates(cx: &mut Cx, pos: V, sizes: &[i64]) -> Vec<V> {
    let shape = cx.g.ty(pos).shape.clone();
    contiguous_strides(sizes)
        .iter()
        .zip(sizes)
        .map(|(&stride, &size)| {
            let s = cx.g.full(stride as f64, DType::I64, &shape);
            let q = cx.g.binary("stablehlo.divide", pos, s);
            let n = cx.g.full(size as f64, DType::I64, &shape);
            cx.g.binary("stablehlo.remainder", q, n)
        })
        .collect()
}

/// `self != 0`, read as at least 1-D.
fn nonzero_mask(cx: &mut Cx) -> Result<(V, Vec<i64>)> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let sizes = as_vector(&t);
    let x = cx.g.reshape(x, &sizes);
    let zero = cx.g.full(0.0, t.dtype, &sizes);
    Ok((cx.g.compare("NE", x, zero), sizes))
}

fn nonzero_measure(cx: &mut Cx) -> Result<Vec<V>> {
    let (mask, _) = nonzero_mask(cx)?;
    let count = count_true(cx, mask);
    Ok(sizes_vector(cx, &[count]))
}

/// The [k, rank] coordinates of the nonzero elements, in row-major order.
fn nonzero(cx: &mut Cx) -> Result<Vec<V>> {
    let rank = cx.meta("self")?.sizes.len() as i64;
    let k = cx.sizes[0];
    if k == 0 || rank == 0 {
        return Ok(vec![cx.g.full(0.0, DType::I64, &[k, rank])]);
    }
    let (mask, sizes) = nonzero_mask(cx)?;
    let pos = true_positions(cx, mask, k);
    let columns: Vec<V> = coordinates(cx, pos, &sizes).into_iter().map(|c| cx.g.reshape(c, &[k, 1])).collect();
    Ok(vec![cx.g.concatenate(&columns, 1)])
}

/// `nonzero` cut or padded to `size` rows (`fill_value` in the rows past
/// the count): a static shape, so nothing is measured.
fn nonzero_static(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (size, fill) = (cx.int("size")?, cx.int("fill_value")?);
    if size < 0 {
        return Err(Error::runtime("nonzero_static: 'size' must be an non-negative integer"));
    }
    let rank = t.sizes.len() as i64;
    if size == 0 || rank == 0 || t.numel() == 0 {
        let value = if rank == 0 { 0.0 } else { fill as f64 };
        return Ok(vec![cx.g.full(value, DType::I64, &[size, rank])]);
    }
    let (mask, sizes) = nonzero_mask(cx)?;
    let m = size.min(t.numel());
    let pos = true_positions(cx, mask, m);
    let columns: Vec<V> = coordinates(cx, pos, &sizes).into_iter().map(|c| cx.g.reshape(c, &[m, 1])).collect();
    let coords = cx.g.concatenate(&columns, 1);
    let count = count_true(cx, mask);
    let count = cx.g.broadcast_to(count, &[m, rank]);
    let row = cx.g.iota(DType::I64, &[m, rank], 0);
    let found = cx.g.compare("LT", row, count);
    let fills = cx.g.full(fill as f64, DType::I64, &[m, rank]);
    let coords = cx.g.select(found, coords, fills);
    let fill = cx.g.scalar(fill as f64, DType::I64);
    Ok(vec![cx.g.pad(coords, fill, &[0, 0], &[size - m, 0], &[0, 0])])
}

/// What `unique` compares: `self`'s elements (no dim) or its slices along
/// `dim`, as the rows of an [s, m] matrix.
struct Rows {
    dim: Option<usize>,
    s: i64,
    m: i64,
}

fn rows(cx: &Cx, unique_dim: bool) -> Result<Rows> {
    let t = cx.meta("self")?;
    if !unique_dim {
        return Ok(Rows { dim: None, s: t.numel(), m: 1 });
    }
    let given = cx.int("dim")?;
    if t.sizes.is_empty() {
        return Err(Error::index(format!("Dimension specified as {given} but tensor has no dimensions")));
    }
    let dim = wrap_dim(given, t.sizes.len())?;
    if t.sizes.iter().enumerate().any(|(d, &n)| n == 0 && d != dim) {
        return Err(Error::runtime(
            "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied",
        ));
    }
    let s = t.sizes[dim];
    Ok(Rows { dim: Some(dim), s, m: if s == 0 { 0 } else { t.numel() / s } })
}

/// The perm moving `dim` first.
fn dim_first(rank: usize, dim: usize) -> Vec<i64> {
    std::iter::once(dim).chain((0..rank).filter(|&d| d != dim)).map(|d| d as i64).collect()
}

/// `self` as the [s, m] matrix of its rows.
fn row_matrix(cx: &mut Cx, r: &Rows) -> Result<V> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let x = match r.dim {
        Some(dim) => cx.g.transpose(x, &dim_first(t.sizes.len(), dim)),
        None => x,
    };
    Ok(cx.g.reshape(x, &[r.s, r.m]))
}

/// The rows in sorted (lexicographic) order, or in their own order when not
/// `sort`, as positions, and flags marking the first row of each run of
/// equal rows (a row with a NaN is a run of its own, as on CPU).
fn runs(cx: &mut Cx, matrix: V, r: &Rows, sort: bool) -> (V, V) {
    let (s, m) = (r.s, r.m);
    let mut operands: Vec<V> = (0..m)
        .map(|j| {
            let column = cx.g.slice(matrix, &[0, j], &[s, j + 1], &[1, 1]);
            cx.g.reshape(column, &[s])
        })
        .collect();
    operands.push(cx.g.iota(DType::I64, &[s], 0));
    let sorted = if sort { cx.g.sort(&operands, 0, false, m as usize) } else { operands };
    let mut changed = cx.g.full(0.0, DType::Bool, &[s - 1]);
    for &column in &sorted[..m as usize] {
        let later = cx.g.slice(column, &[1], &[s], &[1]);
        let earlier = cx.g.slice(column, &[0], &[s - 1], &[1]);
        let differs = cx.g.compare("NE", later, earlier);
        changed = cx.g.binary("stablehlo.or", changed, differs);
    }
    let first = cx.g.full(1.0, DType::Bool, &[1]);
    (sorted[m as usize], cx.g.concatenate(&[first, changed], 0))
}

fn unique_measure(cx: &mut Cx, unique_dim: bool, sort: bool) -> Result<Vec<V>> {
    let r = rows(cx, unique_dim)?;
    let count = if r.s == 0 || r.m == 0 {
        cx.g.scalar(0.0, DType::I64)
    } else {
        let matrix = row_matrix(cx, &r)?;
        let (_, first) = runs(cx, matrix, &r, sort);
        count_true(cx, first)
    };
    Ok(sizes_vector(cx, &[count]))
}

/// The distinct rows in sorted order (or each run's first row in order, when
/// not `sort`; shaped as `self`, with k rows), each row's index among them
/// (i64[s]) and each distinct row's count (i64[k]).
fn distinct(cx: &mut Cx, r: &Rows, sort: bool) -> Result<(V, V, V)> {
    let t = cx.meta("self")?;
    let k = cx.sizes[0];
    let rank = t.sizes.len();
    let mut shape = match r.dim {
        Some(dim) => dim_first(rank, dim).iter().map(|&d| t.sizes[d as usize]).collect(),
        None => vec![t.numel()],
    };
    shape[0] = k;
    let restore = |cx: &mut Cx, rows: V| {
        let rows = cx.g.reshape(rows, &shape);
        match r.dim {
            Some(dim) => cx.g.transpose(rows, &inverse(&dim_first(rank, dim))),
            None => rows,
        }
    };
    if r.s == 0 || r.m == 0 {
        let empty = cx.g.full(0.0, t.dtype, &[k, r.m]);
        let values = restore(cx, empty);
        return Ok((values, cx.g.full(0.0, DType::I64, &[r.s]), cx.g.full(0.0, DType::I64, &[k])));
    }
    let matrix = row_matrix(cx, r)?;
    let (order, first) = runs(cx, matrix, r, sort);
    let starts = true_positions(cx, first, k);
    let representatives = cx.g.take(order, starts, 0);
    let rows = cx.g.take(matrix, representatives, 0);
    let values = restore(cx, rows);
    // A row's index: the number of runs started up to it, less one.
    let ones = cx.g.convert(first, DType::I64);
    let add = |cx: &mut Cx, earlier: &[V], later: &[V]| vec![cx.g.binary("stablehlo.add", later[0], earlier[0])];
    let run = scan(cx, &[ones], 0, &[ReduceKind::Sum], add)[0];
    let one = cx.g.full(1.0, DType::I64, &[r.s]);
    let run = cx.g.binary("stablehlo.subtract", run, one);
    let zeros = cx.g.full(0.0, DType::I64, &[r.s]);
    let index = cx.g.put(zeros, order, run, 0, None);
    let next = cx.g.slice(starts, &[1], &[k], &[1]);
    let end = cx.g.full(r.s as f64, DType::I64, &[1]);
    let ends = cx.g.concatenate(&[next, end], 0);
    let counts = cx.g.binary("stablehlo.subtract", ends, starts);
    Ok((values, index, counts))
}

/// `_unique2` (`_unique` has no counts): sorted distinct elements, each
/// element's index among them (shaped as self) and counts; one not asked
/// for is empty. CPU sorts whether asked to or not.
fn unique(cx: &mut Cx, with_counts: bool) -> Result<Vec<V>> {
    let r = rows(cx, false)?;
    let found = distinct(cx, &r, true)?;
    let mut results = asked_for(cx, found)?;
    if !with_counts {
        results.pop();
    }
    Ok(results)
}

/// Values, and the inverse (shaped as self) and counts where asked for
/// (empty otherwise), of elements found by `distinct`.
fn asked_for(cx: &mut Cx, (values, index, counts): (V, V, V)) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let index =
        if cx.bool("return_inverse")? { cx.g.reshape(index, t.sizes) } else { cx.g.full(0.0, DType::I64, &[0]) };
    // `_unique` has no counts to ask for.
    let counts =
        if cx.has("return_counts") && cx.bool("return_counts")? { counts } else { cx.g.full(0.0, DType::I64, &[0]) };
    Ok(vec![values, index, counts])
}

/// `unique_consecutive`: the first of each run of equal elements (or slices
/// along `dim`, where CPU returns the inverse and counts whether asked for
/// or not, except along dimension 0 of a vector).
fn unique_consecutive(cx: &mut Cx) -> Result<Vec<V>> {
    let rank = cx.meta("self")?.sizes.len();
    let dim = cx.opt_int("dim")?;
    let r = rows(cx, dim.is_some())?;
    let found = distinct(cx, &r, false)?;
    if dim.is_some_and(|d| d != 0 || rank != 1) {
        return Ok(vec![found.0, found.1, found.2]);
    }
    asked_for(cx, found)
}

/// `unique_dim`: distinct slices along `dim`; CPU returns the inverse and
/// counts whether asked for or not.
fn unique_dim(cx: &mut Cx) -> Result<Vec<V>> {
    let r = rows(cx, true)?;
    let (values, index, counts) = distinct(cx, &r, true)?;
    Ok(vec![values, index, counts])
}

/// self and mask broadcast together, flat.
fn masked_operands(cx: &mut Cx) -> Result<(V, V)> {
    let (t, m) = (cx.meta("self")?, cx.meta("mask")?);
    if m.dtype != DType::Bool {
        return Err(Error::runtime("masked_select: expected BoolTensor for mask"));
    }
    let shape = crate::ir::broadcast_all(&[t.sizes, m.sizes])?;
    let n = shape.iter().product();
    let (x, mask) = (cx.tensor("self")?, cx.tensor("mask")?);
    let (x, mask) = (cx.g.broadcast_to(x, &shape), cx.g.broadcast_to(mask, &shape));
    Ok((cx.g.reshape(x, &[n]), cx.g.reshape(mask, &[n])))
}

fn masked_measure(cx: &mut Cx) -> Result<Vec<V>> {
    let (_, mask) = masked_operands(cx)?;
    let count = count_true(cx, mask);
    Ok(sizes_vector(cx, &[count]))
}

fn masked_select(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = cx.meta("self")?.dtype;
    let (x, mask) = masked_operands(cx)?;
    let k = cx.sizes[0];
    if k == 0 {
        return Ok(vec![cx.g.full(0.0, dtype, &[0])]);
    }
    let pos = true_positions(cx, mask, k);
    Ok(vec![cx.g.take(x, pos, 0)])
}

// ------------------------------------------------------------------ advanced indexing

/// An `indices` list resolved against `self`: the dimensions it indexes
/// (in order), their i64 indices broadcast to `shape` and wrapped, and
/// whether those dimensions are adjacent (the result's indexed dimensions
/// then replace them in place; otherwise they come first).
struct Advanced {
    dims: Vec<usize>,
    indices: Vec<V>,
    shape: Vec<i64>,
    adjacent: bool,
}

fn is_mask(t: &Tensor) -> bool {
    matches!(t.dtype, DType::Bool | DType::U8)
}

/// The `indices` list with PyTorch's checks of dtypes, count and mask
/// shapes; masks are returned as defined entries too.
fn index_list<'a>(cx: &Cx<'a>, t: &Tensor) -> Result<Vec<Option<Tensor<'a>>>> {
    let list = cx.metas("indices")?;
    let mut dim = 0;
    for it in list.iter() {
        match it {
            Some(it) if !is_index_dtype(it.dtype) && !is_mask(it) => {
                return Err(Error::index("tensors used as indices must be long, int, byte or bool tensors"))
            }
            Some(it) if is_mask(it) => {
                for (j, &size) in it.sizes.iter().enumerate() {
                    if t.sizes.get(dim + j).is_some_and(|&s| s != size) {
                        return Err(Error::index(format!(
                            "The shape of the mask {:?} at index {j} does not match the shape of the indexed tensor {:?} at index {}",
                            it.sizes,
                            t.sizes,
                            dim + j
                        )));
                    }
                }
                dim += it.sizes.len();
            }
            _ => dim += 1,
        }
    }
    if dim > t.sizes.len() {
        return Err(Error::index(format!("too many indices for tensor of dimension {} (got {dim})", t.sizes.len())));
    }
    Ok(list)
}

/// Counts of the masks in `indices`, for `measure`.
fn index_measure(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let list = index_list(cx, &t)?;
    let values = cx.index_tensors("indices")?;
    let counts: Vec<V> = list
        .iter()
        .zip(values)
        .filter(|(it, _)| it.as_ref().is_some_and(is_mask))
        .map(|(_, v)| {
            let mask = cx.g.convert(v.expect("defined"), DType::Bool);
            count_true(cx, mask)
        })
        .collect();
    Ok(sizes_vector(cx, &counts))
}

/// Resolves `indices` (masks become the coordinates of their true
/// elements, counted by `index_measure`) and checks their range.
fn advanced(cx: &mut Cx, t: &Tensor) -> Result<Advanced> {
    let list = index_list(cx, t)?;
    let values = cx.index_tensors("indices")?;
    let (mut dims, mut indices, mut in_range) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dim, mut masks) = (0, 0);
    for (it, v) in list.iter().zip(values) {
        match (it, v) {
            (Some(it), Some(v)) if is_mask(it) => {
                let k = cx.sizes[masks];
                masks += 1;
                let mask = cx.g.convert(v, DType::Bool);
                let pos = true_positions(cx, mask, k);
                for c in coordinates(cx, pos, it.sizes) {
                    dims.push(dim);
                    indices.push(c);
                    in_range.push(true);
                    dim += 1;
                }
            }
            (Some(_), Some(v)) => {
                dims.push(dim);
                indices.push(v);
                in_range.push(false);
                dim += 1;
            }
            _ => dim += 1,
        }
    }
    let shapes: Vec<Vec<i64>> = indices.iter().map(|&v| cx.g.ty(v).shape.clone()).collect();
    let refs: Vec<&[i64]> = shapes.iter().map(|s| s.as_slice()).collect();
    let shape = crate::ir::broadcast_all(&refs).map_err(|_| {
        let list: Vec<String> = shapes.iter().map(|s| format!("{s:?}")).collect();
        Error::index(format!(
            "shape mismatch: indexing tensors could not be broadcast together with shapes {}",
            list.join(", ")
        ))
    })?;
    for (i, v) in indices.iter_mut().enumerate() {
        let size = t.sizes[dims[i]];
        if !in_range[i] {
            // CPU names neither index nor dimension when the dimension is empty.
            let message = if size == 0 {
                "index is out of bounds for dimension with size 0".to_string()
            } else {
                format!("index {{}} is out of bounds for dimension {i} with size {size}")
            };
            *v = checked_indices(cx, *v, size, true, Kind::Index, message);
        }
        *v = cx.g.broadcast_to(*v, &shape);
    }
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    Ok(Advanced { dims, indices, shape, adjacent })
}

/// How `index` lays self out: self transposed to [indexed dims, others]
/// and its indexed dims flattened into one, the flat index into that
/// dimension, and the permutation from [index shape, others] to the result.
struct Layout {
    perm: Vec<i64>,
    /// self's transposed shape, and with its indexed dims flattened.
    transposed: Vec<i64>,
    flattened: Vec<i64>,
    flat_index: V,
    /// [index shape, others] and the result's permutation of it.
    gathered: Vec<i64>,
    result_perm: Vec<i64>,
}

fn layout(cx: &mut Cx, t: &Tensor, a: &Advanced) -> Layout {
    let rank = t.sizes.len();
    let others: Vec<usize> = (0..rank).filter(|d| !a.dims.contains(d)).collect();
    let perm: Vec<i64> = a.dims.iter().chain(&others).map(|&d| d as i64).collect();
    let transposed: Vec<i64> = perm.iter().map(|&d| t.sizes[d as usize]).collect();
    let indexed: Vec<i64> = a.dims.iter().map(|&d| t.sizes[d]).collect();
    let rest: Vec<i64> = others.iter().map(|&d| t.sizes[d]).collect();
    let mut flattened = vec![indexed.iter().product()];
    flattened.extend(&rest);
    let mut flat_index = cx.g.full(0.0, DType::I64, &a.shape);
    for (&idx, stride) in a.indices.iter().zip(contiguous_strides(&indexed)) {
        let s = cx.g.full(stride as f64, DType::I64, &a.shape);
        let term = cx.g.binary("stablehlo.multiply", idx, s);
        flat_index = cx.g.binary("stablehlo.add", flat_index, term);
    }
    let mut gathered = a.shape.clone();
    gathered.extend(&rest);
    let (nb, first) = (a.shape.len() as i64, if a.adjacent { a.dims[0] as i64 } else { 0 });
    let nrest = rest.len() as i64;
    let result_perm: Vec<i64> = (nb..nb + first).chain(0..nb).chain(nb + first..nb + nrest).collect();
    Layout { perm, transposed, flattened, flat_index, gathered, result_perm }
}

fn permuted(shape: &[i64], perm: &[i64]) -> Vec<i64> {
    perm.iter().map(|&p| shape[p as usize]).collect()
}

fn inverse(perm: &[i64]) -> Vec<i64> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as i64;
    }
    inv
}

/// `self[indices]` (advanced indexing).
fn index(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let a = advanced(cx, &t)?;
    let l = layout(cx, &t, &a);
    let shape = permuted(&l.gathered, &l.result_perm);
    if shape.contains(&0) || l.flattened[0] == 0 {
        return Ok(vec![cx.g.full(0.0, t.dtype, &shape)]);
    }
    let x = cx.tensor("self")?;
    let x = cx.g.transpose(x, &l.perm);
    let x = cx.g.reshape(x, &l.flattened);
    let r = cx.g.take(x, l.flat_index, 0);
    Ok(vec![cx.g.transpose(r, &l.result_perm)])
}

/// `self[indices] = values` (or `+=` with accumulate, duplicates adding up).
fn index_put(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, vt) = (cx.meta("self")?, cx.meta("values")?);
    if t.dtype != vt.dtype {
        return Err(Error::runtime(format!(
            "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source.",
            t.dtype.torch_name(),
            vt.dtype.torch_name()
        )));
    }
    let a = advanced(cx, &t)?;
    let l = layout(cx, &t, &a);
    let shape = permuted(&l.gathered, &l.result_perm);
    let fits = crate::ir::broadcast_all(&[vt.sizes, &shape]).is_ok_and(|s| s == shape);
    if !fits {
        return Err(Error::runtime(format!(
            "shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result of shape {shape:?}",
            vt.sizes
        )));
    }
    let x = cx.tensor("self")?;
    if shape.contains(&0) || l.flattened[0] == 0 {
        return Ok(vec![x]);
    }
    let values = cx.tensor("values")?;
    let values = cx.g.broadcast_to(values, &shape);
    let values = cx.g.transpose(values, &inverse(&l.result_perm));
    let n: i64 = a.shape.iter().product();
    let mut rows = vec![n];
    rows.extend(&l.flattened[1..]);
    let values = cx.g.reshape(values, &rows);
    let flat_index = cx.g.reshape(l.flat_index, &[n]);
    let x = cx.g.transpose(x, &l.perm);
    let x = cx.g.reshape(x, &l.flattened);
    let combine = cx.bool("accumulate")?.then_some(ReduceKind::Sum);
    let r = cx.g.put(x, flat_index, values, 0, combine);
    let r = cx.g.reshape(r, &l.transposed);
    Ok(vec![cx.g.transpose(r, &inverse(&l.perm))])
}

/// `self` with its elements where `mask` is true replaced, in order, by
/// the leading elements of `source`.
fn masked_scatter(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, m, st) = (cx.meta("self")?, cx.meta("mask")?, cx.meta("source")?);
    if m.dtype != DType::Bool {
        return Err(Error::runtime(format!(
            "masked_scatter_ only supports boolean masks, but got mask with dtype {}",
            m.dtype.torch_name()
        )));
    }
    if t.dtype != st.dtype {
        return Err(Error::runtime(format!(
            "masked_scatter: expected self and source to have same dtypes but got{} and {}",
            t.dtype.torch_name(),
            st.dtype.torch_name()
        )));
    }
    // CPU's kernel names the mask's type CPU<T>Type, where Tensor.expand prints torch.<T>Tensor.
    super::shape::expand_check(&m, t.sizes).map_err(|e| Error {
        message: e
            .message
            .replace(&format!("torch.{}Tensor", m.dtype.torch_name()), &format!("CPU{}Type", m.dtype.torch_name())),
        ..e
    })?;
    let n = t.numel();
    let (x, mask) = (cx.tensor("self")?, cx.tensor("mask")?);
    let mask = cx.g.broadcast_to(mask, t.sizes);
    let (x, mask) = (cx.g.reshape(x, &[n]), cx.g.reshape(mask, &[n]));
    // Each true element's source position: the count of true ones before it.
    let ones = cx.g.convert(mask, DType::I64);
    let upto = scan(cx, &[ones], 0, &[ReduceKind::Sum], |cx, a, b| vec![cx.g.binary("stablehlo.add", b[0], a[0])]);
    let before = cx.g.binary("stablehlo.subtract", upto[0], ones);
    let count = count_true(cx, mask);
    let available = cx.g.full(st.numel() as f64, DType::I64, &[]);
    let short = cx.g.compare("GT", count, available);
    cx.check(short, None, Kind::Runtime, "Number of elements of source < number of ones in mask");
    if st.numel() == 0 || n == 0 {
        return Ok(vec![cx.g.reshape(x, t.sizes)]);
    }
    let last = cx.g.full((st.numel() - 1) as f64, DType::I64, &[n]);
    let at = cx.g.binary("stablehlo.minimum", before, last);
    let source = cx.tensor("source")?;
    let source = cx.g.reshape(source, &[st.numel()]);
    let picked = cx.g.take(source, at, 0);
    let r = cx.g.select(mask, picked, x);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `repeat_interleave(repeats)`'s checks (a 1-D integer tensor): its length
/// and dtype.
fn repeats(cx: &Cx) -> Result<(i64, DType)> {
    let r = cx.meta("repeats")?;
    if r.sizes.len() != 1 {
        return Err(Error::runtime("repeat_interleave only accept 1D vector as repeat"));
    }
    if !r.dtype.is_int() {
        return Err(not_implemented("repeat_interleave_cpu", r.dtype));
    }
    Ok((r.sizes[0], r.dtype))
}

/// The result's length, the repeats' sum, unless `output_size` gives it.
fn repeat_measure(cx: &mut Cx) -> Result<Vec<V>> {
    repeats(cx)?;
    if !cx.is_none("output_size") {
        return Ok(vec![]);
    }
    let r = cx.tensor("repeats")?;
    let r = cx.g.convert(r, DType::I64);
    let total = cx.g.reduce(ReduceKind::Sum, r, &[0]);
    let zero = cx.g.scalar(0.0, DType::I64);
    let total = cx.g.binary("stablehlo.maximum", total, zero);
    Ok(sizes_vector(cx, &[total]))
}

/// Index i repeated `repeats[i]` times: a 1 marked at each repeat's end,
/// summed from the start.
fn repeat_interleave(cx: &mut Cx) -> Result<Vec<V>> {
    let (n, dtype) = repeats(cx)?;
    let given = cx.opt_int("output_size")?;
    let total = given.unwrap_or_else(|| cx.sizes[0]);
    if n == 0 {
        return Ok(vec![cx.g.full(0.0, dtype, &[total])]);
    }
    let reps = cx.tensor("repeats")?;
    let reps = cx.g.convert(reps, DType::I64);
    let zero = cx.g.full(0.0, DType::I64, &[n]);
    let negative = cx.g.compare("LT", reps, zero);
    let any = cx.g.reduce(ReduceKind::Or, negative, &[0]);
    cx.check(any, None, Kind::Runtime, "repeats can not be negative");
    let ends = running_sum(cx, reps);
    if given.is_some() {
        let last = cx.g.slice(ends, &[n - 1], &[n], &[1]);
        let expected = cx.g.full(total as f64, DType::I64, &[1]);
        let differs = cx.g.compare("NE", last, expected);
        let differs = cx.g.reshape(differs, &[]);
        cx.check(differs, None, Kind::Runtime, "allocated size does not match required size");
    }
    let index = counted_up_to(cx, ends, total);
    Ok(vec![cx.g.convert(index, dtype)])
}

/// For each position in [0, n), how many of `positions` (i64[k]) are at or
/// before it: ones scattered at the positions, then a running sum (one at n
/// or past it counts nowhere).
pub(super) fn counted_up_to(cx: &mut Cx, positions: V, n: i64) -> V {
    let k = cx.g.ty(positions).shape[0];
    let zeros = cx.g.full(0.0, DType::I64, &[n + 1]);
    let ones = cx.g.full(1.0, DType::I64, &[k]);
    let marks = cx.g.put(zeros, positions, ones, 0, Some(ReduceKind::Sum));
    let counts = running_sum(cx, marks);
    cx.g.slice_dim(counts, 0, 0, n, 1)
}

/// The inclusive running sum of a 1-D array.
fn running_sum(cx: &mut Cx, x: V) -> V {
    scan(cx, &[x], 0, &[ReduceKind::Sum], |cx, earlier, later| vec![cx.g.binary("stablehlo.add", later[0], earlier[0])])
        [0]
}
