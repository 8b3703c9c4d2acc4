//! Indexing operators. Out-of-range indices raise CPU's exception and
//! message after the program ran.
use super::elementwise::{cpp_name, opmath};
use super::{op, wrap_dim, Cx, Entry};
use crate::args::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Kind, Result};
use crate::ir::{ReduceKind, V};
use crate::view::contiguous_strides;

pub static ENTRIES: &[Entry] = &[
    op("index_select", index_select),
    op("index_add", index_add),
    op("gather", gather),
    op("scatter", |cx| scatter(cx, "scatter")),
    op("scatter_add", |cx| scatter(cx, "scatter_add")),
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
        let idx = checked_indices(cx, idx, 1, true, Kind::Index, "index_select(): Index out of range in self".into());
        let x = cx.g.reshape(x, &[1]);
        let r = cx.g.take(x, idx, 0);
        return Ok(vec![cx.g.reshape(r, &[])]);
    }
    let idx = checked_indices(cx, idx, t.sizes[dim], true, Kind::Index, "index out of range in self".into());
    Ok(vec![cx.g.take(x, idx, dim)])
}

/// `self` with `alpha * source` slices added at `index` along `dim`.
fn index_add(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, it, st) = (cx.meta("self")?, cx.meta("index")?, cx.meta("source")?);
    if it.sizes.len() > 1 {
        return Err(Error::index(format!(
            "index_add_(): Index is supposed to be a vector, but got dim: {} with type: {} and size: {:?}",
            it.sizes.len(),
            it.dtype.torch_name(),
            it.sizes
        )));
    }
    if !is_index_dtype(it.dtype) {
        return Err(Error::runtime(format!(
            "index_add_(): Expected dtype int32/int64 for index but got: {}",
            it.dtype.torch_name()
        )));
    }
    if t.dtype != st.dtype {
        return Err(Error::runtime(format!(
            "index_add_(): self ({}) and source ({}) must have the same scalar type",
            t.dtype.torch_name(),
            st.dtype.torch_name()
        )));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    // 0-dim tensors act as vectors of one element.
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
        return Err(Error::index(format!(
            "index_add_(): Number of indices ({}) should be equal to source.size(dim): ({}), for dim: {dim}",
            it.numel(),
            ssizes[dim]
        )));
    }
    let ct = opmath(t.dtype);
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &sizes);
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    let idx = checked_indices(cx, idx, sizes[dim], false, Kind::Runtime, out_of_bounds(dim, sizes[dim]));
    let src = cx.tensor("source")?;
    let src = cx.g.reshape(src, &ssizes);
    let src = cx.g.convert(src, ct);
    let alpha = cx.scalar_like("alpha", ct, &ssizes)?.expect("alpha");
    let src = cx.g.binary("stablehlo.multiply", src, alpha);
    let src = cx.g.convert(src, t.dtype);
    let r = cx.g.put(x, idx, src, dim, true);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// A tensor's sizes with 0-dim tensors read as one element vectors.
fn as_vector(t: &Tensor) -> Vec<i64> {
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
/// scatter_add: `out[p with index[p] along dim] = src[p]` (or `+=`).
fn scatter(cx: &mut Cx, what: &str) -> Result<Vec<V>> {
    let (t, it) = (cx.meta("self")?, cx.meta("index")?);
    let add = match cx.has("reduce").then(|| cx.str("reduce")).transpose()? {
        None => what == "scatter_add",
        Some("add") => true,
        Some("multiply") => {
            return Err(Error::not_implemented("torchtpu: scatter with reduce='multiply' is not supported on tpu"))
        }
        Some(_) => return Err(Error::runtime("reduce argument must be either add or multiply.")),
    };
    let x = cx.tensor("self")?;
    // CPU checks nothing more of an empty index.
    if it.numel() == 0 {
        return Ok(vec![x]);
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
    let updates = cx.g.reshape(updates, &[it.numel()]);
    let x = cx.g.reshape(x, &[t.numel()]);
    let r = cx.g.put(x, pos, updates, 0, add);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}
