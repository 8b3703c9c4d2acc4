//! Matrix factorizations and what is built on them: LU with partial
//! pivoting (solves, inverses, determinants), QR, the symmetric
//! eigendecomposition, and which leading minor a failed Cholesky
//! factorization (`stablehlo.cholesky`, in `linalg.rs`) stopped at.
//!
//! QR and eigh are XLA custom calls ("Qr", "ProductOfElementaryHouseholderReflectors",
//! "Eigh") that XLA's compilers expand into their own blocked Householder and
//! Jacobi algorithms on every platform; "Qr" returns LAPACK's `geqrf` layout
//! (R above the diagonal, reflectors below, and their scales). XLA has no LU
//! expander (JAX calls LAPACK on CPU), so LU is written here, blocked as
//! LAPACK's `getrf`, in loops ([`Op::Loop`](crate::ir::Op::Loop), so the
//! program's size does not grow with the matrix's order): per block of
//! columns, a panel factored column by column (a pivot search, a row swap and
//! a rank-1 update each), its swaps applied to the rest, a triangular solve
//! and one product for the trailing block; every step works on whole arrays
//! under masks, since a loop's values keep one shape. Results follow LAPACK's
//! `getrf`: the first row of largest magnitude is the pivot, the column is
//! scaled by the pivot's reciprocal, and `info` names the first zero pivot.
//!
//! Where CPU factors the transpose of a contiguous input (`_linalg_det`,
//! `_linalg_slogdet`: its LU and pivots are outputs that their backward
//! formulas read with the same rule), so does tpu.
use super::elementwise::cpp_name;
use super::linalg::{diagonal_mask, lapack_dtype};
use super::shape::keep_triangle;
use super::{op, Cx, Entry, UNDEFINED};
use crate::ensure;
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::DType;
use crate::ir::{broadcast_all, Graph, Precision, ReduceKind, Ty, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op("linalg_lu_factor_ex", lu_factor_ex),
    op("linalg_lu", lu),
    op("lu_unpack", lu_unpack),
    op("linalg_lu_solve", lu_solve),
    op("_linalg_solve_ex", solve_ex),
    op("linalg_inv_ex", inv_ex),
    op("_linalg_det", det),
    op("_linalg_slogdet", slogdet),
    op("geqrf", geqrf),
    op("linalg_householder_product", householder_product),
    op("linalg_qr", qr),
    op("_linalg_eigh", eigh),
];

/// The batch dimensions and the two matrix dimensions of a shape.
pub(super) fn split(shape: &[i64]) -> (Vec<i64>, i64, i64) {
    let r = shape.len();
    (shape[..r - 2].to_vec(), shape[r - 2], shape[r - 1])
}

pub(super) fn with(batch: &[i64], tail: &[i64]) -> Vec<i64> {
    batch.iter().chain(tail).copied().collect()
}

/// Rows `rows` and columns `cols` of each trailing matrix.
pub(super) fn block(g: &mut Graph, a: V, rows: (i64, i64), cols: (i64, i64)) -> V {
    let shape = g.ty(a).shape.clone();
    let r = shape.len();
    let mut start = vec![0; r];
    let mut limit = shape.clone();
    (start[r - 2], limit[r - 2], start[r - 1], limit[r - 1]) = (rows.0, rows.1, cols.0, cols.1);
    g.slice(a, &start, &limit, &vec![1; r])
}

/// The last two dimensions swapped.
pub(super) fn transpose(g: &mut Graph, a: V) -> V {
    let r = g.ty(a).rank() as i64;
    let perm: Vec<i64> = (0..r - 2).chain([r - 1, r - 2]).collect();
    g.transpose(a, &perm)
}

/// `a` broadcast to `batch` + its matrix dimensions.
fn to_batch(g: &mut Graph, a: V, batch: &[i64], tail: usize) -> V {
    let shape = g.ty(a).shape.clone();
    g.broadcast_to(a, &with(batch, &shape[shape.len() - tail..]))
}

/// A scalar splat to `v`'s shape.
pub(super) fn splat(g: &mut Graph, value: f64, v: V) -> V {
    let ty = g.ty(v).clone();
    g.full(value, ty.dtype, &ty.shape)
}

/// The identity's first `cols` columns, for each of `batch`.
pub(super) fn eye(g: &mut Graph, dtype: DType, batch: &[i64], rows: i64, cols: i64) -> V {
    let diagonal = diagonal_mask(g, &with(batch, &[rows, cols]));
    g.convert(diagonal, dtype)
}

// ------------------------------------------------------------------ LU

/// An LU factorization: the packed factors, 1-based int32 pivots
/// ([batch, min(m, n)]) and int32 `info` per matrix (the first zero pivot,
/// 1-based, or 0).
struct Lu {
    lu: V,
    pivots: V,
    info: V,
}

/// Columns per block of the blocked factorization; orders below two blocks
/// run column by column.
const BLOCK: i64 = 16;

fn factor(g: &mut Graph, a: V) -> Lu {
    let ty = g.ty(a).clone();
    let (batch, m, n) = split(&ty.shape);
    let info = g.full(0.0, DType::I32, &batch);
    let pivots = g.full(0.0, DType::I32, &with(&batch, &[m.min(n)]));
    if ty.numel() == 0 {
        return Lu { lu: a, pivots, info };
    }
    let k = m.min(n);
    let blocks = if k >= 2 * BLOCK { k / BLOCK } else { 0 };
    let mut values = vec![a, pivots, info];
    if blocks > 0 {
        let trips = g.scalar(blocks as f64, DType::I32);
        values = g.counted_loop(trips, &values, factor_block);
    }
    // The columns after the last block, one at a time.
    let done = blocks * BLOCK;
    if done < k {
        let trips = g.scalar((k - done) as f64, DType::I32);
        values = g.counted_loop(trips, &values, |g, t, values| {
            let done = g.scalar(done as f64, DType::I32);
            let col = g.binary("stablehlo.add", t, done);
            let (a, pivots, info, _) = eliminate(g, col, col, values[0], values[1], values[2]);
            vec![a, pivots, info]
        });
    }
    Lu { lu: values[0], pivots: values[1], info: values[2] }
}

/// Block `t` (an i32 scalar) of the factorization of `[a, pivots, info]`, as
/// LAPACK's `getrf`: its columns factored as a panel, the panel's row swaps
/// applied to the whole matrix, the block row right of it solved for U and
/// the trailing block less one product.
fn factor_block(g: &mut Graph, t: V, values: &[V]) -> Vec<V> {
    let (a, pivots, info) = (values[0], values[1], values[2]);
    let ty = g.ty(a).clone();
    let (batch, m, n) = split(&ty.shape);
    let r = ty.rank();
    let width = g.scalar(BLOCK as f64, DType::I32);
    let first = g.binary("stablehlo.multiply", t, width);
    let end = g.binary("stablehlo.add", first, width);
    let zero = g.scalar(0.0, DType::I32);
    let starts = |row: V, col: V| matrix_starts(&batch, zero, row, col);
    let panel = g.dynamic_slice(a, &starts(zero, first), &with(&batch, &[m, BLOCK]));
    let perm = g.iota(DType::I32, &with(&batch, &[m]), r - 2);
    let trips = g.scalar(BLOCK as f64, DType::I32);
    let out = g.counted_loop(trips, &[panel, pivots, info, perm, first], |g, c, values| {
        let [panel, pivots, info, perm, first] = [values[0], values[1], values[2], values[3], values[4]];
        let row = g.binary("stablehlo.add", first, c);
        let (panel, pivots, info, p) = eliminate(g, row, c, panel, pivots, info);
        let perm = swap(g, perm, r - 2, row, p);
        vec![panel, pivots, info, perm, first]
    });
    let (panel, pivots, info, perm) = (out[0], out[1], out[2], out[3]);
    let perm = g.convert(perm, DType::I64);
    let a = permute_rows(g, a, perm, false);
    let a = g.dynamic_update_slice(a, panel, &starts(zero, first));
    // U's block row right of the panel: L11⁻¹ A12.
    let row = g.dynamic_slice(a, &starts(first, zero), &with(&batch, &[BLOCK, n]));
    let l11 = g.dynamic_slice(panel, &starts(first, zero), &with(&batch, &[BLOCK, BLOCK]));
    let solved = g.triangular_solve(l11, row, true, true, true, false);
    let right = index_is(g, end, &with(&batch, &[BLOCK, n]), r - 1, "GE");
    let row = g.select(right, solved, row);
    let a = g.dynamic_update_slice(a, row, &starts(first, zero));
    // The trailing block less L21 U12 (both zero outside it).
    let below = index_is(g, end, &with(&batch, &[m, BLOCK]), r - 2, "GE");
    let zeros = splat(g, 0.0, panel);
    let l21 = g.select(below, panel, zeros);
    let zeros = splat(g, 0.0, row);
    let u12 = g.select(right, row, zeros);
    let product = g.matmul(l21, u12, Precision::Highest);
    let updated = g.binary("stablehlo.subtract", a, product);
    let below = index_is(g, end, &ty.shape, r - 2, "GE");
    let right = index_is(g, end, &ty.shape, r - 1, "GE");
    let trailing = g.binary("stablehlo.and", below, right);
    vec![g.select(trailing, updated, a), pivots, info]
}

/// One column of the factorization: column `col` of `a` pivots on row
/// `row` (i32 scalars; they differ in a panel of a blocked factorization,
/// whose rows are the whole matrix's): the pivot search, the row swap, and
/// the update below and right of the pivot. Also returns the pivot's row
/// (i32, per matrix).
fn eliminate(g: &mut Graph, row: V, col: V, a: V, pivots: V, info: V) -> (V, V, V, V) {
    let ty = g.ty(a).clone();
    let (batch, m, n) = split(&ty.shape);
    let r = ty.rank();
    let all: Vec<i64> = (0..r as i64).collect();
    let zero = g.scalar(0.0, DType::I32);
    let at = |g: &mut Graph, a: V, row: V, col: V, sizes: &[i64]| {
        g.dynamic_slice(a, &matrix_starts(&batch, zero, row, col), &with(&batch, sizes))
    };
    // The pivot: the first row of largest magnitude at or below `row`.
    let column = at(g, a, zero, col, &[m, 1]);
    let column = g.reshape(column, &with(&batch, &[m]));
    let magnitude = g.unary("stablehlo.abs", column);
    let above = index_is(g, row, &with(&batch, &[m]), r - 2, "LT");
    let never = splat(g, -1.0, magnitude);
    let magnitude = g.select(above, never, magnitude);
    let p = g.arg_reduce(magnitude, r - 2, true);
    let p = g.convert(p, DType::I32);
    let one = g.full(1.0, DType::I32, &batch);
    let numbered = g.binary("stablehlo.add", p, one);
    let shape = g.ty(pivots).shape.clone();
    let numbered = g.broadcast_in_dim(numbered, &shape, &(0..r as i64 - 2).collect::<Vec<_>>());
    let here = index_is(g, row, &shape, r - 2, "EQ");
    let pivots = g.select(here, numbered, pivots);
    let a = swap(g, a, r - 2, row, p);
    // info: the first zero pivot.
    let pivot = at(g, a, row, col, &[1, 1]);
    let flat = g.reshape(pivot, &batch);
    let zeros = splat(g, 0.0, flat);
    let singular = g.compare("EQ", flat, zeros);
    let info = note_failure(g, info, singular, row);
    // Scale the column below the pivot (by its reciprocal unless that
    // would overflow, as LAPACK's getf2) and update the trailing block.
    let column = at(g, a, zero, col, &[m, 1]);
    let pivot = g.broadcast_in_dim(pivot, &with(&batch, &[m, 1]), &all);
    let one = splat(g, 1.0, pivot);
    let reciprocal = g.binary("stablehlo.divide", one, pivot);
    let scaled = g.binary("stablehlo.multiply", column, reciprocal);
    let divided = g.binary("stablehlo.divide", column, pivot);
    let magnitude = g.unary("stablehlo.abs", pivot);
    let tiny = splat(g, if ty.dtype == DType::F32 { f32::MIN_POSITIVE as f64 } else { f64::MIN_POSITIVE }, pivot);
    let safe = g.compare("GE", magnitude, tiny);
    let l = g.select(safe, scaled, divided);
    let zeros = splat(g, 0.0, pivot);
    let singular = g.compare("EQ", pivot, zeros);
    let l = g.select(singular, column, l);
    let u = at(g, a, row, zero, &[1, n]);
    let l = g.broadcast_in_dim(l, &ty.shape, &all);
    let u = g.broadcast_in_dim(u, &ty.shape, &all);
    let product = g.binary("stablehlo.multiply", l, u);
    let updated = g.binary("stablehlo.subtract", a, product);
    let below = index_is(g, row, &ty.shape, r - 2, "GT");
    let right = index_is(g, col, &ty.shape, r - 1, "GT");
    let on = index_is(g, col, &ty.shape, r - 1, "EQ");
    let trailing = g.binary("stablehlo.and", below, right);
    let a = g.select(trailing, updated, a);
    let scaled = g.binary("stablehlo.and", below, on);
    (g.select(scaled, l, a), pivots, info, p)
}

/// `info` (i32, per matrix) with order `step + 1` (`step` an i32 scalar)
/// where `failed` holds and no earlier step failed: LAPACK's `info`.
fn note_failure(g: &mut Graph, info: V, failed: V, step: V) -> V {
    let batch = g.ty(info).shape.clone();
    let none = g.full(0.0, DType::I32, &batch);
    let unset = g.compare("EQ", info, none);
    let first = g.binary("stablehlo.and", failed, unset);
    let one = g.scalar(1.0, DType::I32);
    let order = g.binary("stablehlo.add", step, one);
    let order = g.broadcast_in_dim(order, &batch, &[]);
    g.select(first, order, info)
}

/// Start indices (i32 scalars) at `row` and `col` of each trailing matrix
/// (`zero` for the `batch` dimensions).
fn matrix_starts(batch: &[i64], zero: V, row: V, col: V) -> Vec<V> {
    batch.iter().map(|_| zero).chain([row, col]).collect()
}

/// Where the index along `dim` of `shape` compares `dir` to `k` (an i32 scalar).
fn index_is(g: &mut Graph, k: V, shape: &[i64], dim: usize, dir: &'static str) -> V {
    let index = g.iota(DType::I32, shape, dim);
    let k = g.broadcast_in_dim(k, shape, &[]);
    g.compare(dir, index, k)
}

/// The row permutation pivots describe: `perm[i]` is the row of A that is
/// row i of `P^T A` (i64, [batch, m]); applying the swaps one by one.
fn permutation(g: &mut Graph, pivots: V, m: i64) -> V {
    let shape = g.ty(pivots).shape.clone();
    let (batch, k) = (shape[..shape.len() - 1].to_vec(), shape[shape.len() - 1]);
    let r = shape.len();
    let perm = g.iota(DType::I64, &with(&batch, &[m]), r - 1);
    let trips = g.scalar(k as f64, DType::I32);
    let out = g.counted_loop(trips, &[perm, pivots], |g, s, values| {
        let (perm, pivots) = (values[0], values[1]);
        let zero = g.scalar(0.0, DType::I32);
        let starts: Vec<V> = batch.iter().map(|_| zero).chain([s]).collect();
        let p = g.dynamic_slice(pivots, &starts, &with(&batch, &[1]));
        let one = splat(g, 1.0, p);
        let p = g.binary("stablehlo.subtract", p, one);
        let p = g.reshape(p, &batch);
        vec![swap(g, perm, r - 1, s, p), pivots]
    });
    out[0]
}

/// `x` with positions `k` (an i32 scalar) and `p` (i32, one per index of
/// the dimensions before `dim`) swapped along `dim`, exactly: selects, and a
/// max over one slice.
fn swap(g: &mut Graph, x: V, dim: usize, k: V, p: V) -> V {
    let ty = g.ty(x).clone();
    let r = ty.rank();
    let index = g.iota(DType::I32, &ty.shape, dim);
    let before: Vec<i64> = (0..dim as i64).collect();
    let p = g.broadcast_in_dim(p, &ty.shape, &before);
    let is_p = g.compare("EQ", index, p);
    let k_index = g.broadcast_in_dim(k, &ty.shape, &[]);
    let is_k = g.compare("EQ", index, k_index);
    let lowest = g.identity(ReduceKind::Max, ty.dtype, &ty.shape);
    let only_p = g.select(is_p, x, lowest);
    let at_p = g.reduce(ReduceKind::Max, only_p, &[dim]);
    let others: Vec<i64> = (0..r as i64).filter(|&d| d != dim as i64).collect();
    let at_p = g.broadcast_in_dim(at_p, &ty.shape, &others);
    let zero = g.scalar(0.0, DType::I32);
    let starts: Vec<V> = (0..r).map(|d| if d == dim { k } else { zero }).collect();
    let mut sizes = ty.shape.clone();
    sizes[dim] = 1;
    let at_k = g.dynamic_slice(x, &starts, &sizes);
    let all: Vec<i64> = (0..r as i64).collect();
    let at_k = g.broadcast_in_dim(at_k, &ty.shape, &all);
    let swapped = g.select(is_p, at_k, x);
    g.select(is_k, at_p, swapped)
}

/// Row `perm[i]` of each matrix of `b` as its row i (`inverse`: row i as
/// row `perm[i]`); `perm` has b's batch dimensions.
fn permute_rows(g: &mut Graph, b: V, perm: V, inverse: bool) -> V {
    let ty = g.ty(b).clone();
    let (batch, n, k) = split(&ty.shape);
    let count: i64 = batch.iter().product();
    let rows = g.reshape(b, &[count * n, k]);
    // Row indices into the flattened batch: perm + n * (batch element).
    let perm = g.reshape(perm, &[count, n]);
    let base = g.iota(DType::I64, &[count, n], 0);
    let stride = g.full(n as f64, DType::I64, &[count, n]);
    let base = g.binary("stablehlo.multiply", base, stride);
    let index = g.binary("stablehlo.add", perm, base);
    let index = g.reshape(index, &[count * n]);
    let out = if inverse {
        let zeros = g.full(0.0, ty.dtype, &[count * n, k]);
        g.put(zeros, index, rows, 0, None)
    } else {
        g.take(rows, index, 0)
    };
    g.reshape(out, &ty.shape)
}

/// Solves `A X = B` (`adjoint`: `A^T X = B`) from A's LU factors; B has
/// the batch dimensions of the result.
fn solve_left(g: &mut Graph, lu: V, pivots: V, b: V, adjoint: bool) -> V {
    let (batch, n, _) = split(&g.ty(b).shape.clone());
    let lu = to_batch(g, lu, &batch, 2);
    let pivots = to_batch(g, pivots, &batch, 1);
    let perm = permutation(g, pivots, n);
    if adjoint {
        // A^T = U^T L^T P^T: solve U^T, then L^T, then undo the permutation.
        let y = g.triangular_solve(lu, b, true, false, false, true);
        let z = g.triangular_solve(lu, y, true, true, true, true);
        permute_rows(g, z, perm, true)
    } else {
        let pb = permute_rows(g, b, perm, false);
        let y = g.triangular_solve(lu, pb, true, true, true, false);
        g.triangular_solve(lu, y, true, false, false, false)
    }
}

/// `A X = B` (or `X A = B` when not `left`; `adjoint` uses A^T).
fn solve_with(g: &mut Graph, lu: &Lu, b: V, left: bool, adjoint: bool) -> V {
    if left {
        return solve_left(g, lu.lu, lu.pivots, b, adjoint);
    }
    // X A = B  <=>  A^T X^T = B^T.
    let bt = transpose(g, b);
    let x = solve_left(g, lu.lu, lu.pivots, bt, !adjoint);
    transpose(g, x)
}

/// Raises CPU's `_linalg_check_errors` error for the first matrix whose
/// `info` is non-zero; `message` names its `info` as its `mentions` `{}`s
/// (after the batch element's index when batched).
pub(super) fn check_info(cx: &mut Cx, info: V, kind: Kind, api: &str, message: &str, mentions: usize) {
    let batch = cx.g.ty(info).shape.clone();
    let zero = cx.g.full(0.0, DType::I32, &batch);
    let bad = cx.g.compare("NE", info, zero);
    let count: i64 = batch.iter().product();
    let bad = cx.g.reshape(bad, &[count]);
    let info = cx.g.reshape(info, &[count]);
    let any = cx.g.reduce(ReduceKind::Or, bad, &[0]);
    let flags = cx.g.convert(bad, DType::U8);
    let element = cx.g.arg_reduce(flags, 0, true);
    let index = cx.g.reshape(element, &[1]);
    let first = cx.g.take(info, index, 0);
    let first = cx.g.convert(first, DType::I64);
    let mut parts = vec![first; mentions];
    let prefix = if batch.is_empty() {
        ""
    } else {
        parts.insert(0, index);
        "(Batch element {}): "
    };
    let value = cx.g.concatenate(&parts, 0);
    cx.check(any, Some(value), kind, format!("{api}: {prefix}{message}"));
}

/// The factorization `linalg_lu_factor_ex` computes, after CPU's checks.
fn factored(cx: &mut Cx, name: &str, transposed: bool) -> Result<Lu> {
    let t = cx.meta(name)?;
    // CPU returns empty inputs before dispatching on the dtype.
    if t.numel() > 0 {
        lapack_dtype(&t, "lu_cpu")?;
    }
    let a = cx.tensor(name)?;
    let a = if transposed { transpose(&mut cx.g, a) } else { a };
    Ok(factor(&mut cx.g, a))
}

fn check_pivot(cx: &Cx) -> Result<()> {
    ensure!(cx.bool("pivot")?, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
    Ok(())
}

fn lu_factor_ex(cx: &mut Cx) -> Result<Vec<V>> {
    check_pivot(cx)?;
    let lu = factored(cx, "A", false)?;
    if cx.bool("check_errors")? {
        check_info(
            cx,
            lu.info,
            Kind::Runtime,
            "torch.linalg.lu_factor_ex",
            "U[{},{}] is zero and using it on lu_solve would result in a division by zero. If you still want to perform the factorization, consider calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)",
            2,
        );
    }
    Ok(vec![lu.lu, lu.pivots, lu.info])
}

/// P, L and U from packed factors (each UNDEFINED-free; `unpack_*` false
/// gives empty tensors, as CPU).
fn unpack(g: &mut Graph, lu: &Lu, data: bool, pivots: bool) -> Vec<V> {
    let ty = g.ty(lu.lu).clone();
    let (batch, m, n) = split(&ty.shape);
    let k = m.min(n);
    let empty = |g: &mut Graph| g.full(0.0, ty.dtype, &[0]);
    let p = if pivots {
        // P[perm[j], j] = 1, so that A = P L U.
        let perm = permutation(g, lu.pivots, m);
        let shape = with(&batch, &[m, m]);
        let r = shape.len();
        let rows = g.iota(DType::I64, &shape, r - 2);
        let dims: Vec<i64> = (0..r as i64 - 2).chain([r as i64 - 1]).collect();
        let perm = g.broadcast_in_dim(perm, &shape, &dims);
        let hit = g.compare("EQ", rows, perm);
        let (one, zero) = (g.full(1.0, ty.dtype, &shape), g.full(0.0, ty.dtype, &shape));
        g.select(hit, one, zero)
    } else {
        empty(g)
    };
    if !data {
        return vec![p, empty(g), empty(g)];
    }
    let l = block(g, lu.lu, (0, m), (0, k));
    let l = lower_unit(g, l);
    let u = block(g, lu.lu, (0, k), (0, n));
    let u = keep_triangle(g, u, false, 0);
    vec![p, l, u]
}

/// The strictly lower triangle plus the identity.
fn lower_unit(g: &mut Graph, l: V) -> V {
    let ty = g.ty(l).clone();
    let (batch, m, k) = split(&ty.shape);
    let strict = keep_triangle(g, l, true, -1);
    let identity = eye(g, ty.dtype, &batch, m, k);
    g.binary("stablehlo.add", strict, identity)
}

fn lu(cx: &mut Cx) -> Result<Vec<V>> {
    check_pivot(cx)?;
    let lu = factored(cx, "A", false)?;
    Ok(unpack(&mut cx.g, &lu, true, true))
}

/// Data-dependent checks of pivots handed in by the user (`api`'s messages).
fn check_pivots(cx: &mut Cx, pivots: V, n: i64, low: &str, high: &str) {
    let shape = cx.g.ty(pivots).shape.clone();
    let dims: Vec<usize> = (0..shape.len()).collect();
    for (dir, bound, message) in [("LT", 1, low), ("GT", n, high)] {
        let limit = cx.g.full(bound as f64, DType::I32, &shape);
        let bad = cx.g.compare(dir, pivots, limit);
        let any = cx.g.reduce(ReduceKind::Or, bad, &dims);
        cx.check(any, None, Kind::Runtime, message);
    }
}

fn lu_unpack(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("LU_data")?;
    let (data, pivots) = (cx.bool("unpack_data")?, cx.bool("unpack_pivots")?);
    let lu = cx.tensor("LU_data")?;
    let piv = cx.tensor("LU_pivots")?;
    if pivots && t.numel() > 0 {
        let message = "pivots passed to lu_unpack must be between 1 and LU.size(-2) inclusive.Did you properly pass the result of lu_factor?";
        check_pivots(cx, piv, t.sizes[t.sizes.len() - 2], message, message);
    }
    let info = UNDEFINED;
    Ok(unpack(&mut cx.g, &Lu { lu, pivots: piv, info }, data, pivots))
}

fn lu_solve(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, tb) = (cx.meta("LU")?, cx.meta("B")?);
    let (left, adjoint) = (cx.bool("left")?, cx.bool("adjoint")?);
    let (lu, pivots) = (cx.tensor("LU")?, cx.tensor("pivots")?);
    let b = cx.tensor("B")?;
    let r = t.sizes.len();
    let n = t.sizes[r - 1];
    if t.numel() > 0 && tb.numel() > 0 {
        check_pivots(
            cx,
            pivots,
            n,
            "Pivots given to lu_solve must all be greater or equal to 1. Did you properly pass the result of lu_factor?",
            "Pivots given to lu_solve must all be smaller or equal to LU.size(-2). Did you properly pass the result of lu_factor?",
        );
    }
    let rb = tb.sizes.len();
    let batch = broadcast_all(&[&t.sizes[..r - 2], &tb.sizes[..rb - 2]])?;
    if batch.contains(&0) || tb.numel() == 0 {
        return Ok(vec![cx.g.full(0.0, tb.dtype, &with(&batch, &tb.sizes[rb - 2..]))]);
    }
    let b = to_batch(&mut cx.g, b, &batch, 2);
    Ok(vec![solve_with(&mut cx.g, &Lu { lu, pivots, info: UNDEFINED }, b, left, adjoint)])
}

/// CPU factors A^T when A is contiguous (see the module's comment).
fn factors_transpose(t: &Tensor) -> bool {
    t.view().is_contiguous()
}

fn solve_ex(cx: &mut Cx) -> Result<Vec<V>> {
    let (ta, tb) = (cx.meta("A")?, cx.meta("B")?);
    let left = cx.bool("left")?;
    let ra = ta.sizes.len();
    let vector = tb.sizes.len() == 1 || (tb.sizes.len() + 1 == ra && tb.sizes == &ta.sizes[..ra - 1]);
    let lu = factored(cx, "A", false)?;
    let b = cx.tensor("B")?;
    let b = if vector {
        let mut shape = tb.sizes.to_vec();
        shape.insert(if left { shape.len() } else { shape.len() - 1 }, 1);
        cx.g.reshape(b, &shape)
    } else {
        b
    };
    let bshape = cx.g.ty(b).shape.clone();
    let batch = broadcast_all(&[&ta.sizes[..ra - 2], &bshape[..bshape.len() - 2]])?;
    let out = with(&batch, &bshape[bshape.len() - 2..]);
    let x = if out.contains(&0) {
        cx.g.full(0.0, ta.dtype, &out)
    } else {
        let b = to_batch(&mut cx.g, b, &batch, 2);
        solve_with(&mut cx.g, &lu, b, left, false)
    };
    let x = if vector {
        let mut shape = out.clone();
        shape.remove(if left { shape.len() - 1 } else { shape.len() - 2 });
        cx.g.reshape(x, &shape)
    } else {
        x
    };
    if cx.bool("check_errors")? {
        check_info(
            cx,
            lu.info,
            Kind::LinAlg,
            "torch.linalg.solve_ex",
            "The solver failed because the input matrix is singular.",
            0,
        );
    }
    Ok(vec![x, lu.lu, lu.pivots, lu.info])
}

fn inv_ex(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("A")?;
    let lu = factored(cx, "A", false)?;
    let (batch, n, _) = split(t.sizes);
    let identity = eye(&mut cx.g, t.dtype, &batch, n, n);
    let inverse = if t.numel() == 0 { identity } else { solve_with(&mut cx.g, &lu, identity, true, false) };
    if cx.bool("check_errors")? {
        check_info(
            cx,
            lu.info,
            Kind::LinAlg,
            "linalg.inv_ex",
            "The diagonal element {} is zero, the inversion could not be completed because the input matrix is singular.",
            1,
        );
    }
    Ok(vec![inverse, lu.info])
}

/// The diagonal of U, and the permutation's sign (+1 or -1), per matrix.
fn diagonal_and_sign(g: &mut Graph, lu: &Lu) -> (V, V) {
    let ty = g.ty(lu.lu).clone();
    let (batch, n, _) = split(&ty.shape);
    let r = ty.rank();
    let on = diagonal_mask(g, &ty.shape);
    let zero = g.full(0.0, ty.dtype, &ty.shape);
    let diagonal = g.select(on, lu.lu, zero);
    let diagonal = g.reduce(ReduceKind::Sum, diagonal, &[r - 1]);
    // Each pivot that is not its own row swaps two rows.
    let pshape = with(&batch, &[n]);
    let own = g.iota(DType::I32, &pshape, r - 2);
    let one = g.full(1.0, DType::I32, &pshape);
    let own = g.binary("stablehlo.add", own, one);
    let swapped = g.compare("NE", lu.pivots, own);
    let (minus, plus) = (g.full(-1.0, ty.dtype, &pshape), g.full(1.0, ty.dtype, &pshape));
    let signs = g.select(swapped, minus, plus);
    let sign = g.reduce(ReduceKind::Prod, signs, &[r - 2]);
    (diagonal, sign)
}

/// The factors `_linalg_det` and `_linalg_slogdet` return.
fn determinant_input(cx: &mut Cx) -> Result<Lu> {
    let transposed = factors_transpose(&cx.meta("A")?);
    factored(cx, "A", transposed)
}

fn det(cx: &mut Cx) -> Result<Vec<V>> {
    let lu = determinant_input(cx)?;
    let (diagonal, sign) = diagonal_and_sign(&mut cx.g, &lu);
    let r = cx.g.ty(diagonal).rank();
    let product = cx.g.reduce(ReduceKind::Prod, diagonal, &[r - 1]);
    let det = cx.g.binary("stablehlo.multiply", product, sign);
    Ok(vec![det, lu.lu, lu.pivots])
}

fn slogdet(cx: &mut Cx) -> Result<Vec<V>> {
    let lu = determinant_input(cx)?;
    let (diagonal, sign) = diagonal_and_sign(&mut cx.g, &lu);
    let r = cx.g.ty(diagonal).rank();
    let signs = cx.g.unary("stablehlo.sign", diagonal);
    let signs = cx.g.reduce(ReduceKind::Prod, signs, &[r - 1]);
    let sign = cx.g.binary("stablehlo.multiply", signs, sign);
    let magnitude = cx.g.unary("stablehlo.abs", diagonal);
    let logs = cx.g.unary("stablehlo.log", magnitude);
    let logabsdet = cx.g.reduce(ReduceKind::Sum, logs, &[r - 1]);
    Ok(vec![sign, logabsdet, lu.lu, lu.pivots])
}

// ------------------------------------------------------------------ Cholesky

/// Per matrix, the order of the first leading minor of `a` (its lower
/// triangle read, as LAPACK's `potrf`) that is not positive-definite, or 0:
/// the first pivot of the unblocked factorization that is not positive. The
/// loop runs only where `failed` (a bool scalar) holds: no trip otherwise.
pub(super) fn first_bad_minor(g: &mut Graph, a: V, failed: V) -> V {
    let ty = g.ty(a).clone();
    let (batch, _, n) = split(&ty.shape);
    let r = ty.rank();
    let (count, none) = (g.scalar(n as f64, DType::I32), g.scalar(0.0, DType::I32));
    let trips = g.select(failed, count, none);
    let info = g.full(0.0, DType::I32, &batch);
    let out = g.counted_loop(trips, &[a, info], |g, j, values| {
        let (a, info) = (values[0], values[1]);
        let all: Vec<i64> = (0..r as i64).collect();
        let zero = g.scalar(0.0, DType::I32);
        let at = |g: &mut Graph, row: V, sizes: &[i64]| {
            g.dynamic_slice(a, &matrix_starts(&batch, zero, row, j), &with(&batch, sizes))
        };
        let pivot = at(g, j, &[1, 1]);
        let flat = g.reshape(pivot, &batch);
        let zeros = g.full(0.0, ty.dtype, &batch);
        let positive = g.compare("GT", flat, zeros);
        let bad = g.unary("stablehlo.not", positive);
        let info = note_failure(g, info, bad, j);
        // The column below the pivot over its root updates the trailing block.
        let column = at(g, zero, &[n, 1]);
        let root = g.unary("stablehlo.sqrt", pivot);
        let root = g.broadcast_in_dim(root, &with(&batch, &[n, 1]), &all);
        let l = g.binary("stablehlo.divide", column, root);
        let lt = transpose(g, l);
        let (l, lt) = (g.broadcast_in_dim(l, &ty.shape, &all), g.broadcast_in_dim(lt, &ty.shape, &all));
        let product = g.binary("stablehlo.multiply", l, lt);
        let updated = g.binary("stablehlo.subtract", a, product);
        let below = index_is(g, j, &ty.shape, r - 2, "GT");
        let right = index_is(g, j, &ty.shape, r - 1, "GT");
        let trailing = g.binary("stablehlo.and", below, right);
        vec![g.select(trailing, updated, a), info]
    });
    out[1]
}

// ------------------------------------------------------------------ QR and eigh

/// LAPACK's `geqrf` of each matrix: (R and the reflectors, their scales).
fn householder(g: &mut Graph, a: V) -> (V, V) {
    let ty = g.ty(a).clone();
    let (batch, m, n) = split(&ty.shape);
    let tau = Ty::new(ty.dtype, &with(&batch, &[m.min(n)]));
    if ty.numel() == 0 {
        return (a, g.full(0.0, ty.dtype, &tau.shape));
    }
    let r = g.custom_call("Qr", "", &[a], &[ty, tau]);
    (r[0], r[1])
}

/// The product of the reflectors `a` (m x n, m >= n) and `tau` describe:
/// the first n columns of H_1 ... H_k (LAPACK's `orgqr`).
fn reflectors_product(g: &mut Graph, a: V, tau: V) -> V {
    let ty = g.ty(a).clone();
    let (batch, m, n) = split(&ty.shape);
    if ty.numel() == 0 || g.ty(tau).numel() == 0 {
        return eye(g, ty.dtype, &batch, m, n);
    }
    g.custom_call("ProductOfElementaryHouseholderReflectors", "", &[a, tau], &[ty])[0]
}

fn geqrf(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    ensure!(t.sizes.len() >= 2, "torch.geqrf: input must have at least 2 dimensions.");
    lapack_dtype(&t, "geqrf_cpu")?;
    let a = cx.tensor("self")?;
    let (a, tau) = householder(&mut cx.g, a);
    Ok(vec![a, tau])
}

fn householder_product(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, tt) = (cx.meta("input")?, cx.meta("tau")?);
    let what = "torch.linalg.householder_product";
    let r = t.sizes.len();
    ensure!(r >= 2, "{what}: input must have at least 2 dimensions.");
    ensure!(
        t.sizes[r - 2] >= t.sizes[r - 1],
        "{what}: input.shape[-2] must be greater than or equal to input.shape[-1]"
    );
    ensure!(
        tt.sizes.len() + 1 == r,
        "{what}: Expected tau to have one dimension less than input, but got tau.ndim equal to {} and input.ndim is equal to {r}",
        tt.sizes.len()
    );
    ensure!(
        t.sizes[r - 1] >= tt.sizes[r - 2],
        "{what}: input.shape[-1] must be greater than or equal to tau.shape[-1]"
    );
    ensure!(
        tt.sizes[..r - 2] == t.sizes[..r - 2],
        "{what}: Expected batch dimensions of tau to be equal to input.shape[:-2], but got {:?}",
        &tt.sizes[..r - 2]
    );
    ensure!(
        tt.dtype == t.dtype,
        "{what}: tau dtype {} does not match input dtype {}",
        cpp_name(tt.dtype),
        cpp_name(t.dtype)
    );
    lapack_dtype(&t, "orgqr_cpu")?;
    let (a, tau) = (cx.tensor("input")?, cx.tensor("tau")?);
    Ok(vec![reflectors_product(&mut cx.g, a, tau)])
}

/// R's first `rows` rows (k = min(m, n), or m for the complete form) from
/// each matrix's `geqrf` form `h`.
fn upper_factor(g: &mut Graph, h: V, rows: i64) -> V {
    let n = *g.ty(h).shape.last().unwrap();
    let r = block(g, h, (0, rows), (0, n));
    keep_triangle(g, r, false, 0)
}

/// Q's first `cols` columns (k, or m for the complete form) from the
/// reflectors in `h` and their scales `tau`, padded with zero reflectors
/// where A has fewer columns.
fn orthogonal_factor(g: &mut Graph, h: V, tau: V, cols: i64) -> V {
    let ty = g.ty(h).clone();
    let (batch, m, n) = split(&ty.shape);
    let reflectors = block(g, h, (0, m), (0, cols.min(n)));
    let reflectors = if cols > n {
        let zeros = g.full(0.0, ty.dtype, &with(&batch, &[m, cols - n]));
        g.concatenate(&[reflectors, zeros], batch.len() + 1)
    } else {
        reflectors
    };
    reflectors_product(g, reflectors, tau)
}

/// Each matrix's QR factorization: Q (m x k, or m x m when `complete`) and
/// R (k x n, or m x n).
pub(super) fn qr_factors(g: &mut Graph, a: V, complete: bool) -> (V, V) {
    let (_, m, n) = split(&g.ty(a).shape);
    let k = if complete { m } else { m.min(n) };
    let (h, tau) = householder(g, a);
    (orthogonal_factor(g, h, tau, k), upper_factor(g, h, k))
}

fn qr(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("A")?;
    let mode = cx.str("mode")?;
    lapack_dtype(&t, "geqrf_cpu")?;
    let a = cx.tensor("A")?;
    if mode == "r" {
        let (h, _) = householder(&mut cx.g, a);
        let (_, m, n) = split(t.sizes);
        let r = upper_factor(&mut cx.g, h, m.min(n));
        return Ok(vec![cx.g.full(0.0, t.dtype, &[0]), r]);
    }
    let (q, r) = qr_factors(&mut cx.g, a, mode == "complete");
    Ok(vec![q, r])
}

/// The largest order XLA's Jacobi eigh (and the SVD built on it) runs at: its
/// sweeps cost ~n³ elementwise work each (XLA:CPU, float32: 2.5 ms at order
/// 64, 149 ms at 256, 10 s at 1024, where LAPACK takes 0.14, 2.5 and 77 ms),
/// so larger matrices take the counted CPU fallback (bench/linalg.py).
const JACOBI_LIMIT: i64 = 64;

/// Sends `what` of an order past [`JACOBI_LIMIT`] to the CPU fallback.
pub(super) fn check_jacobi_order(n: i64, what: &str) -> Result<()> {
    if n > JACOBI_LIMIT {
        return Err(Error::fallback(format!(
            "torchtpu: {what} of order {n} runs on the CPU (XLA's Jacobi eigh past order {JACOBI_LIMIT} is slower than a host round trip)"
        )));
    }
    Ok(())
}

/// Each symmetric matrix's eigenvectors (columns) and eigenvalues, ascending
/// as LAPACK's, from its lower (or upper) triangle.
pub(super) fn symmetric_eigen(g: &mut Graph, a: V, lower: bool) -> (V, V) {
    let ty = g.ty(a).clone();
    let (batch, n, _) = split(&ty.shape);
    // Jacobi sweeps until the off-diagonal norm is this small relative to
    // the matrix's (a few ulps).
    let tol = if ty.dtype == DType::F32 { 1e-6 } else { 1e-14 };
    let config = format!("{},1,100,{tol:e}", lower as i32);
    let r = g.custom_call("Eigh", &config, &[a], &[ty.clone(), Ty::new(ty.dtype, &with(&batch, &[n]))]);
    if ty.dtype != DType::F64 {
        return (r[0], r[1]);
    }
    // XLA's sweeps measure the off-diagonal norm as √(‖A‖² - ‖diag A‖²),
    // which cancels below √eps ‖A‖: they stop there, float64 vectors ~1e-8
    // from LAPACK's (float32's are at their own precision already).
    let triangle = keep_triangle(g, a, lower, 0);
    let strict = keep_triangle(g, a, lower, if lower { -1 } else { 1 });
    let mirrored = transpose(g, strict);
    let symmetric = g.binary("stablehlo.add", triangle, mirrored);
    (refined(g, symmetric, r[0]), r[1])
}

/// One step of Ogita and Aishima's refinement ("Iterative refinement for
/// symmetric eigenvalue decomposition", 2018) of the eigenvectors `x` of
/// each symmetric `a`: it squares their error. Eigenvalues closer than the
/// step's own error bound form a cluster, whose vectors are only made
/// orthonormal (a second step would divide by their gaps).
fn refined(g: &mut Graph, a: V, x: V) -> V {
    let ty = g.ty(x).clone();
    let (batch, n, _) = split(&ty.shape);
    let r = ty.rank();
    let xt = transpose(g, x);
    let gram = g.matmul(xt, x, Precision::Highest);
    let identity = eye(g, ty.dtype, &batch, n, n);
    let residual = g.binary("stablehlo.subtract", identity, gram);
    let ax = g.matmul(a, x, Precision::Highest);
    let projected = g.matmul(xt, ax, Precision::Highest);
    // Symmetric as the paper's exact S: a rounding's asymmetry divided by a
    // small gap would cost the vectors their orthogonality.
    let mirrored = transpose(g, projected);
    let projected = g.binary("stablehlo.add", projected, mirrored);
    let halves = splat(g, 0.5, x);
    let projected = g.binary("stablehlo.multiply", projected, halves);
    let on_diagonal = diagonal_mask(g, &ty.shape);
    let zeros = splat(g, 0.0, x);
    let diagonal = |g: &mut Graph, m: V| {
        let d = g.select(on_diagonal, m, zeros);
        g.reduce(ReduceKind::Sum, d, &[r - 2])
    };
    let (s, rr) = (diagonal(g, projected), diagonal(g, residual));
    let ones = splat(g, 1.0, rr);
    let rr = g.binary("stablehlo.subtract", ones, rr);
    let values = g.binary("stablehlo.divide", s, rr);
    let batch_dims: Vec<i64> = (0..r as i64 - 2).collect();
    let along = |g: &mut Graph, dim: i64| {
        let dims: Vec<i64> = batch_dims.iter().copied().chain([dim]).collect();
        g.broadcast_in_dim(values, &ty.shape, &dims)
    };
    let (row, column) = (along(g, r as i64 - 1), along(g, r as i64 - 2));
    let on_diagonal_values = g.select(on_diagonal, row, zeros);
    let off = g.binary("stablehlo.subtract", projected, on_diagonal_values);
    // δ = 2 (‖S - diag λ‖ + ‖A‖ ‖R‖), with Frobenius norms.
    let frobenius = |g: &mut Graph, m: V| {
        let squares = g.binary("stablehlo.multiply", m, m);
        let sum = g.reduce(ReduceKind::Sum, squares, &[r - 2, r - 1]);
        g.unary("stablehlo.sqrt", sum)
    };
    let (f_off, f_a, f_r) = (frobenius(g, off), frobenius(g, a), frobenius(g, residual));
    let bound = g.binary("stablehlo.multiply", f_a, f_r);
    let bound = g.binary("stablehlo.add", f_off, bound);
    let two = splat(g, 2.0, bound);
    let bound = g.binary("stablehlo.multiply", two, bound);
    let bound = g.broadcast_in_dim(bound, &ty.shape, &batch_dims);
    // E_ij = (s_ij + λ_j r_ij) / (λ_j - λ_i) apart, r_ij / 2 in a cluster.
    let gap = g.binary("stablehlo.subtract", row, column);
    let distance = g.unary("stablehlo.abs", gap);
    let apart = g.compare("GT", distance, bound);
    let ones = splat(g, 1.0, x);
    let gap = g.select(apart, gap, ones);
    let scaled = g.binary("stablehlo.multiply", row, residual);
    let numerator = g.binary("stablehlo.add", projected, scaled);
    let rotation = g.binary("stablehlo.divide", numerator, gap);
    let half = g.binary("stablehlo.multiply", residual, halves);
    let e = g.select(apart, rotation, half);
    let correction = g.matmul(x, e, Precision::Highest);
    g.binary("stablehlo.add", x, correction)
}

fn eigh(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("A")?;
    lapack_dtype(&t, "linalg_eigh_cpu")?;
    check_jacobi_order(t.sizes[t.sizes.len() - 1], "linalg_eigh")?;
    let lower = cx.str("UPLO")? == "L";
    let compute_v = cx.bool("compute_v")?;
    let a = cx.tensor("A")?;
    let (vectors, values) = if t.numel() == 0 {
        let r = t.sizes.len();
        (a, cx.g.full(0.0, t.dtype, &t.sizes[..r - 1]))
    } else {
        symmetric_eigen(&mut cx.g, a, lower)
    };
    let vectors = if compute_v { vectors } else { cx.g.full(0.0, t.dtype, &[0]) };
    Ok(vec![values, vectors])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Ty;

    /// The lines of the program that factors a [2, n, n] matrix and
    /// permutes by its pivots.
    fn factor_program(n: i64) -> usize {
        let mut g = Graph::default();
        let a = g.param(Ty::new(DType::F64, &[2, n, n]));
        let lu = factor(&mut g, a);
        let perm = permutation(&mut g, lu.pivots, n);
        g.outputs = vec![lu.lu, lu.info, perm];
        crate::ir::emit::emit(&g).lines().count()
    }

    #[test]
    fn lu_programs_do_not_grow_with_the_order() {
        // Column by column below two blocks; blocks, then the columns left, above.
        assert_eq!(factor_program(3), factor_program(2 * BLOCK - 1));
        assert_eq!(factor_program(2 * BLOCK + 1), factor_program(300));
    }
}
