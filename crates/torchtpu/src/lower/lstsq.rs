//! Least squares (`linalg_lstsq`) with CPU's drivers and outputs. `gels`
//! (CUDA's only driver) solves through a QR factorization, of A when it has
//! at least as many rows as columns, else of Aᵀ for the minimum-norm
//! solution, as LAPACK's `gels`; `gelsy` (CPU's default), `gelsd` and
//! `gelss` give the minimum-norm solution through the SVD (`svd.rs`),
//! singular values up to `rcond` times the largest counting as zero, which
//! is what LAPACK's rank-revealing drivers compute. What each driver
//! returns follows CPU: `rank` for all but `gels`, singular values for
//! `gelsd`/`gelss`, residuals for `gels` with more rows than columns. Those
//! of `gelsd`/`gelss` exist only when every matrix has full rank (a shape
//! the data decides), and empty inputs, run on the CPU (counted).
use super::factor::{check_jacobi_order, qr_factors, split, transpose, with};
use super::svd::decompose;
use super::{op, Cx, Entry};
use crate::ensure;
use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::{broadcast_all, Graph, Precision, ReduceKind, V};

pub static ENTRIES: &[Entry] = &[op("linalg_lstsq", lstsq)];

const WHAT: &str = "torch.linalg.lstsq";

fn lstsq(cx: &mut Cx) -> Result<Vec<V>> {
    let (ta, tb) = (cx.meta("self")?, cx.meta("b")?);
    let (ra, rb) = (ta.sizes.len(), tb.sizes.len());
    ensure!(ra >= 2, "{WHAT}: input must have at least 2 dimensions.");
    ensure!(rb >= 1, "{WHAT}: other must have at least 1 dimension.");
    ensure!(
        ta.dtype == tb.dtype,
        "{WHAT}: Expected input and other to have the same dtype, but got input's dtype {} and other's dtype {}",
        ta.dtype.torch_name(),
        tb.dtype.torch_name()
    );
    ensure!(
        ra == rb || ra == rb + 1,
        "{WHAT}: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1"
    );
    // One dimension fewer: a batch of vectors.
    let vector = ra == rb + 1;
    let (b_batch, b_rows) =
        if vector { (&tb.sizes[..rb - 1], tb.sizes[rb - 1]) } else { (&tb.sizes[..rb - 2], tb.sizes[rb - 2]) };
    let (batch, m, n) = split(ta.sizes);
    ensure!(m == b_rows, "{WHAT}: input.size(-2) should match other.size({})", if vector { -1 } else { -2 });
    let driver = if cx.is_none("driver") { "gelsy" } else { cx.str("driver")? };
    ensure!(
        matches!(driver, "gels" | "gelsy" | "gelsd" | "gelss"),
        "{WHAT}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)"
    );
    if ta.dtype.is_complex() {
        return Err(Error::fallback(format!("torchtpu: {WHAT} of complex matrices runs on the CPU")));
    }
    ensure!(
        matches!(ta.dtype, DType::F32 | DType::F64),
        "This function doesn't handle types other than float and double"
    );
    let batch = broadcast_all(&[&batch, b_batch])?;
    let decomposed = driver != "gels";
    let residuals = m > n && !decomposed;
    if ta.numel() == 0 || tb.numel() == 0 || (m > n && matches!(driver, "gelsd" | "gelss")) {
        return Err(Error::fallback(format!(
            "torchtpu: {WHAT} of empty matrices, or the residuals {driver} returns only for full-rank matrices, run on the CPU"
        )));
    }
    if decomposed {
        check_jacobi_order(m.min(n), "linalg_lstsq")?;
    }
    let dtype = ta.dtype;
    let rcond = cx.scalar("rcond", dtype)?;
    let (a, b) = (cx.tensor("self")?, cx.tensor("b")?);
    let g = &mut cx.g;
    let b = if vector { g.reshape(b, &with(b_batch, &[m, 1])) } else { b };
    let k = g.ty(b).shape.last().copied().unwrap();
    let a = g.broadcast_to(a, &with(&batch, &[m, n]));
    let b = g.broadcast_to(b, &with(&batch, &[m, k]));
    let empty = |g: &mut Graph, dtype: DType| g.full(0.0, dtype, &[0]);
    let (x, rank, values) = if decomposed {
        let (x, rank, s) = minimum_norm(g, a, b, rcond, driver != "gelsy");
        (x, rank, if driver == "gelsy" { empty(g, dtype) } else { s })
    } else {
        (by_qr(g, a, b), empty(g, DType::I64), empty(g, dtype))
    };
    let residuals = if residuals {
        let ax = g.matmul(a, x, Precision::Highest);
        let r = g.binary("stablehlo.subtract", ax, b);
        let squares = g.binary("stablehlo.multiply", r, r);
        g.reduce(ReduceKind::Sum, squares, &[batch.len()])
    } else {
        empty(g, dtype)
    };
    let x = if vector { g.reshape(x, &with(&batch, &[n])) } else { x };
    Ok(vec![x, residuals, rank, values])
}

/// LAPACK's `gels`: X = R⁻¹ Qᵀ B with A = QR (m >= n), or X = Q R⁻ᵀ B with
/// Aᵀ = QR (m < n), the solution of least norm.
fn by_qr(g: &mut Graph, a: V, b: V) -> V {
    let (_, m, n) = split(&g.ty(a).shape);
    if m >= n {
        let (q, r) = qr_factors(g, a, false);
        let qt = transpose(g, q);
        let c = g.matmul(qt, b, Precision::Highest);
        g.triangular_solve(r, c, true, false, false, false)
    } else {
        let at = transpose(g, a);
        let (q, r) = qr_factors(g, at, false);
        let y = g.triangular_solve(r, b, true, false, false, true);
        g.matmul(q, y, Precision::Highest)
    }
}

/// The least-norm solution V Σ⁺ Uᵀ B, singular values up to `rcond` (eps
/// max(m, n) by default, as CPU's; eps where negative if `floor`, as
/// LAPACK's `gelsd`/`gelss`) times the largest counting as zero; with each
/// matrix's rank and singular values.
fn minimum_norm(g: &mut Graph, a: V, b: V, rcond: Option<V>, floor: bool) -> (V, V, V) {
    let ty = g.ty(a).clone();
    let (batch, m, n) = split(&ty.shape);
    let r = batch.len();
    let eps = if ty.dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
    let rcond = match rcond {
        None => g.scalar(eps * m.max(n) as f64, ty.dtype),
        Some(rcond) if floor => {
            let (zero, eps) = (g.scalar(0.0, ty.dtype), g.scalar(eps, ty.dtype));
            let negative = g.compare("LT", rcond, zero);
            g.select(negative, eps, rcond)
        }
        Some(rcond) => rcond,
    };
    let (u, s, v) = decompose(g, a, false);
    let s_shape = g.ty(s).shape.clone();
    let largest = g.slice_dim(s, r, 0, 1, 1);
    let largest = g.reshape(largest, &batch);
    let rcond = g.broadcast_in_dim(rcond, &batch, &[]);
    let bound = g.binary("stablehlo.multiply", rcond, largest);
    let bound = g.broadcast_in_dim(bound, &s_shape, &(0..r as i64).collect::<Vec<_>>());
    let kept = g.compare("GT", s, bound);
    let ones = g.full(1.0, ty.dtype, &s_shape);
    let zeros = g.full(0.0, ty.dtype, &s_shape);
    let divisor = g.select(kept, s, ones);
    let inverse = g.binary("stablehlo.divide", ones, divisor);
    let inverse = g.select(kept, inverse, zeros);
    let ut = transpose(g, u);
    let c = g.matmul(ut, b, Precision::Highest);
    let c_shape = g.ty(c).shape.clone();
    let dims: Vec<i64> = (0..=r as i64).collect();
    let inverse = g.broadcast_in_dim(inverse, &c_shape, &dims);
    let c = g.binary("stablehlo.multiply", c, inverse);
    let x = g.matmul(v, c, Precision::Highest);
    let rank = g.convert(kept, DType::I64);
    let rank = g.reduce(ReduceKind::Sum, rank, &[r]);
    (x, rank, s)
}
