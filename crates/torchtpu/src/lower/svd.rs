//! The singular value decomposition (`_linalg_svd`, behind `linalg.svd`,
//! `svdvals`, `pinv`, `matrix_rank`, `cond` and the spectral and nuclear
//! norms) as JAX computes it on TPUs (Nakatsukasa and Higham, "Stable and
//! efficient spectral divide and conquer algorithms for the symmetric
//! eigenvalue decomposition and the SVD", 2013): the polar decomposition
//! A = U_p H by QR-based dynamically weighted Halley iterations (QDWH), the
//! eigendecomposition of the symmetric H = V Σ Vᵀ (XLA's Jacobi "Eigh"), and
//! U = U_p V. XLA has no SVD of its own (JAX calls LAPACK on CPUs and
//! cuSOLVER on GPUs); products, QR, Cholesky and eigh it expands everywhere.
//!
//! The iteration's weights depend only on the dtype's epsilon: it must take
//! singular values from eps·‖A‖ up to 1, so they are computed here, and its
//! fixed steps (4 for float32, 6 for float64) converge for every matrix of a
//! condition number below 1/eps. Smaller singular values (a rank-deficient
//! matrix) leave U_p short of unitary, and U is then orthonormalized by a QR
//! factorization, as JAX does. Singular vectors are unique up to sign (and
//! to a rotation within a repeated singular value): these and LAPACK's
//! differ there, as CUDA's do. Past order 64 (min(m, n)), XLA's Jacobi
//! sweeps cost more than LAPACK on the host: those take the counted CPU
//! fallback (`factor::check_jacobi_order`).
use super::factor::{block, check_jacobi_order, eye, qr_factors, splat, split, symmetric_eigen, transpose, with};
use super::linalg::{check_floating, diagonal_mask, lapack_dtype};
use super::{op, Cx, Entry};
use crate::ensure;
use crate::error::{Kind, Result};
use crate::ir::dtype::DType;
use crate::ir::{Graph, Precision, ReduceKind, V};

pub static ENTRIES: &[Entry] = &[op("_linalg_svd", svd)];

/// A step whose weight c is above this solves through a QR factorization
/// (stable for the first, ill-conditioned iterates), the others through a
/// Cholesky factorization (half the work).
const CHOLESKY_CUTOFF: f64 = 100.0;

/// Rows past this many times the columns are reduced to R's square first.
const TALL: f64 = 1.15;

fn svd(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("A")?;
    ensure!(t.sizes.len() >= 2, "linalg.svd: The input tensor A must have at least 2 dimensions.");
    check_floating(&t, "linalg.svd")?;
    // CPU refuses a driver; tpu accepts CUDA's names, as libraries written
    // for CUDA pass them (the result is the same).
    if !cx.is_none("driver") {
        let driver = cx.str("driver")?;
        ensure!(
            matches!(driver, "gesvd" | "gesvdj" | "gesvda"),
            "torch.linalg.svd: unknown svd driver {driver} in svd_cusolver computation. Check doc at https://pytorch.org/docs/stable/generated/torch.linalg.svd.html"
        );
    }
    let (full, compute_uv) = (cx.bool("full_matrices")?, cx.bool("compute_uv")?);
    let (batch, m, n) = split(t.sizes);
    let k = m.min(n);
    // CPU returns empty inputs before dispatching on the dtype.
    if t.numel() > 0 {
        lapack_dtype(&t, "linalg_svd_cpu")?;
        check_jacobi_order(k, "_linalg_svd")?;
    }
    let a = cx.tensor("A")?;
    let g = &mut cx.g;
    let (u, s, vh) = if t.numel() == 0 {
        // CPU: the identity's leading columns are an empty matrix's SVD.
        let (u_cols, vh_rows) = if full { (m, n) } else { (k, k) };
        let s = g.full(0.0, t.dtype, &with(&batch, &[k]));
        (eye(g, t.dtype, &batch, m, u_cols), s, eye(g, t.dtype, &batch, vh_rows, n))
    } else {
        let (u, s, v) = decompose(g, a, full);
        (u, s, transpose(g, v))
    };
    if batch.is_empty() {
        // CPU checks a single matrix's LAPACK status (a batch's element of
        // non-finite values comes out NaN).
        let zero = g.full(0.0, t.dtype, t.sizes);
        let difference = g.binary("stablehlo.subtract", a, a);
        let finite = g.compare("EQ", difference, zero);
        let bad = g.unary("stablehlo.not", finite);
        cx.check_any(
            bad,
            Kind::LinAlg,
            "linalg.svd: The algorithm failed to converge because the input matrix contained non-finite values.",
        );
    }
    if !compute_uv {
        let empty = cx.g.full(0.0, t.dtype, &[0]);
        return Ok(vec![empty, s, empty]);
    }
    Ok(vec![u, s, vh])
}

/// U (m x k), the singular values descending (k) and V (n x k) of each
/// m x n matrix, k = min(m, n); U and V square when `full`.
pub(super) fn decompose(g: &mut Graph, a: V, full: bool) -> (V, V, V) {
    let (_, m, n) = split(&g.ty(a).shape);
    if m >= n {
        return tall(g, a, full);
    }
    // Aᵀ = U' Σ V'ᵀ, so A = V' Σ U'ᵀ.
    let at = transpose(g, a);
    let (u, s, v) = tall(g, at, full);
    (v, s, u)
}

/// [`decompose`] of m x n matrices, m >= n.
fn tall(g: &mut Graph, a: V, full: bool) -> (V, V, V) {
    let (_, m, n) = split(&g.ty(a).shape);
    let (q, square) = if m > n && (full || m as f64 > TALL * n as f64) {
        let (q, r) = qr_factors(g, a, full);
        (Some(q), block(g, r, (0, n), (0, n)))
    } else {
        (None, a)
    };
    let (polar, h) = polar(g, square);
    let (vectors, values) = symmetric_eigen(g, h, true);
    // Descending singular values (a rounding below zero clamped), equal ones
    // in eigh's order: a zero matrix's vectors are the identity, as LAPACK's.
    let shape = g.ty(vectors).shape.clone();
    let r = shape.len() - 1;
    let mut dims: Vec<i64> = (0..r as i64 - 1).collect();
    dims.push(r as i64);
    let keys = g.broadcast_in_dim(values, &shape, &dims);
    let v = g.sort(&[keys, vectors], r, true, 1)[1];
    let values = g.sort(&[values], r - 1, true, 1)[0];
    let zeros = splat(g, 0.0, values);
    let s = g.binary("stablehlo.maximum", values, zeros);
    let u = g.matmul(polar, v, Precision::Highest);
    let u = orthonormalized(g, u, s);
    let u = match q {
        None => u,
        Some(q) if full => {
            let (head, tail) = (block(g, q, (0, m), (0, n)), block(g, q, (0, m), (n, m)));
            let head = g.matmul(head, u, Precision::Highest);
            g.concatenate(&[head, tail], r)
        }
        Some(q) => g.matmul(q, u, Precision::Highest),
    };
    (u, s, v)
}

/// The polar decomposition A = U H of each m x n matrix (m >= n): U with
/// orthonormal columns, H symmetric positive semi-definite.
fn polar(g: &mut Graph, a: V) -> (V, V) {
    let ty = g.ty(a).clone();
    let r = ty.rank();
    // Scaled by 1/√(‖A‖₁‖A‖∞) <= 1/‖A‖₂, the singular values lie in (0, 1].
    let abs = g.unary("stablehlo.abs", a);
    let columns = g.reduce(ReduceKind::Sum, abs, &[r - 2]);
    let one_norm = g.reduce(ReduceKind::Max, columns, &[r - 2]);
    let rows = g.reduce(ReduceKind::Sum, abs, &[r - 1]);
    let inf_norm = g.reduce(ReduceKind::Max, rows, &[r - 2]);
    let product = g.binary("stablehlo.multiply", one_norm, inf_norm);
    let scale = g.unary("stablehlo.rsqrt", product);
    let (zero, one) = (splat(g, 0.0, product), splat(g, 1.0, product));
    let is_zero = g.compare("EQ", product, zero);
    let scale = g.select(is_zero, one, scale);
    let scale = g.broadcast_in_dim(scale, &ty.shape, &(0..r as i64 - 2).collect::<Vec<_>>());
    let mut u = g.binary("stablehlo.multiply", a, scale);

    let eps = if ty.dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
    let steps = weights(eps);
    let (by_qr, by_cholesky): (Vec<_>, Vec<_>) = steps.iter().partition(|w| w.2 > CHOLESKY_CUTOFF);
    u = iterate(g, u, &by_qr, qr_step);
    u = iterate(g, u, &by_cholesky, cholesky_step);

    // One Newton-Schulz step for the last ulps: U (3 I - UᵀU) / 2.
    let ut = transpose(g, u);
    let gram = g.matmul(ut, u, Precision::Highest);
    let correction = g.matmul(u, gram, Precision::Highest);
    let u = axpby(g, 1.5, u, -0.5, correction);
    let ut = transpose(g, u);
    let h = g.matmul(ut, a, Precision::Highest);
    let ht = transpose(g, h);
    let h = axpby(g, 0.5, h, 0.5, ht);
    (u, h)
}

/// The weights (a, b, c) of each step, which takes singular values in
/// [l, 1] to [l', 1] (the paper's equations 3.3-3.5), from l = eps until l
/// is 1 within 5 eps.
fn weights(eps: f64) -> Vec<(f64, f64, f64)> {
    let (mut l, mut out) = (eps, vec![]);
    while l + 5.0 * eps < 1.0 {
        let l2 = l * l;
        let d = (4.0 * (1.0 / l2 - 1.0) / l2).cbrt();
        let sqd = (1.0 + d).sqrt();
        let a = sqd + (2.0 - d + 2.0 * (2.0 - l2) / (l2 * sqd)).sqrt();
        let b = (a - 1.0) * (a - 1.0) / 4.0;
        let c = a + b - 1.0;
        l = l * (a + b * l2) / (1.0 + c * l2);
        out.push((a, b, c));
    }
    out
}

/// `u` after one `step` per weights, in a loop over the weights.
fn iterate(g: &mut Graph, u: V, weights: &[&(f64, f64, f64)], step: fn(&mut Graph, V, [V; 3]) -> V) -> V {
    if weights.is_empty() {
        return u;
    }
    let (a, b, c): (Vec<f64>, Vec<f64>, Vec<f64>) = (
        weights.iter().map(|w| w.0).collect(),
        weights.iter().map(|w| w.1).collect(),
        weights.iter().map(|w| w.2).collect(),
    );
    let trips = g.scalar(weights.len() as f64, DType::I32);
    let out = g.counted_loop(trips, &[u], |g, trip, values| {
        let dtype = g.ty(values[0]).dtype;
        let mut pick = |table: &[f64]| {
            let table = g.constant(table, dtype);
            let one = g.dynamic_slice(table, &[trip], &[1]);
            g.reshape(one, &[])
        };
        let abc = [pick(&a), pick(&b), pick(&c)];
        vec![step(g, values[0], abc)]
    });
    out[0]
}

/// One step through a QR factorization: with [√c U; I] = [Q₁; Q₂] R,
/// U ← (b/c) U + (a - b/c)/√c Q₁ Q₂ᵀ.
fn qr_step(g: &mut Graph, u: V, [a, b, c]: [V; 3]) -> V {
    let ty = g.ty(u).clone();
    let (batch, m, n) = split(&ty.shape);
    let root = g.unary("stablehlo.sqrt", c);
    let scaled = times(g, root, u);
    let identity = eye(g, ty.dtype, &batch, n, n);
    let stacked = g.concatenate(&[scaled, identity], batch.len());
    let (q, _) = qr_factors(g, stacked, false);
    let (q1, q2) = (block(g, q, (0, m), (0, n)), block(g, q, (m, m + n), (0, n)));
    let q2t = transpose(g, q2);
    let product = g.matmul(q1, q2t, Precision::Highest);
    let e = g.binary("stablehlo.divide", b, c);
    let rest = g.binary("stablehlo.subtract", a, e);
    let rest = g.binary("stablehlo.divide", rest, root);
    let first = times(g, e, u);
    let second = times(g, rest, product);
    g.binary("stablehlo.add", first, second)
}

/// One step through a Cholesky factorization: with c UᵀU + I = L Lᵀ,
/// U ← (b/c) U + (a - b/c) U L⁻ᵀ L⁻¹.
fn cholesky_step(g: &mut Graph, u: V, [a, b, c]: [V; 3]) -> V {
    let ty = g.ty(u).clone();
    let (batch, _, n) = split(&ty.shape);
    let ut = transpose(g, u);
    let gram = g.matmul(ut, u, Precision::Highest);
    let gram = times(g, c, gram);
    let identity = eye(g, ty.dtype, &batch, n, n);
    let x = g.binary("stablehlo.add", gram, identity);
    let l = g.cholesky(x, true);
    let w = g.triangular_solve(l, u, false, true, false, true);
    let z = g.triangular_solve(l, w, false, true, false, false);
    let e = g.binary("stablehlo.divide", b, c);
    let rest = g.binary("stablehlo.subtract", a, e);
    let first = times(g, e, u);
    let second = times(g, rest, z);
    g.binary("stablehlo.add", first, second)
}

/// `u` (m x n, columns for singular values `s` descending) with its columns
/// orthonormalized where the matrix is rank-deficient (its smallest singular
/// value at most n eps times its largest): the columns of singular values
/// the iteration did not bring to 1 are then short of unit length. A QR
/// factorization keeps the others (signed as they were) and completes them.
/// It runs only when some matrix of the batch needs it.
fn orthonormalized(g: &mut Graph, u: V, s: V) -> V {
    let ty = g.ty(u).clone();
    let (batch, _, n) = split(&ty.shape);
    let r = ty.rank();
    let eps = if ty.dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
    let largest = g.slice_dim(s, r - 2, 0, 1, 1);
    let smallest = g.slice_dim(s, r - 2, n - 1, n, 1);
    let bound = splat(g, n as f64 * eps, largest);
    let bound = g.binary("stablehlo.multiply", largest, bound);
    let deficient = g.compare("LE", smallest, bound);
    let deficient = g.reshape(deficient, &batch);
    let any = if batch.is_empty() {
        deficient
    } else {
        let all: Vec<usize> = (0..batch.len()).collect();
        g.reduce(ReduceKind::Or, deficient, &all)
    };
    let trips = g.convert(any, DType::I32);
    let out = g.counted_loop(trips, &[u, deficient], |g, _, values| {
        let (u, deficient) = (values[0], values[1]);
        let (q, rr) = qr_factors(g, u, false);
        let shape = g.ty(rr).shape.clone();
        let on_diagonal = diagonal_mask(g, &shape);
        let zeros = splat(g, 0.0, rr);
        let diagonal = g.select(on_diagonal, rr, zeros);
        let diagonal = g.reduce(ReduceKind::Sum, diagonal, &[r - 2]);
        let zeros = splat(g, 0.0, diagonal);
        let (plus, minus) = (splat(g, 1.0, diagonal), splat(g, -1.0, diagonal));
        let positive = g.compare("GE", diagonal, zeros);
        let signs = g.select(positive, plus, minus);
        let mut dims: Vec<i64> = (0..r as i64 - 2).collect();
        dims.push(r as i64 - 1);
        let signs = g.broadcast_in_dim(signs, &ty.shape, &dims);
        let q = g.binary("stablehlo.multiply", q, signs);
        let which = g.broadcast_in_dim(deficient, &ty.shape, &(0..r as i64 - 2).collect::<Vec<_>>());
        vec![g.select(which, q, u), deficient]
    });
    out[0]
}

/// A scalar `k` times `x`.
fn times(g: &mut Graph, k: V, x: V) -> V {
    let shape = g.ty(x).shape.clone();
    let k = g.broadcast_in_dim(k, &shape, &[]);
    g.binary("stablehlo.multiply", k, x)
}

/// `p x + q y`.
fn axpby(g: &mut Graph, p: f64, x: V, q: f64, y: V) -> V {
    let (p, q) = (splat(g, p, x), splat(g, q, y));
    let x = g.binary("stablehlo.multiply", p, x);
    let y = g.binary("stablehlo.multiply", q, y);
    g.binary("stablehlo.add", x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_converge_in_a_few_steps() {
        // JAX's counts: QDWH converges in at most 6 steps for float64.
        assert_eq!(weights(f64::EPSILON).len(), 6);
        assert_eq!(weights(f32::EPSILON as f64).len(), 4);
        // The first steps are the ill-conditioned ones, solved by QR.
        let w = weights(f64::EPSILON);
        assert!(w.windows(2).all(|p| p[0].2 >= p[1].2));
        assert!(w[0].2 > CHOLESKY_CUTOFF && w[5].2 < CHOLESKY_CUTOFF);
    }
}
