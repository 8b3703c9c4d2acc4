//! Factories and fills: `fill_`/`zero_` (behind zeros/ones/full), `arange`,
//! `linspace`, `logspace`, `eye`, `kaiser_window`.
use super::bessel::{self, Bessel};
use super::elementwise::no_bool;
use super::linalg::diagonal_mask;
use super::{op, op_complex, op_consts, rules, Cx, Entry};
use crate::ensure;
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[
    op_complex("fill", fill).ruled(rules::value_fits),
    op_complex("zero", zero),
    op("_efficientzerotensor", efficient_zero),
    op_consts("arange", arange, &["start", "end", "step"]),
    op_consts("linspace", |cx| spaced(cx, false), &["start", "end"]),
    op_consts("logspace", |cx| spaced(cx, true), &["start", "end", "base"]),
    op("eye", eye),
    op("kaiser_window", kaiser_window),
    op("tril_indices", |cx| triangle_indices(cx, true)),
    op("triu_indices", |cx| triangle_indices(cx, false)),
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
        return Err(Error::runtime("upper bound and lower bound inconsistent with step sign"));
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

/// linspace's `steps` points from start to end, as CPU computes them: the
/// first half counted up from start, the rest down from end (in float32 for
/// half types, float64 for integers); logspace raises `base` to them, in
/// float64.
fn spaced(cx: &mut Cx, log: bool) -> Result<Vec<V>> {
    let out = cx.meta("out")?;
    let (start, end, steps) = (cx.const_f64("start")?, cx.const_f64("end")?, cx.int("steps")?);
    ensure!(steps >= 0, "number of steps must be non-negative");
    if steps > 1 {
        // One step is a fill, with no kernel to refuse bool.
        no_bool(out.dtype, if log { "logspace_cpu" } else { "linspace_cpu" })?;
    }
    let ct = if out.dtype.is_float() { opmath(out.dtype) } else { DType::F64 };
    // The kernel converts start and end to the result's type first.
    let typed = |v: f64| if out.dtype.is_float() { v } else { v.trunc() };
    let (start, end) = (typed(start), typed(end));
    let n = [steps];
    let points = if steps == 1 {
        cx.g.full(start, ct, &n)
    } else {
        let step = (end - start) / (steps - 1) as f64;
        let step = if ct == DType::F32 { step as f32 as f64 } else { step };
        let idx = cx.g.iota(ct, &n, 0);
        let step = cx.g.full(step, ct, &n);
        let up = cx.g.binary("stablehlo.multiply", step, idx);
        let first = cx.g.full(start, ct, &n);
        let up = cx.g.binary("stablehlo.add", first, up);
        let last = cx.g.full((steps - 1) as f64, ct, &n);
        let left = cx.g.binary("stablehlo.subtract", last, idx);
        let down = cx.g.binary("stablehlo.multiply", step, left);
        let end = cx.g.full(end, ct, &n);
        let down = cx.g.binary("stablehlo.subtract", end, down);
        let halfway = cx.g.full((steps / 2) as f64, ct, &n);
        let lower = cx.g.compare("LT", idx, halfway);
        cx.g.select(lower, up, down)
    };
    let r = if log {
        let exponent = cx.g.convert(points, DType::F64);
        let base = cx.g.full(cx.const_f64("base")?, DType::F64, &n);
        cx.g.binary("stablehlo.power", base, exponent)
    } else {
        points
    };
    Ok(vec![cx.g.convert(r, out.dtype)])
}

/// CPU's Kaiser window: i0(beta * sqrt(|1 - ((i - a) / a)^2|)) / i0(beta)
/// over i in 0..n, a = (n - 1) / 2, n one longer where `periodic` (and its
/// last point dropped); the indices are first made in the window's dtype.
/// `periodic` defaults to true and `beta` to 12.
fn kaiser_window(cx: &mut Cx) -> Result<Vec<V>> {
    let given = cx.int("window_length")?;
    let dtype = cx.dtype("dtype")?.unwrap_or(crate::ir::dtype::DEFAULT_FLOAT);
    ensure!(given >= 0, "kaiser_window requires non-negative window_length, got window_length={given}");
    ensure!(
        dtype.is_float(),
        "kaiser_window expects floating point dtypes, got: TensorOptions(dtype={}, device=tpu:{}, layout=Strided (default), requires_grad=false (default), pinned_memory=false, memory_format=(nullopt))",
        super::elementwise::cpp_name(dtype),
        cx.device
    );
    if given <= 1 {
        return Ok(vec![cx.g.full(1.0, dtype, &[given])]);
    }
    let periodic = !cx.has("periodic") || cx.int("periodic")? != 0;
    let n = if periodic { given + 1 } else { given };
    let ct = opmath(dtype);
    let i = cx.g.iota(dtype, &[n], 0);
    let i = cx.g.convert(i, ct);
    let alpha = cx.g.full((n - 1) as f64 / 2.0, ct, &[n]);
    let one = cx.g.full(1.0, ct, &[n]);
    let d = cx.g.binary("stablehlo.subtract", i, alpha);
    let d = cx.g.binary("stablehlo.divide", d, alpha);
    let d2 = cx.g.binary("stablehlo.multiply", d, d);
    let r = cx.g.binary("stablehlo.subtract", one, d2);
    let r = cx.g.unary("stablehlo.abs", r);
    let r = cx.g.unary("stablehlo.sqrt", r);
    let beta = match cx.has("beta") {
        true => cx.scalar_like("beta", ct, &[n])?.expect("beta"),
        false => cx.g.full(12.0, ct, &[n]),
    };
    let r = cx.g.binary("stablehlo.multiply", beta, r);
    let num = bessel::of(cx, r, Bessel::I0);
    let den = bessel::of(cx, beta, Bessel::I0);
    let w = cx.g.binary("stablehlo.divide", num, den);
    let w = cx.g.slice(w, &[0], &[given], &[1]);
    Ok(vec![cx.g.convert(w, dtype)])
}

/// The [2, k] coordinates of a row x col matrix's lower (`tril_indices`) or
/// upper triangle, row by row as CPU lists them. Each row's span is known
/// here; on the device, each position finds its row by the marked ends of
/// the rows before it, and its column from its offset in that row.
fn triangle_indices(cx: &mut Cx, lower: bool) -> Result<Vec<V>> {
    let (row, col, offset) = (cx.int("row")?, cx.int("col")?, cx.int("offset")?);
    ensure!(row >= 0, "row must be non-negative, got{row}");
    ensure!(col >= 0, "col must be non-negative, got{col}");
    let dtype = cx.dtype("dtype")?.unwrap_or(DType::I64);
    let name = if lower { "tril_indices" } else { "triu_indices" };
    if !matches!(dtype, DType::I32 | DType::I64) {
        return Err(super::elementwise::not_implemented(name, dtype));
    }
    // Each row's first column and count.
    let spans: Vec<(i64, i64)> = (0..row)
        .map(|r| {
            if lower {
                (0, (r + offset + 1).clamp(0, col))
            } else {
                let first = (r + offset).max(0);
                (first, (col - first).max(0))
            }
        })
        .collect();
    let total: i64 = spans.iter().map(|s| s.1).sum();
    if total == 0 {
        return Ok(vec![cx.g.full(0.0, dtype, &[2, 0])]);
    }
    let mut ends = Vec::with_capacity(spans.len());
    let mut starts = Vec::with_capacity(spans.len());
    let mut at = 0;
    for &(_, n) in &spans {
        starts.push(at as f64);
        at += n;
        ends.push(at as f64);
    }
    let firsts: Vec<f64> = spans.iter().map(|s| s.0 as f64).collect();
    let ends = cx.g.constant(&ends, DType::I64);
    let rows = super::index::counted_up_to(cx, ends, total);
    let starts = cx.g.constant(&starts, DType::I64);
    let firsts = cx.g.constant(&firsts, DType::I64);
    let start = cx.g.take(starts, rows, 0);
    let first = cx.g.take(firsts, rows, 0);
    let position = cx.g.iota(DType::I64, &[total], 0);
    let cols = cx.g.binary("stablehlo.subtract", position, start);
    let cols = cx.g.binary("stablehlo.add", cols, first);
    let rows = cx.g.reshape(rows, &[1, total]);
    let cols = cx.g.reshape(cols, &[1, total]);
    let r = cx.g.concatenate(&[rows, cols], 0);
    Ok(vec![cx.g.convert(r, dtype)])
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
