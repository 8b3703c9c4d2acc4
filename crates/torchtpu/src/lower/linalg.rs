//! Matrix products. Everything reaches `dot_general`; float16/bfloat16
//! multiply in float32 and round once, as PyTorch's CPU BLAS paths do.
use super::elementwise::opmath;
use super::{op, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[
    op("mm", |cx| product(cx, "self", "mat2", 2)),
    op("bmm", |cx| product(cx, "self", "mat2", 3)),
    op("addmm", |cx| add_product(cx, 2)),
    op("baddbmm", |cx| add_product(cx, 3)),
];

/// `a @ b` for matrices (rank 2) or batches of them (rank 3).
fn matmul(cx: &mut Cx, a: &str, b: &str, rank: usize) -> Result<V> {
    let (ta, tb) = (cx.meta(a)?, cx.meta(b)?);
    let what = if rank == 2 { "matrix" } else { "3D tensor" };
    if ta.sizes.len() != rank || tb.sizes.len() != rank {
        let bad = if ta.sizes.len() != rank { a } else { b };
        return Err(Error::runtime(format!("{bad} must be a {what}")));
    }
    if ta.dtype != tb.dtype {
        return Err(Error::runtime(format!(
            "expected m1 and m2 to have the same dtype, but got: {} != {}",
            ta.dtype.torch_name().to_lowercase(),
            tb.dtype.torch_name().to_lowercase()
        )));
    }
    let k = rank - 1;
    if ta.sizes[k] != tb.sizes[k - 1] || (rank == 3 && ta.sizes[0] != tb.sizes[0]) {
        return Err(Error::runtime(format!(
            "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
            ta.sizes[k - 1], ta.sizes[k], tb.sizes[k - 1], tb.sizes[k]
        )));
    }
    let ct = opmath(ta.dtype);
    let x = cx.tensor(a)?;
    let y = cx.tensor(b)?;
    let (x, y) = (cx.g.convert(x, ct), cx.g.convert(y, ct));
    Ok(cx.g.matmul(x, y))
}

fn product(cx: &mut Cx, a: &str, b: &str, rank: usize) -> Result<Vec<V>> {
    let dtype = cx.meta(a)?.dtype;
    let r = matmul(cx, a, b, rank)?;
    Ok(vec![cx.g.convert(r, dtype)])
}

/// `beta * self + alpha * (m1 @ m2)`; beta == 0 ignores self (NaN included).
fn add_product(cx: &mut Cx, rank: usize) -> Result<Vec<V>> {
    let (a, b) = if rank == 2 { ("mat1", "mat2") } else { ("batch1", "batch2") };
    let dtype = cx.meta(a)?.dtype;
    let p = matmul(cx, a, b, rank)?;
    let ty = cx.g.ty(p).clone();
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
    let r = cx.g.binary("stablehlo.add", scaled, ap);
    Ok(vec![cx.g.convert(r, dtype)])
}
