//! The fused LSTM and GRU cells that PyTorch's nn.LSTM/nn.GRU call on CUDA
//! and PrivateUse1 devices (CPU has no kernel for them, so they cannot fall
//! back), and their backward operators: the CUDA kernels' formulas in the
//! opmath type. The workspace a cell returns for its backward holds the
//! activated gates (LSTM: i, f, g, o; GRU: r, z, n, hx, and hn with its bias).
use super::elementwise::{float_only, full_like};
use super::nn::{add, mul, sub};
use super::{op, Cx, Entry, UNDEFINED};
use crate::ensure;
use crate::error::Result;
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[
    op("_thnn_fused_lstm_cell", lstm_cell),
    op("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward),
    op("_thnn_fused_gru_cell", gru_cell),
    op("_thnn_fused_gru_cell_backward", gru_cell_backward),
];

/// `x` [B, n H] split into its n gates along dimension 1.
fn gates(cx: &mut Cx, x: V, n: i64) -> Vec<V> {
    let h = cx.g.ty(x).shape[1] / n;
    (0..n).map(|k| cx.g.slice_dim(x, 1, k * h, (k + 1) * h, 1)).collect()
}

fn sigmoid(cx: &mut Cx, x: V) -> V {
    cx.g.unary("stablehlo.logistic", x)
}

fn tanh(cx: &mut Cx, x: V) -> V {
    cx.g.unary("stablehlo.tanh", x)
}

/// `s (1 - s)`, the sigmoid's derivative from its value.
fn sigmoid_slope(cx: &mut Cx, s: V) -> V {
    let one = full_like(cx, 1.0, s);
    let c = sub(cx, one, s);
    mul(cx, c, s)
}

/// `1 - t²`, tanh's derivative from its value.
fn tanh_slope(cx: &mut Cx, t: V) -> V {
    let one = full_like(cx, 1.0, t);
    let t2 = mul(cx, t, t);
    sub(cx, one, t2)
}

/// Tensor `name` in the opmath type (None if absent).
fn read(cx: &mut Cx, name: &str) -> Result<Option<V>> {
    let Some(v) = cx.opt_tensor(name)? else { return Ok(None) };
    let ct = opmath(cx.g.ty(v).dtype);
    Ok(Some(cx.g.convert(v, ct)))
}

/// Checks as the CUDA kernels' `checkSizes`, for `factor` gates per unit.
fn check_cell(cx: &Cx, kernel: &str, factor: i64, prev: &str) -> Result<DType> {
    let (ig, hg, h) = (cx.meta("input_gates")?, cx.meta("hidden_gates")?, cx.meta(prev)?);
    ensure!(ig.sizes.len() == 2, "Expected 2-dimensional tensor, but got {}-dimensional tensor for argument #1 'input_gates' (while checking arguments for {kernel})", ig.sizes.len());
    ensure!(
        ig.sizes == hg.sizes,
        "Expected tensor for argument #1 'input_gates' to have same size as tensor for argument #2 'hidden_gates'; but {:?} does not equal {:?} (while checking arguments for {kernel})",
        ig.sizes,
        hg.sizes
    );
    if !cx.is_none("input_bias") {
        let (ib, hb) = (cx.meta("input_bias")?, cx.meta("hidden_bias")?);
        ensure!(
            ib.sizes == [ig.sizes[1]] && hb.sizes == ib.sizes,
            "{kernel}: the biases must have {} elements each",
            ig.sizes[1]
        );
    }
    ensure!(
        h.sizes.len() == 2 && h.numel() * factor == ig.numel(),
        "{kernel}: argument #5 'prev_hidden' must be 2-dimensional with {} elements",
        ig.numel() / factor
    );
    float_only(ig.dtype, kernel)?;
    Ok(ig.dtype)
}

/// The input gates plus the hidden gates plus both biases, as the kernels add them.
fn summed_gates(cx: &mut Cx, n: i64) -> Result<(Vec<V>, Vec<V>, Option<(Vec<V>, Vec<V>)>)> {
    let ig = read(cx, "input_gates")?.expect("input_gates");
    let hg = read(cx, "hidden_gates")?.expect("hidden_gates");
    let shape = cx.g.ty(ig).shape.clone();
    let biases = match (read(cx, "input_bias")?, read(cx, "hidden_bias")?) {
        (Some(ib), Some(hb)) => {
            let ib = cx.g.broadcast_in_dim(ib, &shape, &[1]);
            let hb = cx.g.broadcast_in_dim(hb, &shape, &[1]);
            Some((gates(cx, ib, n), gates(cx, hb, n)))
        }
        _ => None,
    };
    Ok((gates(cx, ig, n), gates(cx, hg, n), biases))
}

fn lstm_cell(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = check_cell(cx, "_thnn_fused_lstm_cell", 4, "cx")?;
    let (ig, hg, biases) = summed_gates(cx, 4)?;
    let mut sums = Vec::with_capacity(4);
    for k in 0..4 {
        let mut s = add(cx, ig[k], hg[k]);
        if let Some((b1, b2)) = &biases {
            s = add(cx, s, b1[k]);
            s = add(cx, s, b2[k]);
        }
        sums.push(s);
    }
    let (i, f, g, o) = (sigmoid(cx, sums[0]), sigmoid(cx, sums[1]), tanh(cx, sums[2]), sigmoid(cx, sums[3]));
    let c = read(cx, "cx")?.expect("cx");
    let fc = mul(cx, f, c);
    let ig_ = mul(cx, i, g);
    let cy = add(cx, fc, ig_);
    let tc = tanh(cx, cy);
    let hy = mul(cx, o, tc);
    let workspace = cx.g.concatenate(&[i, f, g, o], 1);
    Ok([hy, cy, workspace].into_iter().map(|v| cx.g.convert(v, dtype)).collect())
}

fn lstm_cell_backward(cx: &mut Cx) -> Result<Vec<V>> {
    if cx.is_none("grad_hy") && cx.is_none("grad_cy") {
        return Ok(vec![UNDEFINED; 3]);
    }
    let (c_meta, w_meta) = (cx.meta("cx")?, cx.meta("workspace")?);
    let defined = if cx.is_none("grad_hy") { "grad_cy" } else { "grad_hy" };
    let g_meta = cx.meta(defined)?;
    ensure!(
        g_meta.sizes.len() == 2 && c_meta.sizes == g_meta.sizes && cx.meta("cy")?.sizes == g_meta.sizes,
        "fused_lstm_cell_backward: grad_hy, grad_cy, cx and cy must be 2-dimensional, of the same size"
    );
    ensure!(
        w_meta.sizes.len() == 2 && w_meta.numel() == 4 * g_meta.numel(),
        "fused_lstm_cell_backward: the workspace must be 2-dimensional with {} elements",
        4 * g_meta.numel()
    );
    let dtype = w_meta.dtype;
    let w = read(cx, "workspace")?.expect("workspace");
    let w = gates(cx, w, 4);
    let (i, f, g, o) = (w[0], w[1], w[2], w[3]);
    let c = read(cx, "cx")?.expect("cx");
    let cy = read(cx, "cy")?.expect("cy");
    let zero = full_like(cx, 0.0, c);
    let go = read(cx, "grad_hy")?.unwrap_or(zero);
    let goc = read(cx, "grad_cy")?.unwrap_or(zero);
    let t = tanh(cx, cy);
    let gog = mul(cx, go, t);
    let slope = tanh_slope(cx, t);
    let gcx = mul(cx, go, o);
    let gcx = mul(cx, gcx, slope);
    let gcx = add(cx, gcx, goc);
    let (gig, gfg, gcg) = (mul(cx, gcx, g), mul(cx, gcx, c), mul(cx, gcx, i));
    let grad_cx = mul(cx, gcx, f);
    let (si, sf, sg, so) = (sigmoid_slope(cx, i), sigmoid_slope(cx, f), tanh_slope(cx, g), sigmoid_slope(cx, o));
    let grads = [mul(cx, gig, si), mul(cx, gfg, sf), mul(cx, gcg, sg), mul(cx, gog, so)];
    let grad_gates = cx.g.concatenate(&grads, 1);
    let grad_gates = cx.g.convert(grad_gates, dtype);
    let grad_bias = bias_grad(cx, grad_gates)?;
    Ok(vec![grad_gates, cx.g.convert(grad_cx, dtype), grad_bias])
}

/// The batch sum of gate gradients when the cell has biases.
fn bias_grad(cx: &mut Cx, grad_gates: V) -> Result<V> {
    Ok(if cx.bool("has_bias")? { cx.g.reduce(ReduceKind::Sum, grad_gates, &[0]) } else { UNDEFINED })
}

fn gru_cell(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = check_cell(cx, "_thnn_fused_gru_cell", 3, "hx")?;
    let (ig, hg, biases) = summed_gates(cx, 3)?;
    let (mut r, mut z, mut n_in, mut hn) = (add(cx, ig[0], hg[0]), add(cx, ig[1], hg[1]), ig[2], hg[2]);
    if let Some((b1, b2)) = &biases {
        r = add(cx, r, b1[0]);
        r = add(cx, r, b2[0]);
        z = add(cx, z, b1[1]);
        z = add(cx, z, b2[1]);
        n_in = add(cx, n_in, b1[2]);
        hn = add(cx, hn, b2[2]);
    }
    let (r, z) = (sigmoid(cx, r), sigmoid(cx, z));
    let rhn = mul(cx, r, hn);
    let n = add(cx, n_in, rhn);
    let n = tanh(cx, n);
    let hx = read(cx, "hx")?.expect("hx");
    let d = sub(cx, hx, n);
    let zd = mul(cx, z, d);
    let hy = add(cx, n, zd);
    let workspace = cx.g.concatenate(&[r, z, n, hx, hn], 1);
    Ok([hy, workspace].into_iter().map(|v| cx.g.convert(v, dtype)).collect())
}

fn gru_cell_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (g_meta, w_meta) = (cx.meta("grad_hy")?, cx.meta("workspace")?);
    ensure!(
        g_meta.sizes.len() == 2 && w_meta.sizes == [g_meta.sizes[0], g_meta.sizes[1] * 5],
        "fused_gru_cell_backward: grad_hy must be 2-dimensional [B, H] and the workspace [B, 5 H]"
    );
    let dtype = g_meta.dtype;
    let w = read(cx, "workspace")?.expect("workspace");
    let w = gates(cx, w, 5);
    let (r, z, n, hx, hn) = (w[0], w[1], w[2], w[3], w[4]);
    let go = read(cx, "grad_hy")?.expect("grad_hy");
    let d = sub(cx, hx, n);
    let gz = mul(cx, go, d);
    let sz = sigmoid_slope(cx, z);
    let gz = mul(cx, gz, sz);
    let ghx = mul(cx, go, z);
    let one = full_like(cx, 1.0, z);
    let omz = sub(cx, one, z);
    let gn = mul(cx, go, omz);
    let sn = tanh_slope(cx, n);
    let gn = mul(cx, gn, sn);
    let ghn = mul(cx, gn, r);
    let gr = mul(cx, gn, hn);
    let sr = sigmoid_slope(cx, r);
    let gr = mul(cx, gr, sr);
    let grad_input = cx.g.concatenate(&[gr, gz, gn], 1);
    let grad_hidden = cx.g.concatenate(&[gr, gz, ghn], 1);
    let (grad_input, grad_hidden) = (cx.g.convert(grad_input, dtype), cx.g.convert(grad_hidden, dtype));
    let (bi, bh) = (bias_grad(cx, grad_input)?, bias_grad(cx, grad_hidden)?);
    Ok(vec![grad_input, grad_hidden, cx.g.convert(ghx, dtype), bi, bh])
}
