//! PyTorch's fused attention kernels: `_native_multi_head_attention`
//! (nn.MultiheadAttention's fast path in eval mode, which PyTorch takes on
//! PrivateUse1 devices too), `_masked_softmax` with its backward, and the
//! fused `scaled_dot_product_attention` the adapter chooses
//! (`torchtpu::attention`, csrc/attention.cpp) with its backward, with
//! CPU's formulas in the opmath type.
use super::elementwise::{finish, float_only};
use super::nn::{add, div, exp_shifted, mul, reduce_back, sub};
use super::random::uniform01_of;
use super::{op, op_consts, wrap_dim, Cx, Entry, UNDEFINED};
use crate::ensure;
use crate::error::Result;
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, Ty, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op("_native_multi_head_attention", multi_head_attention),
    op("_masked_softmax", masked_softmax),
    op("_masked_softmax_backward", masked_softmax_backward),
    op_consts("torchtpu::attention", fused_attention, &["dropout_p"]),
    op_consts("torchtpu::attention_backward", fused_attention_backward, &["dropout_p"]),
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

/// The sizes of a fused attention call, its query heads grouped by the key
/// head they share (grouped-query attention; G = 1 otherwise). Scores are
/// computed per key head over G·L rows, [B, Hk, G·L, S]: query head
/// `j·G + g` reads key head `j`, as the composite's `repeat_interleave`.
struct Grouped {
    b: i64,
    hk: i64,
    g: i64,
    l: i64,
    s: i64,
    ev: i64,
    ct: DType,
}

impl Grouped {
    fn of(cx: &Cx) -> Result<Grouped> {
        let (q, k, v) = (cx.meta("query")?, cx.meta("key")?, cx.meta("value")?);
        ensure!(
            q.sizes.len() == 4 && k.sizes.len() == 4 && v.sizes.len() == 4,
            "tpu's fused attention takes 4-d query, key and value"
        );
        float_only(q.dtype, "_scaled_dot_product_fused_attention_overrideable")?;
        ensure!(k.dtype == q.dtype && v.dtype == q.dtype, "Expected query, key, and value to have the same dtype");
        let (hq, hk) = (q.sizes[1], k.sizes[1]);
        ensure!(hk > 0 && hq % hk == 0, "number of heads in key/value must divide number of heads in query");
        let g = hq / hk;
        Ok(Grouped { b: q.sizes[0], hk, g, l: q.sizes[2], s: k.sizes[2], ev: v.sizes[3], ct: opmath(q.dtype) })
    }

    fn scores(&self) -> [i64; 4] {
        [self.b, self.hk, self.g * self.l, self.s]
    }

    /// The query heads' shape of a [B, Hk, G·L, n] value.
    fn by_query_head(&self, n: i64) -> [i64; 4] {
        [self.b, self.hk * self.g, self.l, n]
    }

    /// Reads `name` [B, H, T, ..] in the opmath type as [B, Hk, G·T, ..]
    /// (query-shaped operands, and the log-sum-exp [B, Hq, L]) or as it is
    /// (key-shaped ones).
    fn read(&self, cx: &mut Cx, name: &str) -> Result<V> {
        let x = cx.tensor(name)?;
        let shape = cx.g.ty(x).shape.clone();
        let x = cx.g.convert(x, self.ct);
        let grouped: Vec<i64> =
            [shape[0], self.hk, shape[1] / self.hk * shape[2]].into_iter().chain(shape[3..].iter().copied()).collect();
        Ok(cx.g.reshape(x, &grouped))
    }
}

/// `lhs` [B, Hk, m, k] times `rhs` [B, Hk, .., ..], contracting dimension
/// `lc` of lhs with `rc` of rhs.
fn batched(cx: &mut Cx, lhs: V, rhs: V, lc: i64, rc: i64) -> V {
    cx.g.dot_general(lhs, rhs, (&[0, 1], &[0, 1]), (&[lc], &[rc]), cx.precision)
}

/// The scores `scale · q kᵀ + attn_bias` [B, Hk, G·L, S] in the opmath type,
/// the positions a causal mask leaves out at -inf, and the scale splat to
/// the scores' shape (`scale`, else 1/√E).
fn scores(cx: &mut Cx, at: &Grouped, q: V, k: V) -> Result<(V, V)> {
    let shape = at.scores();
    let e = cx.meta("query")?.sizes[3];
    let scale = match cx.scalar_like("scale", at.ct, &shape)? {
        Some(s) => s,
        None => cx.g.full(1.0 / (e as f64).sqrt(), at.ct, &shape),
    };
    let qk = batched(cx, q, k, 3, 3);
    let mut s = mul(cx, qk, scale);
    if let Some(bias) = cx.opt_tensor("attn_bias")? {
        let bias = cx.g.convert(bias, at.ct);
        let bias = cx.g.broadcast_to(bias, &at.by_query_head(at.s));
        let bias = cx.g.reshape(bias, &shape);
        s = add(cx, s, bias);
    }
    if cx.bool("is_causal")? {
        // Row l keeps columns 0..=l (the upper-left triangle, as the composite's tril).
        let grid = [at.g, at.l, at.s];
        let (rows, cols) = (cx.g.iota(DType::I64, &grid, 1), cx.g.iota(DType::I64, &grid, 2));
        let after = cx.g.compare("GT", cols, rows);
        let after = cx.g.reshape(after, &[at.g * at.l, at.s]);
        let after = cx.g.broadcast_in_dim(after, &shape, &[2, 3]);
        let minus_inf = cx.g.full(f64::NEG_INFINITY, at.ct, &shape);
        s = cx.g.select(after, minus_inf, s);
    }
    Ok((s, scale))
}

/// `x` with its dimensions in the order the int list `layout` gives (the
/// adapter views the result with the strides PyTorch's meta function gives).
fn laid_out(cx: &mut Cx, x: V, layout: &str) -> Result<V> {
    let order = cx.ints(layout)?;
    Ok(cx.g.transpose(x, &order))
}

/// `x` where `cond`, else 0.
fn zero_unless(cx: &mut Cx, cond: V, x: V) -> V {
    let ty = cx.g.ty(x).clone();
    let zero = cx.g.full(0.0, ty.dtype, &ty.shape);
    cx.g.select(cond, x, zero)
}

/// The softmax of the scores over their last dimension, unnormalized: the
/// exponentials `e` of the scores less their row's maximum, the rows' sums
/// and maxima, and which rows have a position left in (`live`: a row whose
/// every position is left out gives 0, as PyTorch's `_safe_softmax` in the
/// composite).
struct Softmax {
    e: V,
    sum: V,
    max: V,
    live: V,
}

fn softmax_rows(cx: &mut Cx, at: &Grouped, s: V) -> Softmax {
    let max = cx.g.reduce(ReduceKind::Max, s, &[3]);
    let (e, max, live) = exp_less(cx, at, s, max);
    let sum = cx.g.reduce(ReduceKind::Sum, e, &[3]);
    Softmax { e, sum, max, live }
}

/// `exp(s - shift)` with `shift` [B, Hk, G·L] per row, a row whose shift is
/// -inf (every position left out) shifted by 0 instead, so that its
/// exponentials are 0, not NaN; and that shift and which rows are live.
fn exp_less(cx: &mut Cx, at: &Grouped, s: V, shift: V) -> (V, V, V) {
    let (shape, rows) = (at.scores(), &at.scores()[..3]);
    let minus_inf = cx.g.full(f64::NEG_INFINITY, at.ct, rows);
    let live = cx.g.compare("NE", shift, minus_inf);
    let shift = zero_unless(cx, live, shift);
    let shift_b = cx.g.broadcast_in_dim(shift, &shape, &[0, 1, 2]);
    let shifted = sub(cx, s, shift_b);
    (cx.g.unary("stablehlo.exponential", shifted), shift, live)
}

/// `value` [B, Hk, G·L, n] divided by its row's sum, 0 in rows left out.
fn normalize(cx: &mut Cx, sm: &Softmax, value: V) -> V {
    let shape = cx.g.ty(value).shape.clone();
    let sum = cx.g.broadcast_in_dim(sm.sum, &shape, &[0, 1, 2]);
    let live = cx.g.broadcast_in_dim(sm.live, &shape, &[0, 1, 2]);
    let r = div(cx, value, sum);
    zero_unless(cx, live, r)
}

/// The dropout of the probabilities (`dropout_p` > 0): the positions kept,
/// each with probability 1 - p as `native_dropout` keeps them, drawn from a
/// u64[2] key, and the factor 1 / (1 - p) of those kept. The backward
/// draws the same positions again from the key the forward returned.
struct Dropout {
    keep: V,
    scale: V,
}

impl Dropout {
    fn of(cx: &mut Cx, at: &Grouped, key: V) -> Result<Dropout> {
        let p = cx.const_f64("dropout_p")?;
        let shape = at.scores();
        let u = uniform01_of(cx, key, &shape);
        let keep_p = cx.g.full(1.0 - p, DType::F32, &shape);
        let keep = cx.g.compare("LT", u, keep_p);
        let scale = cx.g.full(1.0 / (1.0 - p), at.ct, &shape);
        Ok(Dropout { keep, scale })
    }

    /// `x` [B, Hk, G·L, S] with the dropped positions 0, the rest scaled.
    fn apply(&self, cx: &mut Cx, x: V) -> V {
        let kept = zero_unless(cx, self.keep, x);
        mul(cx, kept, self.scale)
    }
}

/// `softmax(scores) · v` (its dimensions in `layout`'s order, the
/// probabilities through the dropout if there is one), the rows' log-sum-exp
/// (-inf for a row left out), and the dropout's key as two int64 scalars
/// (PyTorch's philox seed and offset; zeros without dropout).
fn fused_attention(cx: &mut Cx) -> Result<Vec<V>> {
    let at = Grouped::of(cx)?;
    let dtype = cx.meta("query")?.dtype;
    let (q, k, v) = (at.read(cx, "query")?, at.read(cx, "key")?, at.read(cx, "value")?);
    let (s, _) = scores(cx, &at, q, k)?;
    let sm = softmax_rows(cx, &at, s);
    let key = if cx.const_f64("dropout_p")? > 0.0 { Some(cx.seed(None)?) } else { None };
    let e = match key {
        Some(key) => Dropout::of(cx, &at, key)?.apply(cx, sm.e),
        None => sm.e,
    };
    let ev = batched(cx, e, v, 3, 2);
    let out = normalize(cx, &sm, ev);
    let out = cx.g.reshape(out, &at.by_query_head(at.ev));
    let out = laid_out(cx, out, "layout")?;
    // A row left out has max 0 and sum 0: its log-sum-exp is -inf as it is.
    let log_sum = cx.g.unary("stablehlo.log", sm.sum);
    let lse = add(cx, sm.max, log_sum);
    let lse = cx.g.reshape(lse, &at.by_query_head(1)[..3]);
    let (seed, offset) = match key {
        Some(key) => (key_half(cx, key, 0), key_half(cx, key, 1)),
        None => (cx.g.full(0.0, DType::I64, &[]), cx.g.full(0.0, DType::I64, &[])),
    };
    Ok(vec![cx.g.convert(out, dtype), cx.g.convert(lse, DType::F32), seed, offset])
}

/// Word `i` of a u64[2] key as an int64 scalar.
fn key_half(cx: &mut Cx, key: V, i: i64) -> V {
    let word = cx.g.slice(key, &[i], &[i + 1], &[1]);
    let word = cx.g.reshape(word, &[]);
    cx.g.bitcast(word, Ty::new(DType::I64, &[]))
}

/// The u64[2] key the forward returned as `philox_seed` and `philox_offset`.
fn key_of(cx: &mut Cx) -> Result<V> {
    let mut words = Vec::with_capacity(2);
    for name in ["philox_seed", "philox_offset"] {
        let word = cx.tensor(name)?;
        let word = cx.g.bitcast(word, Ty::new(DType::U64, &[]));
        words.push(cx.g.reshape(word, &[1]));
    }
    Ok(cx.g.concatenate(&words, 0))
}

/// `x` [B, Hq, L, S] summed over the dimensions `attn_bias` broadcast
/// along, in its shape.
fn sum_to_bias(cx: &mut Cx, x: V, bias: &[i64]) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let lead = shape.len() - bias.len();
    let dims: Vec<usize> = (0..shape.len()).filter(|&d| d < lead || (bias[d - lead] == 1 && shape[d] != 1)).collect();
    let summed = cx.g.reduce(ReduceKind::Sum, x, &dims);
    cx.g.reshape(summed, bias)
}

/// The gradients of query, key, value and attn_bias (those
/// `grad_input_mask` asks for), as flash attention's backward computes
/// them: the probabilities P = exp(S - lse) recomputed from the scores and
/// the forward's log-sum-exp (0 in rows left out), dP = dO Vᵀ,
/// dS = P ∘ (dP - D) with D = rowsum(dO ∘ O), which equals rowsum(P ∘ dP)
/// but reads the forward's output [.., L, Ev] instead of two [.., L, S]
/// values; dV = Pᵀ dO, dQ = scale · dS K, dK = scale · dSᵀ Q,
/// d(attn_bias) = dS; with dropout, dV takes the dropped P and dP goes
/// through the same dropout (the forward's key draws the same positions).
/// Renormalizing P by its recomputed row maximum and sum, then reducing
/// P ∘ dP, cost three more passes over the scores, what a large model's
/// step pays on a GPU (bench/RESULTS.md). A saturated row (P = 1 at one
/// position) keeps a zero gradient up to rounding: its dP there and D are
/// the same product, dO · v. With bf16/f16 operands D reads the rounded
/// output, as CUDA's flash attention does.
fn fused_attention_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let at = Grouped::of(cx)?;
    let wanted = cx.bools("grad_input_mask")?;
    let (qm, km, vm) = (cx.meta("query")?, cx.meta("key")?, cx.meta("value")?);
    let (q, k, v) = (at.read(cx, "query")?, at.read(cx, "key")?, at.read(cx, "value")?);
    let (grad, out, lse) = (at.read(cx, "grad_out")?, at.read(cx, "out")?, at.read(cx, "logsumexp")?);
    let (s, scale) = scores(cx, &at, q, k)?;
    let (p, _, _) = exp_less(cx, &at, s, lse);
    let dp = batched(cx, grad, v, 3, 3);
    let (dropped, dp) = if cx.const_f64("dropout_p")? > 0.0 {
        let key = key_of(cx)?;
        let dropout = Dropout::of(cx, &at, key)?;
        (dropout.apply(cx, p), dropout.apply(cx, dp))
    } else {
        (p, dp)
    };
    let grad_by_out = mul(cx, grad, out);
    let d = cx.g.reduce(ReduceKind::Sum, grad_by_out, &[3]);
    let d = cx.g.broadcast_in_dim(d, &at.scores(), &[0, 1, 2]);
    let centered = sub(cx, dp, d);
    let ds = mul(cx, p, centered);
    let ds_scaled = mul(cx, ds, scale);
    let want = |i: usize| wanted.get(i).copied().unwrap_or(true);
    let mut grads = [UNDEFINED; 4];
    if want(0) {
        let dq = batched(cx, ds_scaled, k, 3, 2);
        let dq = cx.g.reshape(dq, qm.sizes);
        let dq = cx.g.convert(dq, qm.dtype);
        grads[0] = laid_out(cx, dq, "query_layout")?;
    }
    if want(1) {
        let dk = batched(cx, ds_scaled, q, 2, 2);
        let dk = cx.g.convert(dk, km.dtype);
        grads[1] = laid_out(cx, dk, "key_layout")?;
    }
    if want(2) {
        let dv = batched(cx, dropped, grad, 2, 2);
        let dv = cx.g.convert(dv, vm.dtype);
        grads[2] = laid_out(cx, dv, "value_layout")?;
    }
    if want(3) && !cx.is_none("attn_bias") {
        let bias = cx.meta("attn_bias")?;
        let ds = cx.g.reshape(ds, &at.by_query_head(at.s));
        let db = sum_to_bias(cx, ds, bias.sizes);
        let db = cx.g.convert(db, bias.dtype);
        grads[3] = laid_out(cx, db, "attn_bias_layout")?;
    }
    Ok(grads.to_vec())
}
