//! Pathwise (reparameterized) gradients of random samples: what
//! `Gamma.rsample()`'s backward needs, `_standard_gamma_grad`, the derivative
//! of a Gamma(alpha) sample x with respect to alpha, -(∂F/∂alpha)(x; alpha) /
//! f(x; alpha), as CPU's `standard_gamma_grad_one` approximates it: a Taylor
//! series of the CDF for x below 0.8, Rice's saddle-point expansion for
//! alpha above 8, else a bivariate rational fit in log(x / alpha) and
//! log(alpha). Every branch is computed and one selected per element, in
//! double as CPU's kernel accumulates (float for float16/bfloat16, which CPU
//! refuses and CUDA takes).
use super::elementwise::{digamma_of, not_implemented};
use super::{op, Cx, Entry};
use crate::error::Result;
use crate::ir::dtype::DType;
use crate::ir::{broadcast_all, Graph, V};

pub static ENTRIES: &[Entry] = &[op("_standard_gamma_grad", standard_gamma_grad)];

/// The rational fit's coefficients: rows of u⁰, u¹, u²; p's four powers of
/// v, then q's.
const COEF_UV: [[f64; 8]; 3] = [
    [0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1.0, 0.32668115, 0.10406089, 0.0014179084],
    [0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623],
    [
        0.040121004,
        -0.0065914022,
        -0.0026286047,
        -0.0013441777,
        0.017050642,
        -0.0021309326,
        0.00085092367,
        -1.5247877e-07,
    ],
];

fn standard_gamma_grad(cx: &mut Cx) -> Result<Vec<V>> {
    let (ta, tx) = (cx.meta("self")?, cx.meta("output")?);
    if !ta.dtype.is_float() {
        return Err(not_implemented("_standard_gamma_grad_cpu", ta.dtype));
    }
    let shape = broadcast_all(&[ta.sizes, tx.sizes])?;
    let acc = if matches!(ta.dtype, DType::F16 | DType::BF16) { DType::F32 } else { DType::F64 };
    let (alpha, x) = (cx.tensor("self")?, cx.tensor("output")?);
    let [alpha, x] = [alpha, x].map(|v| {
        let v = cx.g.convert(v, acc);
        cx.g.broadcast_to(v, &shape)
    });
    let digamma = digamma_of(cx, alpha);
    let mut e = Expr { g: &mut cx.g, shape, dtype: acc };
    let small_x = e.taylor(alpha, x, digamma);
    let large_alpha = e.saddle_point(alpha, x);
    let otherwise = e.rational(alpha, x);
    let below = e.k(0.8);
    let below = e.g.compare("LT", x, below);
    let eight = e.k(8.0);
    let large = e.g.compare("GT", alpha, eight);
    let r = e.g.select(large, large_alpha, otherwise);
    let r = e.g.select(below, small_x, r);
    Ok(vec![cx.g.convert(r, ta.dtype)])
}

/// Elementwise arithmetic on values of one shape and dtype, constants
/// splat to it: the formulas read as CPU's.
struct Expr<'g> {
    g: &'g mut Graph,
    shape: Vec<i64>,
    dtype: DType,
}

impl Expr<'_> {
    fn k(&mut self, value: f64) -> V {
        self.g.full(value, self.dtype, &self.shape)
    }
    fn op(&mut self, name: &'static str, a: V, b: V) -> V {
        self.g.binary(name, a, b)
    }
    fn add(&mut self, a: V, b: V) -> V {
        self.op("stablehlo.add", a, b)
    }
    fn sub(&mut self, a: V, b: V) -> V {
        self.op("stablehlo.subtract", a, b)
    }
    fn mul(&mut self, a: V, b: V) -> V {
        self.op("stablehlo.multiply", a, b)
    }
    fn div(&mut self, a: V, b: V) -> V {
        self.op("stablehlo.divide", a, b)
    }
    fn pow(&mut self, a: V, b: V) -> V {
        self.op("stablehlo.power", a, b)
    }
    fn log(&mut self, a: V) -> V {
        self.g.unary("stablehlo.log", a)
    }
    /// `a * value`.
    fn times(&mut self, a: V, value: f64) -> V {
        let k = self.k(value);
        self.mul(a, k)
    }
    /// `a + value`.
    fn plus(&mut self, a: V, value: f64) -> V {
        let k = self.k(value);
        self.add(a, k)
    }
    /// `value / a`.
    fn over(&mut self, value: f64, a: V) -> V {
        let k = self.k(value);
        self.div(k, a)
    }

    /// x < 0.8: the CPU's five-term series of the regularized incomplete
    /// gamma function and its alpha derivative; NaN gives 0.
    fn taylor(&mut self, alpha: V, x: V, digamma: V) -> V {
        let mut numer = self.k(1.0);
        let mut denom = alpha;
        let mut series1 = self.over(1.0, denom);
        let squared = self.mul(denom, denom);
        let mut series2 = self.over(1.0, squared);
        let minus_x = self.g.unary("stablehlo.negate", x);
        for i in 1..=5 {
            let step = self.times(minus_x, 1.0 / i as f64);
            numer = self.mul(numer, step);
            denom = self.plus(denom, 1.0);
            let term = self.div(numer, denom);
            series1 = self.add(series1, term);
            let term = self.div(term, denom);
            series2 = self.add(series2, term);
        }
        let pow_x_alpha = self.pow(x, alpha);
        let alpha_less_one = self.plus(alpha, -1.0);
        let pdf = self.pow(x, alpha_less_one);
        let decay = self.g.unary("stablehlo.exponential", minus_x);
        let pdf = self.mul(pdf, decay);
        let cdf = self.mul(pow_x_alpha, series1);
        let log_x = self.log(x);
        let factor = self.sub(log_x, digamma);
        let cdf_alpha = self.mul(factor, cdf);
        let correction = self.mul(pow_x_alpha, series2);
        let cdf_alpha = self.sub(cdf_alpha, correction);
        let r = self.div(cdf_alpha, pdf);
        let r = self.g.unary("stablehlo.negate", r);
        let is_number = self.g.compare("EQ", r, r);
        let zero = self.k(0.0);
        self.g.select(is_number, r, zero)
    }

    /// alpha > 8: Rice's saddle-point expansion; a polynomial within 10% of
    /// alpha, where the expansion's terms cancel.
    fn saddle_point(&mut self, alpha: V, x: V) -> V {
        let a2 = self.mul(alpha, alpha);
        // (1 + 24 α (1 + 12 α)) (1440 α² + 6 x (53 - 120 x) - 65 x² / α + α (107 + 3600 x)) / (1244160 α⁴)
        let inner = self.times(alpha, 12.0);
        let inner = self.plus(inner, 1.0);
        let inner = self.mul(alpha, inner);
        let inner = self.times(inner, 24.0);
        let numer_1 = self.plus(inner, 1.0);
        let t1 = self.times(a2, 1440.0);
        let x120 = self.times(x, -120.0);
        let t2 = self.plus(x120, 53.0);
        let t2 = self.mul(x, t2);
        let t2 = self.times(t2, 6.0);
        let x2 = self.mul(x, x);
        let t3 = self.div(x2, alpha);
        let t3 = self.times(t3, -65.0);
        let t4 = self.times(x, 3600.0);
        let t4 = self.plus(t4, 107.0);
        let t4 = self.mul(alpha, t4);
        let numer_2 = self.add(t1, t2);
        let numer_2 = self.add(numer_2, t3);
        let numer_2 = self.add(numer_2, t4);
        let a4 = self.mul(a2, a2);
        let denom = self.times(a4, 1244160.0);
        let near = self.mul(numer_1, numer_2);
        let near = self.div(near, denom);

        let eight_alpha = self.times(alpha, 8.0);
        let denom = self.g.unary("stablehlo.sqrt", eight_alpha);
        let gap = self.sub(alpha, x);
        let term2 = self.div(denom, gap);
        let ratio = self.div(x, alpha);
        let log_ratio = self.log(ratio);
        let base = self.sub(x, alpha);
        let scaled = self.mul(alpha, log_ratio);
        let base = self.sub(base, scaled);
        let exponent = self.k(-1.5);
        let term3 = self.pow(base, exponent);
        let below = self.g.compare("LT", x, alpha);
        let (difference, sum) = (self.sub(term2, term3), self.add(term2, term3));
        let term23 = self.g.select(below, difference, sum);
        let first = self.mul(log_ratio, term23);
        let two_over = self.over(2.0, alpha);
        let root = self.g.unary("stablehlo.sqrt", two_over);
        let total = self.add(alpha, x);
        let second = self.mul(root, total);
        let gap2 = self.mul(gap, gap);
        let second = self.div(second, gap2);
        let term1 = self.sub(first, second);
        // 1 + 1 / (12 α) (1 + 1 / (24 α))
        let inv24 = self.over(1.0 / 24.0, alpha);
        let inv24 = self.plus(inv24, 1.0);
        let inv12 = self.over(1.0 / 12.0, alpha);
        let stirling = self.mul(inv12, inv24);
        let stirling = self.plus(stirling, 1.0);
        let numer = self.mul(x, term1);
        let far = self.mul(stirling, numer);
        let far = self.div(far, denom);
        let far = self.g.unary("stablehlo.negate", far);

        let low = self.times(alpha, 0.9);
        let high = self.times(alpha, 1.1);
        let above_low = self.g.compare("LE", low, x);
        let below_high = self.g.compare("LE", x, high);
        let within = self.g.binary("stablehlo.and", above_low, below_high);
        self.g.select(within, near, far)
    }

    /// Otherwise: exp(p / q), p and q cubics in v = log(alpha) whose
    /// coefficients are quadratics in u = log(x / alpha).
    fn rational(&mut self, alpha: V, x: V) -> V {
        let ratio = self.div(x, alpha);
        let u = self.log(ratio);
        let v = self.log(alpha);
        let coef: Vec<V> = (0..8)
            .map(|i| {
                let c2 = self.times(u, COEF_UV[2][i]);
                let c1 = self.plus(c2, COEF_UV[1][i]);
                let c1 = self.mul(u, c1);
                self.plus(c1, COEF_UV[0][i])
            })
            .collect();
        let mut cubic = |c: &[V]| {
            let h = self.mul(v, c[3]);
            let h = self.add(c[2], h);
            let h = self.mul(v, h);
            let h = self.add(c[1], h);
            let h = self.mul(v, h);
            self.add(c[0], h)
        };
        let (p, q) = (cubic(&coef[..4]), cubic(&coef[4..]));
        let r = self.div(p, q);
        self.g.unary("stablehlo.exponential", r)
    }
}
