//! Interpolation (`upsample_*`, what `F.interpolate` reaches) and the
//! separable resampling it shares with reflection and replication padding.
//!
//! A resampling maps each output position of a dimension to a few input
//! positions ("taps") with weights; dimensions are resampled one after the
//! other, the last first, as CPU's kernels nest their interpolation. Source
//! indices and weights are computed here on the host with CPU's formulas and
//! arithmetic types (float32 for float32/bfloat16, double for float64), so
//! they are exactly CPU's, and enter the program as constants. The backward
//! operators scatter-add the weighted gradient to the same taps.
use super::elementwise::{finish, not_implemented};
use super::layout::is_channels_last;
use super::nn::{add, mul};
use super::{op_consts, Cx, Entry, Layout};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};
use crate::lower::args::Tensor;

const SCALES: &[&str] = &["scales", "scales_d", "scales_h", "scales_w"];

/// Results keep the layout their input suggests, and most gradients their
/// grad_output's (not bicubic's or 3-d nearest's), as CPU's meta functions
/// choose them.
const INPUT: Layout = Layout::Suggested(&["self"]);
const GRAD: Layout = Layout::Suggested(&["grad_output"]);

pub static ENTRIES: &[Entry] = &[
    op_consts("upsample_nearest1d", |cx| upsample(cx, Mode::Nearest, 1), SCALES).laid_out(INPUT),
    op_consts("upsample_nearest2d", |cx| upsample(cx, Mode::Nearest, 2), SCALES).laid_out(INPUT),
    op_consts("upsample_nearest3d", |cx| upsample(cx, Mode::Nearest, 3), SCALES).laid_out(INPUT),
    op_consts("_upsample_nearest_exact1d", |cx| upsample(cx, Mode::NearestExact, 1), SCALES).laid_out(INPUT),
    op_consts("_upsample_nearest_exact2d", |cx| upsample(cx, Mode::NearestExact, 2), SCALES).laid_out(INPUT),
    op_consts("_upsample_nearest_exact3d", |cx| upsample(cx, Mode::NearestExact, 3), SCALES).laid_out(INPUT),
    op_consts("upsample_linear1d", |cx| upsample(cx, Mode::Linear, 1), SCALES).laid_out(INPUT),
    op_consts("upsample_bilinear2d", |cx| upsample(cx, Mode::Linear, 2), SCALES).laid_out(INPUT),
    op_consts("upsample_trilinear3d", |cx| upsample(cx, Mode::Linear, 3), SCALES).laid_out(INPUT),
    op_consts("upsample_bicubic2d", |cx| upsample(cx, Mode::Cubic, 2), SCALES).laid_out(INPUT),
    op_consts("upsample_nearest1d_backward", |cx| upsample_backward(cx, Mode::Nearest), SCALES).laid_out(GRAD),
    op_consts("upsample_nearest2d_backward", |cx| upsample_backward(cx, Mode::Nearest), SCALES).laid_out(GRAD),
    op_consts("upsample_nearest3d_backward", |cx| upsample_backward(cx, Mode::Nearest), SCALES),
    op_consts("_upsample_nearest_exact1d_backward", |cx| upsample_backward(cx, Mode::NearestExact), SCALES)
        .laid_out(GRAD),
    op_consts("_upsample_nearest_exact2d_backward", |cx| upsample_backward(cx, Mode::NearestExact), SCALES)
        .laid_out(GRAD),
    op_consts("_upsample_nearest_exact3d_backward", |cx| upsample_backward(cx, Mode::NearestExact), SCALES),
    op_consts("upsample_linear1d_backward", |cx| upsample_backward(cx, Mode::Linear), SCALES).laid_out(GRAD),
    op_consts("upsample_bilinear2d_backward", |cx| upsample_backward(cx, Mode::Linear), SCALES).laid_out(GRAD),
    op_consts("upsample_trilinear3d_backward", |cx| upsample_backward(cx, Mode::Linear), SCALES).laid_out(GRAD),
    op_consts("upsample_bicubic2d_backward", |cx| upsample_backward(cx, Mode::Cubic), SCALES),
    op_consts("_upsample_bilinear2d_aa", |cx| upsample(cx, Mode::LinearAa, 2), SCALES).laid_out(INPUT),
    op_consts("_upsample_bicubic2d_aa", |cx| upsample(cx, Mode::CubicAa, 2), SCALES).laid_out(INPUT),
    op_consts("_upsample_bilinear2d_aa_backward", |cx| upsample_backward(cx, Mode::LinearAa), SCALES).laid_out(GRAD),
    op_consts("_upsample_bicubic2d_aa_backward", |cx| upsample_backward(cx, Mode::CubicAa), SCALES),
];

/// One tap of a dimension's resampling: for each output position, the
/// input position it reads and its weight (None: weight 1).
pub struct Tap {
    pub index: Vec<i64>,
    pub weight: Option<Vec<f64>>,
}

/// The resampling of one dimension from `input` positions: its taps.
pub struct Resample {
    pub dim: usize,
    pub input: i64,
    pub taps: Vec<Tap>,
}

/// `x` resampled along each dimension (in reverse order), in x's type.
pub fn resample(cx: &mut Cx, x: V, dims: &[Resample]) -> V {
    dims.iter().rev().fold(x, |x, r| {
        let dtype = cx.g.ty(x).dtype;
        let parts: Vec<V> = r
            .taps
            .iter()
            .map(|t| {
                let idx = cx.g.constant(&t.index.iter().map(|&i| i as f64).collect::<Vec<_>>(), DType::I64);
                let v = cx.g.take(x, idx, r.dim);
                weighted(cx, v, t, r.dim, dtype)
            })
            .collect();
        parts.into_iter().reduce(|a, b| add(cx, a, b)).expect("a tap")
    })
}

/// The adjoint of [`resample`]: `g` scattered back to the input positions.
pub fn resample_backward(cx: &mut Cx, g: V, dims: &[Resample]) -> V {
    dims.iter().fold(g, |g, r| {
        let ty = cx.g.ty(g).clone();
        let mut shape = ty.shape.clone();
        shape[r.dim] = r.input;
        let mut acc = cx.g.full(0.0, ty.dtype, &shape);
        for t in &r.taps {
            let idx = cx.g.constant(&t.index.iter().map(|&i| i as f64).collect::<Vec<_>>(), DType::I64);
            let v = weighted(cx, g, t, r.dim, ty.dtype);
            acc = cx.g.put(acc, idx, v, r.dim, Some(ReduceKind::Sum));
        }
        acc
    })
}

/// `v` times the tap's weights along `dim`.
fn weighted(cx: &mut Cx, v: V, t: &Tap, dim: usize, dtype: DType) -> V {
    match &t.weight {
        None => v,
        Some(w) => {
            let w = cx.g.constant(w, dtype);
            let shape = cx.g.ty(v).shape.clone();
            let w = cx.g.broadcast_in_dim(w, &shape, &[dim as i64]);
            mul(cx, v, w)
        }
    }
}

// ------------------------------------------------------------------ upsample

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nearest,
    NearestExact,
    Linear,
    Cubic,
    /// Antialiased (`antialias=True`): a triangle or cubic (a = -0.5)
    /// filter stretched over the input positions an output covers.
    LinearAa,
    CubicAa,
}

/// Host arithmetic in CPU's accumulation type: float32 unless double.
fn round_acc(x: f64, double: bool) -> f64 {
    if double {
        x
    } else {
        x as f32 as f64
    }
}

/// `compute_scales_value`: 1 / scale when given and positive, else in / out.
fn scale_value(scale: Option<f64>, input: i64, output: i64, double: bool) -> f64 {
    match scale {
        Some(s) if s > 0.0 => round_acc(1.0 / s, double),
        _ => round_acc(round_acc(input as f64, double) / output as f64, double),
    }
}

/// `area_pixel_compute_scale`: input positions per output position.
fn pixel_scale(input: i64, output: i64, align: bool, scale: Option<f64>, double: bool) -> f64 {
    if !align {
        scale_value(scale, input, output, double)
    } else if output > 1 {
        round_acc(round_acc((input - 1) as f64, double) / (output - 1) as f64, double)
    } else {
        0.0
    }
}

/// `area_pixel_compute_scale` and `area_pixel_compute_source_index`: the
/// fractional source position of each output position.
fn source_positions(input: i64, output: i64, align: bool, scale: Option<f64>, cubic: bool, double: bool) -> Vec<f64> {
    let r = |x: f64| round_acc(x, double);
    let s = pixel_scale(input, output, align, scale, double);
    (0..output)
        .map(|o| {
            if align {
                r(s * o as f64)
            } else {
                let src = r(r(s * r(o as f64 + 0.5)) - 0.5);
                if !cubic && src < 0.0 {
                    0.0
                } else {
                    src
                }
            }
        })
        .collect()
}

/// The cubic convolution weights (A = -0.75) of the 4 taps around `t`.
fn cubic_weights(t: f64, double: bool) -> [f64; 4] {
    let r = |x: f64| round_acc(x, double);
    let a = -0.75;
    let near = |x: f64| r(r(r(r(r((a + 2.0) * x) - (a + 3.0)) * x) * x) + 1.0);
    let far = |x: f64| r(r(r(r(r(r(a * x) - 5.0 * a) * x) + 8.0 * a) * x) - 4.0 * a);
    [far(r(t + 1.0)), near(t), near(r(1.0 - t)), far(r(r(1.0 - t) + 1.0))]
}

/// The antialiasing filters of `_compute_weights_aa`.
fn aa_filter(x: f64, cubic: bool, double: bool) -> f64 {
    let r = |v: f64| round_acc(v, double);
    let x = x.abs();
    if !cubic {
        return if x < 1.0 { r(1.0 - x) } else { 0.0 };
    }
    let a = -0.5;
    if x < 1.0 {
        r(r(r(r(r((a + 2.0) * x) - (a + 3.0)) * x) * x) + 1.0)
    } else if x < 2.0 {
        r(r(r(r(r(r(a * x) - 5.0 * a) * x) + 8.0 * a) * x) - 4.0 * a)
    } else {
        0.0
    }
}

/// Antialiased taps (`_compute_indices_min_size_weights_aa`): output `o`
/// reads the inputs within `support` of its center `scale (o + 1/2)`,
/// weighted by the filter and normalized to sum 1; shorter windows are
/// padded with zero weights.
fn aa_taps(input: i64, output: i64, align: bool, scale: Option<f64>, cubic: bool, double: bool) -> Vec<Tap> {
    let r = |v: f64| round_acc(v, double);
    let scale = pixel_scale(input, output, align, scale, double);
    let half = if cubic { 2.0 } else { 1.0 };
    let support = if scale >= 1.0 { r(half * scale) } else { half };
    let invscale = if scale >= 1.0 { r(1.0 / scale) } else { 1.0 };
    let width = (support.ceil() as usize) * 2 + 1;
    let mut taps: Vec<Tap> =
        (0..width).map(|_| Tap { index: Vec::with_capacity(output as usize), weight: Some(vec![]) }).collect();
    for o in 0..output {
        let center = r(scale * r(o as f64 + 0.5));
        let xmin = (r(r(center - support) + 0.5) as i64).max(0);
        let xsize = ((r(r(center + support) + 0.5) as i64).min(input) - xmin).max(0) as usize;
        let mut w: Vec<f64> = (0..xsize)
            .map(|j| aa_filter(r(r(r((j as i64 + xmin) as f64 - center) + 0.5) * invscale), cubic, double))
            .collect();
        let total = w.iter().fold(0.0, |t, &v| r(t + v));
        if total != 0.0 {
            w.iter_mut().for_each(|v| *v = r(*v / total));
        }
        for (k, tap) in taps.iter_mut().enumerate() {
            let inside = k < xsize;
            tap.index.push(if inside { xmin + k as i64 } else { xmin.min(input - 1) });
            tap.weight.as_mut().expect("weighted").push(if inside { w[k] } else { 0.0 });
        }
    }
    taps
}

/// One dimension's taps, as CPU's upsample kernels compute them.
fn taps(mode: Mode, input: i64, output: i64, align: bool, scale: Option<f64>, double: bool) -> Vec<Tap> {
    match mode {
        Mode::Nearest | Mode::NearestExact => {
            // nearest_idx / nearest_exact_idx: the scale is a float.
            let s = scale_value(scale, input, output, false);
            let index = (0..output)
                .map(|o| match mode {
                    Mode::Nearest if output == input => o,
                    Mode::Nearest if output == 2 * input => o >> 1,
                    Mode::Nearest => ((o as f32 * s as f32).floor() as i64).min(input - 1),
                    _ => (((o as f64 + 0.5) * s).floor() as i64).min(input - 1),
                })
                .collect();
            vec![Tap { index, weight: None }]
        }
        Mode::Linear => {
            let src = source_positions(input, output, align, scale, false, double);
            let i0: Vec<i64> = src.iter().map(|&x| (x.floor() as i64).min(input - 1)).collect();
            let l1: Vec<f64> =
                src.iter().zip(&i0).map(|(&x, &i)| round_acc(x - i as f64, double).clamp(0.0, 1.0)).collect();
            let i1 = i0.iter().map(|&i| if i < input - 1 { i + 1 } else { i }).collect();
            let l0 = l1.iter().map(|&l| round_acc(1.0 - l, double)).collect();
            vec![Tap { index: i0, weight: Some(l0) }, Tap { index: i1, weight: Some(l1) }]
        }
        Mode::LinearAa | Mode::CubicAa => aa_taps(input, output, align, scale, mode == Mode::CubicAa, double),
        Mode::Cubic => {
            let src = source_positions(input, output, align, scale, true, double);
            let floor: Vec<i64> = src.iter().map(|&x| x.floor() as i64).collect();
            let w: Vec<[f64; 4]> =
                src.iter().zip(&floor).map(|(&x, &f)| cubic_weights(round_acc(x - f as f64, double), double)).collect();
            (0..4)
                .map(|k| Tap {
                    index: floor.iter().map(|&f| (f - 1 + k as i64).clamp(0, input - 1)).collect(),
                    weight: Some(w.iter().map(|w| w[k]).collect()),
                })
                .collect()
        }
    }
}

/// The resampling of the last `d` dimensions from `input` to `output` sizes.
fn upsample_plan(cx: &Cx, mode: Mode, input: &[i64], output: &[i64], dtype: DType) -> Result<Vec<Resample>> {
    let d = output.len();
    let lead = input.len() - d;
    let names: &[&str] = match d {
        1 => &["scales"],
        2 => &["scales_h", "scales_w"],
        _ => &["scales_d", "scales_h", "scales_w"],
    };
    let align = cx.has("align_corners") && cx.bool("align_corners")?;
    let double = dtype == DType::F64;
    (0..d)
        .map(|i| {
            let scale = if cx.is_none(names[i]) { None } else { Some(cx.const_f64(names[i])?) };
            let (inp, out) = (input[lead + i], output[i]);
            Ok(Resample { dim: lead + i, input: inp, taps: taps(mode, inp, out, align, scale, double) })
        })
        .collect()
}

/// Only nearest modes accept integer inputs (and uint8 only), as on CPU;
/// antialiased modes accept float16 and bfloat16 as CUDA's kernels do
/// (CPU's accept float32 and float64 only).
/// Its error names the kernel it picks: a channels-last one for 2-d and
/// 3-d nearest and (bi/tri)linear modes on channels-last inputs of more
/// than 3 channels, and for 2-d outputs of at most 128 rows plus columns;
/// otherwise the generic one, which fails computing its indices.
fn check_dtype(mode: Mode, t: &Tensor, output: &[i64]) -> Result<()> {
    let ok = t.dtype.is_float() || (t.dtype == DType::U8 && matches!(mode, Mode::Nearest | Mode::NearestExact));
    if ok {
        return Ok(());
    }
    let d = output.len();
    let channels_last =
        (is_channels_last(&t.view()) && t.sizes[1] > 3) || (d == 2 && output.iter().sum::<i64>() <= 128);
    let kernel = match (mode, d) {
        (Mode::Nearest | Mode::NearestExact, 2 | 3) if channels_last => format!("upsample_nearest{d}d_channels_last"),
        (Mode::Linear, 2) if channels_last => "upsample_bilinear2d_channels_last".into(),
        (Mode::Linear, 3) if channels_last => "upsample_trilinear3d_channels_last".into(),
        (Mode::Nearest | Mode::NearestExact, _) => "compute_indices_weights_nearest".into(),
        (Mode::Linear, _) => "compute_indices_weights_linear".into(),
        (Mode::Cubic, _) => "compute_indices_weights_cubic".into(),
        (Mode::LinearAa | Mode::CubicAa, _) => "compute_index_ranges_weights".into(),
    };
    Err(not_implemented(&kernel, t.dtype))
}

fn upsample(cx: &mut Cx, mode: Mode, d: usize) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let output = cx.ints("output_size")?;
    if output.len() != d {
        return Err(Error::runtime(format!("It is expected output_size equals to {d}, but got size {}", output.len())));
    }
    if t.dtype == DType::U8 && matches!(mode, Mode::LinearAa | Mode::CubicAa) {
        // CPU resamples uint8 images with PIL's fixed-point weights.
        return Err(Error::fallback("torchtpu: antialiased uint8 resizing runs CPU's fixed-point kernel"));
    }
    check_dtype(mode, &t, &output)?;
    let ct = opmath(t.dtype);
    let plan = upsample_plan(cx, mode, t.sizes, &output, t.dtype)?;
    let x = cx.tensor("self")?;
    let x = if ct.is_float() { cx.g.convert(x, ct) } else { x };
    let r = resample(cx, x, &plan);
    finish(cx, r, t.dtype)
}

fn upsample_backward(cx: &mut Cx, mode: Mode) -> Result<Vec<V>> {
    let t = cx.meta("grad_output")?;
    let (input, output) = (cx.ints("input_size")?, cx.ints("output_size")?);
    let plan = upsample_plan(cx, mode, &input, &output, t.dtype)?;
    let g = cx.tensor("grad_output")?;
    let g = cx.g.convert(g, opmath(t.dtype));
    let r = resample_backward(cx, g, &plan);
    finish(cx, r, t.dtype)
}
