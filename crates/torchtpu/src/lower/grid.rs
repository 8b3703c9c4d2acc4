//! `grid_sampler_2d` and `grid_sampler_3d` (`F.grid_sample` on 4-d and 5-d
//! inputs) and their backward, with the formulas of CPU's kernels: grid
//! coordinates unnormalised, padded (border: clipped; reflection: reflected,
//! then clipped), and the input read at the 1 (nearest), 2^d ((bi/tri)linear)
//! or 4^d (bi/tricubic) taps around each point. A tap outside the input
//! reads zero, which a NaN weight still turns into NaN, as on CPU. Taps are
//! gathers from the input's [N·(D·)H·W, C] rows; the input gradient
//! scatter-adds to the same rows.
use super::elementwise::{float_only, full_like};
use super::nn::{add, mul};
use super::{op, Cx, Entry, UNDEFINED};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[
    op("grid_sampler_2d", forward),
    op("grid_sampler_2d_backward", backward),
    op("grid_sampler_3d", forward),
    op("grid_sampler_3d_backward", backward),
];

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
    n: i64,
    c: i64,
    /// The input's spatial sizes ([H, W] or [D, H, W]); grid coordinate k
    /// (x, y, z) indexes the k-th from the end.
    size: Vec<i64>,
    /// The grid's points per item ([Ho, Wo] or [Do, Ho, Wo]).
    out: Vec<i64>,
    ct: DType,
}

impl Sampler {
    fn of(cx: &Cx) -> Result<Sampler> {
        let (t, g) = (cx.meta("input")?, cx.meta("grid")?);
        let (mode, padding) = (cx.int("interpolation_mode")?, cx.int("padding_mode")?);
        check_shapes(cx.op.name.contains("3d"), t.sizes, g.sizes)?;
        let dims = t.sizes.len() - 2;
        // Tricubic sampling is new in the torch this project pins (2.15); the
        // GPU image's 2.11 refuses it, as CPU and CUDA there do.
        if dims == 3 && mode == BICUBIC && !crate::error::torch_at_least(2, 15) {
            return Err(Error::runtime("grid_sampler(): bicubic interpolation only supports 4D input"));
        }
        if !(BILINEAR..=BICUBIC).contains(&mode) || !(0..=REFLECTION).contains(&padding) {
            return Err(Error::runtime(format!("torchtpu: grid_sampler: mode {mode}, padding {padding}")));
        }
        float_only(t.dtype, if dims == 2 { "grid_sampler_2d_cpu_kernel_impl" } else { "grid_sampler3d_cpu" })?;
        Ok(Sampler {
            mode,
            padding,
            align: cx.bool("align_corners")?,
            n: t.sizes[0],
            c: t.sizes[1],
            size: t.sizes[2..].to_vec(),
            out: g.sizes[1..g.sizes.len() - 1].to_vec(),
            ct: opmath(t.dtype),
        })
    }

    fn dims(&self) -> usize {
        self.size.len()
    }

    /// The size along grid coordinate `axis` (0: x, the last dimension).
    fn extent(&self, axis: usize) -> i64 {
        self.size[self.dims() - 1 - axis]
    }

    fn points(&self) -> Vec<i64> {
        std::iter::once(self.n).chain(self.out.iter().copied()).collect()
    }

    /// Nothing to sample (no item, channel or point; the input's spatial
    /// sizes are checked non-empty).
    fn empty(&self) -> bool {
        self.n * self.c * self.out.iter().product::<i64>() == 0
    }

    fn full(&self, cx: &mut Cx, value: f64) -> V {
        cx.g.full(value, self.ct, &self.points())
    }

    /// Grid coordinate `axis` (0: x, 1: y, 2: z) in pixels, and d(pixels)/d(grid).
    fn unnormalize(&self, cx: &mut Cx, grid: V, axis: usize) -> (V, f64) {
        let size = self.extent(axis) as f64;
        let points = self.points();
        let r = points.len();
        let mut start = vec![0; r + 1];
        start[r] = axis as i64;
        let mut limit = points.clone();
        limit.push(axis as i64 + 1);
        let x = cx.g.slice(grid, &start, &limit, &vec![1; r + 1]);
        let x = cx.g.reshape(x, &points);
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

    /// Input rows at integer pixel coordinates (`p`: floats, x first): the
    /// gather positions into [N·(D·)H·W] and whether each is inside the input.
    fn tap(&self, cx: &mut Cx, p: &[V]) -> (V, V) {
        let pts = self.points();
        let mut at = cx.g.iota(DType::I64, &pts, 0);
        let mut valid = None;
        // Row-major over (item, z, y, x): the last coordinate first.
        for axis in (0..self.dims()).rev() {
            let (clamped, ok) = bounds(cx, p[axis], self.extent(axis), false);
            let index = cx.g.convert(clamped, DType::I64);
            let size = cx.g.full(self.extent(axis) as f64, DType::I64, &pts);
            at = mul(cx, at, size);
            at = add(cx, at, index);
            valid = Some(match valid {
                None => ok,
                Some(v) => cx.g.binary("stablehlo.and", v, ok),
            });
        }
        (at, valid.expect("a spatial dimension"))
    }

    /// The taps of each point and their weights, with the weights'
    /// derivatives along each coordinate (per pixel) and the coordinates'
    /// grid multipliers.
    fn taps(&self, cx: &mut Cx, grid: V) -> Taps {
        let dims = self.dims();
        let (coords, scales): (Vec<V>, Vec<f64>) = (0..dims).map(|a| self.unnormalize(cx, grid, a)).unzip();
        let mut taps = Taps { at: vec![], valid: vec![], weight: vec![], d: vec![vec![]; dims], m: coords.clone() };
        if self.mode == BICUBIC {
            // Per coordinate: the cell's corner below, and the 4 taps' cubic
            // weights and their derivatives in its offset.
            let mut corner = Vec::with_capacity(dims);
            let (mut weights, mut slopes) = (Vec::with_capacity(dims), Vec::with_capacity(dims));
            for &x in &coords {
                let x0 = cx.g.unary("stablehlo.floor", x);
                let t = cx.g.binary("stablehlo.subtract", x, x0);
                weights.push(cubic(cx, t));
                slopes.push(cubic_grad(cx, t));
                corner.push(x0);
            }
            // 4^d taps, x varying fastest; a weight is the product of its
            // coordinates' weights from x up, its derivative along a coordinate
            // that coordinate's slope times the others' weights.
            for tap in 0..4usize.pow(dims as u32) {
                let offset = |a: usize| (tap / 4usize.pow(a as u32)) % 4;
                let mut p = Vec::with_capacity(dims);
                for (a, &x0) in corner.iter().enumerate() {
                    let o = full_like(cx, offset(a) as f64 - 1.0, x0);
                    let at = add(cx, x0, o);
                    p.push(self.pad(cx, at, self.extent(a)).0);
                }
                let (at, valid) = self.tap(cx, &p);
                taps.at.push(at);
                taps.valid.push(valid);
                let w: Vec<V> = (0..dims).map(|a| weights[a][offset(a)]).collect();
                let weight = w[1..].iter().fold(w[0], |acc, &f| mul(cx, acc, f));
                taps.weight.push(weight);
                for a in 0..dims {
                    let slope = slopes[a][offset(a)];
                    let d = (0..dims).filter(|&b| b != a).fold(slope, |acc, b| mul(cx, acc, w[b]));
                    // CPU subtracts these (its coefficient gradients are in -t).
                    taps.d[a].push(cx.g.unary("stablehlo.negate", d));
                }
            }
            taps.m = scales.iter().map(|&s| self.full(cx, s)).collect();
            return taps;
        }
        let mut padded = Vec::with_capacity(dims);
        for (a, (&x, &scale)) in coords.iter().zip(&scales).enumerate() {
            let (x, gx) = self.pad(cx, x, self.extent(a));
            let sv = self.full(cx, scale);
            taps.m[a] = mul(cx, gx, sv);
            padded.push(x);
        }
        if self.mode == NEAREST {
            let p: Vec<V> = padded.iter().map(|&x| cx.g.unary("stablehlo.round_nearest_even", x)).collect();
            let (at, valid) = self.tap(cx, &p);
            taps.at.push(at);
            taps.valid.push(valid);
            taps.weight.push(self.full(cx, 1.0));
            for d in &mut taps.d {
                d.push(self.full(cx, 0.0));
            }
            return taps;
        }
        // Per coordinate: the corner below and its weight `1 - (x - x0)`, the
        // corner above and its weight `x - x0` (CPU's w, e = 1 - w).
        let one = self.full(cx, 1.0);
        let mut corners = Vec::with_capacity(dims);
        for &x in &padded {
            let x0 = cx.g.unary("stablehlo.floor", x);
            let x1 = add(cx, x0, one);
            let above = cx.g.binary("stablehlo.subtract", x, x0);
            let below = cx.g.binary("stablehlo.subtract", one, above);
            corners.push([(x0, below), (x1, above)]);
        }
        // 2^d corners, x varying fastest (CPU's nw, ne, sw, se; then the
        // bottom plane's); a weight is the product of its coordinates'
        // weights from the last coordinate down, and its derivative along a
        // coordinate the product of the others', signed.
        let product = |cx: &mut Cx, factors: &[V]| {
            let mut p = factors[factors.len() - 1];
            for &f in factors[..factors.len() - 1].iter().rev() {
                p = mul(cx, p, f);
            }
            p
        };
        for corner in 0..1usize << dims {
            let side = |a: usize| (corner >> a) & 1;
            let p: Vec<V> = (0..dims).map(|a| corners[a][side(a)].0).collect();
            let w: Vec<V> = (0..dims).map(|a| corners[a][side(a)].1).collect();
            let (at, valid) = self.tap(cx, &p);
            taps.at.push(at);
            taps.valid.push(valid);
            let weight = product(cx, &w);
            taps.weight.push(weight);
            for a in 0..dims {
                let mut others = w.clone();
                others[a] = if side(a) == 1 { one } else { cx.g.unary("stablehlo.negate", one) };
                let d = product(cx, &others);
                taps.d[a].push(d);
            }
        }
        taps
    }

    /// The input as [N·(D·)H·W, C] rows in compute type.
    fn rows(&self, cx: &mut Cx) -> Result<V> {
        let x = cx.tensor("input")?;
        let x = cx.g.convert(x, self.ct);
        let x = cx.g.transpose(x, &self.channels_last());
        Ok(cx.g.reshape(x, &[self.n * self.size.iter().product::<i64>(), self.c]))
    }

    /// The permutation that moves dimension 1 (channels) last.
    fn channels_last(&self) -> Vec<i64> {
        let r = self.dims() as i64 + 2;
        std::iter::once(0).chain(2..r).chain([1]).collect()
    }

    /// The permutation that moves the last dimension (channels) to 1.
    fn channels_first(&self) -> Vec<i64> {
        let r = self.dims() as i64 + 2;
        [0, r - 1].into_iter().chain(1..r - 1).collect()
    }

    /// A per-point value broadcast over channels: [N, (Do,) Ho, Wo, C].
    fn per_channel(&self, cx: &mut Cx, v: V) -> V {
        let mut shape = self.points();
        let dims: Vec<i64> = (0..shape.len() as i64).collect();
        shape.push(self.c);
        cx.g.broadcast_in_dim(v, &shape, &dims)
    }

    /// Tap values, zero outside the input: [N, (Do,) Ho, Wo, C].
    fn read(&self, cx: &mut Cx, rows: V, at: V, valid: V) -> V {
        let v = cx.g.take(rows, at, 0);
        let valid = self.per_channel(cx, valid);
        let zero = full_like(cx, 0.0, v);
        cx.g.select(valid, v, zero)
    }
}

/// CPU's `check_grid_sampler_common`, then `check_grid_sampler_2d`/`_3d`.
fn check_shapes(volumetric: bool, input: &[i64], grid: &[i64]) -> Result<()> {
    let fail = |message: String| Err(Error::runtime(format!("grid_sampler(): {message}")));
    let rank = if volumetric { 5 } else { 4 };
    let ranks = || {
        fail(format!(
            "expected {rank}D input and grid with same number of dimensions, but got input with sizes {input:?} and grid with sizes {grid:?}"
        ))
    };
    if input.is_empty() || grid.is_empty() {
        return ranks();
    }
    if input[0] != grid[0] {
        return fail(format!(
            "expected grid and input to have same batch size, but got input with sizes {input:?} and grid with sizes {grid:?}"
        ));
    }
    let spatial = input.len() as i64 - 2;
    if grid[grid.len() - 1] != spatial {
        return fail(format!(
            "expected grid to have size {spatial} in last dimension, but got grid with sizes {grid:?}"
        ));
    }
    if let Some(i) = (2..input.len()).find(|&i| input[i] <= 0) {
        return fail(format!(
            "expected input to have non-empty spatial dimensions, but input has sizes {input:?} with dimension {i} being empty"
        ));
    }
    if input.len() != rank || grid.len() != rank {
        return ranks();
    }
    Ok(())
}

struct Taps {
    at: Vec<V>,
    valid: Vec<V>,
    weight: Vec<V>,
    /// Per coordinate (x, y, z), each tap weight's derivative along it.
    d: Vec<Vec<V>>,
    /// Per coordinate, d(pixel)/d(grid).
    m: Vec<V>,
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
    let mut shape = vec![s.n, s.c];
    shape.extend(&s.out);
    if s.empty() {
        return Ok(vec![cx.g.full(0.0, dtype, &shape)]);
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
    let out = cx.g.transpose(out, &s.channels_first());
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
    let want_input = mask.first().copied().unwrap_or(true);
    let want_grid = mask.get(1).copied().unwrap_or(true);
    if s.empty() {
        let gi = if want_input { cx.g.full(0.0, t.dtype, t.sizes) } else { UNDEFINED };
        let gg = if want_grid { cx.g.full(0.0, gt.dtype, gt.sizes) } else { UNDEFINED };
        return Ok(vec![gi, gg]);
    }
    let grid = cx.tensor("grid")?;
    let taps = s.taps(cx, grid);
    let g = cx.tensor("grad_output")?;
    let g = cx.g.convert(g, s.ct);
    let g = cx.g.transpose(g, &s.channels_last());
    let mut out = vec![UNDEFINED, UNDEFINED];
    if want_input {
        let mut acc = cx.g.full(0.0, s.ct, &[s.n * s.size.iter().product::<i64>(), s.c]);
        for k in 0..taps.at.len() {
            let w = s.per_channel(cx, taps.weight[k]);
            let upd = mul(cx, g, w);
            let valid = s.per_channel(cx, taps.valid[k]);
            let zero = full_like(cx, 0.0, upd);
            let upd = cx.g.select(valid, upd, zero);
            acc = cx.g.put(acc, taps.at[k], upd, 0, Some(ReduceKind::Sum));
        }
        let mut shape = vec![s.n];
        shape.extend(&s.size);
        shape.push(s.c);
        let r = cx.g.reshape(acc, &shape);
        let r = cx.g.transpose(r, &s.channels_first());
        out[0] = cx.g.convert(r, t.dtype);
    }
    if want_grid {
        let rows = s.rows(cx)?;
        let mut sums: Vec<V> = (0..s.dims()).map(|_| s.full(cx, 0.0)).collect();
        let channels = s.dims() + 1;
        for k in 0..taps.at.len() {
            let v = s.read(cx, rows, taps.at[k], taps.valid[k]);
            let vg = mul(cx, v, g);
            let vg = cx.g.reduce(ReduceKind::Sum, vg, &[channels]);
            for (a, sum) in sums.iter_mut().enumerate() {
                let d = mul(cx, vg, taps.d[a][k]);
                *sum = add(cx, *sum, d);
            }
        }
        let mut column = s.points();
        column.push(1);
        let parts: Vec<V> = (0..s.dims())
            .map(|a| {
                let scaled = mul(cx, sums[a], taps.m[a]);
                cx.g.reshape(scaled, &column)
            })
            .collect();
        let r = cx.g.concatenate(&parts, channels);
        out[1] = cx.g.convert(r, gt.dtype);
    }
    Ok(out)
}
