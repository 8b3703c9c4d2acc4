//! Matrix products. Everything reaches `dot_general`; float16/bfloat16
//! multiply in float32 and round once, as PyTorch's CPU BLAS paths do.
//! Checks and messages follow each op's CPU meta function and kernel.
use super::elementwise::{cpp_name, full_like, no_bool, not_implemented, round_to};
use super::factor::{check_info, first_bad_minor, transpose};
use super::shape::{expand_check, keep_triangle};
use super::{op, op_complex, Cx, Entry};
use crate::ensure;
use crate::error::{torch_at_least, Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{Graph, ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op_complex("mm", mm),
    op_complex("bmm", bmm),
    op_complex("addmm", addmm),
    op("_addmm_activation", addmm_activation),
    op_complex("baddbmm", baddbmm),
    op_complex("addbmm", addbmm),
    op_complex("linalg_cross", cross),
    op_complex("addmv", addmv),
    op_complex("dot", |cx| dot(cx, "tensor")),
    // Real vectors' vdot is their dot, with dot's checks and messages on CPU
    // too; complex ones conjugate the first.
    op_complex("vdot", |cx| dot(cx, "other")),
    op("_grouped_mm", grouped_mm),
    op("linalg_cholesky_ex", cholesky),
    op("linalg_solve_triangular", solve_triangular),
    op("triangular_solve", triangular_solve),
    op("_cholesky_solve_helper", cholesky_solve),
    op("cholesky_inverse", cholesky_inverse),
];

/// Rank and shape checks of `mm`/`addmm` (`what` names the op in torch
/// 2.15's messages; 2.11's name neither the op nor the rank).
fn check_matrices(m1: &Tensor, m2: &Tensor, what: &str) -> Result<()> {
    let named = crate::error::torch_at_least(2, 15);
    let (op, sep) = if named { (what, ": ") } else { ("", "") };
    for (m, name) in [(m1, "self"), (m2, "mat2")] {
        let rank = m.sizes.len();
        let got = || if named { format!(", got {rank}-D tensor") } else { String::new() };
        ensure!(rank == 2, "{op}{sep}{name} must be a matrix{}", got());
    }
    ensure!(
        m1.sizes[1] == m2.sizes[0],
        "{op}{sep}mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
        m1.sizes[0],
        m1.sizes[1],
        m2.sizes[0],
        m2.sizes[1]
    );
    Ok(())
}

/// Rank and shape checks of `bmm`/`baddbmm`.
fn check_batches(b1: &Tensor, b2: &Tensor) -> Result<()> {
    ensure!(b1.sizes.len() == 3, "batch1 must be a 3D tensor");
    ensure!(b2.sizes.len() == 3, "batch2 must be a 3D tensor");
    ensure!(
        b2.sizes[..2] == [b1.sizes[0], b1.sizes[2]],
        "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: [{}, {}].",
        b1.sizes[0],
        b1.sizes[2],
        b2.sizes[0],
        b2.sizes[1]
    );
    ensure!(b1.dtype == b2.dtype, "expected scalar type {} but found {}", b1.dtype.torch_name(), b2.dtype.torch_name());
    Ok(())
}

/// `a @ b` in opmath; a vector `a` acts as a [1, n] matrix and a vector `b`
/// as [n, 1], and their dimension is dropped from the result. Bool raises
/// the CPU `kernel`'s error, which empty products never reach. `vdot`
/// conjugates `a`.
fn product(cx: &mut Cx, a: &str, b: &str, kernel: &str) -> Result<V> {
    let (ta, tb) = (cx.meta(a)?, cx.meta(b)?);
    let mut shape = ta.sizes[..ta.sizes.len() - 1].to_vec();
    if tb.sizes.len() > 1 {
        shape.push(tb.sizes[tb.sizes.len() - 1]);
    }
    let ct = opmath(ta.dtype);
    let k = ta.sizes[ta.sizes.len() - 1];
    if k == 0 || shape.contains(&0) {
        return Ok(cx.g.full(0.0, ct, &shape));
    }
    // CPU's batched products hand all but tiny ones to addmm's kernel.
    let kernel = if ta.sizes.len() == 3 && k * shape[1] * shape[2] >= 400 { "addmm_impl_cpu_" } else { kernel };
    no_bool(ta.dtype, kernel)?;
    let x = cx.tensor(a)?;
    let y = cx.tensor(b)?;
    let (mut x, mut y) = (cx.g.convert(x, ct), cx.g.convert(y, ct));
    if kernel == "vdot" {
        x = cx.g.conj(x);
    }
    if ta.sizes.len() == 1 {
        x = cx.g.reshape(x, &[1, ta.sizes[0]]);
    }
    if tb.sizes.len() == 1 {
        y = cx.g.reshape(y, &[tb.sizes[0], 1]);
    }
    let p = cx.g.matmul(x, y, cx.precision);
    Ok(cx.g.reshape(p, &shape))
}

/// `beta * self + alpha * p`, in p's (opmath) type; beta == 0 ignores self,
/// NaN included.
fn add_scaled(cx: &mut Cx, p: V) -> Result<V> {
    let ty = cx.g.ty(p).clone();
    let t = cx.meta("self")?;
    expand_check(&t, &ty.shape)?;
    let input = cx.tensor("self")?;
    let input = cx.g.convert(input, ty.dtype);
    let input = cx.g.broadcast_to(input, &ty.shape);
    let alpha = cx.scalar_like("alpha", ty.dtype, &ty.shape)?.expect("alpha");
    let beta = cx.scalar_like("beta", ty.dtype, &ty.shape)?.expect("beta");
    let zero = cx.g.full(0.0, ty.dtype, &ty.shape);
    let scaled = cx.g.binary("stablehlo.multiply", beta, input);
    let skip = cx.g.compare("EQ", beta, zero);
    let scaled = cx.g.select(skip, zero, scaled);
    let ap = cx.g.binary("stablehlo.multiply", alpha, p);
    Ok(cx.g.binary("stablehlo.add", scaled, ap))
}

fn finish(cx: &mut Cx, v: V, dtype: DType) -> Result<Vec<V>> {
    Ok(vec![cx.g.convert(v, dtype)])
}

fn mm(cx: &mut Cx) -> Result<Vec<V>> {
    let (m1, m2) = (cx.meta("self")?, cx.meta("mat2")?);
    check_matrices(&m1, &m2, "mm")?;
    ensure!(
        m1.dtype == m2.dtype,
        "expected m1 and m2 to have the same dtype, but got: {} != {}",
        cpp_name(m1.dtype),
        cpp_name(m2.dtype)
    );
    let p = product(cx, "self", "mat2", "addmm_impl_cpu_")?;
    finish(cx, p, m1.dtype)
}

fn addmm(cx: &mut Cx) -> Result<Vec<V>> {
    let (r, dtype) = addmm_value(cx)?;
    finish(cx, r, dtype)
}

/// addmm, then ReLU or GELU (`use_gelu`): nn.Linear with its activation in
/// PyTorch's transformer fast path.
fn addmm_activation(cx: &mut Cx) -> Result<Vec<V>> {
    let (r, dtype) = addmm_value(cx)?;
    // CPU applies the activation in place to the rounded result.
    let r = round_to(cx, r, dtype);
    let r = if cx.bool("use_gelu")? {
        super::nn::gelu_exact(cx, r)
    } else {
        let zero = full_like(cx, 0.0, r);
        cx.g.binary("stablehlo.maximum", r, zero)
    };
    finish(cx, r, dtype)
}

/// `beta self + alpha mat1 mat2` in the compute type, and the result dtype.
fn addmm_value(cx: &mut Cx) -> Result<(V, DType)> {
    let (t, m1, m2) = (cx.meta("self")?, cx.meta("mat1")?, cx.meta("mat2")?);
    check_matrices(&m1, &m2, "addmm")?;
    for (name, x) in [("self", &t), ("mat1", &m1)] {
        ensure!(
            x.dtype == m2.dtype,
            "{name} and mat2 must have the same dtype, but got {} and {}",
            x.dtype.torch_name(),
            m2.dtype.torch_name()
        );
    }
    let p = product(cx, "mat1", "mat2", "addmm_impl_cpu_")?;
    Ok((add_scaled(cx, p)?, m1.dtype))
}

/// `_grouped_mm` (MoE layers): products of E groups given by `offs`, the
/// groups' exclusive ends. Shapes stay static, whatever the routing: each
/// group's product is computed for all rows and each row keeps its own
/// group's (E times one product's work; rows past the last group are zero).
/// 2-d x 3-d: self's rows grouped, one mat2 matrix per group; 2-d x 2-d: the
/// contracted dimension grouped, one result per group (the weight gradient);
/// 3-d x 3-d without offs: a batched product.
fn grouped_mm(cx: &mut Cx) -> Result<Vec<V>> {
    let (a, b) = (cx.meta("self")?, cx.meta("mat2")?);
    ensure!(cx.is_none("bias"), "Bias not supported yet");
    let out_dtype = cx.dtype("out_dtype")?.unwrap_or(a.dtype);
    let ct = opmath(a.dtype);
    let x = cx.tensor("self")?;
    let y = cx.tensor("mat2")?;
    let (x, y) = (cx.g.convert(x, ct), cx.g.convert(y, ct));
    let offs = cx.opt_tensor("offs")?;
    let r = match (a.sizes, b.sizes, offs) {
        (&[_, _, _], &[_, _, _], None) => cx.g.matmul(x, y, cx.precision),
        (&[m, k], &[e, _, n], Some(offs)) => {
            let xe = cx.g.broadcast_in_dim(x, &[e, m, k], &[1, 2]);
            let all = cx.g.matmul(xe, y, cx.precision);
            let mask = group_mask(cx, offs, m);
            let mask = cx.g.broadcast_in_dim(mask, &[e, m, n], &[0, 1]);
            let zero = cx.g.full(0.0, ct, &[e, m, n]);
            let own = cx.g.select(mask, all, zero);
            cx.g.reduce(ReduceKind::Sum, own, &[0])
        }
        (&[m, k], &[_, n], Some(offs)) => {
            let e = cx.g.ty(offs).numel();
            let mask = group_mask(cx, offs, k);
            let mask = cx.g.broadcast_in_dim(mask, &[e, m, k], &[0, 2]);
            let xe = cx.g.broadcast_in_dim(x, &[e, m, k], &[1, 2]);
            let zero = cx.g.full(0.0, ct, &[e, m, k]);
            let xe = cx.g.select(mask, xe, zero);
            let ye = cx.g.broadcast_in_dim(y, &[e, k, n], &[1, 2]);
            cx.g.matmul(xe, ye, cx.precision)
        }
        _ => {
            return Err(Error::not_implemented(format!(
                "torchtpu: _grouped_mm of a {}-d and a {}-d tensor{} has no lowering",
                a.sizes.len(),
                b.sizes.len(),
                if cx.is_none("offs") { " without offs" } else { " with offs" }
            )))
        }
    };
    finish(cx, r, out_dtype)
}

/// [E, n] bools: whether position j lies in group e, [offs[e - 1], offs[e]).
fn group_mask(cx: &mut Cx, offs: V, n: i64) -> V {
    let e = cx.g.ty(offs).numel();
    let ends = cx.g.convert(offs, DType::I64);
    let first = cx.g.full(0.0, DType::I64, &[1]);
    let before = cx.g.slice(ends, &[0], &[e - 1], &[1]);
    let starts = cx.g.concatenate(&[first, before], 0);
    let (starts, ends) = (cx.g.broadcast_in_dim(starts, &[e, n], &[0]), cx.g.broadcast_in_dim(ends, &[e, n], &[0]));
    let pos = cx.g.iota(DType::I64, &[e, n], 1);
    let after_start = cx.g.compare("GE", pos, starts);
    let before_end = cx.g.compare("LT", pos, ends);
    cx.g.binary("stablehlo.and", after_start, before_end)
}

fn bmm(cx: &mut Cx) -> Result<Vec<V>> {
    let (b1, b2) = (cx.meta("self")?, cx.meta("mat2")?);
    check_batches(&b1, &b2)?;
    let p = product(cx, "self", "mat2", "bmm")?;
    finish(cx, p, b1.dtype)
}

fn baddbmm(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, b1, b2) = (cx.meta("self")?, cx.meta("batch1")?, cx.meta("batch2")?);
    check_batches(&b1, &b2)?;
    ensure!(
        t.dtype == b1.dtype,
        "Input dtypes must be the same, got: input {}, batch1: {}, batch2: {}",
        cpp_name(t.dtype),
        cpp_name(b1.dtype),
        cpp_name(b2.dtype)
    );
    let p = product(cx, "batch1", "batch2", "baddbmm")?;
    let r = add_scaled(cx, p)?;
    finish(cx, r, b1.dtype)
}

/// `beta self + alpha Σ_b batch1[b] batch2[b]`: one product of the batches
/// laid side by side ([n, B·k] by [B·k, p]).
fn addbmm(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, b1, b2) = (cx.meta("self")?, cx.meta("batch1")?, cx.meta("batch2")?);
    ensure!(b1.sizes.len() == 3, "batch1 must be a 3D tensor");
    ensure!(b2.sizes.len() == 3, "batch2 must be a 3D tensor");
    let (batches, n, k, p) = (b1.sizes[0], b1.sizes[1], b1.sizes[2], b2.sizes[2]);
    expand_check(&t, &[n, p])?;
    ensure!(
        b2.sizes[0] == batches,
        "batch1 and batch2 must have same number of batches, got {batches} and {}",
        b2.sizes[0]
    );
    ensure!(b2.sizes[1] == k, "Incompatible matrix sizes for bmm ({n}x{k} and {}x{p})", b2.sizes[1]);
    for (name, x) in [("self", &t), ("mat1", &b1)] {
        ensure!(
            x.dtype == b2.dtype,
            "{name} and mat2 must have the same dtype, but got {} and {}",
            x.dtype.torch_name(),
            b2.dtype.torch_name()
        );
    }
    let ct = opmath(b1.dtype);
    let product = if batches * k == 0 {
        cx.g.full(0.0, ct, &[n, p])
    } else {
        no_bool(b1.dtype, "addmm_impl_cpu_")?;
        let (x, y) = (cx.tensor("batch1")?, cx.tensor("batch2")?);
        let (x, y) = (cx.g.convert(x, ct), cx.g.convert(y, ct));
        let x = cx.g.transpose(x, &[1, 0, 2]);
        let x = cx.g.reshape(x, &[n, batches * k]);
        let y = cx.g.reshape(y, &[batches * k, p]);
        cx.g.matmul(x, y, cx.precision)
    };
    let r = add_scaled(cx, product)?;
    finish(cx, r, b1.dtype)
}

/// The cross product of 3-vectors along `dim`, the batch broadcast.
fn cross(cx: &mut Cx) -> Result<Vec<V>> {
    let (a, b) = (cx.meta("self")?, cx.meta("other")?);
    ensure!(a.sizes.len() == b.sizes.len(), "linalg.cross: inputs must have the same number of dimensions.");
    let given = cx.int("dim")?;
    let dim = super::wrap_dim(given, a.sizes.len())?;
    ensure!(
        a.sizes[dim] == 3 && b.sizes[dim] == 3,
        "linalg.cross: inputs dimension {given} must have length 3. Got {} and {}",
        a.sizes[dim],
        b.sizes[dim]
    );
    ensure!(a.dtype == b.dtype, "expected scalar type {} but found {}", a.dtype.torch_name(), b.dtype.torch_name());
    no_bool(a.dtype, "cross")?;
    let ops = [cx.operand("self")?, cx.operand("other")?];
    let v = cx.promote_to(&ops, opmath(a.dtype))?;
    let shape = cx.g.ty(v[0]).shape.clone();
    let part = |cx: &mut Cx, x: V, i: i64| {
        let mut start = vec![0; shape.len()];
        let mut limit = shape.clone();
        start[dim] = i;
        limit[dim] = i + 1;
        cx.g.slice(x, &start, &limit, &vec![1; shape.len()])
    };
    let xs: Vec<V> = (0..3).map(|i| part(cx, v[0], i)).collect();
    let ys: Vec<V> = (0..3).map(|i| part(cx, v[1], i)).collect();
    let parts: Vec<V> = (0..3)
        .map(|i| {
            let (j, k) = ((i + 1) % 3, (i + 2) % 3);
            let left = cx.g.binary("stablehlo.multiply", xs[j], ys[k]);
            let right = cx.g.binary("stablehlo.multiply", xs[k], ys[j]);
            cx.g.binary("stablehlo.subtract", left, right)
        })
        .collect();
    let r = cx.g.concatenate(&parts, dim);
    finish(cx, r, a.dtype)
}

/// `beta * self + alpha * (mat @ vec)`; `mv` arrives here too.
fn addmv(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, m, v) = (cx.meta("self")?, cx.meta("mat")?, cx.meta("vec")?);
    let ranks = (t.sizes.len(), m.sizes.len(), v.sizes.len());
    ensure!(
        matches!(ranks, (0 | 1, 2, 1)),
        "vector + matrix @ vector expected, got {}, {}, {}",
        ranks.0,
        ranks.1,
        ranks.2
    );
    ensure!(
        m.sizes[1] == v.sizes[0] && (t.numel() == 1 || t.sizes == [m.sizes[0]]),
        "size mismatch, got input ({}), mat ({}x{}), vec ({})",
        t.numel(),
        m.sizes[0],
        m.sizes[1],
        v.sizes[0]
    );
    ensure!(
        t.dtype == m.dtype && m.dtype == v.dtype,
        "addmv input tensors must have the same dtype, but got {}, {}, and {}",
        t.dtype.torch_name(),
        m.dtype.torch_name(),
        v.dtype.torch_name()
    );
    let p = product(cx, "mat", "vec", "addmv_impl_cpu")?;
    let r = add_scaled(cx, p)?;
    finish(cx, r, m.dtype)
}

/// `dot(self, tensor)` and `vdot(self, other)`: `second` names the operand.
fn dot(cx: &mut Cx, second: &str) -> Result<Vec<V>> {
    let (a, b) = (cx.meta("self")?, cx.meta(second)?);
    let (na, nb) = (a.numel(), b.numel());
    ensure!(
        a.sizes.len() == 1 && b.sizes.len() == 1,
        "1D tensors expected, but got {}D and {}D tensors",
        a.sizes.len(),
        b.sizes.len()
    );
    ensure!(
        a.dtype == b.dtype,
        "dot : expected both vectors to have same dtype, but found {} and {}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    ensure!(
        na == nb,
        "inconsistent tensor size, expected tensor [{na}] and src [{nb}] to have the same number of elements, but got {na} and {nb} elements respectively"
    );
    no_bool(a.dtype, "dot")?;
    let kernel = if second == "other" { "vdot" } else { "dot" };
    let p = product(cx, "self", second, kernel)?;
    finish(cx, p, a.dtype)
}

// ------------------------------------------------------------------ factorizations and solves
//
// StableHLO has `cholesky` and `triangular_solve`; XLA expands both into
// its own blocked algorithms on every platform. LU, QR and eigh: factor.rs.

/// `what`'s checks of a batch of square floating-point matrices.
fn check_square(t: &Tensor, what: &str, name: &str) -> Result<()> {
    let r = t.sizes.len();
    ensure!(r >= 2, "{what}: The input tensor {name} must have at least 2 dimensions.");
    ensure!(
        t.sizes[r - 1] == t.sizes[r - 2],
        "{what}: {name} must be batches of square matrices, but they are {} by {} matrices",
        t.sizes[r - 2],
        t.sizes[r - 1]
    );
    check_floating(t, what)
}

/// CPU's `checkFloatingOrComplex` (a NotImplementedError since torch 2.15).
pub(super) fn check_floating(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype.has_float_values() {
        return Ok(());
    }
    let message = format!("{what}: Expected a floating point or complex tensor as input. Got {}", t.dtype.torch_name());
    Err(if torch_at_least(2, 15) { Error::not_implemented(message) } else { Error::runtime(message) })
}

/// CPU's LAPACK `kernel` has float32 and float64 (and complex: those calls
/// run through the CPU fallback).
pub(super) fn lapack_dtype(t: &Tensor, kernel: &str) -> Result<()> {
    if t.dtype.is_complex() {
        return Err(crate::error::Error::fallback(format!("torchtpu: {kernel} has no complex lowering")));
    }
    if !matches!(t.dtype, DType::F32 | DType::F64) {
        return Err(not_implemented(kernel, t.dtype));
    }
    Ok(())
}

/// `linalg_cholesky_ex`: the factor, and per matrix the order of the first
/// leading minor that is not positive-definite (0 when none is).
fn cholesky(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    check_square(&t, "linalg.cholesky", "A")?;
    let upper = cx.bool("upper")?;
    let r = t.sizes.len();
    // CPU returns empty inputs before dispatching on the dtype.
    if t.numel() == 0 {
        return Ok(vec![cx.g.full(0.0, t.dtype, t.sizes), cx.g.full(0.0, DType::I32, &t.sizes[..r - 2])]);
    }
    lapack_dtype(&t, "cholesky_cpu")?;
    let x = cx.tensor("self")?;
    let f = cx.g.cholesky(x, !upper);
    // StableHLO leaves the other triangle unspecified.
    let f = keep_triangle(&mut cx.g, f, !upper, 0);
    let on_diagonal = diagonal_mask(&mut cx.g, t.sizes);
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    let diagonal = cx.g.select(on_diagonal, f, zero);
    let diagonal = cx.g.reduce(ReduceKind::Sum, diagonal, &[r - 1]);
    let batch = cx.g.ty(diagonal).shape.clone();
    // A failed factorization leaves NaN (or a non-positive pivot) from the failing column on.
    let zeros = cx.g.full(0.0, t.dtype, &batch);
    let positive = cx.g.compare("GT", diagonal, zeros);
    let bad = cx.g.unary("stablehlo.not", positive);
    let any = cx.g.reduce(ReduceKind::Or, bad, &[r - 2]);
    let bad = cx.g.convert(bad, DType::U8);
    let first = cx.g.arg_reduce(bad, r - 2, true);
    let first = cx.g.convert(first, DType::I32);
    let one = cx.g.full(1.0, DType::I32, &batch[..r - 2]);
    let order = cx.g.binary("stablehlo.add", first, one);
    // XLA:CPU's factor is NaN throughout when it fails: the pivots name the
    // failing minor (its own order, where they do not find one).
    let lower = if upper { transpose(&mut cx.g, x) } else { x };
    let failed = cx.g.reduce(ReduceKind::Or, any, &(0..r - 2).collect::<Vec<_>>());
    let minor = first_bad_minor(&mut cx.g, lower, failed);
    let zeros = cx.g.full(0.0, DType::I32, &batch[..r - 2]);
    let found = cx.g.compare("NE", minor, zeros);
    let order = cx.g.select(found, minor, order);
    let info = cx.g.select(any, order, zeros);
    if cx.bool("check_errors")? {
        check_info(
            cx,
            info,
            Kind::LinAlg,
            "linalg.cholesky",
            "The factorization could not be completed because the input is not positive-definite (the leading minor of order {} is not positive-definite).",
            1,
        );
    }
    Ok(vec![f, info])
}

/// True on the main diagonal of each trailing matrix of `shape`.
pub(super) fn diagonal_mask(g: &mut Graph, shape: &[i64]) -> V {
    let r = shape.len();
    let rows = g.iota(DType::I64, shape, r - 2);
    let cols = g.iota(DType::I64, shape, r - 1);
    g.compare("EQ", rows, cols)
}

/// Both operands with their batch dimensions broadcast together.
fn batched(cx: &mut Cx, a: &str, b: &str) -> Result<(V, V)> {
    let (ta, tb) = (cx.meta(a)?, cx.meta(b)?);
    let (ra, rb) = (ta.sizes.len(), tb.sizes.len());
    let batch = crate::ir::broadcast_all(&[&ta.sizes[..ra - 2], &tb.sizes[..rb - 2]])?;
    let (va, vb) = (cx.tensor(a)?, cx.tensor(b)?);
    let shape = |m: &[i64]| batch.iter().chain(m).copied().collect::<Vec<i64>>();
    let va = cx.g.broadcast_to(va, &shape(&ta.sizes[ra - 2..]));
    let vb = cx.g.broadcast_to(vb, &shape(&tb.sizes[rb - 2..]));
    Ok((va, vb))
}

/// Checks of a triangular system's operands (`what` names the op).
fn check_system(a: &Tensor, b: &Tensor, what: &str) -> Result<()> {
    ensure!(a.sizes.len() >= 2, "{what}: The input tensor A must have at least 2 dimensions.");
    ensure!(b.sizes.len() >= 2, "{what}: The input tensor B must have at least 2 dimensions.");
    ensure!(
        a.dtype == b.dtype,
        "{what}: Expected A and B to have the same dtype, but found A of type {} and B of type {} instead",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    check_square(a, what, "A")?;
    lapack_dtype(a, "triangular_solve_cpu")
}

fn solve_triangular(cx: &mut Cx) -> Result<Vec<V>> {
    let (ta, tb) = (cx.meta("self")?, cx.meta("B")?);
    check_system(&ta, &tb, "linalg.solve_triangular")?;
    let (upper, left, unit) = (cx.bool("upper")?, cx.bool("left")?, cx.bool("unitriangular")?);
    let (a, b) = batched(cx, "self", "B")?;
    Ok(vec![cx.g.triangular_solve(a, b, left, !upper, unit, false)])
}

/// The deprecated `triangular_solve(B, A)`: the solution and a copy of A.
fn triangular_solve(cx: &mut Cx) -> Result<Vec<V>> {
    let (tb, ta) = (cx.meta("self")?, cx.meta("A")?);
    check_system(&ta, &tb, "torch.triangular_solve")?;
    let (upper, transpose, unit) = (cx.bool("upper")?, cx.bool("transpose")?, cx.bool("unitriangular")?);
    let (a, b) = batched(cx, "A", "self")?;
    Ok(vec![cx.g.triangular_solve(a, b, true, !upper, unit, transpose), a])
}

/// Solves `L L^T x = b` (or `U^T U x = b`) by two triangular solves.
fn solve_factored(cx: &mut Cx, f: V, b: V, upper: bool) -> V {
    let y = cx.g.triangular_solve(f, b, true, !upper, false, upper);
    cx.g.triangular_solve(f, y, true, !upper, false, !upper)
}

fn cholesky_solve(cx: &mut Cx) -> Result<Vec<V>> {
    let (b, f) = batched(cx, "self", "A")?;
    let upper = cx.bool("upper")?;
    Ok(vec![solve_factored(cx, f, b, upper)])
}

/// The inverse of `L L^T` (or `U^T U`) from its factor.
fn cholesky_inverse(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let r = t.sizes.len();
    ensure!(r >= 2, "cholesky_inverse: The input tensor input must have at least 2 dimensions.");
    let f = cx.tensor("self")?;
    let on_diagonal = diagonal_mask(&mut cx.g, t.sizes);
    let (one, zero) = (cx.g.full(1.0, t.dtype, t.sizes), cx.g.full(0.0, t.dtype, t.sizes));
    let identity = cx.g.select(on_diagonal, one, zero);
    let upper = cx.bool("upper")?;
    Ok(vec![solve_factored(cx, f, identity, upper)])
}
