//! The matrix exponential (`linalg_matrix_exp`) as CPU computes it (Bader,
//! Blanes and Casas, "Computing the Matrix Exponential with an Optimized
//! Taylor Polynomial Approximation", 2019): by the matrix's 1-norm, a Taylor
//! polynomial of degree 1, 2, 4, 8 or 12 in its optimized product form, or
//! degree 18 of the matrix scaled by 2^-s and then squared s times, with
//! CPU's thresholds and coefficients in the input's precision. Every matrix
//! of a batch gets the form its norm picks: all forms are computed and one
//! selected per matrix, and the squarings run in a loop (`Op::Loop`) as long
//! as the batch's largest s, each matrix squared only its own s times.
//! Its gradient (PyTorch's block-matrix formula) is an exponential too.
use super::linalg::diagonal_mask;
use super::{op, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::{Graph, Precision, ReduceKind, V};

pub static ENTRIES: &[Entry] = &[op("linalg_matrix_exp", matrix_exp)];

/// The largest 1-norm each degree (1, 2, 4, 8, 12, 18) serves, per dtype.
const THETAS_F32: [f64; 6] = [
    1.192092800768788e-07,
    5.978858893805233e-04,
    5.116619363445086e-02,
    5.800524627688768e-01,
    1.461661507209034e+00,
    3.010066362817634e+00,
];
const THETAS_F64: [f64; 6] = [
    2.220446049250313e-16,
    2.580956802971767e-08,
    3.397168839976962e-04,
    4.991228871115323e-02,
    2.996158913811580e-01,
    1.090863719290036e+00,
];

/// Degree 12's coefficients of {I, A, A², A³}, one row per combination.
const T12: [[f64; 4]; 4] = [
    [9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740],
    [5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989],
    [0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230],
    [-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359],
];

/// Degree 18's coefficients of {I, A, A², A³, A⁶}.
const T18: [[f64; 5]; 5] = [
    [0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.],
    [
        0.,
        3.97849749499645077844e-01,
        1.36783778460411720168e+00,
        4.98289622525382669416e-01,
        -6.37898194594723280150e-04,
    ],
    [
        -1.09676396052962061844e+01,
        1.68015813878906206114e+00,
        5.71779846478865511061e-02,
        -6.98210122488052056106e-03,
        3.34975017086070470649e-05,
    ],
    [
        -9.04316832390810593223e-02,
        -6.76404519071381882256e-02,
        6.75961301770459654925e-02,
        2.95552570429315521194e-02,
        -1.39180257516060693404e-05,
    ],
    [0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05],
];

/// Powers 2^0 ... 2^62: the scalings' factors, exact in either dtype.
const SCALINGS: i64 = 63;

/// The matrices of one batch ([B, n, n]) and what they are computed in.
struct Batch {
    dtype: DType,
    shape: Vec<i64>,
}

impl Batch {
    fn dot(&self, g: &mut Graph, a: V, b: V) -> V {
        g.matmul(a, b, Precision::Highest)
    }

    fn identity(&self, g: &mut Graph) -> V {
        let diagonal = diagonal_mask(g, &self.shape);
        g.convert(diagonal, self.dtype)
    }

    /// `Σ c_j m_j`, the coefficients rounded to the dtype as CPU's arrays are.
    fn combination(&self, g: &mut Graph, matrices: &[V], coefficients: &[f64]) -> V {
        let mut sum = None;
        for (&m, &c) in matrices.iter().zip(coefficients) {
            let c = g.full(c, self.dtype, &self.shape);
            let term = g.binary("stablehlo.multiply", c, m);
            sum = Some(match sum {
                None => term,
                Some(s) => g.binary("stablehlo.add", s, term),
            });
        }
        sum.expect("a term")
    }

    fn add(&self, g: &mut Graph, a: V, b: V) -> V {
        g.binary("stablehlo.add", a, b)
    }

    /// {I, A, A², A³, A⁶}, the first `count`.
    fn powers(&self, g: &mut Graph, a: V, count: usize) -> Vec<V> {
        let mut p = vec![self.identity(g), a];
        if count > 2 {
            p.push(self.dot(g, a, a));
        }
        if count > 3 {
            p.push(self.dot(g, a, p[2]));
        }
        if count > 4 {
            p.push(self.dot(g, p[3], p[3]));
        }
        p
    }

    /// Degree 1, 2 and 4: I + A, I + A + A²/2, I + A + A²(I/2 + A/6 + A²/24).
    fn low(&self, g: &mut Graph, a: V) -> [V; 3] {
        let p = self.powers(g, a, 3);
        let t1 = self.add(g, p[0], p[1]);
        let half = self.combination(g, &p[2..3], &[0.5]);
        let t2 = self.add(g, t1, half);
        let inner = self.combination(g, &p, &[1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0]);
        let a4 = self.dot(g, p[2], inner);
        let t4 = self.add(g, t1, a4);
        [t1, t2, t4]
    }

    /// Degree 8: A4 = A²(x1 A + x2 A²), A8 = (x3 A² + A4)(x4 I + x5 A + x6 A² + x7 A4),
    /// I + A + y2 A² + A8.
    fn degree8(&self, g: &mut Graph, a: V) -> V {
        // CPU's constexpr arithmetic: the float operands rounded, the quotients in double.
        let r = |x: f64| if self.dtype == DType::F32 { x as f32 as f64 } else { x };
        let sqrt177 = r(0.1330413469565007072504e+2);
        let x3 = r(2. / 3.);
        let [x1, x2] = [88., 352.].map(|d| r(x3 * ((1. + sqrt177) / d)));
        let x4 = r((-271. + 29. * sqrt177) / (315. * x3));
        let x5 = r((-11. + 11. * sqrt177) / (1260. * x3));
        let x6 = r((-99. + 11. * sqrt177) / (5040. * x3));
        let x7 = r((89. - sqrt177) / (5040. * x3 * x3));
        let y2 = r((857. - 58. * sqrt177) / 630.);
        let p = self.powers(g, a, 3);
        let inner = self.combination(g, &p[1..3], &[x1, x2]);
        let a4 = self.dot(g, p[2], inner);
        let left = self.combination(g, &[p[2], a4], &[x3, 1.0]);
        let right = self.combination(g, &[p[0], p[1], p[2], a4], &[x4, x5, x6, x7]);
        let a8 = self.dot(g, left, right);
        let head = self.combination(g, &p, &[1.0, 1.0, y2]);
        self.add(g, head, a8)
    }

    /// Degree 12: B = T12 · {I, A, A², A³}, A6 = B3 B3 + B2, B0 + (B1 + A6) A6.
    fn degree12(&self, g: &mut Graph, a: V) -> V {
        self.product_form(g, a, &T12.map(Vec::from), [3, 3, 2], [0, 1])
    }

    /// Degree 18: B = T18 · {I, A, A², A³, A⁶}, A9 = B0 B4 + B3, B1 + (B2 + A9) A9.
    fn degree18(&self, g: &mut Graph, a: V) -> V {
        self.product_form(g, a, &T18.map(Vec::from), [0, 4, 3], [1, 2])
    }

    /// The form degrees 12 and 18 share: B = rows · powers of A,
    /// X = B[i] B[j] + B[k] (`inner`), B[u] + (B[v] + X) X (`outer`).
    fn product_form(&self, g: &mut Graph, a: V, rows: &[Vec<f64>], inner: [usize; 3], outer: [usize; 2]) -> V {
        let p = self.powers(g, a, rows.len());
        let b: Vec<V> = rows.iter().map(|row| self.combination(g, &p, row)).collect();
        let x = self.dot(g, b[inner[0]], b[inner[1]]);
        let x = self.add(g, b[inner[2]], x);
        let left = self.add(g, b[outer[1]], x);
        let prod = self.dot(g, left, x);
        self.add(g, b[outer[0]], prod)
    }

    /// Degree 18 of `a / 2^s`, squared s times, s = ceil(log2(norm / theta)) at
    /// least 0 (the count of powers of two below norm / theta: exact).
    fn scaled_and_squared(&self, g: &mut Graph, a: V, norm: V, theta: f64) -> V {
        let (dtype, batch) = (self.dtype, self.shape[0]);
        let powers: Vec<f64> = (0..SCALINGS).map(|k| (k as f64).exp2()).collect();
        let table = g.constant(&powers, dtype);
        let theta = g.full(theta, dtype, &[batch]);
        let ratio = g.binary("stablehlo.divide", norm, theta);
        let ratio = g.broadcast_in_dim(ratio, &[batch, SCALINGS], &[0]);
        let bounds = g.broadcast_in_dim(table, &[batch, SCALINGS], &[1]);
        let below = g.compare("GT", ratio, bounds);
        let below = g.convert(below, DType::I64);
        let s = g.reduce(ReduceKind::Sum, below, &[1]);
        let top = g.full((SCALINGS - 1) as f64, DType::I64, &[batch]);
        let s = g.binary("stablehlo.minimum", s, top);
        let factor = g.take(table, s, 0);
        let factor = g.broadcast_in_dim(factor, &self.shape, &[0]);
        let scaled = g.binary("stablehlo.divide", a, factor);
        let m = self.degree18(g, scaled);
        let most = g.reduce(ReduceKind::Max, s, &[0]);
        let trips = g.convert(most, DType::I32);
        let out = g.counted_loop(trips, &[m, s], |g, trip, v| {
            let (m, s) = (v[0], v[1]);
            let shape = g.ty(m).shape.clone();
            let squared = g.matmul(m, m, Precision::Highest);
            let trip = g.convert(trip, DType::I64);
            let trip = g.broadcast_in_dim(trip, &[shape[0]], &[]);
            let more = g.compare("LT", trip, s);
            let more = g.broadcast_in_dim(more, &shape, &[0]);
            vec![g.select(more, squared, m), s]
        });
        out[0]
    }
}

fn matrix_exp(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let r = t.sizes.len();
    if r < 2 || t.sizes[r - 1] != t.sizes[r - 2] || !matches!(t.dtype, DType::F32 | DType::F64) {
        // CPU's kernel raises its error, or computes complex and half-precision
        // types (the latter wrongly: it reads its double coefficients as
        // halves, NaN for OpInfo's samples; followed as it is, counted).
        return Err(Error::fallback("torchtpu: linalg_matrix_exp of this input runs on the CPU"));
    }
    let dtype = t.dtype;
    let a = cx.tensor("self")?;
    let n = t.sizes[r - 1];
    if n == 1 || t.numel() == 0 {
        return Ok(vec![cx.g.unary("stablehlo.exponential", a)]);
    }
    let batch = t.numel() / (n * n);
    let b = Batch { dtype, shape: vec![batch, n, n] };
    let thetas = if dtype == DType::F32 { THETAS_F32 } else { THETAS_F64 };
    let g = &mut cx.g;
    let a3 = g.reshape(a, &b.shape);
    // The 1-norm: the largest column sum of magnitudes.
    let magnitude = g.unary("stablehlo.abs", a3);
    let columns = g.reduce(ReduceKind::Sum, magnitude, &[1]);
    let norm = g.reduce(ReduceKind::Max, columns, &[1]);
    let [t1, t2, t4] = b.low(g, a3);
    let forms = [t1, t2, t4, b.degree8(g, a3), b.degree12(g, a3)];
    let mut result = b.scaled_and_squared(g, a3, norm, thetas[5]);
    // Norms in (theta[i-1], theta[i]] take degree i's form; from theta[4] on, degree 18's.
    let threshold = |g: &mut Graph, value: f64| g.full(value, dtype, &[batch]);
    let large_at = threshold(g, thetas[4]);
    let large = g.compare("GE", norm, large_at);
    for (i, &form) in forms.iter().enumerate() {
        let upper = threshold(g, thetas[i]);
        let lower = threshold(g, if i == 0 { -1.0 } else { thetas[i - 1] });
        let above = g.compare("GT", norm, lower);
        let within = g.compare("LE", norm, upper);
        let here = g.binary("stablehlo.and", above, within);
        let not_large = g.unary("stablehlo.not", large);
        let here = g.binary("stablehlo.and", here, not_large);
        let here = g.broadcast_in_dim(here, &b.shape, &[0]);
        result = g.select(here, form, result);
    }
    Ok(vec![g.reshape(result, t.sizes)])
}
