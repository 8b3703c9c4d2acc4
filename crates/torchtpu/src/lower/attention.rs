//! PyTorch's fused attention kernels: `_native_multi_head_attention`
//! (nn.MultiheadAttention's fast path in eval mode, which PyTorch takes on
//! PrivateUse1 devices too) and `_masked_softmax` with its backward, with
//! CPU's formulas in the opmath type. `scaled_dot_product_attention` is
//! PyTorch's math composite and needs nothing here.
use super::elementwise::{finish, float_only};
use super::nn::{add, div, exp_shifted, mul, reduce_back, sub};
use super::{op, wrap_dim, Cx, Entry, UNDEFINED};
use crate::ensure;
use crate::error::Result;
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op("_native_multi_head_attention", multi_head_attention),
    op("_masked_softmax", masked_softmax),
    op("_masked_softmax_backward", masked_softmax_backward),
];

/// `x` [.., k] times `w`ᵀ (w: [n, k]) plus `b` [n].
fn linear(cx: &mut Cx, x: V, w: V, b: V) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let (lead, k) = (&shape[..shape.len() - 1], shape[shape.len() - 1]);
    let (rows, n) = (lead.iter().product::<i64>(), cx.g.ty(w).shape[0]);
    let x = cx.g.reshape(x, &[rows, k]);
    let wt = cx.g.transpose(w, &[1, 0]);
    let y = cx.g.matmul(x, wt, cx.precision);
    let b = cx.g.broadcast_in_dim(b, &[rows, n], &[1]);
    let y = add(cx, y, b);
    cx.g.reshape(y, &[lead, &[n]].concat())
}

/// The mask of `_masked_softmax` as a bool array of the input's shape
/// (true: left out). A 2-d mask of a 4-d input [B, H, L, L] is, by
/// `mask_type`, an attention mask (0: [L, L]) or a padding mask (1: [B, L]);
/// any other (2) has the input's shape.
fn softmax_mask(cx: &mut Cx, input: &Tensor, mask: &Tensor, mask_type: Option<i64>) -> Result<V> {
    let (x, m) = (input.sizes, mask.sizes);
    let kind = if m.len() != 2 || x.len() != 4 { 2 } else { mask_type.unwrap_or(2) };
    let dims: &[i64] = match kind {
        2 => {
            ensure!(x == m, "For mask_type == 2 mask shape should match input shape");
            &[0, 1, 2, 3][..x.len()]
        }
        1 => {
            ensure!(x[0] == m[0] && x[2] == m[1], "For mask_type == 1 mask shape should be (B, L)");
            &[0, 3]
        }
        0 => {
            ensure!(x[2] == m[0] && x[2] == m[1], "For mask_type == 0 mask shape should be (L, L)");
            &[2, 3]
        }
        n => return Err(crate::error::Error::runtime(format!("Unknown mask_type: {n}"))),
    };
    let v = cx.tensor("mask")?;
    Ok(cx.g.broadcast_in_dim(v, x, dims))
}

/// Softmax of `x` over `dims` with the `masked` positions left out (a row
/// left out entirely is NaN, as on CPU).
fn softmax_without(cx: &mut Cx, x: V, masked: V, dims: &[usize]) -> V {
    let ty = cx.g.ty(x).clone();
    let minus_inf = cx.g.full(f64::NEG_INFINITY, ty.dtype, &ty.shape);
    let x = cx.g.select(masked, minus_inf, x);
    let (_, e, sum) = exp_shifted(cx, x, dims);
    div(cx, e, sum)
}

/// The reduced dimension of `_masked_softmax` and its backward (none for a
/// 0-d tensor: its softmax is over its one element).
fn softmax_dims(cx: &Cx, rank: usize) -> Result<Vec<usize>> {
    let dim = wrap_dim(cx.opt_int("dim")?.unwrap_or(rank as i64 - 1), rank)?;
    Ok(if rank == 0 { vec![] } else { vec![dim] })
}

fn masked_softmax(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, m) = (cx.meta("self")?, cx.meta("mask")?);
    ensure!(m.dtype == DType::Bool, "Mask should be a boolean tensor");
    let mask = softmax_mask(cx, &t, &m, cx.opt_int("mask_type")?)?;
    float_only(t.dtype, "masked_softmax")?;
    let dims = softmax_dims(cx, t.sizes.len())?;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(t.dtype));
    let r = softmax_without(cx, x, mask, &dims);
    finish(cx, r, t.dtype)
}

/// `y (g - sum(g y))` over the positions the mask keeps, 0 elsewhere.
fn masked_softmax_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (gt, m) = (cx.meta("grad_output")?, cx.meta("mask")?);
    ensure!(gt.sizes == m.sizes, "Mask shape should match grad shape");
    ensure!(m.dtype == DType::Bool, "Mask should be a boolean tensor");
    float_only(gt.dtype, "masked_softmax_backward")?;
    let dims = softmax_dims(cx, gt.sizes.len())?;
    let ct = opmath(gt.dtype);
    let g = cx.tensor("grad_output")?;
    let y = cx.tensor("output")?;
    let mask = cx.tensor("mask")?;
    let (g, y) = (cx.g.convert(g, ct), cx.g.convert(y, ct));
    let zero = cx.g.full(0.0, ct, gt.sizes);
    let gy = mul(cx, g, y);
    let gy = cx.g.select(mask, zero, gy);
    let sum = reduce_back(cx, ReduceKind::Sum, gy, &dims);
    let d = sub(cx, g, sum);
    let r = mul(cx, y, d);
    let r = cx.g.select(mask, zero, r);
    finish(cx, r, gt.dtype)
}

/// Checks as CPU's `native_multi_head_attention_cpu` makes them.
fn check_attention(cx: &Cx, d: i64, heads: i64) -> Result<()> {
    let (q, k, v) = (cx.meta("query")?, cx.meta("key")?, cx.meta("value")?);
    let (w, b) = (cx.meta("qkv_weight")?, cx.meta("qkv_bias")?);
    ensure!(q.sizes.len() == 3, "expected 3-D `query`, got {}-D tensor", q.sizes.len());
    ensure!(q.sizes[2] == d, "passed-in embed_dim {d} didn't match last dim of query {}", q.sizes[2]);
    ensure!(k.sizes.len() == 3, "expected 3-D `key`, got {}-D tensor", k.sizes.len());
    ensure!(v.sizes.len() == 3, "expected 3-D `value`, got {}-D tensor", v.sizes.len());
    ensure!(q.sizes == k.sizes && k.sizes == v.sizes, "expected `query`/`key`/`value` shapes to match");
    ensure!(w.sizes.len() == 2, "expected 2-D `qkv_weight`, got {}-D tensor", w.sizes.len());
    ensure!(d * 3 == w.sizes[0], "expected `qkv_weight` first dim to be 3x embed_dim");
    ensure!(d == w.sizes[1], "expected `qkv_weight` second dim to be embed_Dim");
    ensure!(b.sizes.len() == 1, "expected 1-D `qkv_bias`, got {}-D tensor", b.sizes.len());
    ensure!(b.sizes[0] == 3 * d, "expected `qkv_bias` first dim and first dim of query to be equal");
    ensure!(heads > 0 && d % heads == 0, "`embed_dim` must divide evenly by `num_heads`");
    Ok(())
}

/// Projects query, key and value by their thirds of `qkv_weight`/`qkv_bias`,
/// attends per head (`softmax(q kᵀ / sqrt(dh)) v`, the mask's positions left
/// out), and projects the heads' concatenation; the weights are averaged
/// over heads if asked for.
fn multi_head_attention(cx: &mut Cx) -> Result<Vec<V>> {
    let (d, heads) = (cx.int("embed_dim")?, cx.int("num_head")?);
    check_attention(cx, d, heads)?;
    let q = cx.meta("query")?;
    let need_weights = cx.bool("need_weights")?;
    if q.numel() == 0 {
        return Ok(vec![cx.g.full(0.0, q.dtype, q.sizes), UNDEFINED]);
    }
    float_only(q.dtype, "transform_bias_rescale_qkv")?;
    let (b, t, dh) = (q.sizes[0], q.sizes[1], d / heads);
    let ct = opmath(q.dtype);
    let mut read = |name: &str| -> Result<V> {
        let v = cx.tensor(name)?;
        Ok(cx.g.convert(v, ct))
    };
    let (w, bias, proj_w, proj_b) = (read("qkv_weight")?, read("qkv_bias")?, read("proj_weight")?, read("proj_bias")?);
    let inputs = [read("query")?, read("key")?, read("value")?];
    // [B, T, D] -> [B, H, T, dh] for each of q, k, v.
    let mut qkv = Vec::with_capacity(3);
    for (i, x) in inputs.into_iter().enumerate() {
        let i = i as i64;
        let wi = cx.g.slice_dim(w, 0, i * d, (i + 1) * d, 1);
        let bi = cx.g.slice_dim(bias, 0, i * d, (i + 1) * d, 1);
        let y = linear(cx, x, wi, bi);
        let y = cx.g.reshape(y, &[b, t, heads, dh]);
        qkv.push(cx.g.transpose(y, &[0, 2, 1, 3]));
    }
    let scale = cx.g.full(1.0 / (dh as f64).sqrt(), ct, &[b, heads, t, dh]);
    let q_scaled = mul(cx, qkv[0], scale);
    let kt = cx.g.transpose(qkv[1], &[0, 1, 3, 2]);
    let scores = cx.g.matmul(q_scaled, kt, cx.precision);
    let weights = if cx.is_none("mask") {
        let (_, e, sum) = exp_shifted(cx, scores, &[3]);
        div(cx, e, sum)
    } else {
        let (m, sizes) = (cx.meta("mask")?, [b, heads, t, t]);
        let mask = softmax_mask(cx, &Tensor { sizes: &sizes, ..q }, &m, cx.opt_int("mask_type")?)?;
        // Any nonzero value of a float mask leaves its position out.
        let zero = cx.g.full(0.0, m.dtype, &sizes);
        let mask = if m.dtype == DType::Bool { mask } else { cx.g.compare("NE", mask, zero) };
        softmax_without(cx, scores, mask, &[3])
    };
    let context = cx.g.matmul(weights, qkv[2], cx.precision);
    let context = cx.g.transpose(context, &[0, 2, 1, 3]);
    let context = cx.g.reshape(context, &[b, t, d]);
    let out = linear(cx, context, proj_w, proj_b);
    let out = cx.g.convert(out, q.dtype);
    if !need_weights {
        return Ok(vec![out, UNDEFINED]);
    }
    let weights = if cx.bool("average_attn_weights")? {
        let sum = cx.g.reduce(ReduceKind::Sum, weights, &[1]);
        let h = cx.g.full(heads as f64, ct, &[b, t, t]);
        div(cx, sum, h)
    } else {
        weights
    };
    Ok(vec![out, cx.g.convert(weights, q.dtype)])
}
