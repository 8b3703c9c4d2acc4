//! Pairwise distances (`cdist`, `pdist`) and their gradients: the p-norm of
//! the difference of two rows, with the special cases (p = 0, 1, 2, inf) and
//! the gradient formulas of CPU's distance kernels. `p` picks the formula,
//! so it is compile-time.
use super::elementwise::{full_like, not_implemented};
use super::{op_consts, Cx, Entry};
use crate::ensure;
use crate::error::Result;
use crate::ir::dtype::DType;
use crate::ir::{broadcast_all, ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op_consts("_cdist_forward", cdist, &["p"]),
    op_consts("_cdist_backward", cdist_backward, &["p"]),
    op_consts("_pdist_forward", pdist, &["p"]),
    op_consts("_pdist_backward", pdist_backward, &["p"]),
];

/// A p-norm of a row difference `d`: the norm of `|d|`, and its gradient
/// with respect to `d`, given the norm's gradient and the norm itself.
#[derive(Clone, Copy)]
pub(super) enum Norm {
    Zero,
    One,
    Two,
    Inf,
    P(f64),
}

impl Norm {
    pub(super) fn of(p: f64) -> Norm {
        if p == 0.0 {
            Norm::Zero
        } else if p == 1.0 {
            Norm::One
        } else if p == 2.0 {
            Norm::Two
        } else if p.is_infinite() {
            Norm::Inf
        } else {
            Norm::P(p)
        }
    }

    /// The norm over the last dimension of `a = |d|`. `drop_nan`: CPU's
    /// scalar loop (cdist) takes the inf-norm with `std::max`, which skips a
    /// NaN; its vectorised loop (pdist) keeps it.
    pub(super) fn reduce(self, cx: &mut Cx, a: V, drop_nan: bool) -> V {
        let last = cx.g.ty(a).rank() - 1;
        let sum = |cx: &mut Cx, x: V| cx.g.reduce(ReduceKind::Sum, x, &[last]);
        match self {
            Norm::Zero => {
                let one = full_like(cx, 1.0, a);
                let c = cx.g.unary("stablehlo.ceil", a);
                let nonzero = cx.g.binary("stablehlo.minimum", c, one);
                sum(cx, nonzero)
            }
            Norm::One => sum(cx, a),
            Norm::Two => {
                let sq = cx.g.binary("stablehlo.multiply", a, a);
                let s = sum(cx, sq);
                cx.g.unary("stablehlo.sqrt", s)
            }
            Norm::Inf => {
                let a = if drop_nan {
                    let nan = cx.g.compare("NE", a, a);
                    let zero = full_like(cx, 0.0, a);
                    cx.g.select(nan, zero, a)
                } else {
                    a
                };
                cx.g.reduce(ReduceKind::Max, a, &[last])
            }
            Norm::P(p) => {
                let pv = full_like(cx, p, a);
                let powered = cx.g.binary("stablehlo.power", a, pv);
                let s = sum(cx, powered);
                let inv = full_like(cx, 1.0 / p, s);
                cx.g.binary("stablehlo.power", s, inv)
            }
        }
    }

    /// d(norm)/d(d) times `grad`, elementwise; `grad` and `dist` are
    /// broadcast to `d`'s shape. The expressions and their order are the
    /// CPU kernel's (`*dist_calc::backward`).
    fn backward(self, cx: &mut Cx, d: V, grad: V, dist: V) -> V {
        let zero = full_like(cx, 0.0, d);
        let mul = |cx: &mut Cx, a: V, b: V| cx.g.binary("stablehlo.multiply", a, b);
        let div = |cx: &mut Cx, a: V, b: V| cx.g.binary("stablehlo.divide", a, b);
        let pow = |cx: &mut Cx, a: V, e: f64| {
            let e = full_like(cx, e, a);
            cx.g.binary("stablehlo.power", a, e)
        };
        let r = match self {
            Norm::Zero => return zero,
            Norm::One => {
                let sign = cx.g.unary("stablehlo.sign", d);
                return mul(cx, grad, sign);
            }
            Norm::Inf => {
                // 1 where |d| is the max: 1 - min(1, ceil(||d| - dist|)).
                let sign = cx.g.unary("stablehlo.sign", d);
                let abs = cx.g.unary("stablehlo.abs", d);
                let one = full_like(cx, 1.0, d);
                let off = cx.g.binary("stablehlo.subtract", abs, dist);
                let off = cx.g.unary("stablehlo.abs", off);
                let off = cx.g.unary("stablehlo.ceil", off);
                let off = cx.g.binary("stablehlo.minimum", one, off);
                let is_max = cx.g.binary("stablehlo.subtract", one, off);
                let r = mul(cx, grad, sign);
                return mul(cx, r, is_max);
            }
            Norm::Two => {
                let r = mul(cx, grad, d);
                div(cx, r, dist)
            }
            Norm::P(p) if p < 2.0 => {
                let sign = cx.g.unary("stablehlo.sign", d);
                let abs = cx.g.unary("stablehlo.abs", d);
                let a = pow(cx, abs, p - 1.0);
                let r = mul(cx, sign, a);
                let r = mul(cx, r, grad);
                let dp = pow(cx, dist, p - 1.0);
                let r = div(cx, r, dp);
                if p < 1.0 {
                    // 0^(p-1) is inf: a zero difference gets no gradient.
                    let flat = cx.g.compare("EQ", d, zero);
                    cx.g.select(flat, zero, r)
                } else {
                    r
                }
            }
            Norm::P(p) => {
                let abs = cx.g.unary("stablehlo.abs", d);
                let a = pow(cx, abs, p - 2.0);
                let r = mul(cx, d, a);
                let r = mul(cx, r, grad);
                let dp = pow(cx, dist, p - 1.0);
                div(cx, r, dp)
            }
        };
        let at_zero = cx.g.compare("EQ", dist, zero);
        cx.g.select(at_zero, zero, r)
    }
}

fn check_p(p: f64, what: &str) -> Result<()> {
    ensure!(p >= 0.0, "{what} only supports non-negative p values");
    Ok(())
}

/// CPU's distance kernels exist for float32 and float64 only.
fn check_dtype(t: &Tensor, kernel: &str) -> Result<()> {
    if matches!(t.dtype, DType::F16 | DType::BF16) {
        return Err(not_implemented(kernel, t.dtype));
    }
    Ok(())
}

/// `x1`, `x2` broadcast over their batch dimensions: (batch, r1, r2, c).
fn cdist_shapes(x1: &Tensor, x2: &Tensor) -> Result<(Vec<i64>, i64, i64, i64)> {
    let (n1, n2) = (x1.sizes.len(), x2.sizes.len());
    let batch = broadcast_all(&[&x1.sizes[..n1 - 2], &x2.sizes[..n2 - 2]])?;
    Ok((batch, x1.sizes[n1 - 2], x2.sizes[n2 - 2], x1.sizes[n1 - 1]))
}

/// The differences `x1[.., i, :] - x2[.., j, :]`, shaped [batch.., r1, r2, c].
fn differences(cx: &mut Cx, x1: V, x2: V, batch: &[i64], r1: i64, r2: i64, c: i64) -> V {
    let n = batch.len() as i64;
    let rows = |r: i64| [batch, &[r, c]].concat();
    let full = [batch, &[r1, r2, c]].concat();
    let keep: Vec<i64> = (0..n).collect();
    let x1 = cx.g.broadcast_to(x1, &rows(r1));
    let x2 = cx.g.broadcast_to(x2, &rows(r2));
    let x1 = cx.g.broadcast_in_dim(x1, &full, &[&keep[..], &[n, n + 2]].concat());
    let x2 = cx.g.broadcast_in_dim(x2, &full, &[&keep[..], &[n + 1, n + 2]].concat());
    cx.g.binary("stablehlo.subtract", x1, x2)
}

fn check_cdist(x1: &Tensor, x2: &Tensor, p: f64) -> Result<()> {
    for (t, name) in [(x1, "X1"), (x2, "X2")] {
        ensure!(t.sizes.len() >= 2, "cdist only supports at least 2D tensors, {name} got: {}D", t.sizes.len());
    }
    let (c1, c2) = (x1.sizes[x1.sizes.len() - 1], x2.sizes[x2.sizes.len() - 1]);
    ensure!(c1 == c2, "X1 and X2 must have the same number of columns. X1: {c1} X2: {c2}");
    for (t, name) in [(x1, "X1"), (x2, "X2")] {
        ensure!(t.dtype.is_float(), "cdist only supports floating-point dtypes, {name} got: {}", t.dtype.torch_name());
    }
    check_p(p, "cdist")?;
    ensure!(x1.dtype == x2.dtype, "expected scalar type {} but found {}", x1.dtype.torch_name(), x2.dtype.torch_name());
    Ok(())
}

fn cdist(cx: &mut Cx) -> Result<Vec<V>> {
    let (t1, t2) = (cx.meta("x1")?, cx.meta("x2")?);
    let p = cx.const_f64("p")?;
    check_cdist(&t1, &t2, p)?;
    let mode = cx.opt_int("compute_mode")?.unwrap_or(0);
    ensure!((0..=2).contains(&mode), "possible modes: 0, 1, 2, but was: {mode}");
    let (batch, r1, r2, c) = cdist_shapes(&t1, &t2)?;
    let shape = [&batch[..], &[r1, r2]].concat();
    if shape.contains(&0) || c == 0 {
        return Ok(vec![cx.g.full(0.0, t1.dtype, &shape)]);
    }
    let (x1, x2) = (cx.tensor("x1")?, cx.tensor("x2")?);
    if p == 2.0 && (mode == 1 || (mode == 0 && (r1 > 25 || r2 > 25))) {
        return Ok(vec![euclidean(cx, x1, x2, &batch, r1, r2, c)]);
    }
    check_dtype(&t1, "cdist")?;
    let d = differences(cx, x1, x2, &batch, r1, r2, c);
    let a = cx.g.unary("stablehlo.abs", d);
    Ok(vec![Norm::of(p).reduce(cx, a, true)])
}

/// `_euclidean_dist`, CPU's matrix-product path for p = 2:
/// `[-2 x1, |x1|², 1] · [x2, 1, |x2|²]ᵀ`, clamped at 0, square-rooted.
fn euclidean(cx: &mut Cx, x1: V, x2: V, batch: &[i64], r1: i64, r2: i64, c: i64) -> V {
    let dtype = cx.g.ty(x1).dtype;
    let ct = crate::ir::dtype::opmath(dtype);
    let side = |cx: &mut Cx, x: V, r: i64, scale: f64, norm_first: bool| {
        let x = cx.g.broadcast_to(x, &[batch, &[r, c]].concat());
        let x = cx.g.convert(x, ct);
        let sq = cx.g.binary("stablehlo.multiply", x, x);
        let last = batch.len() + 1;
        let norm = cx.g.reduce(ReduceKind::Sum, sq, &[last]);
        let norm = cx.g.reshape(norm, &[batch, &[r, 1]].concat());
        let ones = full_like(cx, 1.0, norm);
        let s = full_like(cx, scale, x);
        let x = cx.g.binary("stablehlo.multiply", x, s);
        let parts = if norm_first { [x, norm, ones] } else { [x, ones, norm] };
        cx.g.concatenate(&parts, last)
    };
    let a = side(cx, x1, r1, -2.0, true);
    let b = side(cx, x2, r2, 1.0, false);
    let n = batch.len() as i64;
    let perm: Vec<i64> = (0..n).chain([n + 1, n]).collect();
    let b = cx.g.transpose(b, &perm);
    let prod = cx.g.matmul(a, b, cx.precision);
    let zero = full_like(cx, 0.0, prod);
    let clamped = cx.g.binary("stablehlo.maximum", prod, zero);
    let r = cx.g.unary("stablehlo.sqrt", clamped);
    cx.g.convert(r, dtype)
}

/// The gradient of `_cdist_forward` for x1 (autograd calls it with the
/// operands swapped for x2), shaped as x1 broadcast to the batch.
fn cdist_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (t1, t2) = (cx.meta("x1")?, cx.meta("x2")?);
    let p = cx.const_f64("p")?;
    let (batch, r1, r2, c) = cdist_shapes(&t1, &t2)?;
    let shape = [&batch[..], &[r1, c]].concat();
    if r1 == 0 || r2 == 0 || c == 0 || batch.contains(&0) {
        return Ok(vec![cx.g.full(0.0, t1.dtype, t1.sizes)]);
    }
    let (x1, x2) = (cx.tensor("x1")?, cx.tensor("x2")?);
    let grad = cx.tensor("grad_output")?;
    let dist = cx.tensor("cdist")?;
    let d = differences(cx, x1, x2, &batch, r1, r2, c);
    let full = cx.g.ty(d).shape.clone();
    let n = batch.len() as i64;
    let pair: Vec<i64> = (0..n + 2).collect();
    let grad = cx.g.broadcast_in_dim(grad, &full, &pair);
    let dist = cx.g.broadcast_in_dim(dist, &full, &pair);
    let g = Norm::of(p).backward(cx, d, grad, dist);
    let g = cx.g.reduce(ReduceKind::Sum, g, &[batch.len() + 1]);
    Ok(vec![cx.g.reshape(g, &shape)])
}

/// The rows of each pair `i < j` in pdist's order (row-major).
fn pairs(n: i64) -> (Vec<f64>, Vec<f64>) {
    (0..n).flat_map(|i| (i + 1..n).map(move |j| (i as f64, j as f64))).unzip()
}

/// `x[i] - x[j]` for each pair, [pairs, c], and the pairs' row indices.
fn pair_differences(cx: &mut Cx, n: i64) -> Result<(V, V, V)> {
    let (i, j) = pairs(n);
    let x = cx.tensor("self")?;
    let (i, j) = (cx.g.constant(&i, DType::I64), cx.g.constant(&j, DType::I64));
    let xi = cx.g.take(x, i, 0);
    let xj = cx.g.take(x, j, 0);
    Ok((cx.g.binary("stablehlo.subtract", xi, xj), i, j))
}

fn check_pdist(t: &Tensor, p: f64, what: &str) -> Result<()> {
    ensure!(t.sizes.len() == 2, "pdist only supports 2D tensors, got: {}D", t.sizes.len());
    ensure!(t.dtype.is_float(), "pdist only supports floating-point dtypes");
    check_p(p, "pdist")?;
    ensure!(t.view().is_contiguous(), "{what} requires contiguous input");
    Ok(())
}

fn pdist(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let p = cx.const_f64("p")?;
    check_pdist(&t, p, "_pdist_forward")?;
    let (n, c) = (t.sizes[0], t.sizes[1]);
    let count = if n <= 1 { 0 } else { n * (n - 1) / 2 };
    if count == 0 || c == 0 {
        return Ok(vec![cx.g.full(0.0, t.dtype, &[count])]);
    }
    check_dtype(&t, "pdist")?;
    let (d, _, _) = pair_differences(cx, n)?;
    let a = cx.g.unary("stablehlo.abs", d);
    Ok(vec![Norm::of(p).reduce(cx, a, false)])
}

/// Each pair's gradient is added to row i and subtracted from row j.
fn pdist_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let p = cx.const_f64("p")?;
    check_pdist(&t, p, "_pdist_backward")?;
    let (n, c) = (t.sizes[0], t.sizes[1]);
    check_dtype(&t, "pdist")?;
    let zeros = cx.g.full(0.0, t.dtype, t.sizes);
    if n <= 1 || c == 0 {
        return Ok(vec![zeros]);
    }
    let (d, i, j) = pair_differences(cx, n)?;
    let full = cx.g.ty(d).shape.clone();
    let grad = cx.tensor("grad_output")?;
    let dist = cx.tensor("pdist")?;
    let grad = cx.g.broadcast_in_dim(grad, &full, &[0]);
    let dist = cx.g.broadcast_in_dim(dist, &full, &[0]);
    let g = Norm::of(p).backward(cx, d, grad, dist);
    let r = cx.g.put(zeros, i, g, 0, Some(ReduceKind::Sum));
    let neg = cx.g.unary("stablehlo.negate", g);
    Ok(vec![cx.g.put(r, j, neg, 0, Some(ReduceKind::Sum))])
}

#[cfg(test)]
mod tests {
    use super::pairs;

    #[test]
    fn pairs_are_in_row_major_order() {
        assert_eq!(pairs(3), (vec![0.0, 0.0, 1.0], vec![1.0, 2.0, 2.0]));
        assert_eq!(pairs(1), (vec![], vec![]));
    }
}
