//! `grid_sampler_2d` (`F.grid_sample` on 4-d inputs) and its backward, with
//! the formulas of CPU's vectorised kernel: grid coordinates unnormalised,
//! padded (border: clipped; reflection: reflected, then clipped), and the
//! input read at the 1 (nearest), 4 (bilinear) or 16 (bicubic) taps around
//! each point. A tap outside the input reads zero, which a NaN weight still
//! turns into NaN, as on CPU. Taps are gathers from the input's [N·H·W, C]
//! rows; the input gradient scatter-adds to the same rows.
use super::elementwise::{float_only, full_like};
use super::nn::{add, mul};
use super::{op, Cx, Entry, UNDEFINED};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[op("grid_sampler_2d", forward), op("grid_sampler_2d_backward", backward)];

const BILINEAR: i64 = 0;
const NEAREST: i64 = 1;
const BICUBIC: i64 = 2;
const BORDER: i64 = 1;
const REFLECTION: i64 = 2;
/// Bicubic convolution's parameter, as PyTorch's.
const A: f64 = -0.75;

struct Sampler {
    mode: i64,
    padding: i64,
    align: bool,
    /// input [n, c, h, w]; grid [n, ho, wo, 2]
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    ho: i64,
    wo: i64,
    ct: DType,
}

impl Sampler {
    fn of(cx: &Cx) -> Result<Sampler> {
        let (t, g) = (cx.meta("input")?, cx.meta("grid")?);
        let (mode, padding) = (cx.int("interpolation_mode")?, cx.int("padding_mode")?);
        if !(BILINEAR..=BICUBIC).contains(&mode) || !(0..=REFLECTION).contains(&padding) {
            return Err(Error::runtime(format!("torchtpu: grid_sampler_2d: mode {mode}, padding {padding}")));
        }
        float_only(t.dtype, "grid_sampler_2d_cpu_kernel_impl")?;
        let s = t.sizes;
        Ok(Sampler {
            mode,
            padding,
            align: cx.bool("align_corners")?,
            n: s[0],
            c: s[1],
            h: s[2],
            w: s[3],
            ho: g.sizes[1],
            wo: g.sizes[2],
            ct: opmath(t.dtype),
        })
    }

    fn points(&self) -> [i64; 3] {
        [self.n, self.ho, self.wo]
    }

    fn full(&self, cx: &mut Cx, value: f64) -> V {
        cx.g.full(value, self.ct, &self.points())
    }

    /// Grid coordinate `axis` (0: x, 1: y) in pixels, and d(pixels)/d(grid).
    fn unnormalize(&self, cx: &mut Cx, grid: V, axis: i64) -> (V, f64) {
        let size = (if axis == 0 { self.w } else { self.h }) as f64;
        let [n, ho, wo] = self.points();
        let x = cx.g.slice(grid, &[0, 0, 0, axis], &[n, ho, wo, axis + 1], &[1, 1, 1, 1]);
        let x = cx.g.reshape(x, &[n, ho, wo]);
        let x = cx.g.convert(x, self.ct);
        let (scale, shift, plus_one) =
            if self.align { ((size - 1.0) / 2.0, 0.0, true) } else { (size / 2.0, size / 2.0 - 0.5, false) };
        let x = if plus_one {
            let one = self.full(cx, 1.0);
            add(cx, x, one)
        } else {
            x
        };
        let s = self.full(cx, scale);
        let x = mul(cx, x, s);
        let x = if shift != 0.0 {
            let b = self.full(cx, shift);
            add(cx, x, b)
        } else {
            x
        };
        (x, scale)
    }

    /// The padding mode applied to pixel coordinates `x` along a dimension
    /// of `size`, and its derivative (0 or ±1).
    fn pad(&self, cx: &mut Cx, x: V, size: i64) -> (V, V) {
        let one = full_like(cx, 1.0, x);
        match self.padding {
            BORDER => clip(cx, x, size),
            REFLECTION => {
                let (low, span) = if self.align { (0.0, 2.0 * (size - 1) as f64) } else { (-0.5, 2.0 * size as f64) };
                if span == 0.0 {
                    let zero = full_like(cx, 0.0, x);
                    return (zero, zero);
                }
                let lowv = full_like(cx, low, x);
                let spanv = full_like(cx, span, x);
                let shifted = cx.g.binary("stablehlo.subtract", x, lowv);
                let zero = full_like(cx, 0.0, x);
                let negative = cx.g.compare("LT", shifted, zero);
                let a = cx.g.unary("stablehlo.abs", shifted);
                let flips = cx.g.binary("stablehlo.divide", a, spanv);
                let flips = trunc(cx, flips);
                let whole = mul(cx, flips, spanv);
                let extra = cx.g.binary("stablehlo.subtract", a, whole);
                let back = cx.g.binary("stablehlo.subtract", spanv, extra);
                let flip = cx.g.compare("GT", extra, back);
                let r = cx.g.select(flip, back, extra);
                let r = add(cx, r, lowv);
                let sign = cx.g.binary("stablehlo.xor", flip, negative);
                let minus = full_like(cx, -1.0, x);
                let g = cx.g.select(sign, minus, one);
                let (r, gc) = clip(cx, r, size);
                (r, mul(cx, g, gc))
            }
            _ => (x, one),
        }
    }

    /// Input rows at integer pixel coordinates (`px`, `py`: floats): the
    /// gather positions into [N·H·W] and whether each is inside the input.
    fn tap(&self, cx: &mut Cx, px: V, py: V) -> (V, V) {
        let inside = |cx: &mut Cx, v: V, size: i64| {
            let (clamped, ok) = bounds(cx, v, size, false);
            (ok, cx.g.convert(clamped, DType::I64))
        };
        let (okx, ix) = inside(cx, px, self.w);
        let (oky, iy) = inside(cx, py, self.h);
        let valid = cx.g.binary("stablehlo.and", okx, oky);
        let pts = self.points();
        let plane = cx.g.full((self.h * self.w) as f64, DType::I64, &pts);
        let width = cx.g.full(self.w as f64, DType::I64, &pts);
        let batch = cx.g.iota(DType::I64, &pts, 0);
        let at = mul(cx, batch, plane);
        let row = mul(cx, iy, width);
        let at = add(cx, at, row);
        let at = add(cx, at, ix);
        (at, valid)
    }

    /// The taps of each point and their weights, with the weights'
    /// derivatives in x and y (per pixel) and the x/y grid multipliers.
    fn taps(&self, cx: &mut Cx, grid: V) -> Taps {
        let (x, sx) = self.unnormalize(cx, grid, 0);
        let (y, sy) = self.unnormalize(cx, grid, 1);
        let mut taps = Taps { at: vec![], valid: vec![], weight: vec![], dx: vec![], dy: vec![], mx: x, my: y };
        if self.mode == BICUBIC {
            let (x0, y0) = (cx.g.unary("stablehlo.floor", x), cx.g.unary("stablehlo.floor", y));
            let tx = cx.g.binary("stablehlo.subtract", x, x0);
            let ty = cx.g.binary("stablehlo.subtract", y, y0);
            let (cxs, gxs) = (cubic(cx, tx), cubic_grad(cx, tx));
            let (cys, gys) = (cubic(cx, ty), cubic_grad(cx, ty));
            for i in 0..4 {
                let oy = full_like(cx, (i - 1) as f64, y);
                let py = add(cx, y0, oy);
                let (py, _) = self.pad(cx, py, self.h);
                for j in 0..4 {
                    let ox = full_like(cx, (j - 1) as f64, x);
                    let px = add(cx, x0, ox);
                    let (px, _) = self.pad(cx, px, self.w);
                    let (at, valid) = self.tap(cx, px, py);
                    taps.at.push(at);
                    taps.valid.push(valid);
                    let w = mul(cx, cxs[j as usize], cys[i as usize]);
                    taps.weight.push(w);
                    // CPU subtracts these (its coefficient gradients are in -t).
                    let dx = mul(cx, gxs[j as usize], cys[i as usize]);
                    let dy = mul(cx, gys[i as usize], cxs[j as usize]);
                    taps.dx.push(cx.g.unary("stablehlo.negate", dx));
                    taps.dy.push(cx.g.unary("stablehlo.negate", dy));
                }
            }
            taps.mx = self.full(cx, sx);
            taps.my = self.full(cx, sy);
            return taps;
        }
        let (x, gx) = self.pad(cx, x, self.w);
        let (y, gy) = self.pad(cx, y, self.h);
        let sxv = self.full(cx, sx);
        let syv = self.full(cx, sy);
        taps.mx = mul(cx, gx, sxv);
        taps.my = mul(cx, gy, syv);
        if self.mode == NEAREST {
            let px = cx.g.unary("stablehlo.round_nearest_even", x);
            let py = cx.g.unary("stablehlo.round_nearest_even", y);
            let (at, valid) = self.tap(cx, px, py);
            let (one, zero) = (self.full(cx, 1.0), self.full(cx, 0.0));
            taps.at.push(at);
            taps.valid.push(valid);
            taps.weight.push(one);
            taps.dx.push(zero);
            taps.dy.push(zero);
            return taps;
        }
        let (x0, y0) = (cx.g.unary("stablehlo.floor", x), cx.g.unary("stablehlo.floor", y));
        let one = self.full(cx, 1.0);
        let x1 = add(cx, x0, one);
        let y1 = add(cx, y0, one);
        // CPU's weights: w = x - x0, e = 1 - w, n = y - y0, s = 1 - n.
        let wgt = cx.g.binary("stablehlo.subtract", x, x0);
        let e = cx.g.binary("stablehlo.subtract", one, wgt);
        let nn = cx.g.binary("stablehlo.subtract", y, y0);
        let s = cx.g.binary("stablehlo.subtract", one, nn);
        let neg = |cx: &mut Cx, v: V| cx.g.unary("stablehlo.negate", v);
        let (ns, nn_, ne_, nw_) = (neg(cx, s), neg(cx, nn), neg(cx, e), neg(cx, wgt));
        // (corner, weight, d/dx, d/dy): nw, ne, sw, se.
        let corners = [
            (x0, y0, mul(cx, s, e), ns, ne_),
            (x1, y0, mul(cx, s, wgt), s, nw_),
            (x0, y1, mul(cx, nn, e), nn_, e),
            (x1, y1, mul(cx, nn, wgt), nn, wgt),
        ];
        for (px, py, w, dx, dy) in corners {
            let (at, valid) = self.tap(cx, px, py);
            taps.at.push(at);
            taps.valid.push(valid);
            taps.weight.push(w);
            taps.dx.push(dx);
            taps.dy.push(dy);
        }
        taps
    }

    /// The input as [N·H·W, C] rows in compute type.
    fn rows(&self, cx: &mut Cx) -> Result<V> {
        let x = cx.tensor("input")?;
        let x = cx.g.convert(x, self.ct);
        let x = cx.g.transpose(x, &[0, 2, 3, 1]);
        Ok(cx.g.reshape(x, &[self.n * self.h * self.w, self.c]))
    }

    /// A per-point value broadcast over channels: [N, Ho, Wo, C].
    fn per_channel(&self, cx: &mut Cx, v: V) -> V {
        let [n, ho, wo] = self.points();
        cx.g.broadcast_in_dim(v, &[n, ho, wo, self.c], &[0, 1, 2])
    }

    /// Tap values, zero outside the input: [N, Ho, Wo, C].
    fn read(&self, cx: &mut Cx, rows: V, at: V, valid: V) -> V {
        let v = cx.g.take(rows, at, 0);
        let valid = self.per_channel(cx, valid);
        let zero = full_like(cx, 0.0, v);
        cx.g.select(valid, v, zero)
    }
}

struct Taps {
    at: Vec<V>,
    valid: Vec<V>,
    weight: Vec<V>,
    dx: Vec<V>,
    dy: Vec<V>,
    /// d(pixel)/d(grid) of x and y.
    mx: V,
    my: V,
}

fn trunc(cx: &mut Cx, x: V) -> V {
    let zero = full_like(cx, 0.0, x);
    let neg = cx.g.compare("LT", x, zero);
    let up = cx.g.unary("stablehlo.ceil", x);
    let down = cx.g.unary("stablehlo.floor", x);
    cx.g.select(neg, up, down)
}

/// `x` clipped to [0, size - 1], and whether it lies within (or, `strict`,
/// strictly within) that range.
fn bounds(cx: &mut Cx, x: V, size: i64, strict: bool) -> (V, V) {
    let zero = full_like(cx, 0.0, x);
    let last = full_like(cx, (size - 1) as f64, x);
    let r = cx.g.binary("stablehlo.maximum", x, zero);
    let r = cx.g.binary("stablehlo.minimum", r, last);
    let lo = cx.g.compare(if strict { "GT" } else { "GE" }, x, zero);
    let hi = cx.g.compare(if strict { "LT" } else { "LE" }, x, last);
    (r, cx.g.binary("stablehlo.and", lo, hi))
}

/// `x` clipped to [0, size - 1] and its derivative: 1 strictly inside.
fn clip(cx: &mut Cx, x: V, size: i64) -> (V, V) {
    let (r, inside) = bounds(cx, x, size, true);
    let one = full_like(cx, 1.0, x);
    let zero = full_like(cx, 0.0, x);
    (r, cx.g.select(inside, one, zero))
}

/// A polynomial in `t` with coefficients from the highest power down.
fn poly(cx: &mut Cx, t: V, coefficients: &[f64]) -> V {
    let mut r = full_like(cx, coefficients[0], t);
    for &c in &coefficients[1..] {
        r = mul(cx, r, t);
        let c = full_like(cx, c, t);
        r = add(cx, r, c);
    }
    r
}

/// `v` shifted: `offset + sign * t`.
fn shifted(cx: &mut Cx, t: V, offset: f64, sign: f64) -> V {
    let s = full_like(cx, sign, t);
    let o = full_like(cx, offset, t);
    let st = mul(cx, s, t);
    add(cx, o, st)
}

/// Bicubic convolution weights of the 4 taps at distances t+1, t, 1-t, 2-t.
fn cubic(cx: &mut Cx, t: V) -> [V; 4] {
    // |x| <= 1: ((A+2)x - (A+3))x² + 1; 1 < |x| < 2: ((Ax - 5A)x + 8A)x - 4A.
    let near = [A + 2.0, -(A + 3.0), 0.0, 1.0];
    let far = [A, -5.0 * A, 8.0 * A, -4.0 * A];
    let u0 = shifted(cx, t, 1.0, 1.0);
    let u2 = shifted(cx, t, 1.0, -1.0);
    let u3 = shifted(cx, t, 2.0, -1.0);
    [poly(cx, u0, &far), poly(cx, t, &near), poly(cx, u2, &near), poly(cx, u3, &far)]
}

/// CPU's `get_cubic_coefficients_grad`: the weights' derivatives, in the
/// variables -1-t, -t, 1-t, 2-t.
fn cubic_grad(cx: &mut Cx, t: V) -> [V; 4] {
    let x0 = shifted(cx, t, -1.0, -1.0);
    let x1 = shifted(cx, t, 0.0, -1.0);
    let x2 = shifted(cx, t, 1.0, -1.0);
    let x3 = shifted(cx, t, 2.0, -1.0);
    [
        poly(cx, x0, &[-3.0 * A, -10.0 * A, -8.0 * A]),
        poly(cx, x1, &[-3.0 * (A + 2.0), -2.0 * (A + 3.0), 0.0]),
        poly(cx, x2, &[3.0 * (A + 2.0), -2.0 * (A + 3.0), 0.0]),
        poly(cx, x3, &[3.0 * A, -10.0 * A, 8.0 * A]),
    ]
}

fn forward(cx: &mut Cx) -> Result<Vec<V>> {
    let s = Sampler::of(cx)?;
    let dtype = cx.meta("input")?.dtype;
    let [n, ho, wo] = s.points();
    if s.n * s.c * s.ho * s.wo == 0 || s.h * s.w == 0 {
        return Ok(vec![cx.g.full(0.0, dtype, &[n, s.c, ho, wo])]);
    }
    let grid = cx.tensor("grid")?;
    let taps = s.taps(cx, grid);
    let rows = s.rows(cx)?;
    let mut out = None;
    for k in 0..taps.at.len() {
        let v = s.read(cx, rows, taps.at[k], taps.valid[k]);
        out = Some(accumulate(cx, out, v, taps.weight[k], &s));
    }
    let out = out.expect("a tap");
    let out = cx.g.transpose(out, &[0, 3, 1, 2]);
    Ok(vec![cx.g.convert(out, dtype)])
}

/// `acc + v * weight` (weight broadcast over channels).
fn accumulate(cx: &mut Cx, acc: Option<V>, v: V, weight: V, s: &Sampler) -> V {
    let w = s.per_channel(cx, weight);
    let term = mul(cx, v, w);
    match acc {
        None => term,
        Some(a) => add(cx, a, term),
    }
}

fn backward(cx: &mut Cx) -> Result<Vec<V>> {
    let s = Sampler::of(cx)?;
    let (t, gt) = (cx.meta("input")?, cx.meta("grid")?);
    let mask = cx.bools("output_mask")?;
    let [n, ho, wo] = s.points();
    let empty = s.n * s.c * s.ho * s.wo == 0 || s.h * s.w == 0;
    let want_input = mask.first().copied().unwrap_or(true);
    let want_grid = mask.get(1).copied().unwrap_or(true);
    if empty {
        let gi = if want_input { cx.g.full(0.0, t.dtype, t.sizes) } else { UNDEFINED };
        let gg = if want_grid { cx.g.full(0.0, gt.dtype, gt.sizes) } else { UNDEFINED };
        return Ok(vec![gi, gg]);
    }
    let grid = cx.tensor("grid")?;
    let taps = s.taps(cx, grid);
    let g = cx.tensor("grad_output")?;
    let g = cx.g.convert(g, s.ct);
    let g = cx.g.transpose(g, &[0, 2, 3, 1]);
    let mut out = vec![UNDEFINED, UNDEFINED];
    if want_input {
        let mut acc = cx.g.full(0.0, s.ct, &[s.n * s.h * s.w, s.c]);
        for k in 0..taps.at.len() {
            let w = s.per_channel(cx, taps.weight[k]);
            let upd = mul(cx, g, w);
            let valid = s.per_channel(cx, taps.valid[k]);
            let zero = full_like(cx, 0.0, upd);
            let upd = cx.g.select(valid, upd, zero);
            acc = cx.g.put(acc, taps.at[k], upd, 0, Some(ReduceKind::Sum));
        }
        let r = cx.g.reshape(acc, &[s.n, s.h, s.w, s.c]);
        let r = cx.g.transpose(r, &[0, 3, 1, 2]);
        out[0] = cx.g.convert(r, t.dtype);
    }
    if want_grid {
        let rows = s.rows(cx)?;
        let (mut gx, mut gy) = (s.full(cx, 0.0), s.full(cx, 0.0));
        for k in 0..taps.at.len() {
            let v = s.read(cx, rows, taps.at[k], taps.valid[k]);
            let vg = mul(cx, v, g);
            let vg = cx.g.reduce(ReduceKind::Sum, vg, &[3]);
            let dx = mul(cx, vg, taps.dx[k]);
            let dy = mul(cx, vg, taps.dy[k]);
            gx = add(cx, gx, dx);
            gy = add(cx, gy, dy);
        }
        let gx = mul(cx, gx, taps.mx);
        let gy = mul(cx, gy, taps.my);
        let gx = cx.g.reshape(gx, &[n, ho, wo, 1]);
        let gy = cx.g.reshape(gy, &[n, ho, wo, 1]);
        let r = cx.g.concatenate(&[gx, gy], 3);
        out[1] = cx.g.convert(r, gt.dtype);
    }
    Ok(out)
}
