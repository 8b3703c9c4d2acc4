//! torchvision's RoIAlign (`torchvision.ops.roi_align`, behind the box and
//! mask heads of its detection models) and its gradient, with the formulas
//! of torchvision's CPU kernel: each output bin averages a grid of bilinear
//! samples, `sampling_ratio` per side, or, where that is not positive (Mask
//! R-CNN's mask targets), `ceil(box size / bins)` per box: the largest such
//! grid is measured on the device and read (as `nonzero`'s count), the
//! program built for it, and each box's samples beyond its own grid weigh 0.
//! Samples gather the input's [N·H·W, C] rows; the gradient scatter-adds to
//! them. torchvision registers its ops by name, and the table holds them
//! under their full names, as the dispatcher sends them to PrivateUse1 like
//! any other.
use super::elementwise::full_like;
use super::nn::{add, div, mul, sub};
use super::{op_measured, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[
    op_measured("torchvision::roi_align", forward, measure),
    op_measured("torchvision::_roi_align_backward", backward, measure),
];

/// Per box: the start and size of one axis (the box's columns `lo` and
/// `hi`), CPU's `roi_start` and `roi_height`/`roi_width`: [K] each.
fn extent(cx: &mut Cx, rois: V, [lo, hi]: [i64; 2], aligned: bool) -> Result<(V, V)> {
    let k = cx.g.ty(rois).shape[0];
    let ct = cx.g.ty(rois).dtype;
    let scale = cx.scalar_like("spatial_scale", ct, &[k])?.expect("spatial_scale");
    let offset = cx.g.full(if aligned { 0.5 } else { 0.0 }, ct, &[k]);
    let edge = |cx: &mut Cx, col: i64| {
        let x = cx.g.slice(rois, &[0, col], &[k, col + 1], &[1, 1]);
        let x = cx.g.reshape(x, &[k]);
        let x = mul(cx, x, scale);
        sub(cx, x, offset)
    };
    let (start, end) = (edge(cx, lo), edge(cx, hi));
    let mut size = sub(cx, end, start);
    if !aligned {
        let one = cx.g.full(1.0, ct, &[k]);
        size = cx.g.binary("stablehlo.maximum", size, one);
    }
    Ok((start, size))
}

/// The boxes as [K, 5] in their compute type, after CPU's shape check.
fn boxes(cx: &mut Cx) -> Result<V> {
    let rois = cx.meta("rois")?;
    if rois.sizes.len() != 2 || rois.sizes[1] != 5 {
        return Err(Error::runtime("rois must have shape as Tensor[K, 5]"));
    }
    let v = cx.tensor("rois")?;
    Ok(cx.g.convert(v, opmath(rois.dtype)))
}

/// Each box's samples per bin along an axis of `size` in `bins` bins, where
/// the grid adapts: `ceil(size / bins)`.
fn adaptive(cx: &mut Cx, size: V, bins: i64) -> V {
    let count = full_like(cx, bins as f64, size);
    let per = div(cx, size, count);
    cx.g.unary("stablehlo.ceil", per)
}

/// An adaptive grid's largest size along y and x over the boxes (at least 1);
/// nothing for a fixed grid.
fn measure(cx: &mut Cx) -> Result<Vec<V>> {
    if cx.int("sampling_ratio")? > 0 {
        return Ok(Vec::new());
    }
    let rois = boxes(cx)?;
    let aligned = cx.bool("aligned")?;
    let mut largest = Vec::new();
    for (cols, bins) in [([2, 4], cx.int("pooled_height")?), ([1, 3], cx.int("pooled_width")?)] {
        let (_, size) = extent(cx, rois, cols, aligned)?;
        let grid = adaptive(cx, size, bins);
        let grid = cx.g.convert(grid, DType::I64);
        let max = cx.g.reduce(ReduceKind::Max, grid, &[0]);
        let one = cx.g.full(1.0, DType::I64, &[]);
        let max = cx.g.binary("stablehlo.maximum", max, one);
        largest.push(cx.g.reshape(max, &[1]));
    }
    Ok(vec![cx.g.concatenate(&largest, 0)])
}

/// The sizes of one call: input [n, c, h, w], `k` boxes of `ph` x `pw` bins
/// of at most `gh` x `gw` samples (all of them where `fixed`), computed in `ct`.
struct RoiAlign {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    k: i64,
    ph: i64,
    pw: i64,
    gh: i64,
    gw: i64,
    fixed: bool,
    aligned: bool,
    ct: DType,
}

/// The four taps of every sample: flat positions into [N·H·W] and weights,
/// each of the samples' shape [k, ph, pw, gh, gw]; a sample outside the
/// input or beyond its box's grid weighs 0 (`inside` false). `count`: each
/// box's samples per bin, [k].
struct Taps {
    at: [V; 4],
    weight: [V; 4],
    inside: V,
    count: V,
}

impl RoiAlign {
    fn of(cx: &Cx, sizes: [i64; 4]) -> Result<RoiAlign> {
        let ratio = cx.int("sampling_ratio")?;
        let (gh, gw) = if ratio > 0 { (ratio, ratio) } else { (cx.sizes[0], cx.sizes[1]) };
        let [n, c, h, w] = sizes;
        let rois = cx.meta("rois")?;
        Ok(RoiAlign {
            n,
            c,
            h,
            w,
            k: rois.sizes[0],
            ph: cx.int("pooled_height")?,
            pw: cx.int("pooled_width")?,
            gh,
            gw,
            fixed: ratio > 0,
            aligned: cx.bool("aligned")?,
            ct: opmath(rois.dtype),
        })
    }

    fn samples(&self) -> [i64; 5] {
        [self.k, self.ph, self.pw, self.gh, self.gw]
    }

    fn points(&self) -> i64 {
        self.samples().iter().product()
    }

    fn full(&self, cx: &mut Cx, value: f64) -> V {
        cx.g.full(value, self.ct, &self.samples())
    }

    /// A per-box value over every sample of its box.
    fn per_box(&self, cx: &mut Cx, v: V) -> V {
        cx.g.broadcast_in_dim(v, &self.samples(), &[0])
    }

    /// One axis of every sample (`[bin, sub]`: the dimensions of the bin and
    /// of the sample within it) and whether the sample lies within its box's
    /// grid: CPU's `start + bin * bin_size + (i + .5) * bin_size / grid`.
    fn axis(&self, cx: &mut Cx, rois: V, cols: [i64; 2], bins: i64, [bin, sub_dim]: [usize; 2]) -> Result<(V, V, V)> {
        let (start, size) = extent(cx, rois, cols, self.aligned)?;
        let grid = if self.fixed {
            cx.g.full((if sub_dim == 3 { self.gh } else { self.gw }) as f64, self.ct, &[self.k])
        } else {
            adaptive(cx, size, bins)
        };
        let count = cx.g.full(bins as f64, self.ct, &[self.k]);
        let bin_size = div(cx, size, count);
        let (start, bin_size, per_box) = (self.per_box(cx, start), self.per_box(cx, bin_size), self.per_box(cx, grid));
        let index = cx.g.iota(self.ct, &self.samples(), bin);
        let at = mul(cx, index, bin_size);
        let at = add(cx, start, at);
        let i = cx.g.iota(self.ct, &self.samples(), sub_dim);
        let within_grid = cx.g.compare("LT", i, per_box);
        let half = self.full(cx, 0.5);
        let i = add(cx, i, half);
        let within = mul(cx, i, bin_size);
        let within = div(cx, within, per_box);
        Ok((add(cx, at, within), within_grid, grid))
    }

    /// CPU's `bilinear_interpolate` for every sample of every box.
    fn taps(&self, cx: &mut Cx) -> Result<Taps> {
        let rois = boxes(cx)?;
        let (y, in_grid_y, grid_y) = self.axis(cx, rois, [2, 4], self.ph, [1, 3])?;
        let (x, in_grid_x, grid_x) = self.axis(cx, rois, [1, 3], self.pw, [2, 4])?;
        let outside = |cx: &mut Cx, v: V, size: i64| {
            let low = full_like(cx, -1.0, v);
            let high = full_like(cx, size as f64, v);
            let below = cx.g.compare("LT", v, low);
            let above = cx.g.compare("GT", v, high);
            cx.g.binary("stablehlo.or", below, above)
        };
        let (out_y, out_x) = (outside(cx, y, self.h), outside(cx, x, self.w));
        let out = cx.g.binary("stablehlo.or", out_y, out_x);
        let inside = cx.g.unary("stablehlo.not", out);
        let in_grid = cx.g.binary("stablehlo.and", in_grid_y, in_grid_x);
        let inside = cx.g.binary("stablehlo.and", inside, in_grid);
        // Per axis: the low and high pixel and the fraction past the low one.
        let pixels = |cx: &mut Cx, v: V, size: i64| {
            let zero = full_like(cx, 0.0, v);
            let v = cx.g.binary("stablehlo.maximum", v, zero);
            let last = full_like(cx, (size - 1) as f64, v);
            let low = cx.g.unary("stablehlo.floor", v);
            let at_end = cx.g.compare("GE", low, last);
            let low = cx.g.select(at_end, last, low);
            let v = cx.g.select(at_end, low, v);
            let one = full_like(cx, 1.0, v);
            let next = add(cx, low, one);
            let high = cx.g.select(at_end, low, next);
            let fraction = sub(cx, v, low);
            let rest = sub(cx, one, fraction);
            (cx.g.convert(low, DType::I64), cx.g.convert(high, DType::I64), fraction, rest)
        };
        let (y_low, y_high, ly, hy) = pixels(cx, y, self.h);
        let (x_low, x_high, lx, hx) = pixels(cx, x, self.w);
        let batch = cx.g.slice(rois, &[0, 0], &[self.k, 1], &[1, 1]);
        let batch = cx.g.reshape(batch, &[self.k]);
        let batch = self.per_box(cx, batch);
        let batch = cx.g.convert(batch, DType::I64);
        let samples = self.samples();
        let first = cx.g.full(0.0, DType::I64, &samples);
        let last = cx.g.full((self.n - 1) as f64, DType::I64, &samples);
        let batch = cx.g.binary("stablehlo.maximum", batch, first);
        let batch = cx.g.binary("stablehlo.minimum", batch, last);
        let plane = cx.g.full((self.h * self.w) as f64, DType::I64, &samples);
        let base = mul(cx, batch, plane);
        let width = cx.g.full(self.w as f64, DType::I64, &samples);
        let at = |cx: &mut Cx, row: V, col: V| {
            let r = mul(cx, row, width);
            let r = add(cx, base, r);
            add(cx, r, col)
        };
        let positions = [at(cx, y_low, x_low), at(cx, y_low, x_high), at(cx, y_high, x_low), at(cx, y_high, x_high)];
        let zero = self.full(cx, 0.0);
        let mut weight = [zero; 4];
        for (i, (a, b)) in [(hy, hx), (hy, lx), (ly, hx), (ly, lx)].into_iter().enumerate() {
            let w = mul(cx, a, b);
            weight[i] = cx.g.select(inside, w, zero);
        }
        let count = mul(cx, grid_y, grid_x);
        let one = cx.g.full(1.0, self.ct, &[self.k]);
        let count = cx.g.binary("stablehlo.maximum", count, one);
        Ok(Taps { at: positions, weight, inside, count })
    }

    /// A per-sample value as a column over channels: [points, C].
    fn per_channel(&self, cx: &mut Cx, v: V) -> V {
        let v = cx.g.reshape(v, &[self.points()]);
        cx.g.broadcast_in_dim(v, &[self.points(), self.c], &[0])
    }
}

fn four_d(sizes: &[i64]) -> Result<[i64; 4]> {
    sizes.try_into().map_err(|_| Error::runtime("input must be a 4-d tensor"))
}

/// `roi_align(input, rois, spatial_scale, pooled_height, pooled_width,
/// sampling_ratio, aligned)`: [K, C, ph, pw], each bin the mean of its samples.
fn forward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("input")?;
    let r = RoiAlign::of(cx, four_d(t.sizes)?)?;
    let taps = r.taps(cx)?;
    let x = cx.tensor("input")?;
    let x = cx.g.convert(x, r.ct);
    let x = cx.g.transpose(x, &[0, 2, 3, 1]);
    let rows = cx.g.reshape(x, &[r.n * r.h * r.w, r.c]);
    let mut sum = None;
    for (at, w) in taps.at.iter().zip(&taps.weight) {
        let at = cx.g.reshape(*at, &[r.points()]);
        let v = cx.g.take(rows, at, 0);
        let w = r.per_channel(cx, *w);
        let v = mul(cx, w, v);
        sum = Some(match sum {
            None => v,
            Some(s) => add(cx, s, v),
        });
    }
    let sum = cx.g.reshape(sum.expect("four taps"), &[r.k, r.ph, r.pw, r.gh * r.gw, r.c]);
    let sum = cx.g.reduce(ReduceKind::Sum, sum, &[3]);
    let count = cx.g.broadcast_in_dim(taps.count, &[r.k, r.ph, r.pw, r.c], &[0]);
    let mean = div(cx, sum, count);
    let out = cx.g.transpose(mean, &[0, 3, 1, 2]);
    Ok(vec![cx.g.convert(out, t.dtype)])
}

/// `_roi_align_backward(grad, rois, spatial_scale, pooled_height,
/// pooled_width, batch_size, channels, height, width, sampling_ratio,
/// aligned)`: each bin's gradient over its count, spread to the taps of
/// its samples inside the input.
fn backward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("grad")?;
    let sizes = [cx.int("batch_size")?, cx.int("channels")?, cx.int("height")?, cx.int("width")?];
    let r = RoiAlign::of(cx, sizes)?;
    let taps = r.taps(cx)?;
    let grad = cx.tensor("grad")?;
    let grad = cx.g.convert(grad, r.ct);
    let count = cx.g.broadcast_in_dim(taps.count, &[r.k, r.c, r.ph, r.pw], &[0]);
    let grad = div(cx, grad, count);
    let grad = cx.g.transpose(grad, &[0, 2, 3, 1]);
    let grad = cx.g.broadcast_in_dim(grad, &[r.k, r.ph, r.pw, r.gh, r.gw, r.c], &[0, 1, 2, 5]);
    let grad = cx.g.reshape(grad, &[r.points(), r.c]);
    let inside = r.per_channel(cx, taps.inside);
    let zero = full_like(cx, 0.0, grad);
    let mut rows = cx.g.full(0.0, r.ct, &[r.n * r.h * r.w, r.c]);
    for (at, w) in taps.at.iter().zip(&taps.weight) {
        let at = cx.g.reshape(*at, &[r.points()]);
        let w = r.per_channel(cx, *w);
        let update = mul(cx, w, grad);
        // CPU adds nothing for a sample outside (a NaN gradient stays out).
        let update = cx.g.select(inside, update, zero);
        rows = cx.g.put(rows, at, update, 0, Some(ReduceKind::Sum));
    }
    let x = cx.g.reshape(rows, &[r.n, r.h, r.w, r.c]);
    let x = cx.g.transpose(x, &[0, 3, 1, 2]);
    Ok(vec![cx.g.convert(x, t.dtype)])
}
