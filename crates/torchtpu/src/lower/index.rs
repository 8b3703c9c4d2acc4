//! Indexing operators. Out-of-range indices raise IndexError, as on CPU.
use super::{op, wrap_dim, Cx, Entry};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[op("index_select", index_select)];

/// Indices as i64 with negatives wrapped, plus an IndexError check of range.
pub fn checked_indices(cx: &mut Cx, idx: V, size: i64, message: String) -> V {
    let ty = cx.g.ty(idx).clone();
    let idx = cx.g.convert(idx, DType::I64);
    let zero = cx.g.full(0.0, DType::I64, &ty.shape);
    let n = cx.g.full(size as f64, DType::I64, &ty.shape);
    let neg = cx.g.compare("LT", idx, zero);
    let shifted = cx.g.binary("stablehlo.add", idx, n);
    let idx = cx.g.select(neg, shifted, idx);
    let low = cx.g.compare("LT", idx, zero);
    let high = cx.g.compare("GE", idx, n);
    let bad = cx.g.binary("stablehlo.or", low, high);
    let dims: Vec<usize> = (0..ty.rank()).collect();
    let any = cx.g.reduce(ReduceKind::Or, bad, &dims);
    cx.check(any, message);
    idx
}

fn index_select(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let it = cx.meta("index")?;
    if it.sizes.len() > 1 {
        return Err(Error::index("index_select(): Index is supposed to be a vector"));
    }
    if !matches!(it.dtype, DType::I64 | DType::I32) {
        return Err(Error::runtime("index_select(): Expected dtype int32 or int64 for index"));
    }
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let x = cx.tensor("self")?;
    let idx = cx.tensor("index")?;
    let idx = cx.g.reshape(idx, &[it.numel()]);
    if t.sizes.is_empty() {
        let idx = checked_indices(cx, idx, 1, "index_select(): Index out of range in self".into());
        let x = cx.g.reshape(x, &[1]);
        let r = cx.g.take(x, idx, 0);
        return Ok(vec![cx.g.reshape(r, &[])]);
    }
    let idx = checked_indices(cx, idx, t.sizes[dim], "index out of range in self".into());
    Ok(vec![cx.g.take(x, idx, dim)])
}
