//! Random numbers: XLA expands a 64-bit seed drawn from the tpu generator
//! (a runtime input, so new seeds never recompile).
use super::elementwise::{cpp_name, not_implemented};
use super::reduce::scan;
use super::rules::{float_max, number, streamed};
use super::{op, op_consts, Cx, Entry};
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{Graph, ReduceKind, Ty, V};

pub static ENTRIES: &[Entry] = &[
    op("uniform", uniform).ruled(uniform_rules),
    op("normal", normal).ruled(normal_rules),
    op("bernoulli", bernoulli).ruled(bernoulli_rules),
    op("random", random),
    op_consts("exponential", exponential, &["lambd"]),
    op("cauchy", cauchy).ruled(cauchy_rules),
    op("log_normal", log_normal).ruled(log_normal_rules),
    op("geometric", geometric).ruled(geometric_rules),
    op("randperm", randperm),
    op("multinomial", multinomial),
    op("_standard_gamma", standard_gamma),
    op("_sample_dirichlet", sample_dirichlet),
    op("poisson", poisson),
    op("binomial", binomial),
];

/// Uniform floats in [0, 1) of `shape`, from the call's generator.
pub fn uniform01(cx: &mut Cx, shape: &[i64], generator: Option<&str>) -> Result<V> {
    let key = cx.seed(generator)?;
    Ok(uniform01_of(cx, key, shape))
}

/// The same from the u64[2] `key`: one key always gives the same numbers.
pub fn uniform01_of(cx: &mut Cx, key: V, shape: &[i64]) -> V {
    let bits = cx.g.rng_bits(key, Ty::new(DType::U32, shape));
    // 23 random mantissa bits under exponent 0: a float in [1, 2).
    let nine = cx.g.full(9.0, DType::U32, shape);
    let mant = cx.g.binary("stablehlo.shift_right_logical", bits, nine);
    let one_bits = cx.g.full(f32::to_bits(1.0) as f64, DType::U32, shape);
    let or = cx.g.binary("stablehlo.or", mant, one_bits);
    let f = cx.g.bitcast(or, Ty::new(DType::F32, shape));
    let one = cx.g.full(1.0, DType::F32, shape);
    cx.g.binary("stablehlo.subtract", f, one)
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

/// CPU's `check_uniform_bounds`: a float dtype, and a range it holds.
fn uniform_rules(cx: &Cx) -> Result<()> {
    let dtype = cx.meta("self")?.dtype;
    if !dtype.has_float_values() {
        return Err(not_implemented("check_uniform_bounds", dtype));
    }
    let max = float_max(dtype);
    let (from, to) = (number(cx, "from").unwrap_or(0.0), number(cx, "to").unwrap_or(1.0));
    for (name, x) in [("from", from), ("to", to)] {
        if !(-max..=max).contains(&x) {
            return Err(Error::runtime(format!("{name} is out of bounds for {}", cpp_name(dtype))));
        }
    }
    if from > to {
        return Err(Error::runtime(format!(
            "uniform_ expects to return a [from, to) range, but found from={} > to={}",
            streamed(from),
            streamed(to)
        )));
    }
    if to - from > max {
        return Err(Error::runtime(format!(
            "uniform_ expects to-from <= std::numeric_limits<{}>::max(), but found to={} and from={} which result in to-from to exceed the limit",
            dtype.torch_name(),
            streamed(to),
            streamed(from)
        )));
    }
    Ok(())
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
    let z = box_muller(cx, u, 0);
    Ok(cx.g.reshape(z, shape))
}

/// Standard normals [1, n] from rows `row` and `row + 1` of the uniforms `u` [rows, n].
fn box_muller(cx: &mut Cx, u: V, row: i64) -> V {
    let n = cx.g.ty(u).shape[1];
    let u1 = cx.g.slice(u, &[row, 0], &[row + 1, n], &[1, 1]);
    let u2 = cx.g.slice(u, &[row + 1, 0], &[row + 2, n], &[1, 1]);
    let one = cx.g.full(1.0, DType::F32, &[1, n]);
    let u1 = cx.g.binary("stablehlo.subtract", one, u1);
    let l = cx.g.unary("stablehlo.log", u1);
    let m2 = cx.g.full(-2.0, DType::F32, &[1, n]);
    let r = cx.g.binary("stablehlo.multiply", m2, l);
    let r = cx.g.unary("stablehlo.sqrt", r);
    let tau = cx.g.full(std::f64::consts::TAU, DType::F32, &[1, n]);
    let th = cx.g.binary("stablehlo.multiply", tau, u2);
    let c = cx.g.unary("stablehlo.cosine", th);
    cx.g.binary("stablehlo.multiply", r, c)
}

/// Rejection sampling's bookkeeping: `value` becomes the sample where this
/// try `accept`s and no earlier one did.
fn keep_first(cx: &mut Cx, accept: V, value: V, sample: &mut V, found: &mut V) {
    let first = cx.g.unary("stablehlo.not", *found);
    let take = cx.g.binary("stablehlo.and", accept, first);
    *sample = cx.g.select(take, value, *sample);
    *found = cx.g.binary("stablehlo.or", *found, accept);
}

/// Tries of Marsaglia and Tsang's method: each is accepted with probability
/// above 0.95 (alpha >= 1 after the boost), so a sample runs past all of
/// them with probability below 1e-15.
const GAMMA_TRIES: i64 = 12;

/// Gamma(alpha, 1) samples [1, n] of `alpha` [1, n] (float32) as CPU's
/// `sample_gamma`: alpha below 1 boosted by one and the sample scaled by
/// u^(1/alpha), then Marsaglia and Tsang's acceptance-rejection, its loop
/// unrolled for GAMMA_TRIES tries (the first accepted kept). Alpha 0
/// samples 0; callers clamp as CPU does.
fn gamma_samples(cx: &mut Cx, alpha: V) -> Result<V> {
    let n = cx.g.ty(alpha).shape[1];
    let shape = [1, n];
    let u = uniform01(cx, &[3 * GAMMA_TRIES + 1, n], Some("generator"))?;
    let c = |cx: &mut Cx, v: f64| cx.g.full(v, DType::F32, &shape);
    let (zero, one) = (c(cx, 0.0), c(cx, 1.0));
    let small = cx.g.compare("LT", alpha, one);
    let boost = cx.g.slice(u, &[3 * GAMMA_TRIES, 0], &[3 * GAMMA_TRIES + 1, n], &[1, 1]);
    let boost = cx.g.binary("stablehlo.subtract", one, boost);
    let inverse = cx.g.binary("stablehlo.divide", one, alpha);
    let boosted_scale = cx.g.binary("stablehlo.power", boost, inverse);
    let scale = cx.g.select(small, boosted_scale, one);
    let raised = cx.g.binary("stablehlo.add", alpha, one);
    let a = cx.g.select(small, raised, alpha);
    let third = c(cx, 1.0 / 3.0);
    let d = cx.g.binary("stablehlo.subtract", a, third);
    let nine = c(cx, 9.0);
    let nine_d = cx.g.binary("stablehlo.multiply", nine, d);
    let root = cx.g.unary("stablehlo.sqrt", nine_d);
    let cc = cx.g.binary("stablehlo.divide", one, root);
    let scale_d = cx.g.binary("stablehlo.multiply", scale, d);
    let (mut sample, mut found) = (scale_d, cx.g.compare("NE", zero, zero));
    for k in 0..GAMMA_TRIES {
        let x = box_muller(cx, u, 2 * k);
        let cx_ = cx.g.binary("stablehlo.multiply", cc, x);
        let y = cx.g.binary("stablehlo.add", one, cx_);
        let valid = cx.g.compare("GT", y, zero);
        let yy = cx.g.binary("stablehlo.multiply", y, y);
        let v = cx.g.binary("stablehlo.multiply", yy, y);
        let uk = cx.g.slice(u, &[2 * GAMMA_TRIES + k, 0], &[2 * GAMMA_TRIES + k + 1, n], &[1, 1]);
        let uk = cx.g.binary("stablehlo.subtract", one, uk);
        let xx = cx.g.binary("stablehlo.multiply", x, x);
        // u < 1 - 0.0331 x^4, or log u < x^2/2 + d (1 - v + log v).
        let k4 = c(cx, 0.0331);
        let x4 = cx.g.binary("stablehlo.multiply", xx, xx);
        let t = cx.g.binary("stablehlo.multiply", k4, x4);
        let bound = cx.g.binary("stablehlo.subtract", one, t);
        let squeeze = cx.g.compare("LT", uk, bound);
        let log_u = cx.g.unary("stablehlo.log", uk);
        let half = c(cx, 0.5);
        let hxx = cx.g.binary("stablehlo.multiply", half, xx);
        let log_v = cx.g.unary("stablehlo.log", v);
        let w = cx.g.binary("stablehlo.subtract", one, v);
        let w = cx.g.binary("stablehlo.add", w, log_v);
        let w = cx.g.binary("stablehlo.multiply", d, w);
        let w = cx.g.binary("stablehlo.add", hxx, w);
        let full = cx.g.compare("LT", log_u, w);
        let accept = cx.g.binary("stablehlo.or", squeeze, full);
        let accept = cx.g.binary("stablehlo.and", valid, accept);
        let value = cx.g.binary("stablehlo.multiply", scale_d, v);
        keep_first(cx, accept, value, &mut sample, &mut found);
    }
    let none = cx.g.compare("EQ", alpha, zero);
    Ok(cx.g.select(none, zero, sample))
}

/// `x` in `dtype`, at least the dtype's smallest normal number.
fn at_least_normal(cx: &mut Cx, x: V, dtype: DType) -> V {
    let x = cx.g.convert(x, dtype);
    let floor = match dtype {
        DType::F16 => 6.103515625e-05,
        DType::F64 => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    };
    let floor = cx.g.full(floor, dtype, &cx.g.ty(x).shape.clone());
    cx.g.binary("stablehlo.maximum", x, floor)
}

/// Gamma samples [1, n] of the float tensor `self`'s n shapes (`kernel`:
/// CPU's name in the error for other dtypes).
fn gamma_of_self(cx: &mut Cx, kernel: &str) -> Result<V> {
    let t = cx.meta("self")?;
    if !t.dtype.is_float() {
        return Err(not_implemented(kernel, t.dtype));
    }
    let alpha = cx.tensor("self")?;
    let alpha = cx.g.convert(alpha, DType::F32);
    let alpha = cx.g.reshape(alpha, &[1, t.numel()]);
    gamma_samples(cx, alpha)
}

/// `_standard_gamma(alpha)`: a Gamma(alpha, 1) sample per element (half
/// types as CUDA's, in float32).
fn standard_gamma(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let g = gamma_of_self(cx, "gamma_cpu")?;
    let g = at_least_normal(cx, g, t.dtype);
    Ok(vec![cx.g.reshape(g, t.sizes)])
}

/// Rates below this are sampled by inversion, from CPU's threshold.
const POISSON_SMALL: f64 = 10.0;
/// Terms of the inverted CDF below POISSON_SMALL: a sample past them has
/// probability below 1e-12.
const POISSON_TERMS: i64 = 40;
/// Tries of Hörmann's transformed rejection (PTRS) at POISSON_SMALL and
/// above, unrolled as the gamma sampler's: each accepted with probability
/// above 0.85, all of them rejected below 1e-10.
const POISSON_TRIES: i64 = 12;

/// Hörmann's transformed rejection (PTRS, BTRS) from a uniform u in [0, 1):
/// with U = u - 1/2 and us = 1/2 - |U|, returns us, (2 a / us + b) U (to
/// which a sampler adds its center before the floor) and the hat's
/// a / us² + b (its acceptance bound's denominator).
fn transformed_proposal(g: &mut Graph, u: V, a: V, b: V) -> (V, V, V) {
    let shape = g.ty(u).shape.clone();
    let h = g.full(0.5, DType::F64, &shape);
    let uu = g.binary("stablehlo.subtract", u, h);
    let abs = g.unary("stablehlo.abs", uu);
    let us = g.binary("stablehlo.subtract", h, abs);
    let two = g.full(2.0, DType::F64, &shape);
    let two_a = g.binary("stablehlo.multiply", two, a);
    let slope = g.binary("stablehlo.divide", two_a, us);
    let slope = g.binary("stablehlo.add", slope, b);
    let x = g.binary("stablehlo.multiply", slope, uu);
    let us2 = g.binary("stablehlo.multiply", us, us);
    let hat = g.binary("stablehlo.divide", a, us2);
    let hat = g.binary("stablehlo.add", hat, b);
    (us, x, hat)
}

/// `poisson(rates)`: a Poisson sample per element, in double as CPU's.
/// Rates from 10 on take CPU's method, Hörmann's transformed rejection
/// (1993); smaller ones invert the CDF (CPU multiplies uniforms until their
/// product falls below exp(-rate): the same distribution, one uniform
/// instead of a loop as long as the sample).
fn poisson(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if !t.dtype.is_float() {
        return Err(not_implemented("poisson_cpu", t.dtype));
    }
    let n = t.numel();
    let shape = [1, n];
    let rate = cx.tensor("self")?;
    let rate = cx.g.convert(rate, DType::F64);
    let rate = cx.g.reshape(rate, &shape);
    let c = |cx: &mut Cx, v: f64| cx.g.full(v, DType::F64, &shape);
    let zero = c(cx, 0.0);
    let valid = cx.g.compare("GE", rate, zero);
    let invalid = cx.g.unary("stablehlo.not", valid);
    cx.check_any(invalid, Kind::Runtime, "invalid Poisson rate, expected rate to be non-negative");
    let u = uniform01(cx, &[2 * POISSON_TRIES + 1, n], Some("generator"))?;
    let u = cx.g.convert(u, DType::F64);
    let row = |cx: &mut Cx, r: i64| cx.g.slice(u, &[r, 0], &[r + 1, n], &[1, 1]);

    // Inversion: the count of k whose CDF lies below u.
    let target = row(cx, 2 * POISSON_TRIES);
    let minus = cx.g.unary("stablehlo.negate", rate);
    let p = cx.g.unary("stablehlo.exponential", minus);
    let trips = cx.g.scalar(POISSON_TERMS as f64, DType::I32);
    let small = cx.g.counted_loop(trips, &[p, p, zero, rate, target], |g, k, v| {
        let (p, cdf, count, rate, target) = (v[0], v[1], v[2], v[3], v[4]);
        let below = g.compare("LT", cdf, target);
        let below = g.convert(below, DType::F64);
        let count = g.binary("stablehlo.add", count, below);
        let next = g.convert(k, DType::F64);
        let next = g.broadcast_in_dim(next, &shape, &[]);
        let one = g.full(1.0, DType::F64, &shape);
        let next = g.binary("stablehlo.add", next, one);
        let ratio = g.binary("stablehlo.divide", rate, next);
        let p = g.binary("stablehlo.multiply", p, ratio);
        let cdf = g.binary("stablehlo.add", cdf, p);
        vec![p, cdf, count, rate, target]
    })[2];

    // PTRS, CPU's constants.
    let slam = cx.g.unary("stablehlo.sqrt", rate);
    let loglam = cx.g.unary("stablehlo.log", rate);
    // k x + b, as CPU's constants read.
    let linear = |cx: &mut Cx, x: V, k: f64, b: f64| {
        let (k, b) = (c(cx, k), c(cx, b));
        let x = cx.g.binary("stablehlo.multiply", k, x);
        cx.g.binary("stablehlo.add", x, b)
    };
    let b = linear(cx, slam, 2.53, 0.931);
    let a = linear(cx, b, 0.02483, -0.059);
    let shifted = linear(cx, b, 1.0, -3.4);
    let constant = c(cx, 1.1328);
    let inv = cx.g.binary("stablehlo.divide", constant, shifted);
    let invalpha = linear(cx, inv, 1.0, 1.1239);
    let log_invalpha = cx.g.unary("stablehlo.log", invalpha);
    let shifted = linear(cx, b, 1.0, -2.0);
    let constant = c(cx, 3.6224);
    let inv = cx.g.binary("stablehlo.divide", constant, shifted);
    let constant = c(cx, 0.9277);
    let vr = cx.g.binary("stablehlo.subtract", constant, inv);
    let (mut sample, mut found) = (zero, cx.g.compare("NE", zero, zero));
    for k in 0..POISSON_TRIES {
        let uu = row(cx, 2 * k);
        let v = row(cx, 2 * k + 1);
        let v = linear(cx, v, -1.0, 1.0);
        // k = floor((2 a / us + b) U + rate + 0.43)
        let (us, x, hat) = transformed_proposal(&mut cx.g, uu, a, b);
        let x = cx.g.binary("stablehlo.add", x, rate);
        let x = linear(cx, x, 1.0, 0.43);
        let kk = cx.g.unary("stablehlo.floor", x);
        let constant = c(cx, 0.07);
        let wide = cx.g.compare("GE", us, constant);
        let low_v = cx.g.compare("LE", v, vr);
        let fast = cx.g.binary("stablehlo.and", wide, low_v);
        let negative = cx.g.compare("LT", kk, zero);
        let constant = c(cx, 0.013);
        let narrow = cx.g.compare("LT", us, constant);
        let high_v = cx.g.compare("GT", v, us);
        let squeezed = cx.g.binary("stablehlo.and", narrow, high_v);
        let rejected = cx.g.binary("stablehlo.or", negative, squeezed);
        // log V + log invalpha - log(a / us² + b) <= -rate + k log rate - lgamma(k + 1)
        let log_v = cx.g.unary("stablehlo.log", v);
        let log_q = cx.g.unary("stablehlo.log", hat);
        let left = cx.g.binary("stablehlo.add", log_v, log_invalpha);
        let left = cx.g.binary("stablehlo.subtract", left, log_q);
        let k1 = linear(cx, kk, 1.0, 1.0);
        let lg = cx.g.unary("chlo.lgamma", k1);
        let right = cx.g.binary("stablehlo.multiply", kk, loglam);
        let right = cx.g.binary("stablehlo.subtract", right, rate);
        let right = cx.g.binary("stablehlo.subtract", right, lg);
        let slow = cx.g.compare("LE", left, right);
        let kept = cx.g.unary("stablehlo.not", rejected);
        let slow = cx.g.binary("stablehlo.and", kept, slow);
        let accept = cx.g.binary("stablehlo.or", fast, slow);
        keep_first(cx, accept, kk, &mut sample, &mut found);
    }
    let constant = c(cx, POISSON_SMALL);
    let is_small = cx.g.compare("LT", rate, constant);
    let r = cx.g.select(is_small, small, sample);
    // An infinite rate: CPU's int64 overflow, -2^63.
    let constant = c(cx, f64::INFINITY);
    let infinite = cx.g.compare("EQ", rate, constant);
    let overflow = c(cx, -9.223372036854775808e18);
    let r = cx.g.select(infinite, overflow, r);
    let r = cx.g.convert(r, t.dtype);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// Below this mean (of the smaller of p and 1 - p) CPU inverts; from it on
/// it takes BTRS.
const BINOMIAL_SMALL: f64 = 10.0;
/// Terms of the inverted CDF below BINOMIAL_SMALL: past 40 with a mean under
/// 10 has probability below 1e-12.
const BINOMIAL_TERMS: i64 = 40;
/// Tries of BTRS, in a counted loop: each accepted with probability above
/// 0.7 (0.71 at the smallest mean, from a simulation of CPU's constants),
/// all rejected below 1e-10 (as PTRS).
const BINOMIAL_TRIES: i64 = 19;

/// Stirling's approximation's tail of log k! for k >= 0 (CPU's table
/// below 10, its series above).
fn stirling_tail(g: &mut Graph, k: V) -> V {
    const TABLE: [f64; 10] = [
        0.0810614667953272,
        0.0413406959554092,
        0.0276779256849983,
        0.02079067210376509,
        0.0166446911898211,
        0.0138761288230707,
        0.0118967099458917,
        0.0104112652619720,
        0.00925546218271273,
        0.00833056343336287,
    ];
    let shape = g.ty(k).shape.clone();
    let c = |g: &mut Graph, v: f64| g.full(v, DType::F64, &shape);
    // (1/12 - (1/360 - 1/1260 / (k+1)²) / (k+1)²) / (k+1)
    let one = c(g, 1.0);
    let k1 = g.binary("stablehlo.add", k, one);
    let sq = g.binary("stablehlo.multiply", k1, k1);
    let t = c(g, 1.0 / 1260.0);
    let t = g.binary("stablehlo.divide", t, sq);
    let third = c(g, 1.0 / 360.0);
    let t = g.binary("stablehlo.subtract", third, t);
    let t = g.binary("stablehlo.divide", t, sq);
    let twelfth = c(g, 1.0 / 12.0);
    let t = g.binary("stablehlo.subtract", twelfth, t);
    let series = g.binary("stablehlo.divide", t, k1);
    let (low, high) = (c(g, 0.0), c(g, 9.0));
    let small = g.compare("LE", k, high);
    let at = g.binary("stablehlo.maximum", k, low);
    let at = g.binary("stablehlo.minimum", at, high);
    let at = g.convert(at, DType::I32);
    let table = g.constant(&TABLE, DType::F64);
    let looked_up = g.take(table, at, 0);
    g.select(small, looked_up, series)
}

/// `binomial(count, prob)`: a sample per element, in double as CPU's. With
/// q the smaller of prob and 1 - prob (a sample for 1 - prob counted from
/// `count` down), a mean count q from 10 on takes CPU's BTRS (Hörmann's
/// transformed rejection, its log-ratio bound as CPU writes it); smaller
/// ones invert the CDF (CPU counts geometric draws until they pass
/// `count`: the same distribution, one uniform instead of a loop as long as
/// the sample). `count` <= 0 or `prob` <= 0 give 0, `prob` >= 1 `count`.
fn binomial(cx: &mut Cx) -> Result<Vec<V>> {
    let (t, pt) = (cx.meta("count")?, cx.meta("prob")?);
    if !t.dtype.is_float() {
        return Err(Error::value(format!(
            "binomial only supports floating-point dtypes for count, got: {}",
            t.dtype.torch_name()
        )));
    }
    if pt.sizes != t.sizes {
        return Err(Error::fallback("binomial of a broadcast prob"));
    }
    let n = t.numel();
    let shape = [1, n];
    let read = |cx: &mut Cx, name: &str| -> Result<V> {
        let v = cx.tensor(name)?;
        let v = cx.g.convert(v, DType::F64);
        Ok(cx.g.reshape(v, &shape))
    };
    let (count, prob) = (read(cx, "count")?, read(cx, "prob")?);
    let c = |cx: &mut Cx, v: f64| cx.g.full(v, DType::F64, &shape);
    let (zero, half, one) = (c(cx, 0.0), c(cx, 0.5), c(cx, 1.0));
    let upper = cx.g.compare("GT", prob, half);
    let complement = cx.g.binary("stablehlo.subtract", one, prob);
    let q = cx.g.select(upper, complement, prob);
    let u = uniform01(cx, &[2 * BINOMIAL_TRIES + 1, n], Some("generator"))?;
    let u = cx.g.convert(u, DType::F64);

    // Inversion: the count of k whose CDF lies below u; P(0) = (1 - q)^count.
    let target = cx.g.slice(u, &[2 * BINOMIAL_TRIES, 0], &[2 * BINOMIAL_TRIES + 1, n], &[1, 1]);
    let minus_q = cx.g.unary("stablehlo.negate", q);
    let log_q0 = cx.g.unary("stablehlo.log_plus_one", minus_q);
    let log_p0 = cx.g.binary("stablehlo.multiply", count, log_q0);
    let p0 = cx.g.unary("stablehlo.exponential", log_p0);
    let rest = cx.g.binary("stablehlo.subtract", one, q);
    let odds = cx.g.binary("stablehlo.divide", q, rest);
    let trips = cx.g.scalar(BINOMIAL_TERMS as f64, DType::I32);
    let small = cx.g.counted_loop(trips, &[p0, p0, zero, count, odds, target], |g, k, v| {
        let (p, cdf, sample, count, odds, target) = (v[0], v[1], v[2], v[3], v[4], v[5]);
        let below = g.compare("LT", cdf, target);
        let below = g.convert(below, DType::F64);
        let sample = g.binary("stablehlo.add", sample, below);
        // P(k+1) = P(k) (count - k) / (k + 1) odds
        let k = g.convert(k, DType::F64);
        let k = g.broadcast_in_dim(k, &shape, &[]);
        let one = g.full(1.0, DType::F64, &shape);
        let next = g.binary("stablehlo.add", k, one);
        let left = g.binary("stablehlo.subtract", count, k);
        let ratio = g.binary("stablehlo.divide", left, next);
        let ratio = g.binary("stablehlo.multiply", ratio, odds);
        let p = g.binary("stablehlo.multiply", p, ratio);
        let cdf = g.binary("stablehlo.add", cdf, p);
        vec![p, cdf, sample, count, odds, target]
    })[2];

    // BTRS, CPU's constants.
    let linear = |cx: &mut Cx, x: V, k: f64, b: f64| {
        let (k, b) = (c(cx, k), c(cx, b));
        let x = cx.g.binary("stablehlo.multiply", k, x);
        cx.g.binary("stablehlo.add", x, b)
    };
    let mean = cx.g.binary("stablehlo.multiply", count, q);
    let variance = cx.g.binary("stablehlo.multiply", mean, rest);
    let stddev = cx.g.unary("stablehlo.sqrt", variance);
    let b = linear(cx, stddev, 2.53, 1.15);
    let a = linear(cx, b, 0.0248, -0.0873);
    let q100 = linear(cx, q, 0.01, 0.0);
    let a = cx.g.binary("stablehlo.add", a, q100);
    let center = linear(cx, mean, 1.0, 0.5);
    let inv_b = cx.g.binary("stablehlo.divide", one, b);
    let v_r = linear(cx, inv_b, -4.2, 0.92);
    let alpha = linear(cx, inv_b, 5.1, 2.83);
    let alpha = cx.g.binary("stablehlo.multiply", alpha, stddev);
    let count1 = linear(cx, count, 1.0, 1.0);
    let m = cx.g.binary("stablehlo.multiply", count1, q);
    let m = cx.g.unary("stablehlo.floor", m);
    // The bound's terms that do not depend on the try's k.
    let m1 = linear(cx, m, 1.0, 1.0);
    let left = cx.g.binary("stablehlo.subtract", count1, m);
    let r_left = cx.g.binary("stablehlo.multiply", odds, left);
    let ratio = cx.g.binary("stablehlo.divide", m1, r_left);
    let log_ratio = cx.g.unary("stablehlo.log", ratio);
    let mh = linear(cx, m, 1.0, 0.5);
    let fixed = cx.g.binary("stablehlo.multiply", mh, log_ratio);
    let tail_m = stirling_tail(&mut cx.g, m);
    let count_m = cx.g.binary("stablehlo.subtract", count, m);
    let tail_count_m = stirling_tail(&mut cx.g, count_m);
    let fixed = cx.g.binary("stablehlo.add", fixed, tail_m);
    let fixed = cx.g.binary("stablehlo.add", fixed, tail_count_m);
    let trips = cx.g.scalar(BINOMIAL_TRIES as f64, DType::I32);
    let no = cx.g.compare("NE", zero, zero);
    let init = [zero, no, u, count, odds, a, b, center, v_r, alpha, fixed, left];
    let large = cx.g.counted_loop(trips, &init, |g, k, v| {
        let (sample, found, u, count, odds, a, b, center, v_r, alpha, fixed, left) =
            (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]);
        let c = |g: &mut Graph, x: f64| g.full(x, DType::F64, &shape);
        let two = g.scalar(2.0, DType::I32);
        let row = g.binary("stablehlo.multiply", k, two);
        let zero_i = g.scalar(0.0, DType::I32);
        let pair = g.dynamic_slice(u, &[row, zero_i], &[2, n]);
        let uu = g.slice(pair, &[0, 0], &[1, n], &[1, 1]);
        let v = g.slice(pair, &[1, 0], &[2, n], &[1, 1]);
        // k = floor((2 a / us + b) U + c)
        let (us, x, hat) = transformed_proposal(g, uu, a, b);
        let x = g.binary("stablehlo.add", x, center);
        let kk = g.unary("stablehlo.floor", x);
        let zero = c(g, 0.0);
        let negative = g.compare("LT", kk, zero);
        let over = g.compare("GT", kk, count);
        let rejected = g.binary("stablehlo.or", negative, over);
        let kept = g.unary("stablehlo.not", rejected);
        let wide = c(g, 0.07);
        let wide = g.compare("GE", us, wide);
        let low_v = g.compare("LE", v, v_r);
        let fast = g.binary("stablehlo.and", wide, low_v);
        // log(V alpha / (a / us² + b)) <= fixed + (count + 1) log((count - m + 1) / (count - k + 1))
        //   + (k + 1/2) log(r (count - k + 1) / (k + 1)) - tail(k) - tail(count - k)
        let va = g.binary("stablehlo.multiply", v, alpha);
        let lhs = g.binary("stablehlo.divide", va, hat);
        let lhs = g.unary("stablehlo.log", lhs);
        let one = c(g, 1.0);
        let count1 = g.binary("stablehlo.add", count, one);
        let count_k = g.binary("stablehlo.subtract", count, kk);
        let count_k1 = g.binary("stablehlo.add", count_k, one);
        let t = g.binary("stablehlo.divide", left, count_k1);
        let t = g.unary("stablehlo.log", t);
        let t = g.binary("stablehlo.multiply", count1, t);
        let rhs = g.binary("stablehlo.add", fixed, t);
        let k1 = g.binary("stablehlo.add", kk, one);
        let t = g.binary("stablehlo.multiply", odds, count_k1);
        let t = g.binary("stablehlo.divide", t, k1);
        let t = g.unary("stablehlo.log", t);
        let h = c(g, 0.5);
        let kh = g.binary("stablehlo.add", kk, h);
        let t = g.binary("stablehlo.multiply", kh, t);
        let rhs = g.binary("stablehlo.add", rhs, t);
        let tail_k = stirling_tail(g, kk);
        let tail_count_k = stirling_tail(g, count_k);
        let rhs = g.binary("stablehlo.subtract", rhs, tail_k);
        let rhs = g.binary("stablehlo.subtract", rhs, tail_count_k);
        let slow = g.compare("LE", lhs, rhs);
        let accept = g.binary("stablehlo.or", fast, slow);
        let accept = g.binary("stablehlo.and", kept, accept);
        let first = g.unary("stablehlo.not", found);
        let take = g.binary("stablehlo.and", accept, first);
        let sample = g.select(take, kk, sample);
        let found = g.binary("stablehlo.or", found, accept);
        vec![sample, found, u, count, odds, a, b, center, v_r, alpha, fixed, left]
    })[0];

    let threshold = c(cx, BINOMIAL_SMALL);
    let is_small = cx.g.compare("LT", mean, threshold);
    let r = cx.g.select(is_small, small, large);
    let mirrored = cx.g.binary("stablehlo.subtract", count, r);
    let r = cx.g.select(upper, mirrored, r);
    // CPU's edges: no trials or no chance, certainty, a NaN chance, and an
    // infinite count (BTRS's first try gives CPU inf, or inf - inf counted
    // down; a NaN count never ends CPU's loop).
    let none = cx.g.compare("LE", count, zero);
    let never = cx.g.compare("LE", prob, zero);
    let none = cx.g.binary("stablehlo.or", none, never);
    let always = cx.g.compare("GE", prob, one);
    let nan = c(cx, f64::NAN);
    let magnitude = cx.g.unary("stablehlo.abs", count);
    let infinity = c(cx, f64::INFINITY);
    let finite = cx.g.compare("LT", magnitude, infinity);
    let unbounded = cx.g.select(upper, nan, count);
    let r = cx.g.select(finite, r, unbounded);
    let chance = cx.g.compare("EQ", prob, prob);
    let r = cx.g.select(chance, r, nan);
    let r = cx.g.select(always, count, r);
    let r = cx.g.select(none, zero, r);
    let r = cx.g.convert(r, t.dtype);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// `_sample_dirichlet(alpha)`: Gamma samples normalised over the last
/// dimension, in float64 and clamped to [smallest normal, 1) as CPU's.
fn sample_dirichlet(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    // CPU samples these in double, clamped at double's smallest normal.
    let g = gamma_of_self(cx, "dirichlet")?;
    let g = at_least_normal(cx, g, DType::F64);
    let rows = super::index::as_vector(&t);
    let g = cx.g.reshape(g, &rows);
    let last = rows.len() - 1;
    let sum = cx.g.reduce(ReduceKind::Sum, g, &[last]);
    let dims: Vec<i64> = (0..last as i64).collect();
    let sum = cx.g.broadcast_in_dim(sum, &rows, &dims);
    let r = cx.g.binary("stablehlo.divide", g, sum);
    let low = cx.g.full(f64::MIN_POSITIVE, DType::F64, &rows);
    let high = cx.g.full(1.0 - f64::EPSILON / 2.0, DType::F64, &rows);
    let r = cx.g.binary("stablehlo.maximum", r, low);
    let r = cx.g.binary("stablehlo.minimum", r, high);
    let r = cx.g.convert(r, t.dtype);
    Ok(vec![cx.g.reshape(r, t.sizes)])
}

/// A float dtype and a non-negative number `std` (a tensor's elements are
/// checked on the device).
fn normal_rules(cx: &Cx) -> Result<()> {
    let tensor = ["self", "mean", "std"].into_iter().find_map(|n| cx.meta(n).ok());
    if let Some(t) = tensor.filter(|t| !t.dtype.has_float_values()) {
        return Err(not_implemented("normal_kernel_cpu", t.dtype));
    }
    if cx.meta("std").is_ok_and(|t| t.dtype.is_complex()) {
        return Err(Error::runtime("normal expects standard deviation to be non-complex"));
    }
    match number(cx, "std") {
        Some(std) if !(std >= 0.0) => {
            Err(Error::runtime(format!("normal expects std >= 0.0, but found std {}", streamed(std))))
        }
        _ => Ok(()),
    }
}

/// `normal_(mean, std)` fills self; `normal(mean, std)` with a tensor mean
/// or std samples at their broadcast shape, in the tensor's dtype (mean's
/// where both are tensors).
fn normal(cx: &mut Cx) -> Result<Vec<V>> {
    if let Ok(t) = cx.meta("self") {
        let ct = opmath(t.dtype);
        let z = standard_normal(cx, t.sizes, Some("generator"))?;
        let mean = cx.scalar_like("mean", ct, t.sizes)?.expect("mean");
        let std = cx.scalar_like("std", ct, t.sizes)?.expect("std");
        return Ok(vec![affine(cx, z, std, mean, t.dtype)]);
    }
    let dtype = match cx.meta("mean") {
        Ok(t) => t.dtype,
        Err(_) => cx.meta("std")?.dtype,
    };
    let (mean, std) = (cx.operand("mean")?, cx.operand("std")?);
    let shapes = [cx.g.ty(mean.v).shape.clone(), cx.g.ty(std.v).shape.clone()];
    let shape = crate::ir::broadcast_all(&[&shapes[0], &shapes[1]])?;
    if cx.meta("std").is_ok() {
        let zero = cx.g.full(0.0, std.dtype, &shapes[1]);
        let ok = cx.g.compare("GE", std.v, zero);
        let bad = cx.g.unary("stablehlo.not", ok);
        cx.check_any(bad, Kind::Runtime, "normal expects all elements of std >= 0.0");
    }
    let ct = opmath(dtype);
    let z = standard_normal(cx, &shape, Some("generator"))?;
    let [mean, std] = [mean.v, std.v].map(|v| {
        let v = cx.g.convert(v, ct);
        cx.g.broadcast_to(v, &shape)
    });
    Ok(vec![affine(cx, z, std, mean, dtype)])
}

/// A probability `p` in [0, 1] (a tensor's elements are checked on the device).
fn bernoulli_rules(cx: &Cx) -> Result<()> {
    match number(cx, "p") {
        Some(p) if !(0.0..=1.0).contains(&p) => {
            Err(Error::runtime(format!("bernoulli_ expects p to be in [0, 1], but got p={}", streamed(p))))
        }
        _ => Ok(()),
    }
}

/// bernoulli_(p: float or tensor) and bernoulli(self) (self holds p).
fn bernoulli(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let u = uniform01(cx, t.sizes, Some("generator"))?;
    let p_tensor =
        if cx.has("p") { cx.meta("p").ok().map(|_| cx.tensor("p")).transpose()? } else { Some(cx.tensor("self")?) };
    if let Some(p) = p_tensor {
        cx.check_unit_interval(
            p,
            "Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message be improved?  If so, please report an enhancement request to PyTorch.)",
        );
    }
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

/// `random_()`, `random_(to)`, `random_(from, to)` (`torch.randint`): integers
/// uniform in [from, to), by default every value of an integer dtype or every
/// integer a float dtype holds exactly ([0, 2^digits]); CPU's checks. Each
/// element takes 32 random bits modulo the range (64 where it is wider), as
/// CPU's `uniform_int_from_to_distribution`.
fn random(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let from = if cx.has("from") { cx.int("from")? } else { 0 } as i128;
    let to = if cx.has("to") { cx.opt_int("to")? } else { None };
    let (min, max) = bounds(t.dtype);
    let to = match to {
        Some(to) => {
            let to = to as i128;
            if from >= to {
                return Err(Error::runtime(format!(
                    "random_ expects 'from' to be less than 'to', but got from={from} >= to={to}"
                )));
            }
            to
        }
        None => max + 1,
    };
    if t.dtype.is_int() || t.dtype == DType::Bool {
        let name = c_type_name(t.dtype);
        if from < min || from > max {
            return Err(Error::runtime(format!("from is out of bounds for {name}")));
        }
        if to - 1 < min || to - 1 > max {
            return Err(Error::runtime(format!("to - 1 is out of bounds for {name}")));
        }
    }
    let range = (to - from) as u128;
    let key = cx.seed(Some("generator"))?;
    let bits = if range > u32::MAX as u128 {
        cx.g.rng_bits(key, Ty::new(DType::U64, t.sizes))
    } else {
        let bits = cx.g.rng_bits(key, Ty::new(DType::U32, t.sizes));
        cx.g.convert(bits, DType::U64)
    };
    // A range of all 2^64 values is the bits themselves.
    let offset = if range > u64::MAX as u128 {
        bits
    } else {
        let r = u64_full(cx, range as u64, t.sizes);
        cx.g.binary("stablehlo.remainder", bits, r)
    };
    // from + offset in two's complement, wrapping as the signed sum does not.
    let base = u64_full(cx, from as i64 as u64, t.sizes);
    let value = cx.g.binary("stablehlo.add", offset, base);
    let value = cx.g.bitcast(value, Ty::new(DType::I64, t.sizes));
    Ok(vec![cx.g.convert(value, t.dtype)])
}

/// A 64-bit integer constant of `shape`, exact (a float holds 53 bits).
fn u64_full(cx: &mut Cx, value: u64, shape: &[i64]) -> V {
    let high = cx.g.full((value >> 32) as f64, DType::U64, shape);
    let low = cx.g.full((value & 0xffff_ffff) as f64, DType::U64, shape);
    let shift = cx.g.full(32.0, DType::U64, shape);
    let high = cx.g.binary("stablehlo.shift_left", high, shift);
    cx.g.binary("stablehlo.or", high, low)
}

/// The smallest and largest integer `dtype` holds (floats: exactly).
fn bounds(dtype: DType) -> (i128, i128) {
    let digits = match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F32 => 24,
        _ => 53,
    };
    dtype.int_range().unwrap_or((-(1 << digits), 1 << digits))
}

/// The C++ name CPU's messages give an integer dtype.
fn c_type_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "bool",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        _ => "long",
    }
}

/// `exponential_(lambd)`: -log(1 - u) / lambd.
fn exponential(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let lambd = cx.const_f64("lambd")?;
    if !(lambd > 0.0) {
        return Err(Error::runtime(format!("exponential_ expects lambda > 0.0, but found lambda={lambd}")));
    }
    let e = standard_exponential(cx, t.sizes, Some("generator"))?;
    let scale = cx.g.full(1.0 / lambd, DType::F32, t.sizes);
    let e = cx.g.binary("stablehlo.multiply", e, scale);
    Ok(vec![cx.g.convert(e, t.dtype)])
}

/// Exp(1) samples of `shape`: -log(1 - u), finite since u < 1.
fn standard_exponential(cx: &mut Cx, shape: &[i64], generator: Option<&str>) -> Result<V> {
    let u = uniform01(cx, shape, generator)?;
    let minus_u = cx.g.unary("stablehlo.negate", u);
    let l = cx.g.unary("stablehlo.log_plus_one", minus_u);
    Ok(cx.g.unary("stablehlo.negate", l))
}

/// CPU's first check of sampler `what`: a positive `name` (`default` if absent).
fn positive(cx: &Cx, what: &str, name: &str, default: f64) -> Result<()> {
    let x = number(cx, name).unwrap_or(default);
    if !(x > 0.0) {
        return Err(Error::runtime(format!("{what} expects {name} > 0.0, but found {name}={}", streamed(x))));
    }
    Ok(())
}

/// CPU's `cauchy_` checks: a positive sigma, then a float dtype.
fn cauchy_rules(cx: &Cx) -> Result<()> {
    positive(cx, "cauchy_", "sigma", 1.0)?;
    let dtype = cx.meta("self")?.dtype;
    if !dtype.is_float() {
        return Err(Error::runtime(format!(
            "Cauchy distribution is a continuous probability distribution. dtype must be a floating point but you specified {}",
            cpp_name(dtype)
        )));
    }
    Ok(())
}

/// `cauchy_(median, sigma)`: median + sigma tan(π (u - 1/2)), as CPU's.
fn cauchy(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let u = uniform01(cx, t.sizes, Some("generator"))?;
    let half = cx.g.full(0.5, DType::F32, t.sizes);
    let centered = cx.g.binary("stablehlo.subtract", u, half);
    let pi = cx.g.full(std::f64::consts::PI, DType::F32, t.sizes);
    let angle = cx.g.binary("stablehlo.multiply", pi, centered);
    let x = cx.g.unary("stablehlo.tan", angle);
    let ct = opmath(t.dtype);
    let median = cx.scalar_like("median", ct, t.sizes)?.expect("median");
    let sigma = cx.scalar_like("sigma", ct, t.sizes)?.expect("sigma");
    Ok(vec![affine(cx, x, sigma, median, t.dtype)])
}

/// CPU's `log_normal_` checks: a positive std, then a float dtype.
fn log_normal_rules(cx: &Cx) -> Result<()> {
    positive(cx, "log_normal_", "std", 2.0)?;
    let dtype = cx.meta("self")?.dtype;
    if !dtype.is_float() {
        return Err(not_implemented("log_normal_cpu", dtype));
    }
    Ok(())
}

/// `log_normal_(mean, std)`: exp(mean + std z).
fn log_normal(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let ct = opmath(t.dtype);
    let z = standard_normal(cx, t.sizes, Some("generator"))?;
    let mean = cx.scalar_like("mean", ct, t.sizes)?.expect("mean");
    let std = cx.scalar_like("std", ct, t.sizes)?.expect("std");
    let x = affine(cx, z, std, mean, ct);
    let x = cx.g.unary("stablehlo.exponential", x);
    Ok(vec![cx.g.convert(x, t.dtype)])
}

/// CPU's `geometric_` checks: p in (0, 1), then a real dtype but bool.
fn geometric_rules(cx: &Cx) -> Result<()> {
    let p = number(cx, "p").unwrap_or(f64::NAN);
    if !(p > 0.0 && p < 1.0) {
        return Err(Error::runtime(format!("geometric_ expects p to be in (0, 1), but got p={}", streamed(p))));
    }
    let dtype = cx.meta("self")?.dtype;
    if dtype == DType::Bool || dtype.is_complex() {
        return Err(not_implemented("geometric_cpu", dtype));
    }
    Ok(())
}

/// `geometric_(p)`: the number of Bernoulli(p) trials up to the first
/// success, ceil(log(v) / log(1 - p)) for v uniform in (0, 1] (at least 1:
/// v = 1 has probability 2^-23).
fn geometric(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let ct = if t.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let u = uniform01(cx, t.sizes, Some("generator"))?;
    let u = cx.g.convert(u, ct);
    let one = cx.g.full(1.0, ct, t.sizes);
    let v = cx.g.binary("stablehlo.subtract", one, u);
    let log_v = cx.g.unary("stablehlo.log", v);
    let p = cx.scalar_like("p", ct, t.sizes)?.expect("p");
    let minus_p = cx.g.unary("stablehlo.negate", p);
    let log_q = cx.g.unary("stablehlo.log_plus_one", minus_p);
    let trials = cx.g.binary("stablehlo.divide", log_v, log_q);
    let trials = cx.g.unary("stablehlo.ceil", trials);
    let trials = cx.g.binary("stablehlo.maximum", trials, one);
    Ok(vec![cx.g.convert(trials, t.dtype)])
}

/// `randperm(n)` into `out`: 0..n ordered by 64 random bits each.
fn randperm(cx: &mut Cx) -> Result<Vec<V>> {
    let n = cx.int("n")?;
    if n < 0 {
        return Err(Error::runtime(format!("n must be non-negative, got{n}")));
    }
    let dtype = cx.meta("out")?.dtype;
    let key = cx.seed(Some("generator"))?;
    let keys = cx.g.rng_bits(key, Ty::new(DType::U64, &[n]));
    let order = cx.g.iota(DType::I64, &[n], 0);
    let sorted = cx.g.sort(&[keys, order], 0, false, 1);
    Ok(vec![cx.g.convert(sorted[1], dtype)])
}

/// `multinomial`: CPU's checks; without replacement (or one sample) the
/// largest of p / Exp(1) draws, as CPU samples them; with replacement, the
/// first category whose running sum exceeds a uniform draw of the total.
fn multinomial(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let samples = cx.int("num_samples")?;
    let replacement = cx.bool("replacement")?;
    if !(1..=2).contains(&t.sizes.len()) {
        return Err(Error::runtime("prob_dist must be 1 or 2 dim"));
    }
    let n = *t.sizes.last().unwrap();
    if samples <= 0 {
        return Err(Error::runtime("cannot sample n_sample <= 0 samples"));
    }
    if !replacement && samples > n {
        return Err(Error::runtime("cannot sample n_sample > prob_dist.size(-1) samples without replacement"));
    }
    let rows = if t.sizes.len() == 2 { t.sizes[0] } else { 1 };
    let p = cx.tensor("self")?;
    let p = cx.g.convert(p, DType::F32);
    let p = cx.g.reshape(p, &[rows, n]);
    let magnitude = cx.g.unary("stablehlo.abs", p);
    let inf = cx.g.full(f64::INFINITY, DType::F32, &[rows, n]);
    let finite = cx.g.compare("LT", magnitude, inf);
    let zero = cx.g.full(0.0, DType::F32, &[rows, n]);
    let nonnegative = cx.g.compare("GE", p, zero);
    let fine = cx.g.binary("stablehlo.and", finite, nonnegative);
    let all_fine = cx.g.reduce(ReduceKind::And, fine, &[0, 1]);
    let bad = cx.g.unary("stablehlo.not", all_fine);
    cx.check(bad, None, Kind::Runtime, "probability tensor contains either `inf`, `nan` or element < 0");
    let totals = cx.g.reduce(ReduceKind::Sum, p, &[1]);
    let zero_rows = cx.g.full(0.0, DType::F32, &[rows]);
    let empty = cx.g.compare("LE", totals, zero_rows);
    let any_empty = cx.g.reduce(ReduceKind::Or, empty, &[0]);
    cx.check(any_empty, None, Kind::Runtime, "invalid multinomial distribution (sum of probabilities <= 0)");
    let picked = if !replacement || samples == 1 {
        let e = standard_exponential(cx, &[rows, n], Some("generator"))?;
        let score = cx.g.binary("stablehlo.divide", p, e);
        let order = cx.g.iota(DType::I64, &[rows, n], 1);
        let sorted = cx.g.sort(&[score, order], 1, true, 1);
        cx.g.slice(sorted[1], &[0, 0], &[rows, samples], &[1, 1])
    } else {
        let cdf = scan(cx, &[p], 1, &[ReduceKind::Sum], |cx, earlier, later| {
            vec![cx.g.binary("stablehlo.add", later[0], earlier[0])]
        })[0];
        let u = uniform01(cx, &[rows, samples], Some("generator"))?;
        let totals = cx.g.broadcast_in_dim(totals, &[rows, samples], &[0]);
        let u = cx.g.binary("stablehlo.multiply", u, totals);
        // The categories whose running sum is at most the draw come before it.
        let shape = [rows, samples, n];
        let cdf = cx.g.broadcast_in_dim(cdf, &shape, &[0, 2]);
        let u = cx.g.broadcast_in_dim(u, &shape, &[0, 1]);
        let below = cx.g.compare("LE", cdf, u);
        let below = cx.g.convert(below, DType::I64);
        let index = cx.g.reduce(ReduceKind::Sum, below, &[2]);
        let last = cx.g.full((n - 1) as f64, DType::I64, &[rows, samples]);
        cx.g.binary("stablehlo.minimum", index, last)
    };
    let out = if t.sizes.len() == 2 { vec![rows, samples] } else { vec![samples] };
    Ok(vec![cx.g.reshape(picked, &out)])
}
