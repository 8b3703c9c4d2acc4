//! Convolutions: `convolution_overrideable` and its backward, PyTorch's hooks
//! for out-of-tree backends, with any number of spatial dimensions, groups,
//! strides, padding, dilation, and transposed convolutions.
//!
//! Both forms are one StableHLO convolution in PyTorch's layouts ([N, C,
//! spatial...] data, [out, in / groups, spatial...] kernel). A transposed
//! convolution is the input gradient of a plain one: a convolution of the
//! lhs-dilated input with the weight spatially reversed and regrouped to a
//! kernel. Gradients are convolutions as well, derived from the IR
//! convolution whatever it computes (as JAX's `_conv_general_dilated_transpose_*`):
//! the input's convolves grad_output with the reversed kernel, the kernel's
//! convolves the input with grad_output, batch and feature roles swapped.
//! Integer tensors convolve in their own type, as on CPU; bool ones raise
//! CPU's error.
use super::elementwise::{finish, not_implemented};
use super::pool::{add_windows, spread_slices, window_slices, Window};
use super::{op, Cx, Entry, Layout, UNDEFINED};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{dilated, Conv, ReduceKind, V};

/// Results are channels-last where the input or the weight is, as CPU's and
/// cuDNN's kernels give them.
const LAYOUT: Layout = Layout::Suggested(&["input", "weight"]);

pub static ENTRIES: &[Entry] = &[
    op("convolution_overrideable", convolution).laid_out(LAYOUT),
    op("convolution_backward_overrideable", convolution_backward).laid_out(LAYOUT),
];

/// PyTorch's convolution arguments.
struct Params {
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    transposed: bool,
    output_padding: Vec<i64>,
    groups: i64,
}

/// The arguments, each list expanded to one entry per spatial dimension as
/// PyTorch's `expand_param_if_needed` does.
fn params(cx: &Cx, spatial: usize) -> Result<Params> {
    let list = |name: &str| -> Result<Vec<i64>> {
        let v = cx.ints(name)?;
        match v.len() {
            1 => Ok(vec![v[0]; spatial]),
            n if n == spatial => Ok(v),
            n => Err(Error::runtime(format!(
                "expected {name} to be a single integer value or a list of {spatial} values to match the convolution dimensions, but got {name}={v:?} ({n} values)"
            ))),
        }
    };
    Ok(Params {
        stride: list("stride")?,
        padding: list("padding")?,
        dilation: list("dilation")?,
        transposed: cx.bool("transposed")?,
        output_padding: list("output_padding")?,
        groups: cx.int("groups")?,
    })
}

/// The CPU kernel that runs a convolution of these parameters and kernel
/// size, as named in its error for bool tensors (the one dtype CPU has no
/// convolution for).
fn cpu_kernel(p: &Params, kernel: &[i64]) -> &'static str {
    let ones = |v: &[i64]| v.iter().all(|&x| x == 1);
    match (p.transposed, kernel.len()) {
        (true, 3) => "slow_conv_transpose3d_out_cpu",
        (true, _) => "slow_conv_transpose2d_out_cpu",
        _ if !ones(&p.dilation) => "slow_conv_dilated<>",
        // Unless it is a pointwise product, it first gathers columns.
        (false, 3) if !ones(kernel) || !ones(&p.stride) || p.padding.iter().any(|&x| x != 0) => "compute_columns3d",
        (false, 3) => "slow_conv3d_cpu",
        _ => "slow_conv2d_cpu",
    }
}

/// Reads a tensor of a convolution in its compute type.
fn operand(cx: &mut Cx, name: &str, p: &Params) -> Result<V> {
    let dtype = cx.meta(name)?.dtype;
    if dtype == DType::Bool {
        return Err(not_implemented(cpu_kernel(p, &cx.meta("weight")?.sizes[2..]), dtype));
    }
    let v = cx.tensor(name)?;
    Ok(cx.g.convert(v, opmath(dtype)))
}

fn identity(rank: usize) -> Vec<i64> {
    (0..rank as i64).collect()
}

/// The IR convolution of input and kernel computing PyTorch's, given the
/// weight's shape.
fn forward_conv(p: &Params, weight: &[i64]) -> Conv {
    let n = weight.len() - 2;
    let layout = identity(n + 2);
    let base = Conv {
        lhs: layout.clone(),
        rhs: layout.clone(),
        out: layout,
        strides: p.stride.clone(),
        padding: p.padding.iter().map(|&x| (x, x)).collect(),
        lhs_dilation: vec![1; n],
        rhs_dilation: p.dilation.clone(),
        feature_groups: p.groups,
        batch_groups: 1,
    };
    if !p.transposed {
        return base;
    }
    // The input gradient of the convolution with these parameters; the
    // output_padding extends the high side.
    let padding = (0..n)
        .map(|i| {
            let edge = dilated(weight[i + 2], p.dilation[i]) - 1 - p.padding[i];
            (edge, edge + p.output_padding[i])
        })
        .collect();
    Conv { strides: vec![1; n], padding, lhs_dilation: p.stride.clone(), ..base }
}

fn spatial_dims(rank: usize) -> Vec<i64> {
    (2..rank as i64).collect()
}

/// [g a, b, k...] -> [g b, a, k...]: exchanges the feature dimensions
/// within each of the g groups (its own inverse, on the result's shape).
fn regroup(cx: &mut Cx, w: V, groups: i64) -> V {
    let shape = cx.g.ty(w).shape.clone();
    let (a, b) = (shape[0] / groups, shape[1]);
    let split: Vec<i64> = [groups, a, b].iter().chain(&shape[2..]).copied().collect();
    let w = cx.g.reshape(w, &split);
    let perm: Vec<i64> = [0, 2, 1].into_iter().chain(3..split.len() as i64).collect();
    let w = cx.g.transpose(w, &perm);
    let merged: Vec<i64> = [groups * b, a].iter().chain(&shape[2..]).copied().collect();
    cx.g.reshape(w, &merged)
}

/// The kernel of `forward_conv`: the weight itself, or for a transposed
/// convolution ([in, out / g, k...]) reversed and regrouped to [out, in / g, k...].
fn kernel(cx: &mut Cx, w: V, p: &Params) -> V {
    if !p.transposed {
        return w;
    }
    let rank = cx.g.ty(w).rank();
    let w = cx.g.reverse(w, &spatial_dims(rank));
    regroup(cx, w, p.groups)
}

/// The weight's gradient from the kernel's (the inverse of `kernel`).
fn weight_grad(cx: &mut Cx, k: V, p: &Params) -> V {
    if !p.transposed {
        return k;
    }
    let rank = cx.g.ty(k).rank();
    let k = regroup(cx, k, p.groups);
    cx.g.reverse(k, &spatial_dims(rank))
}

fn swapped(layout: &[i64]) -> Vec<i64> {
    let mut l = layout.to_vec();
    l.swap(0, 1);
    l
}

/// Sizes of `shape`'s spatial dimensions in `layout`.
fn spatial(shape: &[i64], layout: &[i64]) -> Vec<i64> {
    layout[2..].iter().map(|&d| shape[d as usize]).collect()
}

/// The gradient of `c`'s input (of shape `lhs`) from the output's `g`:
/// grad_output convolved with the reversed kernel, strides and input
/// dilation exchanged. The kernel must be in [out, in, spatial...] order.
fn input_grad(cx: &mut Cx, g: V, kernel: V, c: &Conv, lhs: &[i64]) -> V {
    let (gs, ks) = (cx.g.ty(g).shape.clone(), cx.g.ty(kernel).shape.clone());
    let (ls, ks_sp, os) = (spatial(lhs, &c.lhs), spatial(&ks, &c.rhs), spatial(&gs, &c.out));
    let n = ls.len();
    // Groups move from the kernel's output features to its input features:
    // [g o, i, k...] -> [o, g i, k...].
    let mut kernel = kernel;
    if c.feature_groups > 1 {
        let groups = c.feature_groups;
        let split: Vec<i64> = [groups, ks[0] / groups].iter().chain(&ks[1..]).copied().collect();
        kernel = cx.g.reshape(kernel, &split);
        let perm: Vec<i64> = [1, 0].into_iter().chain(2..split.len() as i64).collect();
        kernel = cx.g.transpose(kernel, &perm);
        let merged: Vec<i64> = [ks[0] / groups, groups * ks[1]].iter().chain(&ks[2..]).copied().collect();
        kernel = cx.g.reshape(kernel, &merged);
    }
    let kernel = cx.g.reverse(kernel, &c.rhs[2..]);
    let padding = (0..n)
        .map(|i| {
            let window = dilated(ks_sp[i], c.rhs_dilation[i]);
            let lo = window - c.padding[i].0 - 1;
            let hi = dilated(ls[i], c.lhs_dilation[i]) + window - 1 - dilated(os[i], c.strides[i]) - lo;
            (lo, hi)
        })
        .collect();
    let t = Conv {
        lhs: c.out.clone(),
        rhs: swapped(&c.rhs),
        out: c.lhs.clone(),
        strides: c.lhs_dilation.clone(),
        padding,
        lhs_dilation: c.strides.clone(),
        rhs_dilation: c.rhs_dilation.clone(),
        feature_groups: c.feature_groups,
        batch_groups: 1,
    };
    cx.g.convolution(g, kernel, t, cx.precision)
}

/// The gradient of `c`'s kernel (of shape `rhs`) from the output's `g`: the
/// input convolved with grad_output, batch and feature roles exchanged,
/// strides and kernel dilation exchanged.
fn kernel_grad(cx: &mut Cx, g: V, input: V, c: &Conv, rhs: &[i64]) -> V {
    let (gs, xs) = (cx.g.ty(g).shape.clone(), cx.g.ty(input).shape.clone());
    let (ls, ks, os) = (spatial(&xs, &c.lhs), spatial(rhs, &c.rhs), spatial(&gs, &c.out));
    let padding = (0..ls.len())
        .map(|i| {
            let lo = c.padding[i].0;
            let hi = dilated(os[i], c.strides[i]) - dilated(ls[i], c.lhs_dilation[i])
                + dilated(ks[i], c.rhs_dilation[i])
                - lo
                - 1;
            (lo, hi)
        })
        .collect();
    let t = Conv {
        lhs: swapped(&c.lhs),
        rhs: swapped(&c.out),
        out: swapped(&c.rhs),
        strides: c.rhs_dilation.clone(),
        padding,
        lhs_dilation: c.lhs_dilation.clone(),
        rhs_dilation: c.strides.clone(),
        feature_groups: 1,
        batch_groups: 1,
    };
    if c.feature_groups == 1 {
        return cx.g.convolution(input, g, t, cx.precision);
    }
    // Each group's kernel contracts its own input and output features over
    // the batch. As a batch-grouped convolution (JAX's form) XLA:CPU expands
    // it into a dense one `groups` times larger (96-768x for ConvNeXt's
    // depthwise layers); instead the batch joins the features: the input as
    // [in / G, G N, spatial...] and grad_output as [G out / G, N, spatial...],
    // feature-grouped.
    debug_assert!(c.lhs == identity(xs.len()) && c.out == identity(gs.len()), "forward_conv's layouts");
    let groups = c.feature_groups;
    let x = batch_into_features(cx, input, groups, &[2, 1, 0], false);
    let g = batch_into_features(cx, g, groups, &[1, 2, 0], true);
    let t = Conv { lhs: identity(xs.len()), rhs: identity(gs.len()), feature_groups: groups, ..t };
    cx.g.convolution(x, g, t, cx.precision)
}

/// [N, G f, spatial...] with the axes (N, G, f) put in `order`, the last two
/// joined (or the first two, `join_first`).
fn batch_into_features(cx: &mut Cx, v: V, groups: i64, order: &[i64; 3], join_first: bool) -> V {
    let shape = cx.g.ty(v).shape.clone();
    let axes = [shape[0], groups, shape[1] / groups];
    let split: Vec<i64> = axes.iter().chain(&shape[2..]).copied().collect();
    let v = cx.g.reshape(v, &split);
    let perm: Vec<i64> = order.iter().copied().chain(3..split.len() as i64).collect();
    let v = cx.g.transpose(v, &perm);
    let [a, b, c] = order.map(|i| axes[i as usize]);
    let joined = if join_first { [a * b, c] } else { [a, b * c] };
    let merged: Vec<i64> = joined.iter().chain(&shape[2..]).copied().collect();
    cx.g.reshape(v, &merged)
}

// ------------------------------------------------------------------ taps

/// How a convolution lowers as taps: one strided slice of the input per
/// kernel offset, combined with that offset's weights and summed. XLA:CPU
/// runs feature-grouped convolutions as naive loops (~0.5 GFLOP/s), and its
/// dense convolutions are slow over small maps of many channels (ResNet's
/// later stages: 3x3 kernels over 2x2 to 8x8 maps, up to 60x slower than
/// CPU's); as taps they are fused loops and matrix products. Over large maps
/// of few channels its own convolution is faster (bench/RESULTS.md).
#[derive(Clone, Copy, PartialEq)]
enum Taps {
    /// One input and one output channel per group (MobileNet's, ConvNeXt's):
    /// each tap multiplies its slice by per-channel weights.
    Depthwise,
    /// One group, a few kernel offsets, and no more output positions (over
    /// the batch) than weights per offset: each tap is a [out, in] matrix
    /// product whose weights outweigh the activations it moves.
    Dense,
}

/// Kernels with at most this many offsets lower as dense taps (1x1, 3x3).
const DENSE_TAPS: i64 = 9;

/// The taps and their window of a convolution, if it lowers as taps.
fn taps(p: &Params, input: &[i64], weight: &[i64]) -> Option<(Taps, Window)> {
    let n = weight.len().checked_sub(2)?;
    if p.transposed || input.contains(&0) || weight.contains(&0) {
        return None;
    }
    let output: Vec<i64> = (0..n)
        .map(|i| (input[i + 2] + 2 * p.padding[i] - dilated(weight[i + 2], p.dilation[i])) / p.stride[i] + 1)
        .collect();
    if output.iter().any(|&o| o <= 0) {
        return None;
    }
    let positions = input[0] * output.iter().product::<i64>();
    let depthwise = p.groups > 1 && p.groups == input[1] && weight[0] == p.groups && weight[1] == 1;
    let dense =
        p.groups == 1 && weight[2..].iter().product::<i64>() <= DENSE_TAPS && positions <= weight[0] * weight[1];
    let kind = match (depthwise, dense) {
        (true, _) => Taps::Depthwise,
        (_, true) => Taps::Dense,
        _ => return None,
    };
    let window = Window {
        kernel: weight[2..].to_vec(),
        stride: p.stride.clone(),
        pad: p.padding.clone(),
        dilation: p.dilation.clone(),
        input: input[2..].to_vec(),
        output,
    };
    Some((kind, window))
}

/// Offset `k`'s weights: per channel [C] (depthwise) or the matrix [out, in]
/// (dense), of the weight [out, in, k...].
fn weights_at(cx: &mut Cx, kind: Taps, w: V, k: i64) -> V {
    let shape = cx.g.ty(w).shape.clone();
    let count: i64 = shape[2..].iter().product();
    let w = cx.g.reshape(w, &[shape[0], shape[1], count]);
    let t = cx.g.slice(w, &[0, 0, k], &[shape[0], shape[1], k + 1], &[1, 1, 1]);
    match kind {
        Taps::Depthwise => cx.g.reshape(t, &[shape[0]]),
        Taps::Dense => cx.g.reshape(t, &[shape[0], shape[1]]),
    }
}

/// [N, C, spatial...] <-> [C, N spatial...]: the layout dense taps multiply in.
fn channels_first(cx: &mut Cx, v: V) -> V {
    let shape = cx.g.ty(v).shape.clone();
    let perm: Vec<i64> = [1, 0].into_iter().chain(2..shape.len() as i64).collect();
    let v = cx.g.transpose(v, &perm);
    cx.g.reshape(v, &[shape[1], shape.iter().product::<i64>() / shape[1]])
}

fn channels_second(cx: &mut Cx, v: V, like: &[i64]) -> V {
    let split: Vec<i64> = [like[1], like[0]].iter().chain(&like[2..]).copied().collect();
    let v = cx.g.reshape(v, &split);
    let perm: Vec<i64> = [1, 0].into_iter().chain(2..like.len() as i64).collect();
    cx.g.transpose(v, &perm)
}

/// Offset k's weights applied to `s` ([N, in, spatial...] -> [N, out,
/// spatial...]); `transposed`: the transposed weights (out -> in).
fn apply_tap(cx: &mut Cx, kind: Taps, s: V, w: V, k: i64, transposed: bool) -> V {
    let shape = cx.g.ty(s).shape.clone();
    let t = weights_at(cx, kind, w, k);
    match kind {
        Taps::Depthwise => {
            let t = cx.g.broadcast_in_dim(t, &shape, &[1]);
            cx.g.binary("stablehlo.multiply", s, t)
        }
        Taps::Dense => {
            let t = if transposed { cx.g.transpose(t, &[1, 0]) } else { t };
            let out = cx.g.ty(t).shape[0];
            let flat = channels_first(cx, s);
            let y = cx.g.matmul(t, flat, cx.precision);
            let like: Vec<i64> = [shape[0], out].iter().chain(&shape[2..]).copied().collect();
            channels_second(cx, y, &like)
        }
    }
}

/// The sum over offsets of each offset's slice with its weights (with
/// `transposed`, the transposed weights: the input gradient). Elementwise
/// (depthwise) it fuses into one loop: a stacked window and a reduction were
/// 40x slower, XLA:CPU materialized the stack.
fn tap_sum(cx: &mut Cx, kind: Taps, slices: Vec<V>, w: V, transposed: bool) -> V {
    let mut acc = None;
    for (k, s) in slices.into_iter().enumerate() {
        let p = apply_tap(cx, kind, s, w, k as i64, transposed);
        acc = Some(acc.map_or(p, |a| cx.g.binary("stablehlo.add", a, p)));
    }
    acc.expect("a kernel offset")
}

/// (input gradient, weight gradient) of a convolution lowered as taps.
fn tap_backward(
    cx: &mut Cx,
    kind: Taps,
    g: V,
    x: Option<V>,
    w: Option<V>,
    win: &Window,
    input: &[i64],
) -> (Option<V>, Option<V>) {
    let gi = w.map(|w| {
        if kind == Taps::Dense && win.stride.iter().any(|&s| s != 1) {
            // Each offset's matrix product on the output grid, spread back:
            // on the stride-spread grid it would multiply zeros too.
            return add_windows(cx, win, input, |cx, k| apply_tap(cx, kind, g, w, k, true));
        }
        let slices = spread_slices(cx, g, win);
        tap_sum(cx, kind, slices, w, true)
    });
    let gw = x.map(|x| {
        let gs = cx.g.ty(g).shape.clone();
        let slices = window_slices(cx, x, win, 0.0);
        let per_tap: Vec<V> = match kind {
            // Every offset's products reduced in one loop: a reduction
            // each was a loop each (~3 s of XLA:CPU compilation for a 7x7
            // kernel, 2x slower at 56x56; bench/RESULTS.md). The spatial
            // (minor) dimensions first: XLA:CPU reduces rows fast.
            Taps::Depthwise => {
                let products: Vec<V> = slices.into_iter().map(|s| cx.g.binary("stablehlo.multiply", s, g)).collect();
                let spatial: Vec<usize> = (2..gs.len()).collect();
                let sums = cx.g.reduce_many(ReduceKind::Sum, &products, &spatial);
                let sums = cx.g.reduce_many(ReduceKind::Sum, &sums, &[0]);
                sums.into_iter().map(|r| cx.g.reshape(r, &[gs[1], 1, 1])).collect()
            }
            Taps::Dense => {
                let gf = channels_first(cx, g);
                slices
                    .into_iter()
                    .map(|s| {
                        let sf = channels_first(cx, s);
                        let sf = cx.g.transpose(sf, &[1, 0]);
                        let r = cx.g.matmul(gf, sf, cx.precision);
                        let r_shape = cx.g.ty(r).shape.clone();
                        cx.g.reshape(r, &[r_shape[0], r_shape[1], 1])
                    })
                    .collect()
            }
        };
        let r = cx.g.concatenate(&per_tap, 2);
        let in_channels = cx.g.ty(r).shape[1];
        let kernel: Vec<i64> = [gs[1], in_channels].iter().chain(&win.kernel).copied().collect();
        cx.g.reshape(r, &kernel)
    });
    (gi, gw)
}

/// Whether a convolution multiplies each position's channels alone: a 1x1
/// kernel, unit strides, no padding, one group (ResNet's bottlenecks,
/// MobileNet's pointwise layers, a Fourier operator's channel mixing). Over
/// maps of at least `POINTWISE_POSITIONS` it lowers as a matrix product per
/// image, [out, in] by [in, positions], which XLA:CPU runs 1.2-3x faster
/// than its convolution or dense taps (whose transposes cost more than
/// their one product saves there; smaller maps keep them: bench/RESULTS.md).
fn pointwise(p: &Params, input: &[i64], weight: &[i64]) -> bool {
    let ones = |v: &[i64]| v.iter().all(|&x| x == 1);
    input[2..].iter().product::<i64>() >= POINTWISE_POSITIONS
        && !p.transposed
        && p.groups == 1
        && ones(&weight[2..])
        && ones(&p.stride)
        && p.padding.iter().all(|&x| x == 0)
        && !input.contains(&0)
        && !weight.contains(&0)
}

/// How a convolution lowers: as matrix products (pointwise), as taps, or
/// as XLA's convolution.
enum Form {
    Pointwise,
    Taps(Taps, Window),
    Convolution,
}

fn form(p: &Params, input: &[i64], weight: &[i64]) -> Form {
    if pointwise(p, input, weight) {
        return Form::Pointwise;
    }
    taps(p, input, weight).map_or(Form::Convolution, |(kind, win)| Form::Taps(kind, win))
}

/// The smallest map (positions per image) a pointwise convolution lowers
/// as per-image products over.
const POINTWISE_POSITIONS: i64 = 128;

/// [N, C, spatial...] as [N, C, positions].
fn flat_map(cx: &mut Cx, v: V) -> V {
    let shape = cx.g.ty(v).shape.clone();
    cx.g.reshape(v, &[shape[0], shape[1], shape[2..].iter().product()])
}

/// The weight [out, in, 1...] as [N, out, in]: one matrix per image, the
/// batch dimension of the products.
fn per_image(cx: &mut Cx, w: V, n: i64) -> V {
    let shape = cx.g.ty(w).shape.clone();
    let w = cx.g.reshape(w, &shape[..2]);
    cx.g.broadcast_in_dim(w, &[n, shape[0], shape[1]], &[1, 2])
}

/// A pointwise convolution: weight [out, in] by each image's [in, positions].
fn pointwise_forward(cx: &mut Cx, x: V, w: V) -> V {
    let shape = cx.g.ty(x).shape.clone();
    let out = cx.g.ty(w).shape[0];
    let wb = per_image(cx, w, shape[0]);
    let xf = flat_map(cx, x);
    let y = cx.g.dot_general(wb, xf, (&[0], &[0]), (&[2], &[1]), cx.precision);
    let like: Vec<i64> = [shape[0], out].iter().chain(&shape[2..]).copied().collect();
    cx.g.reshape(y, &like)
}

/// A pointwise convolution's (input gradient, weight gradient): the
/// transposed weight by each image's gradient, and each image's gradient
/// by its input, summed over images.
fn pointwise_backward(cx: &mut Cx, g: V, x: Option<V>, w: Option<V>, input: &[i64]) -> (Option<V>, Option<V>) {
    let gf = flat_map(cx, g);
    let gi = w.map(|w| {
        let wb = per_image(cx, w, input[0]);
        let gi = cx.g.dot_general(wb, gf, (&[0], &[0]), (&[1], &[1]), cx.precision);
        cx.g.reshape(gi, input)
    });
    let gw = x.map(|x| {
        let xf = flat_map(cx, x);
        // Per image, then summed: XLA:CPU transposes both operands of one
        // product contracting images and positions together (3x slower).
        let per_image = cx.g.dot_general(gf, xf, (&[0], &[0]), (&[2], &[2]), cx.precision);
        let gw = cx.g.reduce(ReduceKind::Sum, per_image, &[0]);
        let shape = cx.g.ty(gw).shape.clone();
        let kernel: Vec<i64> = shape.iter().copied().chain(input[2..].iter().map(|_| 1)).collect();
        cx.g.reshape(gw, &kernel)
    });
    (gi, gw)
}

fn convolution(cx: &mut Cx) -> Result<Vec<V>> {
    let (xt, wt) = (cx.meta("input")?, cx.meta("weight")?);
    let p = params(cx, wt.sizes.len().saturating_sub(2))?;
    let x = operand(cx, "input", &p)?;
    let w = operand(cx, "weight", &p)?;
    let mut y = match form(&p, xt.sizes, wt.sizes) {
        Form::Pointwise => pointwise_forward(cx, x, w),
        Form::Taps(kind, win) => {
            let slices = window_slices(cx, x, &win, 0.0);
            tap_sum(cx, kind, slices, w, false)
        }
        Form::Convolution => {
            let rhs = kernel(cx, w, &p);
            cx.g.convolution(x, rhs, forward_conv(&p, wt.sizes), cx.precision)
        }
    };
    if let Some(b) = cx.opt_tensor("bias")? {
        let b = cx.g.convert(b, opmath(xt.dtype));
        let shape = cx.g.ty(y).shape.clone();
        let b = cx.g.broadcast_in_dim(b, &shape, &[1]);
        y = cx.g.binary("stablehlo.add", y, b);
    }
    finish(cx, y, xt.dtype)
}

/// (grad_input, grad_weight, grad_bias), each computed only if output_mask
/// asks for it.
fn convolution_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (xt, wt) = (cx.meta("input")?, cx.meta("weight")?);
    let p = params(cx, wt.sizes.len().saturating_sub(2))?;
    let mask = cx.bools("output_mask")?;
    let g = operand(cx, "grad_output", &p)?;
    let c = forward_conv(&p, wt.sizes);
    let mut out = vec![UNDEFINED; 3];
    let form = form(&p, xt.sizes, wt.sizes);
    if !matches!(form, Form::Convolution) {
        let w = if mask[0] { Some(operand(cx, "weight", &p)?) } else { None };
        let x = if mask[1] { Some(operand(cx, "input", &p)?) } else { None };
        let (gi, gw) = match form {
            Form::Taps(kind, win) => tap_backward(cx, kind, g, x, w, &win, xt.sizes),
            _ => pointwise_backward(cx, g, x, w, xt.sizes),
        };
        out[0] = gi.map_or(UNDEFINED, |gi| cx.g.convert(gi, xt.dtype));
        out[1] = gw.map_or(UNDEFINED, |gw| cx.g.convert(gw, wt.dtype));
    } else {
        if mask[0] {
            let w = operand(cx, "weight", &p)?;
            let k = kernel(cx, w, &p);
            let gi = input_grad(cx, g, k, &c, xt.sizes);
            out[0] = cx.g.convert(gi, xt.dtype);
        }
        if mask[1] {
            let x = operand(cx, "input", &p)?;
            let mut kernel_shape = wt.sizes.to_vec();
            if p.transposed {
                kernel_shape[0] = wt.sizes[1] * p.groups;
                kernel_shape[1] = wt.sizes[0] / p.groups;
            }
            let gk = kernel_grad(cx, g, x, &c, &kernel_shape);
            let gw = weight_grad(cx, gk, &p);
            out[1] = cx.g.convert(gw, wt.dtype);
        }
    }
    if mask[2] {
        let rank = cx.g.ty(g).rank();
        let dims: Vec<usize> = (0..rank).filter(|&d| d != 1).collect();
        let gb = cx.g.reduce(ReduceKind::Sum, g, &dims);
        out[2] = cx.g.convert(gb, cx.meta("grad_output")?.dtype);
    }
    Ok(out)
}
