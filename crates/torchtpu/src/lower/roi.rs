//! torchvision's RoIAlign (`torchvision.ops.roi_align`, behind the box and
//! mask heads of its detection models) and its gradient, with the formulas
//! of torchvision's CPU kernel: each output bin averages a grid of bilinear
//! samples, `sampling_ratio` per side. An adaptive grid (`sampling_ratio <=
//! 0`) sizes itself by each box, a shape the host cannot know: it runs on
//! the CPU (counted). Samples gather the input's [N·H·W, C] rows; the
//! gradient scatter-adds to them. torchvision registers its ops by name, and
//! the table holds them under their full names, as the dispatcher sends
//! them to PrivateUse1 like any other.
use super::elementwise::full_like;
use super::nn::{add, div, mul, sub};
use super::{op, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] =
    &[op("torchvision::roi_align", forward), op("torchvision::_roi_align_backward", backward)];

/// The sizes of one call: input [n, c, h, w], `k` boxes of `ph` x `pw` bins
/// of `grid` x `grid` samples, computed in `ct`.
struct RoiAlign {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    k: i64,
    ph: i64,
    pw: i64,
    grid: i64,
    aligned: bool,
    ct: DType,
}

/// The four taps of every sample: flat positions into [N·H·W] and weights,
/// each of the samples' shape [k, ph, pw, grid, grid]; a sample outside the
/// input has weight 0 (`inside` false).
struct Taps {
    at: [V; 4],
    weight: [V; 4],
    inside: V,
}

impl RoiAlign {
    fn of(cx: &Cx, sizes: [i64; 4], dtype: DType) -> Result<RoiAlign> {
        let rois = cx.meta("rois")?;
        if rois.sizes.len() != 2 || rois.sizes[1] != 5 {
            return Err(Error::runtime("rois must have shape as Tensor[K, 5]"));
        }
        let grid = cx.int("sampling_ratio")?;
        if grid <= 0 {
            return Err(Error::fallback("torchvision::roi_align: an adaptive sampling grid (sampling_ratio <= 0)"));
        }
        let [n, c, h, w] = sizes;
        Ok(RoiAlign {
            n,
            c,
            h,
            w,
            k: rois.sizes[0],
            ph: cx.int("pooled_height")?,
            pw: cx.int("pooled_width")?,
            grid,
            aligned: cx.bool("aligned")?,
            ct: opmath(dtype),
        })
    }

    fn samples(&self) -> [i64; 5] {
        [self.k, self.ph, self.pw, self.grid, self.grid]
    }

    fn full(&self, cx: &mut Cx, value: f64) -> V {
        cx.g.full(value, self.ct, &self.samples())
    }

    /// Column `i` of the boxes, over every sample of its box.
    fn column(&self, cx: &mut Cx, rois: V, i: i64) -> V {
        let col = cx.g.slice(rois, &[0, i], &[self.k, i + 1], &[1, 1]);
        let col = cx.g.reshape(col, &[self.k]);
        cx.g.broadcast_in_dim(col, &self.samples(), &[0])
    }

    /// One coordinate of every sample (`bin`, `sub`: the dimensions of the
    /// bin and of the sample within it), from the box's start and end
    /// columns: CPU's `start + bin * size + (i + .5) * size / grid`.
    fn coordinate(
        &self,
        cx: &mut Cx,
        rois: V,
        scale: V,
        [lo, hi]: [i64; 2],
        bins: i64,
        [bin, sub_dim]: [usize; 2],
    ) -> V {
        let offset = self.full(cx, if self.aligned { 0.5 } else { 0.0 });
        let edge = |cx: &mut Cx, col: i64| {
            let x = self.column(cx, rois, col);
            let x = mul(cx, x, scale);
            sub(cx, x, offset)
        };
        let (start, end) = (edge(cx, lo), edge(cx, hi));
        let mut size = sub(cx, end, start);
        if !self.aligned {
            let one = self.full(cx, 1.0);
            size = cx.g.binary("stablehlo.maximum", size, one);
        }
        let count = self.full(cx, bins as f64);
        let bin_size = div(cx, size, count);
        let index = cx.g.iota(self.ct, &self.samples(), bin);
        let at = mul(cx, index, bin_size);
        let at = add(cx, start, at);
        let i = cx.g.iota(self.ct, &self.samples(), sub_dim);
        let half = self.full(cx, 0.5);
        let i = add(cx, i, half);
        let within = mul(cx, i, bin_size);
        let grid = self.full(cx, self.grid as f64);
        let within = div(cx, within, grid);
        add(cx, at, within)
    }

    /// CPU's `bilinear_interpolate` for every sample of every box.
    fn taps(&self, cx: &mut Cx) -> Result<Taps> {
        let rois = cx.tensor("rois")?;
        let rois = cx.g.convert(rois, self.ct);
        let scale = cx.scalar_like("spatial_scale", self.ct, &self.samples())?.expect("spatial_scale");
        let y = self.coordinate(cx, rois, scale, [2, 4], self.ph, [1, 3]);
        let x = self.coordinate(cx, rois, scale, [1, 3], self.pw, [2, 4]);
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
        // Per axis: the low and high pixel and the fraction past the low one.
        let axis = |cx: &mut Cx, v: V, size: i64| {
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
        let (y_low, y_high, ly, hy) = axis(cx, y, self.h);
        let (x_low, x_high, lx, hx) = axis(cx, x, self.w);
        let batch = self.column(cx, rois, 0);
        let batch = cx.g.convert(batch, DType::I64);
        let samples = self.samples();
        let (first, last) =
            (cx.g.full(0.0, DType::I64, &samples), cx.g.full((self.n - 1) as f64, DType::I64, &samples));
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
        Ok(Taps { at: positions, weight, inside })
    }

    fn points(&self) -> i64 {
        self.samples().iter().product()
    }

    /// A per-sample value as a column over channels: [points, C].
    fn per_channel(&self, cx: &mut Cx, v: V) -> V {
        let v = cx.g.reshape(v, &[self.points()]);
        cx.g.broadcast_in_dim(v, &[self.points(), self.c], &[0])
    }
}

/// `roi_align(input, rois, spatial_scale, pooled_height, pooled_width,
/// sampling_ratio, aligned)`: [K, C, ph, pw], each bin the mean of its samples.
fn forward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("input")?;
    let sizes: [i64; 4] = t.sizes.try_into().map_err(|_| Error::runtime("input must be a 4-d tensor"))?;
    let r = RoiAlign::of(cx, sizes, t.dtype)?;
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
    let sum = cx.g.reshape(sum.expect("four taps"), &[r.k, r.ph, r.pw, r.grid * r.grid, r.c]);
    let sum = cx.g.reduce(ReduceKind::Sum, sum, &[3]);
    let count = cx.g.full((r.grid * r.grid) as f64, r.ct, &[r.k, r.ph, r.pw, r.c]);
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
    let r = RoiAlign::of(cx, sizes, t.dtype)?;
    let taps = r.taps(cx)?;
    let grad = cx.tensor("grad")?;
    let grad = cx.g.convert(grad, r.ct);
    let count = cx.g.full((r.grid * r.grid) as f64, r.ct, &[r.k, r.c, r.ph, r.pw]);
    let grad = div(cx, grad, count);
    let grad = cx.g.transpose(grad, &[0, 2, 3, 1]);
    let grad = cx.g.broadcast_in_dim(grad, &[r.k, r.ph, r.pw, r.grid, r.grid, r.c], &[0, 1, 2, 5]);
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
