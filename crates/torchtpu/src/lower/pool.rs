//! Pooling over the last 2 or 3 dimensions (1-d pooling reaches us as 2-d):
//! max pooling with CPU's indices, average pooling, adaptive average and
//! max pooling, and their backward operators.
//!
//! A fixed window is read as one strided slice of the padded input per
//! kernel offset, stacked on a new last dimension; adaptive max windows are
//! gathered, a window shorter than the longest repeating its last element
//! (which changes neither its max nor its first max's position). The index
//! of a max is its flat position within its input plane, the first maximum
//! in scan order (NaN wins), as on CPU. Adaptive average pooling is linear
//! and separable: one small averaging matrix per dimension.
use super::elementwise::{finish, not_implemented};
use super::layout::suggests_channels_last;
use super::nn::{add, mul};
use super::{op, Cx, Entry, Layout};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{dilated, Precision, ReduceKind, V};

/// What keeps a channels-last input's layout on CPU: max pooling, and 2-d
/// average and adaptive pooling (their 3-d forms are contiguous there).
const SELF: Layout = Layout::Suggested(&["self"]);

pub static ENTRIES: &[Entry] = &[
    op("max_pool2d_with_indices", |cx| max_pool(cx, 2)).laid_out(SELF),
    op("max_pool3d_with_indices", |cx| max_pool(cx, 3)).laid_out(SELF),
    op("max_pool2d_with_indices_backward", |cx| max_pool_backward(cx, "max_pool2d_backward", 2)).laid_out(SELF),
    op("max_pool3d_with_indices_backward", |cx| max_pool_backward(cx, "max_pool3d_backward", 3)).laid_out(SELF),
    op("adaptive_max_pool2d", |cx| adaptive_max_pool(cx, 2)).laid_out(SELF),
    op("adaptive_max_pool3d", |cx| adaptive_max_pool(cx, 3)),
    op("adaptive_max_pool2d_backward", |cx| max_pool_backward(cx, "adaptive_max_pool2d_backward", 2)).laid_out(SELF),
    op("adaptive_max_pool3d_backward", |cx| max_pool_backward(cx, "adaptive_max_pool3d_backward", 3)),
    op("avg_pool2d", |cx| avg_pool(cx, 2)).laid_out(SELF),
    op("avg_pool3d", |cx| avg_pool(cx, 3)),
    op("avg_pool2d_backward", |cx| avg_pool_backward(cx, 2)).laid_out(SELF),
    op("avg_pool3d_backward", |cx| avg_pool_backward(cx, 3)),
    op("_adaptive_avg_pool2d", |cx| adaptive_avg_pool(cx, 2)).laid_out(SELF),
    op("_adaptive_avg_pool3d", |cx| adaptive_avg_pool(cx, 3)),
    op("_adaptive_avg_pool2d_backward", |cx| adaptive_avg_pool_backward(cx, 2)).laid_out(SELF),
    op("_adaptive_avg_pool3d_backward", |cx| adaptive_avg_pool_backward(cx, 3)),
];

/// A fixed pooling window over the last `d` dimensions.
#[derive(Clone)]
pub(super) struct Window {
    pub kernel: Vec<i64>,
    pub stride: Vec<i64>,
    pub pad: Vec<i64>,
    pub dilation: Vec<i64>,
    /// Input and output sizes of the pooled dimensions.
    pub input: Vec<i64>,
    pub output: Vec<i64>,
}

/// An `int[d]` argument given with d or 1 elements (or none, or absent as
/// avg_pool's dilation: `default`).
fn per_dim(cx: &Cx, name: &str, d: usize, default: &[i64]) -> Result<Vec<i64>> {
    let v = if cx.has(name) { cx.ints(name)? } else { vec![] };
    Ok(match v.len() {
        0 => default.to_vec(),
        1 => vec![v[0]; d],
        _ => v,
    })
}

/// `pooling_output_shape`: the number of windows along one dimension.
fn pooled_size(input: i64, k: i64, pad: i64, stride: i64, dilation: i64, ceil: bool) -> i64 {
    let span = input + 2 * pad - dilation * (k - 1) - 1 + if ceil { stride - 1 } else { 0 };
    let mut out = span.div_euclid(stride) + 1;
    // The last window must start inside the input or its left padding.
    if ceil && (out - 1) * stride >= input + pad {
        out -= 1;
    }
    out
}

fn window(cx: &Cx, d: usize, sizes: &[i64]) -> Result<Window> {
    let kernel = per_dim(cx, "kernel_size", d, &[])?;
    let stride = per_dim(cx, "stride", d, &kernel)?;
    let pad = per_dim(cx, "padding", d, &vec![0; d])?;
    let dilation = per_dim(cx, "dilation", d, &vec![1; d])?;
    if kernel.len() != d || stride.len() != d || pad.len() != d || dilation.len() != d {
        return Err(Error::runtime(format!("torchtpu: {}: bad window arguments", cx.op.name)));
    }
    let ceil = cx.bool("ceil_mode")?;
    // pooling_output_shape's checks, in its order.
    for i in 0..d {
        if stride[i] == 0 {
            return Err(Error::runtime("stride should not be zero"));
        }
        if pad[i] < 0 {
            return Err(Error::runtime(format!("pad must be non-negative, but got pad: {}", pad[i])));
        }
        if pad[i] > ((kernel[i] - 1) * dilation[i] + 1) / 2 {
            return Err(Error::runtime(format!(
                "pad should be at most half of effective kernel size, but got pad={}, kernel_size={} and dilation={}",
                pad[i], kernel[i], dilation[i]
            )));
        }
    }
    let input = sizes[sizes.len() - d..].to_vec();
    let output = (0..d).map(|i| pooled_size(input[i], kernel[i], pad[i], stride[i], dilation[i], ceil)).collect();
    Ok(Window { kernel, stride, pad, dilation, input, output })
}

/// The window elements of the last d dimensions of `x`: one slice of x
/// (padded with `fill`) per kernel offset, stacked on a new last dimension.
pub(super) fn windows(cx: &mut Cx, x: V, w: &Window, fill: f64) -> V {
    let parts = window_slices(cx, x, w, fill);
    let mut stacked = cx.g.ty(parts[0]).shape.clone();
    let last = stacked.len();
    stacked.push(1);
    let parts: Vec<V> = parts.into_iter().map(|p| cx.g.reshape(p, &stacked)).collect();
    cx.g.concatenate(&parts, last)
}

/// One strided slice of `x` (padded with `fill`) per kernel offset, in
/// order, each shaped like the output.
pub(super) fn window_slices(cx: &mut Cx, x: V, w: &Window, fill: f64) -> Vec<V> {
    let shape = cx.g.ty(x).shape.clone();
    let dtype = cx.g.ty(x).dtype;
    let d = w.kernel.len();
    let lead = shape.len() - d;
    let mut low = vec![0; shape.len()];
    let mut high = vec![0; shape.len()];
    for i in 0..d {
        let needed = dilated(w.output[i], w.stride[i]) + (w.kernel[i] - 1) * w.dilation[i];
        low[lead + i] = w.pad[i];
        high[lead + i] = needed - w.pad[i] - w.input[i];
    }
    let fill = cx.g.scalar(fill, dtype);
    let padded = cx.g.pad(x, fill, &low, &high, &vec![0; shape.len()]);
    let mut out_shape = shape[..lead].to_vec();
    out_shape.extend(&w.output);
    let count: i64 = w.kernel.iter().product();
    (0..count)
        .map(|mut k| {
            let mut start = vec![0; shape.len()];
            let mut stride = vec![1; shape.len()];
            for i in (0..d).rev() {
                start[lead + i] = (k % w.kernel[i]) * w.dilation[i];
                stride[lead + i] = w.stride[i];
                k /= w.kernel[i];
            }
            let limit: Vec<i64> = (0..shape.len())
                .map(|j| if j < lead { shape[j] } else { start[j] + dilated(out_shape[j], stride[j]) })
                .collect();
            cx.g.slice(padded, &start, &limit, &stride)
        })
        .collect()
}

/// The flat position of each element within its plane of `sizes`.
fn positions(cx: &mut Cx, sizes: &[i64]) -> V {
    let n: i64 = sizes.iter().product();
    let flat = cx.g.iota(DType::I64, &[n], 0);
    cx.g.reshape(flat, sizes)
}

/// The max of each window (last dimension of `values`) and its position
/// (`positions`: the stacked windows of the input's positions, without the
/// leading dimensions).
fn pick_max(cx: &mut Cx, values: V, positions: V) -> (V, V) {
    let shape = cx.g.ty(values).shape.clone();
    let last = shape.len() - 1;
    let lead = shape.len() - cx.g.ty(positions).rank();
    let max = cx.g.reduce(ReduceKind::Max, values, &[last]);
    let arg = cx.g.arg_reduce(values, last, true);
    let arg = cx.g.broadcast_in_dim(arg, &shape, &(0..last as i64).collect::<Vec<_>>());
    let k = cx.g.iota(DType::I64, &shape, last);
    let hit = cx.g.compare("EQ", k, arg);
    let pos = cx.g.broadcast_in_dim(positions, &shape, &(lead as i64..shape.len() as i64).collect::<Vec<_>>());
    let zero = cx.g.full(0.0, DType::I64, &shape);
    let picked = cx.g.select(hit, pos, zero);
    (max, cx.g.reduce(ReduceKind::Sum, picked, &[last]))
}

/// The lowest value of `dtype` (the padding of max pooling).
fn lowest(dtype: DType) -> f64 {
    match dtype {
        d if d.is_float() => f64::NEG_INFINITY,
        DType::U8 | DType::Bool => 0.0,
        DType::I8 => i8::MIN as f64,
        DType::I16 => i16::MIN as f64,
        DType::I32 => i32::MIN as f64,
        _ => i64::MIN as f64,
    }
}

/// CPU's "`kernel` not implemented for '`dtype`'" of a max-pooling kernel.
fn max_pool_unsupported(kernel: &str, t: &crate::lower::args::Tensor) -> Error {
    let suffix = if suggests_channels_last(&t.view()) { "_channels_last" } else { "" };
    not_implemented(&format!("{kernel}{suffix}"), t.dtype)
}

/// CPU's checks of max_pool3d's arguments (max_pool2d's run in PyTorch's
/// meta function, before us), in its order.
fn check_max_pool3d(sizes: &[i64], w: &Window) -> Result<()> {
    let err = |m: String| Err(Error::runtime(m));
    if w.dilation.iter().any(|&x| x <= 0) {
        let [t, h, w] = [w.dilation[0], w.dilation[1], w.dilation[2]];
        return err(format!(
            "dilation should be greater than zero, but got dilationT: {t} dilationH: {h} dilationW: {w}"
        ));
    }
    let batch = (sizes.len() == 5) as usize;
    if let Some(i) = (batch..sizes.len()).find(|&i| sizes[i] == 0) {
        return err(format!(
            "max_pool3d_with_indices_out_cpu_template(): Expected input to have non-zero size for non-batch \
             dimensions, but input has sizes {sizes:?} with dimension {i} being empty"
        ));
    }
    if w.output.iter().any(|&o| o < 1) {
        let join = |v: &[i64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x");
        let planes = sizes[sizes.len() - 4];
        return err(format!(
            "Given input size: ({planes}x{}). Calculated output size: ({planes}x{}). Output size is too small",
            join(&w.input),
            join(&w.output)
        ));
    }
    Ok(())
}

fn max_pool(cx: &mut Cx, d: usize) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if d == 3 && !matches!(t.sizes.len(), 4 | 5) {
        return Err(Error::runtime("non-empty 4D or 5D (batch mode) tensor expected for input"));
    }
    let w = window(cx, d, t.sizes)?;
    if d == 3 {
        check_max_pool3d(t.sizes, &w)?;
    }
    if t.dtype == DType::Bool {
        return Err(max_pool_unsupported(&format!("max_pool{d}d"), &t));
    }
    let x = cx.tensor("self")?;
    let values = windows(cx, x, &w, lowest(t.dtype));
    let pos = positions(cx, &w.input);
    let pos = windows(cx, pos, &w, -1.0);
    let (max, idx) = pick_max(cx, values, pos);
    Ok(vec![max, idx])
}

/// The gradient of max pooling (fixed or adaptive): grad_output added at
/// the positions `indices` names within each input plane.
fn max_pool_backward(cx: &mut Cx, kernel: &str, d: usize) -> Result<Vec<V>> {
    let (t, gt) = (cx.meta("self")?, cx.meta("grad_output")?);
    if !t.dtype.is_float() {
        return Err(max_pool_unsupported(kernel, &t));
    }
    let lead = t.sizes.len() - d;
    let planes: i64 = t.sizes[..lead].iter().product();
    let plane: i64 = t.sizes[lead..].iter().product();
    let per_plane = gt.numel() / planes.max(1);
    let ct = opmath(gt.dtype);
    let g = cx.tensor("grad_output")?;
    let g = cx.g.convert(g, ct);
    let g = cx.g.reshape(g, &[planes * per_plane]);
    let idx = cx.tensor("indices")?;
    let idx = cx.g.reshape(idx, &[planes, per_plane]);
    let base = cx.g.iota(DType::I64, &[planes, per_plane], 0);
    let size = cx.g.full(plane as f64, DType::I64, &[planes, per_plane]);
    let base = mul(cx, base, size);
    let idx = add(cx, idx, base);
    let idx = cx.g.reshape(idx, &[planes * per_plane]);
    let zeros = cx.g.full(0.0, ct, &[planes * plane]);
    let r = cx.g.put(zeros, idx, g, 0, Some(ReduceKind::Sum));
    let r = cx.g.reshape(r, t.sizes);
    finish(cx, r, gt.dtype)
}

/// Elements each average counts per output position of one dimension
/// (CPU's `pool_size` or, without count_include_pad, the window's part
/// inside the input).
fn avg_counts(w: &Window, i: usize, include_pad: bool) -> Vec<f64> {
    let (k, s, p, n) = (w.kernel[i], w.stride[i], w.pad[i], w.input[i]);
    (0..w.output[i])
        .map(|o| {
            let start = o * s - p;
            let end = (start + k).min(n + p);
            let (start, end) = if include_pad { (start, end) } else { (start.max(0), end.min(n)) };
            (end - start) as f64
        })
        .collect()
}

/// What each output position's window sum is divided by, shaped like the
/// output (`lead` leading dimensions), in `dtype`.
fn avg_divisor(cx: &mut Cx, w: &Window, shape: &[i64], dtype: DType) -> Result<V> {
    if let Some(divisor) = cx.opt_int("divisor_override")? {
        if divisor == 0 {
            return Err(Error::runtime("divisor must be not zero"));
        }
        return Ok(cx.g.full(divisor as f64, dtype, shape));
    }
    let include_pad = cx.bool("count_include_pad")?;
    let lead = shape.len() - w.output.len();
    let mut divisor = cx.g.full(1.0, dtype, shape);
    for i in 0..w.output.len() {
        let counts = cx.g.constant(&avg_counts(w, i, include_pad), dtype);
        let counts = cx.g.broadcast_in_dim(counts, shape, &[(lead + i) as i64]);
        divisor = mul(cx, divisor, counts);
    }
    Ok(divisor)
}

fn avg_pool(cx: &mut Cx, d: usize) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    // CPU's 3-d kernel takes no float16 or bfloat16, CUDA's does (summed in
    // float32, as here): tpu follows CUDA.
    if t.dtype == DType::Bool {
        let kernel = if d == 3 { "avg_pool3d_out_frame".into() } else { format!("avg_pool{d}d") };
        return Err(not_implemented(&kernel, t.dtype));
    }
    let w = window(cx, d, t.sizes)?;
    let ct = opmath(t.dtype);
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let stacked = windows(cx, x, &w, 0.0);
    let last = cx.g.ty(stacked).rank() - 1;
    let sum = cx.g.reduce(ReduceKind::Sum, stacked, &[last]);
    let shape = cx.g.ty(sum).shape.clone();
    let divisor = avg_divisor(cx, &w, &shape, ct)?;
    let r = cx.g.binary("stablehlo.divide", sum, divisor);
    finish(cx, r, t.dtype)
}

/// Each window's share of grad_output, added back at the window's elements.
fn avg_pool_backward(cx: &mut Cx, d: usize) -> Result<Vec<V>> {
    let (t, gt) = (cx.meta("self")?, cx.meta("grad_output")?);
    let w = window(cx, d, t.sizes)?;
    let ct = opmath(gt.dtype);
    let g = cx.tensor("grad_output")?;
    let g = cx.g.convert(g, ct);
    let divisor = avg_divisor(cx, &w, gt.sizes, ct)?;
    let g = cx.g.binary("stablehlo.divide", g, divisor);
    let slices = spread_slices(cx, g, &w);
    let r = slices.into_iter().reduce(|a, b| cx.g.binary("stablehlo.add", a, b)).expect("a kernel offset");
    finish(cx, r, gt.dtype)
}

/// The transpose of `window_slices`, as slices: for each kernel offset in
/// order, what it adds to each input element from `g` (shaped like the
/// output), shaped like the input. They are the windows of `g` spread out
/// by the stride (interior padding), reversed: one padding and strided
/// slices, which XLA:CPU fuses with their sum into one loop, where
/// `add_windows`' spread-out parts were a loop each.
pub(super) fn spread_slices(cx: &mut Cx, g: V, w: &Window) -> Vec<V> {
    let n = w.kernel.len();
    let rank = cx.g.ty(g).rank();
    let lead = rank - n;
    let g = if w.stride.iter().any(|&s| s != 1) {
        let zero = cx.g.scalar(0.0, cx.g.ty(g).dtype);
        let interior: Vec<i64> = (0..rank).map(|d| if d < lead { 0 } else { w.stride[d - lead] - 1 }).collect();
        cx.g.pad(g, zero, &vec![0; rank], &vec![0; rank], &interior)
    } else {
        g
    };
    let back = Window {
        kernel: w.kernel.clone(),
        stride: vec![1; n],
        pad: (0..n).map(|i| w.dilation[i] * (w.kernel[i] - 1) - w.pad[i]).collect(),
        dilation: w.dilation.clone(),
        input: (0..n).map(|i| dilated(w.output[i], w.stride[i])).collect(),
        output: w.input.clone(),
    };
    let mut slices = window_slices(cx, g, &back, 0.0);
    slices.reverse();
    slices
}

/// The transpose of `windows`: for each kernel offset k in order, `part(k)`
/// (shaped like the output) added to the input elements that offset reads;
/// the result is shaped `sizes`, the input's. Each part is the output grid
/// spread out by the stride (interior padding) and shifted to its offset.
pub(super) fn add_windows(cx: &mut Cx, w: &Window, sizes: &[i64], mut part: impl FnMut(&mut Cx, i64) -> V) -> V {
    let d = w.kernel.len();
    let rank = sizes.len();
    let lead = rank - d;
    // The padded input, large enough for every window.
    let full: Vec<i64> = (0..d)
        .map(|i| {
            let reach = dilated(w.output[i], w.stride[i]) + (w.kernel[i] - 1) * w.dilation[i];
            reach.max(w.pad[i] + w.input[i])
        })
        .collect();
    let mut interior = vec![0; rank];
    for i in 0..d {
        interior[lead + i] = w.stride[i] - 1;
    }
    let mut acc = None;
    for k in 0..w.kernel.iter().product::<i64>() {
        let p = part(cx, k);
        let zero = cx.g.scalar(0.0, cx.g.ty(p).dtype);
        let (mut low, mut high) = (vec![0; rank], vec![0; rank]);
        let mut rest = k;
        for i in (0..d).rev() {
            low[lead + i] = (rest % w.kernel[i]) * w.dilation[i];
            high[lead + i] = full[i] - low[lead + i] - dilated(w.output[i], w.stride[i]);
            rest /= w.kernel[i];
        }
        let spread = cx.g.pad(p, zero, &low, &high, &interior);
        acc = Some(match acc {
            None => spread,
            Some(a) => add(cx, a, spread),
        });
    }
    let acc = acc.expect("a kernel offset");
    let start: Vec<i64> = (0..rank).map(|j| if j < lead { 0 } else { w.pad[j - lead] }).collect();
    let limit: Vec<i64> = (0..rank).map(|j| start[j] + sizes[j]).collect();
    cx.g.slice(acc, &start, &limit, &vec![1; rank])
}

// ------------------------------------------------------------------ adaptive

/// CPU's adaptive window of output position `o`: [start, end).
fn adaptive_range(o: i64, input: i64, output: i64) -> (i64, i64) {
    let start = (o * input).div_euclid(output);
    let end = ((o + 1) * input + output - 1).div_euclid(output);
    (start, end)
}

/// The [output, input] matrix averaging each adaptive window.
fn averaging_matrix(cx: &mut Cx, input: i64, output: i64, dtype: DType) -> V {
    let ranges: Vec<(i64, i64)> = (0..output).map(|o| adaptive_range(o, input, output)).collect();
    let shape = [output, input];
    let start = cx.g.constant(&ranges.iter().map(|r| r.0 as f64).collect::<Vec<_>>(), DType::I64);
    let end = cx.g.constant(&ranges.iter().map(|r| r.1 as f64).collect::<Vec<_>>(), DType::I64);
    let inv = cx.g.constant(&ranges.iter().map(|r| 1.0 / (r.1 - r.0) as f64).collect::<Vec<_>>(), dtype);
    let start = cx.g.broadcast_in_dim(start, &shape, &[0]);
    let end = cx.g.broadcast_in_dim(end, &shape, &[0]);
    let inv = cx.g.broadcast_in_dim(inv, &shape, &[0]);
    let h = cx.g.iota(DType::I64, &shape, 1);
    let after = cx.g.compare("GE", h, start);
    let before = cx.g.compare("LT", h, end);
    let inside = cx.g.binary("stablehlo.and", after, before);
    let zero = cx.g.full(0.0, dtype, &shape);
    cx.g.select(inside, inv, zero)
}

/// `x` with dimension `dim` multiplied by `m` ([n, x.shape[dim]]).
fn apply_along(cx: &mut Cx, x: V, dim: usize, m: V) -> V {
    // Exact as CPU's loops, whatever the matmul setting: this is pooling.
    let r = cx.g.dot_general(x, m, (&[], &[]), (&[dim as i64], &[1]), Precision::Highest);
    let last = cx.g.ty(r).rank() as i64 - 1;
    let perm: Vec<i64> = (0..last).take(dim).chain([last]).chain(dim as i64..last).collect();
    cx.g.transpose(r, &perm)
}

/// Checks of `_adaptive_avg_pool{d}d`'s arguments, with CPU's messages.
fn check_adaptive(d: usize, sizes: &[i64], output: &[i64]) -> Result<()> {
    if output.len() != d {
        return Err(Error::runtime(format!(
            "adaptive_avg_pool{d}d: output_size must be {d}, but got {}",
            output.len()
        )));
    }
    let lead = sizes.len() as i64 - d as i64;
    if !(1..=2).contains(&lead) {
        return Err(Error::runtime(format!(
            "adaptive_avg_pool{d}d(): Expected {}D or {}D tensor, but got {:?}",
            d + 1,
            d + 2,
            sizes
        )));
    }
    Ok(())
}

fn adaptive_avg_pool(cx: &mut Cx, d: usize) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let output = cx.ints("output_size")?;
    check_adaptive(d, t.sizes, &output)?;
    // CPU's 1-d and 2-d kernels return an empty input's empty result before
    // dispatching on its type; the 3-d one dispatches first.
    if !t.dtype.is_float() && (t.numel() > 0 || d == 3) {
        let kernel = if d == 3 { "adaptive_avg_pool3d_cpu".into() } else { format!("adaptive_avg_pool{d}d") };
        return Err(not_implemented(&kernel, t.dtype));
    }
    let ct = opmath(t.dtype);
    let lead = t.sizes.len() - d;
    let x = cx.tensor("self")?;
    let mut x = cx.g.convert(x, ct);
    for i in 0..d {
        let m = averaging_matrix(cx, t.sizes[lead + i], output[i], ct);
        x = apply_along(cx, x, lead + i, m);
    }
    finish(cx, x, t.dtype)
}

fn adaptive_avg_pool_backward(cx: &mut Cx, d: usize) -> Result<Vec<V>> {
    let (t, gt) = (cx.meta("self")?, cx.meta("grad_output")?);
    let ct = opmath(gt.dtype);
    let lead = t.sizes.len() - d;
    let g = cx.tensor("grad_output")?;
    let mut g = cx.g.convert(g, ct);
    for i in 0..d {
        let m = averaging_matrix(cx, t.sizes[lead + i], gt.sizes[lead + i], ct);
        let m = cx.g.transpose(m, &[1, 0]);
        g = apply_along(cx, g, lead + i, m);
    }
    finish(cx, g, gt.dtype)
}

/// The adaptive windows of the last d dimensions of `x`, gathered and
/// stacked on a new last dimension.
fn adaptive_windows(cx: &mut Cx, x: V, input: &[i64], output: &[i64]) -> V {
    let d = input.len();
    let lead = cx.g.ty(x).rank() - d;
    let mut widths = Vec::new();
    let mut x = x;
    for i in 0..d {
        let ranges: Vec<(i64, i64)> = (0..output[i]).map(|o| adaptive_range(o, input[i], output[i])).collect();
        let width = ranges.iter().map(|r| r.1 - r.0).max().unwrap_or(1).max(1);
        let idx: Vec<f64> =
            ranges.iter().flat_map(|&(s, e)| (0..width).map(move |k| (s + k).min(e - 1).max(0) as f64)).collect();
        let idx = cx.g.constant(&idx, DType::I64);
        let idx = cx.g.reshape(idx, &[output[i], width]);
        x = cx.g.take(x, idx, lead + 2 * i);
        widths.push(width);
    }
    // [lead.., o1, k1, o2, k2, ..] -> [lead.., o1, o2, .., k1 k2 ..]
    let perm: Vec<i64> = (0..lead)
        .chain((0..d).map(|i| lead + 2 * i))
        .chain((0..d).map(|i| lead + 2 * i + 1))
        .map(|p| p as i64)
        .collect();
    let x = cx.g.transpose(x, &perm);
    let mut shape = cx.g.ty(x).shape[..lead + d].to_vec();
    shape.push(widths.iter().product());
    cx.g.reshape(x, &shape)
}

fn adaptive_max_pool(cx: &mut Cx, d: usize) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let output = cx.ints("output_size")?;
    if !t.dtype.is_float() {
        // CPU's 3-d kernel carries a suffix of its own.
        let kernel = if d == 3 { "adaptive_max_pool3d_cpu".into() } else { format!("adaptive_max_pool{d}d") };
        return Err(max_pool_unsupported(&kernel, &t));
    }
    let input = t.sizes[t.sizes.len() - d..].to_vec();
    let x = cx.tensor("self")?;
    let values = adaptive_windows(cx, x, &input, &output);
    let pos = positions(cx, &input);
    let pos = adaptive_windows(cx, pos, &input, &output);
    let (max, idx) = pick_max(cx, values, pos);
    Ok(vec![max, idx])
}
