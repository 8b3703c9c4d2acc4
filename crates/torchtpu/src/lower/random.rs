//! Random numbers: XLA expands a 64-bit seed drawn from the tpu generator
//! (a runtime input, so new seeds never recompile).
use super::{op, Cx, Entry};
use crate::error::Result;
use crate::ir::dtype::{opmath, DType};
use crate::ir::{Ty, V};

pub static ENTRIES: &[Entry] = &[op("uniform", uniform), op("normal", normal), op("bernoulli", bernoulli)];

/// Uniform floats in [0, 1) of `shape`, from the call's generator.
pub fn uniform01(cx: &mut Cx, shape: &[i64], generator: Option<&str>) -> Result<V> {
    let key = cx.seed(generator)?;
    let bits = cx.g.rng_bits(key, Ty::new(DType::U32, shape));
    // 23 random mantissa bits under exponent 0: a float in [1, 2).
    let nine = cx.g.full(9.0, DType::U32, shape);
    let mant = cx.g.binary("stablehlo.shift_right_logical", bits, nine);
    let one_bits = cx.g.full(f32::to_bits(1.0) as f64, DType::U32, shape);
    let or = cx.g.binary("stablehlo.or", mant, one_bits);
    let f = cx.g.bitcast(or, Ty::new(DType::F32, shape));
    let one = cx.g.full(1.0, DType::F32, shape);
    Ok(cx.g.binary("stablehlo.subtract", f, one))
}

fn uniform(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let ct = opmath(t.dtype);
    let u = uniform01(cx, t.sizes, Some("generator"))?;
    let from = cx.scalar_like("from", ct, t.sizes)?.expect("from");
    let to = cx.scalar_like("to", ct, t.sizes)?.expect("to");
    let span = cx.g.binary("stablehlo.subtract", to, from);
    Ok(vec![affine(cx, u, span, from, t.dtype)])
}

/// `unit * scale + shift` computed in `scale`'s type, rounded to `dtype`.
fn affine(cx: &mut Cx, unit: V, scale: V, shift: V, dtype: DType) -> V {
    let unit = cx.g.convert(unit, cx.g.ty(scale).dtype);
    let r = cx.g.binary("stablehlo.multiply", unit, scale);
    let r = cx.g.binary("stablehlo.add", r, shift);
    cx.g.convert(r, dtype)
}

/// Box-Muller: sqrt(-2 ln(1-u1)) * cos(2 pi u2).
pub fn standard_normal(cx: &mut Cx, shape: &[i64], generator: Option<&str>) -> Result<V> {
    let n: i64 = shape.iter().product();
    let u = uniform01(cx, &[2, n], generator)?;
    let u1 = cx.g.slice(u, &[0, 0], &[1, n], &[1, 1]);
    let u2 = cx.g.slice(u, &[1, 0], &[2, n], &[1, 1]);
    let one = cx.g.full(1.0, DType::F32, &[1, n]);
    let u1 = cx.g.binary("stablehlo.subtract", one, u1);
    let l = cx.g.unary("stablehlo.log", u1);
    let m2 = cx.g.full(-2.0, DType::F32, &[1, n]);
    let r = cx.g.binary("stablehlo.multiply", m2, l);
    let r = cx.g.unary("stablehlo.sqrt", r);
    let tau = cx.g.full(std::f64::consts::TAU, DType::F32, &[1, n]);
    let th = cx.g.binary("stablehlo.multiply", tau, u2);
    let c = cx.g.unary("stablehlo.cosine", th);
    let z = cx.g.binary("stablehlo.multiply", r, c);
    Ok(cx.g.reshape(z, shape))
}

fn normal(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let ct = opmath(t.dtype);
    let z = standard_normal(cx, t.sizes, Some("generator"))?;
    let mean = cx.scalar_like("mean", ct, t.sizes)?.expect("mean");
    let std = cx.scalar_like("std", ct, t.sizes)?.expect("std");
    Ok(vec![affine(cx, z, std, mean, t.dtype)])
}

/// bernoulli_(p: float or tensor) and bernoulli(self) (self holds p).
fn bernoulli(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let u = uniform01(cx, t.sizes, Some("generator"))?;
    let p = if cx.has("p") {
        let o = cx.operand("p")?;
        let p = cx.g.convert(o.v, DType::F32);
        cx.g.broadcast_to(p, t.sizes)
    } else {
        let x = cx.tensor("self")?;
        cx.g.convert(x, DType::F32)
    };
    let hit = cx.g.compare("LT", u, p);
    Ok(vec![cx.g.convert(hit, t.dtype)])
}
