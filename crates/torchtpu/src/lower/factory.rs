//! Factories and fills: `fill_`/`zero_` (behind zeros/ones/full), `arange`, `eye`.
use super::elementwise::no_bool;
use super::linalg::diagonal_mask;
use super::{op, op_complex, op_consts, Cx, Entry};
use crate::ensure;
use crate::error::{Error, Result};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[
    op_complex("fill", fill),
    op_complex("zero", zero),
    op("_efficientzerotensor", efficient_zero),
    op_consts("arange", arange, &["start", "end", "step"]),
    op("eye", eye),
];

fn fill(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let v = cx.operand("value")?;
    if cx.g.ty(v.v).rank() != 0 {
        return Err(Error::runtime(format!(
            "fill_ only supports 0-dimension value tensor but got tensor with {} dimensions.",
            cx.g.ty(v.v).rank()
        )));
    }
    let x = cx.g.convert(v.v, t.dtype);
    Ok(vec![cx.g.broadcast_in_dim(x, t.sizes, &[])])
}

fn zero(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    Ok(vec![cx.g.full(0.0, t.dtype, t.sizes)])
}

/// The zero tensors autograd makes for gradients known to be zero (a plain
/// zero-filled tensor here).
fn efficient_zero(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = cx.dtype("dtype")?.unwrap_or(crate::ir::dtype::DEFAULT_FLOAT);
    Ok(vec![cx.g.full(0.0, dtype, &cx.ints("size")?)])
}

/// `start + i * step`, computed like PyTorch's CPU kernel (in double for
/// floating outputs) and sized from the preallocated `out`.
fn arange(cx: &mut Cx) -> Result<Vec<V>> {
    let out = cx.meta("out")?;
    let start = if cx.has("start") { cx.const_f64("start")? } else { 0.0 };
    let end = cx.const_f64("end")?;
    let step = if cx.has("step") { cx.const_f64("step")? } else { 1.0 };
    if step == 0.0 {
        return Err(Error::runtime("step must be nonzero"));
    }
    if !(step > 0.0 && end >= start || step < 0.0 && end <= start) {
        return Err(Error::runtime("upper bound and larger bound inconsistent with step sign"));
    }
    no_bool(out.dtype, "arange_cpu")?;
    let n = ((end - start) / step).ceil() as i64;
    let acc = if out.dtype.is_float() { crate::ir::dtype::DType::F64 } else { crate::ir::dtype::DType::I64 };
    let i = cx.g.iota(acc, &[n], 0);
    let s = cx.g.full(step, acc, &[n]);
    let b = cx.g.full(start, acc, &[n]);
    let r = cx.g.binary("stablehlo.multiply", i, s);
    let r = cx.g.binary("stablehlo.add", r, b);
    Ok(vec![cx.g.convert(r, out.dtype)])
}

/// The n x m identity (`eye(n)`: n x n), in out's dtype.
fn eye(cx: &mut Cx) -> Result<Vec<V>> {
    let out = cx.meta("out")?;
    let n = cx.int("n")?;
    let m = if cx.has("m") { cx.int("m")? } else { n };
    ensure!(n >= 0, "n must be greater or equal to 0, got {n}");
    ensure!(m >= 0, "m must be greater or equal to 0, got {m}");
    let diagonal = diagonal_mask(&mut cx.g, &[n, m]);
    Ok(vec![cx.g.convert(diagonal, out.dtype)])
}
