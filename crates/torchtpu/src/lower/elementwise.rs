//! Elementwise operators: arithmetic, comparisons, logic, unary math.
//!
//! Shared rules live in the helpers: operands are promoted with
//! `at::result_type`, broadcast together, and float16/bfloat16 are computed
//! in float32 and rounded once, as PyTorch's CPU kernels do.
use super::bessel::{self, Bessel};
use super::{op, op_complex, rules, Cx, Entry, Operand};
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType, DEFAULT_FLOAT};
use crate::ir::V;
use crate::lower::args::Arg;

pub static ENTRIES: &[Entry] = &[
    op_complex("add", |cx| add_sub(cx, "stablehlo.add")),
    op_complex("sub", |cx| add_sub(cx, "stablehlo.subtract")),
    op_complex("rsub", rsub),
    op_complex("mul", |cx| arith(cx, "stablehlo.multiply")),
    op_complex("div", div),
    op("floor_divide", |cx| divide(cx, Some("floor"))),
    op("remainder", remainder),
    op("fmod", fmod),
    op("maximum", |cx| arith(cx, "stablehlo.maximum")),
    op("minimum", |cx| arith(cx, "stablehlo.minimum")),
    op_complex("pow", pow).ruled(pow_rules),
    op("atan2", |cx| float_binary(cx, "stablehlo.atan2")),
    op_complex("eq", |cx| compare(cx, "EQ")),
    op_complex("ne", |cx| compare(cx, "NE")),
    op("lt", |cx| compare(cx, "LT")),
    op("le", |cx| compare(cx, "LE")),
    op("gt", |cx| compare(cx, "GT")),
    op("ge", |cx| compare(cx, "GE")),
    op_complex("logical_and", |cx| logical(cx, "stablehlo.and")),
    op_complex("logical_or", |cx| logical(cx, "stablehlo.or")),
    op_complex("logical_xor", |cx| logical(cx, "stablehlo.xor")),
    op_complex("logical_not", logical_not),
    op("bitwise_and", |cx| bitwise(cx, "stablehlo.and")),
    op("bitwise_or", |cx| bitwise(cx, "stablehlo.or")),
    op("bitwise_xor", |cx| bitwise(cx, "stablehlo.xor")),
    op("bitwise_not", bitwise_not),
    op("bitwise_left_shift", |cx| shift(cx, true)),
    op("bitwise_right_shift", |cx| shift(cx, false)),
    op("__lshift__", |cx| shift(cx, true)),
    op("__rshift__", |cx| shift(cx, false)),
    op("__ilshift__", |cx| shift(cx, true)),
    op("__irshift__", |cx| shift(cx, false)),
    op_complex("neg", neg),
    op_complex("abs", abs),
    op("sign", sign),
    op_complex("sgn", sgn),
    op("floor", |cx| same_unary(cx, "stablehlo.floor", not_implemented("floor_vml_cpu", DType::Bool))),
    op("ceil", |cx| same_unary(cx, "stablehlo.ceil", not_implemented("ceil_vml_cpu", DType::Bool))),
    op("round", round),
    op("trunc", trunc),
    op_complex("exp", |cx| float_unary(cx, "stablehlo.exponential")),
    op_complex("expm1", |cx| float_unary(cx, "stablehlo.exponential_minus_one")),
    op_complex("log", |cx| float_unary(cx, "stablehlo.log")),
    op_complex("log1p", |cx| float_unary(cx, "stablehlo.log_plus_one")),
    op_complex("log2", |cx| log_base(cx, std::f64::consts::LN_2)),
    op_complex("log10", |cx| log_base(cx, std::f64::consts::LN_10)),
    op_complex("sqrt", |cx| branch_unary(cx, "stablehlo.sqrt", false)),
    op_complex("rsqrt", |cx| float_unary(cx, "stablehlo.rsqrt")),
    op_complex("tanh", |cx| float_unary(cx, "stablehlo.tanh")),
    op("sigmoid", |cx| float_unary(cx, "stablehlo.logistic")),
    op_complex("tanh_backward", tanh_backward),
    op_complex("sigmoid_backward", sigmoid_backward),
    op_complex("sin", |cx| trig(cx, "stablehlo.sine")),
    op_complex("cos", |cx| trig(cx, "stablehlo.cosine")),
    op_complex("tan", |cx| float_unary(cx, "stablehlo.tan")),
    op("erf", |cx| float_unary(cx, "chlo.erf")),
    op("erfc", |cx| float_unary(cx, "chlo.erfc")),
    op("erfinv", erfinv),
    op("lgamma", |cx| float_unary(cx, "chlo.lgamma")),
    op("digamma", digamma),
    op("polygamma", polygamma),
    op("frexp", frexp),
    op("gcd", |cx| gcd_lcm(cx, false)),
    op("lcm", |cx| gcd_lcm(cx, true)),
    op("exp2", exp2),
    op("sinc", sinc),
    op("i0", |cx| bessel::lower(cx, Bessel::I0)),
    op("special_i0e", |cx| bessel::lower(cx, Bessel::I0e)),
    op("special_i1", |cx| bessel::lower(cx, Bessel::I1)),
    op("special_i1e", |cx| bessel::lower(cx, Bessel::I1e)),
    op("logaddexp", |cx| logaddexp(cx, false)),
    op("logaddexp2", |cx| logaddexp(cx, true)),
    op("signbit", signbit),
    op_complex("equal", equal),
    op_complex("angle", angle),
    op("complex", complex),
    op("polar", polar),
    op("xlogy", |cx| xlogy(cx, "stablehlo.log")),
    op("special_xlog1py", |cx| xlogy(cx, "stablehlo.log_plus_one")),
    op("special_entr", entr),
    op("nextafter", nextafter),
    op("frac", frac),
    op("logit", logit),
    op("logit_backward", logit_backward),
    op_complex("nan_to_num", nan_to_num),
    op("hypot", hypot),
    op("copysign", copysign),
    op("heaviside", heaviside),
    op("fmax", |cx| nan_ignoring(cx, "stablehlo.maximum")),
    op("fmin", |cx| nan_ignoring(cx, "stablehlo.minimum")),
    // CHLO's inverse trigonometric and hyperbolic ops: XLA expands them with
    // care for the ranges where the textbook formulas lose precision.
    op_complex("asin", |cx| branch_unary(cx, "chlo.asin", false)),
    op_complex("acos", |cx| branch_unary(cx, "chlo.acos", false)),
    op("atan", atan),
    op_complex("sinh", |cx| trig(cx, "chlo.sinh")),
    op_complex("cosh", |cx| trig(cx, "chlo.cosh")),
    op_complex("asinh", |cx| branch_unary(cx, "chlo.asinh", true)),
    op_complex("acosh", |cx| branch_unary(cx, "chlo.acosh", false)),
    op_complex("atanh", |cx| branch_unary(cx, "chlo.atanh", false)),
    op_complex("reciprocal", reciprocal),
    op_complex("where", where_),
    op("clamp", clamp),
    op("clamp_min", clamp),
    op("clamp_max", clamp),
    op_complex("masked_fill", masked_fill).ruled(rules::value_fits),
    op("lerp", lerp),
    op_complex("addcmul", |cx| addc(cx, "stablehlo.multiply")),
    op_complex("addcdiv", |cx| addc(cx, "stablehlo.divide")),
    op_complex("isnan", isnan),
    op("isposinf", |cx| is_infinity(cx, f64::INFINITY)),
    op("isneginf", |cx| is_infinity(cx, f64::NEG_INFINITY)),
];

/// Operands promoted to their common compute type: (values, result dtype).
pub(super) fn promoted(cx: &mut Cx, names: &[&str]) -> Result<(Vec<V>, DType)> {
    let ops: Vec<Operand> = names.iter().map(|n| cx.operand(n)).collect::<Result<_>>()?;
    let dtype = cx.result_type(&ops);
    Ok((cx.promote_to(&ops, opmath(dtype))?, dtype))
}

pub(super) fn finish(cx: &mut Cx, v: V, dtype: DType) -> Result<Vec<V>> {
    Ok(vec![cx.g.convert(v, dtype)])
}

/// `x` (in opmath) rounded to `dtype` and back: the CPU kernels of
/// float16/bfloat16 round some intermediate results. Identity otherwise.
pub(super) fn round_to(cx: &mut Cx, x: V, dtype: DType) -> V {
    let ct = cx.g.ty(x).dtype;
    let r = cx.g.convert(x, dtype);
    cx.g.convert(r, ct)
}

/// A constant shaped like `like`.
pub(super) fn full_like(cx: &mut Cx, value: f64, like: V) -> V {
    let ty = cx.g.ty(like).clone();
    cx.g.full(value, ty.dtype, &ty.shape)
}

fn unsigned(dtype: DType) -> bool {
    matches!(dtype, DType::U8 | DType::U32 | DType::U64)
}

/// CPU's error for a kernel without a version for `dtype`.
pub(super) fn not_implemented(kernel: &str, dtype: DType) -> Error {
    Error::not_implemented(format!("\"{kernel}\" not implemented for '{}'", dtype.torch_name()))
}

/// `not_implemented` unless `dtype` is a floating-point type, as `kernel` requires.
pub(super) fn float_only(dtype: DType, kernel: &str) -> Result<()> {
    if !dtype.is_float() {
        return Err(not_implemented(kernel, dtype));
    }
    Ok(())
}

/// `not_implemented` for bool, which `kernel` lacks.
pub(super) fn no_bool(dtype: DType, kernel: &str) -> Result<()> {
    if dtype == DType::Bool {
        return Err(not_implemented(kernel, dtype));
    }
    Ok(())
}

/// C++'s name of a dtype's element type, as some CPU messages print it.
pub(super) fn cpp_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "bool",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short int",
        DType::I32 => "int",
        DType::I64 => "long int",
        DType::F16 => "c10::Half",
        DType::BF16 => "c10::BFloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::U32 => "unsigned int",
        DType::U64 => "unsigned long",
        DType::C64 => "c10::complex<float>",
        DType::C128 => "c10::complex<double>",
        DType::C32 => "c10::complex<c10::Half>",
        DType::F8E5M2 => "c10::Float8_e5m2",
        DType::F8E4M3FN => "c10::Float8_e4m3fn",
        DType::F8E5M2FNUZ => "c10::Float8_e5m2fnuz",
        DType::F8E4M3FNUZ => "c10::Float8_e4m3fnuz",
    }
}

/// mul, maximum and minimum (also max/min with `other`).
pub fn arith(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    let name = match (dtype, name) {
        (DType::Bool, "stablehlo.multiply") => "stablehlo.and",
        (DType::Bool, "stablehlo.maximum") => "stablehlo.or",
        (DType::Bool, "stablehlo.minimum") => "stablehlo.and",
        _ => name,
    };
    let r = match name {
        "stablehlo.maximum" | "stablehlo.minimum" => nan_extreme(cx, name, v[0], v[1]),
        _ => cx.g.binary(name, v[0], v[1]),
    };
    finish(cx, r, dtype)
}

/// Elementwise maximum/minimum where a NaN operand gives NaN, as on CPU
/// (XLA's CPU max/min may drop it).
fn nan_extreme(cx: &mut Cx, name: &'static str, a: V, b: V) -> V {
    let r = cx.g.binary(name, a, b);
    if !cx.g.ty(a).dtype.is_float() {
        return r;
    }
    let a_nan = cx.g.compare("NE", a, a);
    let r = cx.g.select(a_nan, a, r);
    let b_nan = cx.g.compare("NE", b, b);
    cx.g.select(b_nan, b, r)
}

/// PyTorch's `sub_check`: no bool operand in a subtraction.
fn sub_check(cx: &Cx) -> Result<()> {
    let is_bool = |name| match cx.arg(name) {
        Ok(Arg::Tensor(t)) => t.dtype == DType::Bool,
        Ok(Arg::Bool(_)) => true,
        _ => false,
    };
    match (is_bool("self"), is_bool("other")) {
        (true, true) => Err(Error::not_implemented(
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.",
        )),
        (true, false) | (false, true) => Err(Error::not_implemented(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.",
        )),
        _ => Ok(()),
    }
}

/// PyTorch's `alpha_check`: an alpha of the result's kind.
fn alpha_check(cx: &Cx, dtype: DType) -> Result<()> {
    match cx.arg("alpha") {
        Ok(Arg::Bool(_)) if dtype != DType::Bool => {
            Err(Error::runtime("Boolean alpha only supported for Boolean results."))
        }
        Ok(Arg::Float(_)) if !dtype.is_float() && !dtype.is_complex() => {
            Err(Error::runtime("For integral input tensors, argument alpha must not be a floating point number."))
        }
        _ => Ok(()),
    }
}

/// `self ± alpha * other`.
fn add_sub(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    if name == "stablehlo.subtract" {
        sub_check(cx)?;
    }
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    alpha_check(cx, dtype)?;
    let shape = cx.g.ty(v[0]).shape.clone();
    let mut other = v[1];
    if cx.has("alpha") {
        if let Some(alpha) = cx.scalar_like("alpha", opmath(dtype), &shape)? {
            let mul = if dtype == DType::Bool { "stablehlo.and" } else { "stablehlo.multiply" };
            other = cx.g.binary(mul, other, alpha);
        }
    }
    let name = if dtype == DType::Bool { "stablehlo.or" } else { name };
    let r = cx.g.binary(name, v[0], other);
    finish(cx, r, dtype)
}

/// `other - alpha * self`.
fn rsub(cx: &mut Cx) -> Result<Vec<V>> {
    sub_check(cx)?;
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    alpha_check(cx, dtype)?;
    let shape = cx.g.ty(v[0]).shape.clone();
    let mut s = v[0];
    if let Some(alpha) = cx.scalar_like("alpha", opmath(dtype), &shape)? {
        s = cx.g.binary("stablehlo.multiply", s, alpha);
    }
    let r = cx.g.binary("stablehlo.subtract", v[1], s);
    finish(cx, r, dtype)
}

fn div(cx: &mut Cx) -> Result<Vec<V>> {
    let mode =
        if cx.has("rounding_mode") && !cx.is_none("rounding_mode") { Some(cx.str("rounding_mode")?) } else { None };
    divide(cx, mode)
}

/// True division, or division rounded toward zero ("trunc") or down ("floor").
fn divide(cx: &mut Cx, mode: Option<&str>) -> Result<Vec<V>> {
    let ops = [cx.operand("self")?, cx.operand("other")?];
    let common = cx.result_type(&ops);
    if common.is_complex() && mode.is_some() {
        return Err(not_implemented(&format!("div_{}_cpu", mode.unwrap_or_default()), common));
    }
    let dtype = if mode.is_none() && !common.has_float_values() { DEFAULT_FLOAT } else { common };
    let v = cx.promote_to(&ops, opmath(dtype))?;
    let (a, b) = (v[0], v[1]);
    let r = match (mode, dtype) {
        (None, _) => cx.g.binary("stablehlo.divide", a, b),
        (Some("trunc" | "floor"), DType::Bool) => {
            return Err(not_implemented(&format!("div_{}_cpu", mode.unwrap_or_default()), dtype))
        }
        (Some("trunc"), _) if dtype.is_float() => {
            // The CPU kernel truncates the quotient rounded to the dtype.
            let q = cx.g.binary("stablehlo.divide", a, b);
            let q = round_to(cx, q, dtype);
            trunc_value(cx, q)
        }
        (Some("trunc"), _) => div_rem(cx, "stablehlo.divide", a, b),
        (Some("floor"), _) if dtype.is_float() => floor_div_float(cx, a, b, dtype),
        (Some("floor"), _) => floor_div_int(cx, a, b),
        (Some(other), _) => {
            return Err(Error::runtime(format!(
                "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{other}'"
            )))
        }
    };
    finish(cx, r, dtype)
}

/// PyTorch's `div_floor_floating`: floor division through fmod, exact
/// where floor(a / b) would round wrongly. Every step is rounded to
/// `dtype`, as the float16/bfloat16 CPU kernels do.
fn floor_div_float(cx: &mut Cx, a: V, b: V, dtype: DType) -> V {
    let (zero, one, half) = (full_like(cx, 0.0, a), full_like(cx, 1.0, a), full_like(cx, 0.5, a));
    let m = cx.g.binary("stablehlo.remainder", a, b);
    let m = round_to(cx, m, dtype);
    let exact = cx.g.binary("stablehlo.subtract", a, m);
    let exact = round_to(cx, exact, dtype);
    let div = cx.g.binary("stablehlo.divide", exact, b);
    let div = round_to(cx, div, dtype);
    // A remainder of the other sign than b means the quotient was rounded up.
    let m_nonzero = cx.g.compare("NE", m, zero);
    let m_neg = cx.g.compare("LT", m, zero);
    let b_neg = cx.g.compare("LT", b, zero);
    let signs = cx.g.compare("NE", b_neg, m_neg);
    let fix = cx.g.binary("stablehlo.and", m_nonzero, signs);
    let down = cx.g.binary("stablehlo.subtract", div, one);
    let down = round_to(cx, down, dtype);
    let div = cx.g.select(fix, down, div);
    let floor = cx.g.unary("stablehlo.floor", div);
    let frac = cx.g.binary("stablehlo.subtract", div, floor);
    let frac = round_to(cx, frac, dtype);
    let up = cx.g.compare("GT", frac, half);
    let floor_up = cx.g.binary("stablehlo.add", floor, one);
    let floor_up = round_to(cx, floor_up, dtype);
    let floor = cx.g.select(up, floor_up, floor);
    // A zero quotient keeps the sign of a / b; division by zero gives a / b.
    let q = cx.g.binary("stablehlo.divide", a, b);
    let q = round_to(cx, q, dtype);
    let signed_zero = cx.g.binary("stablehlo.multiply", q, zero);
    let div_zero = cx.g.compare("EQ", div, zero);
    let floor = cx.g.select(div_zero, signed_zero, floor);
    let b_zero = cx.g.compare("EQ", b, zero);
    cx.g.select(b_zero, q, floor)
}

/// `a / b` or `a % b` (C's fmod for floats). Integers never divide by 0
/// or -1 in the program: XLA folds operations on constants (zero-size or
/// never-written tensors read as zeros) when compiling, and traps on
/// both. a / -1 is -a, a % -1 is 0; division by zero (an error on CPU)
/// gives a / 1.
fn div_rem(cx: &mut Cx, name: &'static str, a: V, b: V) -> V {
    let dtype = cx.g.ty(a).dtype;
    if dtype.is_float() {
        return cx.g.binary(name, a, b);
    }
    let (zero, one) = (full_like(cx, 0.0, b), full_like(cx, 1.0, b));
    let mut unsafe_divisor = cx.g.compare("EQ", b, zero);
    // CPU's integer kernels refuse a zero divisor (CUDA's return garbage).
    cx.check_any(unsafe_divisor, Kind::Runtime, "ZeroDivisionError");
    let minus_one = if !unsigned(dtype) {
        let m = full_like(cx, -1.0, b);
        let is_m = cx.g.compare("EQ", b, m);
        unsafe_divisor = cx.g.binary("stablehlo.or", unsafe_divisor, is_m);
        Some(is_m)
    } else {
        None
    };
    let safe = cx.g.select(unsafe_divisor, one, b);
    let r = cx.g.binary(name, a, safe);
    match minus_one {
        Some(is_m) if name == "stablehlo.divide" => {
            let neg = cx.g.unary("stablehlo.negate", a);
            cx.g.select(is_m, neg, r)
        }
        _ => r,
    }
}

/// Integer floor division from the truncating quotient.
fn floor_div_int(cx: &mut Cx, a: V, b: V) -> V {
    let (zero, one) = (full_like(cx, 0.0, a), full_like(cx, 1.0, a));
    let q = div_rem(cx, "stablehlo.divide", a, b);
    let qb = cx.g.binary("stablehlo.multiply", q, b);
    let rem = cx.g.binary("stablehlo.subtract", a, qb);
    let inexact = cx.g.compare("NE", rem, zero);
    let a_neg = cx.g.compare("LT", a, zero);
    let b_neg = cx.g.compare("LT", b, zero);
    let signs = cx.g.compare("NE", a_neg, b_neg);
    let fix = cx.g.binary("stablehlo.and", inexact, signs);
    let down = cx.g.binary("stablehlo.subtract", q, one);
    cx.g.select(fix, down, q)
}

fn fmod(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    no_bool(dtype, "fmod_cpu")?;
    let r = div_rem(cx, "stablehlo.remainder", v[0], v[1]);
    finish(cx, r, dtype)
}

/// Python's modulo: the result takes the divisor's sign.
fn remainder(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    no_bool(dtype, "remainder_cpu")?;
    let ty = cx.g.ty(v[0]).clone();
    let rem = div_rem(cx, "stablehlo.remainder", v[0], v[1]);
    let zero = cx.g.full(0.0, ty.dtype, &ty.shape);
    let nonzero = cx.g.compare("NE", rem, zero);
    let rem_neg = cx.g.compare("LT", rem, zero);
    let div_neg = cx.g.compare("LT", v[1], zero);
    let differ = cx.g.compare("NE", rem_neg, div_neg);
    let fix = cx.g.binary("stablehlo.and", nonzero, differ);
    let shifted = cx.g.binary("stablehlo.add", rem, v[1]);
    let r = cx.g.select(fix, shifted, rem);
    finish(cx, r, dtype)
}

fn pow(cx: &mut Cx) -> Result<Vec<V>> {
    // A complex power of a tensor of exponents overflows where CPU's does
    // not (and the other way round): CPU computes it.
    let tensor_exponent = cx.meta("exponent").is_ok_and(|e| !e.wrapped);
    let complex = ["self", "exponent"].iter().any(|n| cx.meta(n).is_ok_and(|t| t.dtype.is_complex()));
    if tensor_exponent && complex {
        return Err(Error::fallback("torchtpu: a complex power of a tensor exponent runs on the CPU"));
    }
    let (v, dtype) = promoted(cx, &["self", "exponent"])?;
    no_bool(dtype, "pow")?;
    let r = if dtype.has_float_values() { cx.g.binary("stablehlo.power", v[0], v[1]) } else { int_pow(cx, v[0], v[1]) };
    finish(cx, r, dtype)
}

/// CPU refuses an integer tensor to a negative integer number's power (a
/// tensor of exponents is computed: 1 / base, rounded toward zero).
fn pow_rules(cx: &Cx) -> Result<()> {
    // XLA's complex power meets CPU's only away from zero and overflow (0
    // to the (2+1j) is NaN there, 0 on CPU): a power with a complex number
    // for base or exponent stays CPU's (counted), as one with a complex
    // tensor of exponents does.
    if ["self", "exponent"].iter().any(|n| matches!(cx.arg(n), Ok(Arg::Complex(..)))) {
        return Err(Error::fallback("torchtpu: a power of a complex number runs on the CPU"));
    }
    let integral = |t: super::Tensor| t.dtype.is_int() || t.dtype == DType::Bool;
    let negative = matches!(cx.arg("exponent"), Ok(Arg::Int(e)) if *e < 0);
    if negative && cx.meta("self").is_ok_and(integral) {
        return Err(Error::runtime("Integers to negative integer powers are not allowed."));
    }
    Ok(())
}

/// Integer power by squaring over every bit of the exponent, wrapping on
/// overflow as CPU does (XLA's integer power assumes it does not
/// overflow). Negative exponents give 1 / base rounded toward zero.
fn int_pow(cx: &mut Cx, base: V, exp: V) -> V {
    let ty = cx.g.ty(base).clone();
    let (zero, one) = (full_like(cx, 0.0, base), full_like(cx, 1.0, base));
    let (mut result, mut square, mut rest) = (one, base, exp);
    for _ in 0..ty.dtype.size() * 8 {
        let bit = cx.g.binary("stablehlo.and", rest, one);
        let odd = cx.g.compare("NE", bit, zero);
        let product = cx.g.binary("stablehlo.multiply", result, square);
        result = cx.g.select(odd, product, result);
        square = cx.g.binary("stablehlo.multiply", square, square);
        rest = cx.g.binary("stablehlo.shift_right_logical", rest, one);
    }
    if unsigned(ty.dtype) {
        return result;
    }
    // base^-n is 1 for base 1, ±1 for base -1, else 0.
    let minus_one = full_like(cx, -1.0, base);
    let is_one = cx.g.compare("EQ", base, one);
    let is_minus_one = cx.g.compare("EQ", base, minus_one);
    let exp_bit = cx.g.binary("stablehlo.and", exp, one);
    let exp_odd = cx.g.compare("NE", exp_bit, zero);
    let sign = cx.g.select(exp_odd, minus_one, one);
    let unit = cx.g.select(is_minus_one, sign, zero);
    let reciprocal = cx.g.select(is_one, one, unit);
    let negative = cx.g.compare("LT", exp, zero);
    cx.g.select(negative, reciprocal, result)
}

/// Binary op whose integer inputs produce the default float dtype.
fn float_binary(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let (a, b, dtype) = float_pair(cx, None)?;
    let r = cx.g.binary(name, a, b);
    finish(cx, r, dtype)
}

fn compare(cx: &mut Cx, dir: &'static str) -> Result<Vec<V>> {
    let (v, _) = promoted(cx, &["self", "other"])?;
    Ok(vec![cx.g.compare(dir, v[0], v[1])])
}

fn to_bool(cx: &mut Cx, o: Operand) -> V {
    if o.dtype == DType::Bool {
        return o.v;
    }
    let ty = cx.g.ty(o.v).clone();
    let zero = cx.g.full(0.0, ty.dtype, &ty.shape);
    cx.g.compare("NE", o.v, zero)
}

fn logical(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let a = cx.operand("self")?;
    let b = cx.operand("other")?;
    let (a, b) = (to_bool(cx, a), to_bool(cx, b));
    let shapes = [cx.g.ty(a).shape.clone(), cx.g.ty(b).shape.clone()];
    let shape = crate::ir::broadcast_all(&[&shapes[0], &shapes[1]])?;
    let (a, b) = (cx.g.broadcast_to(a, &shape), cx.g.broadcast_to(b, &shape));
    Ok(vec![cx.g.binary(name, a, b)])
}

fn logical_not(cx: &mut Cx) -> Result<Vec<V>> {
    let a = cx.operand("self")?;
    let b = to_bool(cx, a);
    Ok(vec![cx.g.unary("stablehlo.not", b)])
}

fn bitwise(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    if dtype.is_float() {
        return Err(not_implemented(&format!("{}_cpu", base_name(cx)), dtype));
    }
    Ok(vec![cx.g.binary(name, v[0], v[1])])
}

/// The op's name without namespace, overload and in-place `_`.
fn base_name<'a>(cx: &Cx<'a>) -> &'a str {
    let name = cx.op.name.trim_start_matches("aten::");
    name.split('.').next().unwrap_or(name).trim_end_matches('_')
}

/// Shifts by amounts out of [0, bits) give 0, or the sign for right shifts
/// of signed types, in StableHLO as on CPU.
fn shift(cx: &mut Cx, left: bool) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    let kernel = if left { "lshift_cpu" } else { "rshift_cpu" };
    if dtype.is_float() {
        return Err(not_implemented(kernel, dtype));
    }
    no_bool(dtype, kernel)?;
    let name = match (left, unsigned(dtype)) {
        (true, _) => "stablehlo.shift_left",
        (false, true) => "stablehlo.shift_right_logical",
        (false, false) => "stablehlo.shift_right_arithmetic",
    };
    Ok(vec![cx.g.binary(name, v[0], v[1])])
}

fn bitwise_not(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if t.dtype.is_float() {
        return Err(not_implemented("bitwise_not_cpu", t.dtype));
    }
    let x = cx.tensor("self")?;
    Ok(vec![cx.g.unary("stablehlo.not", x)])
}

fn neg(cx: &mut Cx) -> Result<Vec<V>> {
    let bool_error = Error::not_implemented(
        "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.",
    );
    same_unary(cx, "stablehlo.negate", bool_error)
}

/// A unary op keeping the dtype; bool inputs raise `bool_error`, CPU's.
fn same_unary(cx: &mut Cx, name: &'static str, bool_error: Error) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if t.dtype == DType::Bool {
        return Err(bool_error);
    }
    let x = cx.tensor("self")?;
    if !t.dtype.is_float() && matches!(name, "stablehlo.floor" | "stablehlo.ceil") {
        return Ok(vec![x]);
    }
    let x = cx.g.convert(x, opmath(t.dtype));
    let r = cx.g.unary(name, x);
    finish(cx, r, t.dtype)
}

/// Unary math: integer inputs produce the default float dtype.
/// `self` at its op-math type, and the result's dtype: integers and bools
/// compute in the default float, as CPU's float functions do.
pub(super) fn float_operand(cx: &mut Cx) -> Result<(V, DType)> {
    let t = cx.meta("self")?;
    let dtype = if t.dtype.has_float_values() { t.dtype } else { DEFAULT_FLOAT };
    let x = cx.tensor("self")?;
    Ok((cx.g.convert(x, opmath(dtype)), dtype))
}

pub fn float_unary(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let r = cx.g.unary(name, x);
    finish(cx, r, dtype)
}

/// sin, cos, sinh or cosh (`name`, the real op). XLA's complex forms lose
/// small parts (their sinh is (e^y - e^-y) / 2), so a complex value's are
/// composed from its parts' real functions, as glibc's csin and ccosh.
fn trig(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    if !dtype.is_complex() {
        let r = cx.g.unary(name, x);
        return finish(cx, r, dtype);
    }
    let (a, b) = (cx.g.part(x, false), cx.g.part(x, true));
    // sin and cos take the circular functions of the real part and the
    // hyperbolic ones of the imaginary part; sinh and cosh the other way.
    let (circular, hyperbolic) = if name.starts_with("stablehlo") { (a, b) } else { (b, a) };
    let s = cx.g.unary("stablehlo.sine", circular);
    let c = cx.g.unary("stablehlo.cosine", circular);
    let sh = cx.g.unary("chlo.sinh", hyperbolic);
    let ch = cx.g.unary("chlo.cosh", hyperbolic);
    let mul = |cx: &mut Cx, p: V, q: V| cx.g.binary("stablehlo.multiply", p, q);
    // An odd factor (sin, sinh) of an exact zero keeps the product zero
    // where the other factor is infinite or NaN, as C99's csin and csinh:
    // cosh(inf + 0i) is inf + 0i, not inf·0.
    let zero_where = |cx: &mut Cx, product: V, odd: V, input: V, other: V| {
        let (zero, one, inf) = (full_like(cx, 0.0, odd), full_like(cx, 1.0, odd), full_like(cx, f64::INFINITY, odd));
        let at_zero = cx.g.compare("EQ", input, zero);
        let magnitude = cx.g.unary("stablehlo.abs", other);
        let finite = cx.g.compare("LT", magnitude, inf);
        let sign = cx.g.select(finite, other, one);
        let signed = cx.g.binary("stablehlo.multiply", odd, sign);
        cx.g.select(at_zero, signed, product)
    };
    let (re, im) = match name {
        "stablehlo.sine" => {
            let (re, im) = (mul(cx, s, ch), mul(cx, c, sh));
            (zero_where(cx, re, s, circular, ch), zero_where(cx, im, sh, hyperbolic, c))
        }
        "stablehlo.cosine" => {
            let im = mul(cx, s, sh);
            let im = zero_where(cx, im, s, circular, sh);
            let im = zero_where(cx, im, sh, hyperbolic, s);
            (mul(cx, c, ch), cx.g.unary("stablehlo.negate", im))
        }
        "chlo.sinh" => {
            let (re, im) = (mul(cx, sh, c), mul(cx, ch, s));
            (zero_where(cx, re, sh, hyperbolic, c), zero_where(cx, im, s, circular, ch))
        }
        _ => {
            let im = mul(cx, sh, s);
            let im = zero_where(cx, im, sh, hyperbolic, s);
            (mul(cx, ch, c), zero_where(cx, im, s, circular, sh))
        }
    };
    let r = cx.g.complex(re, im);
    finish(cx, r, dtype)
}

/// A function with a branch cut: on the real axis (sqrt, asin, acos, acosh,
/// atanh), where f(conj z) = conj f(z), or on the imaginary axis (asinh, odd:
/// f(-z) = -f(z)). XLA's complex forms ignore a zero part's sign, which
/// picks the side of the cut on CPU (sqrt(-4 - 0i) is -2i): a value whose
/// part across the cut has its sign bit set is computed by the symmetry.
fn branch_unary(cx: &mut Cx, name: &'static str, imaginary_cut: bool) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    if !dtype.is_complex() {
        let r = cx.g.unary(name, x);
        return finish(cx, r, dtype);
    }
    let across = cx.g.part(x, !imaginary_cut);
    let flipped = negative_bit(cx, across);
    let mirror = |cx: &mut Cx, v: V| if imaginary_cut { cx.g.unary("stablehlo.negate", v) } else { cx.g.conj(v) };
    let mirrored = mirror(cx, x);
    let x = cx.g.select(flipped, mirrored, x);
    let r = cx.g.unary(name, x);
    let mirrored = mirror(cx, r);
    let r = cx.g.select(flipped, mirrored, r);
    finish(cx, r, dtype)
}

/// Whether a float's sign bit is set (-0.0 and negative NaNs included).
fn negative_bit(cx: &mut Cx, x: V) -> V {
    let ty = cx.g.ty(x).clone();
    let bits = match ty.dtype {
        DType::F16 | DType::BF16 => DType::I16,
        DType::F32 => DType::I32,
        _ => DType::I64,
    };
    let x = cx.g.bitcast(x, crate::ir::Ty::new(bits, &ty.shape));
    let zero = cx.g.full(0.0, bits, &ty.shape);
    cx.g.compare("LT", x, zero)
}

fn log_base(cx: &mut Cx, ln_base: f64) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let l = cx.g.unary("stablehlo.log", x);
    // A complex logarithm's parts divide by the real constant: dividing by
    // a complex one makes log(0)'s imaginary part inf·0.
    let r = if dtype.is_complex() {
        let (re, im) = (cx.g.part(l, false), cx.g.part(l, true));
        let c = full_like(cx, ln_base, re);
        let (re, im) = (cx.g.binary("stablehlo.divide", re, c), cx.g.binary("stablehlo.divide", im, c));
        cx.g.complex(re, im)
    } else {
        let c = full_like(cx, ln_base, l);
        cx.g.binary("stablehlo.divide", l, c)
    };
    finish(cx, r, dtype)
}

fn reciprocal(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let one = full_like(cx, 1.0, x);
    let r = cx.g.binary("stablehlo.divide", one, x);
    finish(cx, r, dtype)
}

/// atan(x) as atan2(x, y) with y = |sign(x)|·0 + 1, which is 1 for every x
/// (NaN for NaN, as atan's) but no constant: the XLA:CPU of jaxlib 0.11.2
/// turns `chlo.atan`, and atan2 of a constant 1, into code whose vector
/// lanes past the first four return x.
fn atan(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let sign = cx.g.unary("stablehlo.sign", x);
    let magnitude = cx.g.unary("stablehlo.abs", sign);
    let zero = full_like(cx, 0.0, x);
    let one = full_like(cx, 1.0, x);
    let nothing = cx.g.binary("stablehlo.multiply", magnitude, zero);
    let y = cx.g.binary("stablehlo.add", nothing, one);
    let r = cx.g.binary("stablehlo.atan2", x, y);
    finish(cx, r, dtype)
}

fn trunc_value(cx: &mut Cx, x: V) -> V {
    let ty = cx.g.ty(x).clone();
    let zero = cx.g.full(0.0, ty.dtype, &ty.shape);
    let neg = cx.g.compare("LT", x, zero);
    let up = cx.g.unary("stablehlo.ceil", x);
    let down = cx.g.unary("stablehlo.floor", x);
    cx.g.select(neg, up, down)
}

/// `(x > 0) - (x < 0)`: NaN and -0.0 give 0, as on CPU.
fn sign(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    if t.dtype == DType::Bool {
        return Ok(vec![x]);
    }
    let zero = full_like(cx, 0.0, x);
    let pos = cx.g.compare("GT", x, zero);
    let neg = cx.g.compare("LT", x, zero);
    let (pos, neg) = (cx.g.convert(pos, t.dtype), cx.g.convert(neg, t.dtype));
    Ok(vec![cx.g.binary("stablehlo.subtract", pos, neg)])
}

/// sign of reals; z / |z| of a complex z (0 at 0).
fn sgn(cx: &mut Cx) -> Result<Vec<V>> {
    if !cx.meta("self")?.dtype.is_complex() {
        return sign(cx);
    }
    let x = cx.tensor("self")?;
    let m = cx.g.magnitude(x);
    let zero = full_like(cx, 0.0, m);
    let at_zero = cx.g.compare("EQ", m, zero);
    let m = cx.g.complex(m, zero);
    let r = cx.g.binary("stablehlo.divide", x, m);
    let zero = cx.g.complex(zero, zero);
    Ok(vec![cx.g.select(at_zero, zero, r)])
}

fn trunc(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if t.dtype == DType::Bool {
        return Err(not_implemented("trunc_vml_cpu", t.dtype));
    }
    let x = cx.tensor("self")?;
    if !t.dtype.is_float() {
        return Ok(vec![x]);
    }
    let x = cx.g.convert(x, opmath(t.dtype));
    let r = trunc_value(cx, x);
    finish(cx, r, t.dtype)
}

fn round(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let decimals = if cx.has("decimals") { Some(cx.int("decimals")?) } else { None };
    // Integers round to themselves, unless `decimals` is given.
    match (t.dtype, decimals) {
        (DType::Bool, None) | (_, Some(0)) if !t.dtype.is_float() => {
            return Err(not_implemented("round_vml_cpu", t.dtype))
        }
        (dtype, Some(_)) if !dtype.is_float() => return Err(not_implemented("round_cpu", dtype)),
        _ => {}
    }
    let x = cx.tensor("self")?;
    if !t.dtype.is_float() {
        return Ok(vec![x]);
    }
    let x = cx.g.convert(x, opmath(t.dtype));
    let decimals = decimals.unwrap_or(0);
    let r = if decimals == 0 {
        cx.g.unary("stablehlo.round_nearest_even", x)
    } else {
        let ty = cx.g.ty(x).clone();
        let scale = cx.g.full(10f64.powi(decimals.abs() as i32), ty.dtype, &ty.shape);
        let (up, down) = if decimals > 0 {
            ("stablehlo.multiply", "stablehlo.divide")
        } else {
            ("stablehlo.divide", "stablehlo.multiply")
        };
        let s = cx.g.binary(up, x, scale);
        let s = cx.g.unary("stablehlo.round_nearest_even", s);
        cx.g.binary(down, s, scale)
    };
    finish(cx, r, t.dtype)
}

fn where_(cx: &mut Cx) -> Result<Vec<V>> {
    let cond = cx.operand("condition")?;
    let cond = to_bool(cx, cond);
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    let shapes = [cx.g.ty(cond).shape.clone(), cx.g.ty(v[0]).shape.clone()];
    let shape = crate::ir::broadcast_all(&[&shapes[0], &shapes[1]])?;
    let c = cx.g.broadcast_to(cond, &shape);
    let (a, b) = (cx.g.broadcast_to(v[0], &shape), cx.g.broadcast_to(v[1], &shape));
    let r = cx.g.select(c, a, b);
    finish(cx, r, dtype)
}

/// clamp, clamp_min and clamp_max (scalar or tensor bounds).
fn clamp(cx: &mut Cx) -> Result<Vec<V>> {
    let bounds: Vec<&str> = ["min", "max"].into_iter().filter(|n| cx.has(n) && !cx.is_none(n)).collect();
    if bounds.is_empty() {
        return Err(Error::runtime("torch.clamp: At least one of 'min' or 'max' must not be None"));
    }
    let mut names = vec!["self"];
    names.extend(&bounds);
    let (v, dtype) = promoted(cx, &names)?;
    // Bool has kernels for a single tensor bound only (maximum/minimum).
    if dtype == DType::Bool {
        let tensors = bounds.iter().filter(|b| matches!(cx.arg(b), Ok(Arg::Tensor(_)))).count();
        let kernel = match (tensors, bounds.as_slice()) {
            (1, [_]) => None,
            (0, [_, _]) => Some("clamp_scalar_cpu"),
            (0, ["min"]) => Some("clamp_min_scalar_cpu"),
            (0, _) => Some("clamp_max_scalar_cpu"),
            _ => Some("clamp_cpu"),
        };
        if let Some(kernel) = kernel {
            return Err(not_implemented(kernel, dtype));
        }
    }
    let mut r = v[0];
    for (i, b) in bounds.iter().enumerate() {
        let op = if *b == "min" { "stablehlo.maximum" } else { "stablehlo.minimum" };
        r = nan_extreme(cx, op, r, v[i + 1]);
    }
    finish(cx, r, dtype)
}

/// `value` where `mask`, else `self`; the value is converted to self's dtype
/// (CPU's overflow check of that conversion depends on the runtime value
/// and is not made).
fn masked_fill(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let mask = cx.tensor("mask")?;
    let value = cx.operand("value")?;
    let rank = cx.g.ty(value.v).rank();
    if rank != 0 {
        return Err(Error::runtime(format!(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {rank} dimension(s)."
        )));
    }
    if value.dtype.is_complex() && !t.dtype.is_complex() {
        // CPU refuses a nonzero imaginary part, read on the host.
        return Err(Error::fallback("a complex value into a real tensor"));
    }
    let shapes = [cx.g.ty(x).shape.clone(), cx.g.ty(mask).shape.clone()];
    let shape = crate::ir::broadcast_all(&[&shapes[0], &shapes[1]])?;
    let (x, mask) = (cx.g.broadcast_to(x, &shape), cx.g.broadcast_to(mask, &shape));
    let fill = cx.g.convert(value.v, t.dtype);
    let fill = cx.g.broadcast_in_dim(fill, &shape, &[]);
    Ok(vec![cx.g.select(mask, fill, x)])
}

/// PyTorch's lerp: `weight < 0.5 ? self + w*(end-self) : end - (end-self)*(1-w)`,
/// for floating `self`, with `end` (and a non-scalar `weight`) of its dtype.
fn lerp(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let weight = match cx.arg("weight")? {
        Arg::Tensor(w) => Some(*w),
        _ => None,
    };
    let others = [Some(("end", cx.meta("end")?)), weight.filter(|w| !w.sizes.is_empty()).map(|w| ("weight", w))];
    for (name, other) in others.into_iter().flatten() {
        if other.dtype != t.dtype {
            return Err(Error::runtime(format!(
                "expected dtype {} for `{name}` but got dtype {}",
                cpp_name(t.dtype),
                cpp_name(other.dtype)
            )));
        }
    }
    if !t.dtype.is_float() {
        let kernel = if weight.is_some() { "lerp_kernel_tensor" } else { "lerp_kernel_scalar" };
        return Err(not_implemented(kernel, t.dtype));
    }
    let ops = [cx.operand("self")?, cx.operand("end")?, cx.operand("weight")?];
    let v = cx.promote_to(&ops, opmath(t.dtype))?;
    let (dtype, a, b, w) = (t.dtype, v[0], v[1], v[2]);
    let ty = cx.g.ty(a).clone();
    let half = cx.g.full(0.5, ty.dtype, &ty.shape);
    let one = cx.g.full(1.0, ty.dtype, &ty.shape);
    let diff = cx.g.binary("stablehlo.subtract", b, a);
    let small = cx.g.compare("LT", w, half);
    let wd = cx.g.binary("stablehlo.multiply", w, diff);
    let lo = cx.g.binary("stablehlo.add", a, wd);
    let omw = cx.g.binary("stablehlo.subtract", one, w);
    let dw = cx.g.binary("stablehlo.multiply", diff, omw);
    let hi = cx.g.binary("stablehlo.subtract", b, dw);
    let r = cx.g.select(small, lo, hi);
    finish(cx, r, dtype)
}

/// `self + value * (tensor1 op tensor2)`.
fn addc(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    let integral = |name| cx.meta(name).map(|t| !t.dtype.has_float_values());
    if name == "stablehlo.divide" && integral("tensor1")? && integral("tensor2")? {
        return Err(Error::runtime(
            "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: (input + value * tensor1 / tensor2), for all dtypes.",
        ));
    }
    let (v, dtype) = promoted(cx, &["self", "tensor1", "tensor2"])?;
    no_bool(dtype, "addcmul_cpu_out")?;
    let shape = cx.g.ty(v[0]).shape.clone();
    let mut t1 = v[1];
    if let Some(value) = cx.scalar_like("value", opmath(dtype), &shape)? {
        t1 = cx.g.binary("stablehlo.multiply", value, t1);
    }
    let t = cx.g.binary(name, t1, v[2]);
    let r = cx.g.binary("stablehlo.add", v[0], t);
    finish(cx, r, dtype)
}

/// tanh's derivative from its output: `grad * (1 - y²)`.
fn tanh_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "output"])?;
    let (grad, y) = (v[0], v[1]);
    let one = full_like(cx, 1.0, y);
    let y2 = cx.g.binary("stablehlo.multiply", y, y);
    let d = cx.g.binary("stablehlo.subtract", one, y2);
    // Complex gradients take the conjugate derivative, as CPU's kernel.
    let d = cx.g.conj(d);
    let r = cx.g.binary("stablehlo.multiply", grad, d);
    finish(cx, r, dtype)
}

/// sigmoid's derivative from its output: `grad * (1 - y) * y`.
fn sigmoid_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "output"])?;
    let (grad, y) = (v[0], v[1]);
    let one = full_like(cx, 1.0, y);
    let d = cx.g.binary("stablehlo.subtract", one, y);
    let r = if dtype.is_complex() {
        // CPU's complex kernel: grad * conj((1 - y) * y).
        let d = cx.g.binary("stablehlo.multiply", d, y);
        let d = cx.g.conj(d);
        cx.g.binary("stablehlo.multiply", grad, d)
    } else {
        let r = cx.g.binary("stablehlo.multiply", grad, d);
        cx.g.binary("stablehlo.multiply", r, y)
    };
    finish(cx, r, dtype)
}

fn isnan(cx: &mut Cx) -> Result<Vec<V>> {
    let x = cx.tensor("self")?;
    Ok(vec![cx.g.compare("NE", x, x)])
}

/// `self == inf` (of that sign); never true for integers and bools.
fn is_infinity(cx: &mut Cx, inf: f64) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if !t.dtype.is_float() {
        return Ok(vec![cx.g.full(0.0, DType::Bool, t.sizes)]);
    }
    let x = cx.tensor("self")?;
    let inf = cx.g.full(inf, t.dtype, t.sizes);
    Ok(vec![cx.g.compare("EQ", x, inf)])
}

/// CHLO's erf_inv, in float64 for float32: its float32 expansion is a few
/// ulps from CPU's near ±1, where the gradient magnifies them.
fn erfinv(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let wide = if dtype == DType::F32 { cx.g.convert(x, DType::F64) } else { x };
    let r = cx.g.unary("chlo.erf_inv", wide);
    finish(cx, r, dtype)
}

/// CHLO's digamma, with CPU's poles: ∓inf at ±0 (`-1/x`), NaN at the
/// negative integers.
fn digamma(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let r = digamma_of(cx, x);
    finish(cx, r, dtype)
}

pub(super) fn digamma_of(cx: &mut Cx, x: V) -> V {
    let r = cx.g.unary("chlo.digamma", x);
    let zero = full_like(cx, 0.0, x);
    let minus_one = full_like(cx, -1.0, x);
    let pole = cx.g.binary("stablehlo.divide", minus_one, x);
    let at_zero = cx.g.compare("EQ", x, zero);
    let r = cx.g.select(at_zero, pole, r);
    let negative = cx.g.compare("LT", x, zero);
    let whole = cx.g.unary("stablehlo.floor", x);
    let whole = cx.g.compare("EQ", whole, x);
    let negative_integer = cx.g.binary("stablehlo.and", negative, whole);
    let nan = full_like(cx, f64::NAN, x);
    cx.g.select(negative_integer, nan, r)
}

/// The n-th derivative of digamma for n = 0 (digamma, the gradient of
/// lgamma) and 1 (digamma's gradient): CPU's trigamma, its reflection below
/// 1/2, six recurrence steps and the asymptotic series (CHLO's polygamma
/// differs for x < 0).
fn polygamma(cx: &mut Cx) -> Result<Vec<V>> {
    let n = cx.int("n")?;
    if n < 0 {
        return Err(Error::runtime("polygamma(n, x) does not support negative n."));
    }
    let (x, dtype) = float_operand(cx)?;
    let r = match n {
        0 => digamma_of(cx, x),
        1 => trigamma(cx, x),
        // CPU sums Hurwitz's zeta term by term from x up past 9, a loop as long
        // as x is negative: no fixed program computes it.
        _ => return Err(Error::fallback("polygamma of order 2 and more")),
    };
    finish(cx, r, dtype)
}

fn trigamma(cx: &mut Cx, x: V) -> V {
    let c = |cx: &mut Cx, v: f64| full_like(cx, v, x);
    let (half, one, pi) = (c(cx, 0.5), c(cx, 1.0), c(cx, std::f64::consts::PI));
    let reflect = cx.g.compare("LT", x, half);
    let px = cx.g.binary("stablehlo.multiply", pi, x);
    let sin = cx.g.unary("stablehlo.sine", px);
    let sin2 = cx.g.binary("stablehlo.multiply", sin, sin);
    let pi2 = cx.g.binary("stablehlo.multiply", pi, pi);
    let pole = cx.g.binary("stablehlo.divide", pi2, sin2);
    let zero = c(cx, 0.0);
    let neg_pole = cx.g.binary("stablehlo.subtract", zero, pole);
    let mut result = cx.g.select(reflect, neg_pole, zero);
    let mirrored = cx.g.binary("stablehlo.subtract", one, x);
    let mut x = cx.g.select(reflect, mirrored, x);
    for _ in 0..6 {
        let xx = cx.g.binary("stablehlo.multiply", x, x);
        let inv = cx.g.binary("stablehlo.divide", one, xx);
        result = cx.g.binary("stablehlo.add", result, inv);
        x = cx.g.binary("stablehlo.add", x, one);
    }
    let xx = cx.g.binary("stablehlo.multiply", x, x);
    let ixx = cx.g.binary("stablehlo.divide", one, xx);
    // 1 + 1/(2x) + ixx (1/6 - ixx (1/30 - ixx / 42)), over x.
    let (sixth, thirtieth, fortysecond) = (c(cx, 1.0 / 6.0), c(cx, 1.0 / 30.0), c(cx, 1.0 / 42.0));
    let t = cx.g.binary("stablehlo.multiply", ixx, fortysecond);
    let t = cx.g.binary("stablehlo.subtract", thirtieth, t);
    let t = cx.g.binary("stablehlo.multiply", ixx, t);
    let t = cx.g.binary("stablehlo.subtract", sixth, t);
    let t = cx.g.binary("stablehlo.multiply", ixx, t);
    let two = c(cx, 2.0);
    let two_x = cx.g.binary("stablehlo.multiply", two, x);
    let inv_2x = cx.g.binary("stablehlo.divide", one, two_x);
    let series = cx.g.binary("stablehlo.add", one, inv_2x);
    let series = cx.g.binary("stablehlo.add", series, t);
    let series = cx.g.binary("stablehlo.divide", series, x);
    let result = cx.g.binary("stablehlo.add", result, series);
    let flipped = cx.g.unary("stablehlo.negate", result);
    cx.g.select(reflect, flipped, result)
}

/// x = mantissa * 2^exponent with |mantissa| in [0.5, 1) (int32 exponent;
/// 0, inf and NaN are their own mantissa, exponent 0), read from the bits:
/// subnormals are normalised by their leading zeros, not by a product that
/// XLA:CPU would flush to zero. Half types go through float32, as CPU's.
fn frexp(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    if !t.dtype.is_float() {
        return Err(Error::runtime("torch.frexp() only supports floating-point dtypes"));
    }
    if let Some(m) = cx.meta("mantissa").ok().filter(|m| m.dtype != t.dtype) {
        return Err(Error::runtime(format!(
            "torch.frexp() expects mantissa to have dtype {} but got {}",
            cpp_name(t.dtype),
            cpp_name(m.dtype)
        )));
    }
    if let Some(e) = cx.meta("exponent").ok().filter(|e| e.dtype != DType::I32) {
        return Err(Error::runtime(format!(
            "torch.frexp() expects exponent to have int dtype but got {}",
            cpp_name(e.dtype)
        )));
    }
    let wide = t.dtype == DType::F64;
    let (ft, it, fraction, bias) =
        if wide { (DType::F64, DType::I64, 52, 1022) } else { (DType::F32, DType::I32, 23, 126) };
    let width = if wide { 64 } else { 32 };
    let shape = t.sizes;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ft);
    let bits = cx.g.bitcast(x, crate::ir::Ty::new(it, shape));
    let k = |cx: &mut Cx, v: i64| cx.g.full(v as f64, it, shape);
    let exp_bits = width - 1 - fraction;
    let (frac_mask, exp_mask, half_exp) =
        (k(cx, (1 << fraction) - 1), k(cx, (1 << exp_bits) - 1), k(cx, bias << fraction));
    let shift = k(cx, fraction);
    let biased = cx.g.binary("stablehlo.shift_right_logical", bits, shift);
    let biased = cx.g.binary("stablehlo.and", biased, exp_mask);
    let frac = cx.g.binary("stablehlo.and", bits, frac_mask);
    let sign_mask = cx.g.full(if wide { i64::MIN as f64 } else { i32::MIN as f64 }, it, shape);
    let sign = cx.g.binary("stablehlo.and", bits, sign_mask);
    // Normal: the exponent unbiased by one less; subnormal: by the leading zeros.
    let unbias = k(cx, bias);
    let normal_exp = cx.g.binary("stablehlo.subtract", biased, unbias);
    let zeros = cx.g.unary("stablehlo.count_leading_zeros", frac);
    // The top set bit moves to the implicit bit's place; the value was
    // frac * 2^(1 - (bias + 1) - fraction).
    let lead = k(cx, exp_bits);
    let up = cx.g.binary("stablehlo.subtract", zeros, lead);
    let top = k(cx, width - bias - fraction);
    let sub_exp = cx.g.binary("stablehlo.subtract", top, zeros);
    let sub_frac = cx.g.binary("stablehlo.shift_left", frac, up);
    let sub_frac = cx.g.binary("stablehlo.and", sub_frac, frac_mask);
    let none = k(cx, 0);
    let subnormal = cx.g.compare("EQ", biased, none);
    let exponent = cx.g.select(subnormal, sub_exp, normal_exp);
    let frac = cx.g.select(subnormal, sub_frac, frac);
    let m = cx.g.binary("stablehlo.or", sign, half_exp);
    let m = cx.g.binary("stablehlo.or", m, frac);
    let m = cx.g.bitcast(m, crate::ir::Ty::new(ft, shape));
    // 0, inf and NaN: themselves, exponent 0.
    let zero = cx.g.full(0.0, ft, shape);
    let is_zero = cx.g.compare("EQ", x, zero);
    let magnitude = cx.g.unary("stablehlo.abs", x);
    let inf = cx.g.full(f64::INFINITY, ft, shape);
    let finite = cx.g.compare("LT", magnitude, inf);
    let special = cx.g.unary("stablehlo.not", finite);
    let special = cx.g.binary("stablehlo.or", special, is_zero);
    let m = cx.g.select(special, x, m);
    let exponent = cx.g.select(special, none, exponent);
    Ok(vec![cx.g.convert(m, t.dtype), cx.g.convert(exponent, DType::I32)])
}

/// CPU's `calc_gcd` (Euclid's loop on the magnitudes, `abs` wrapping at the
/// type's minimum), unrolled for as many steps as the type's widest
/// Fibonacci pair needs; lcm = |a / gcd * b|, 0 where the gcd is 0.
fn gcd_lcm(cx: &mut Cx, lcm: bool) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    if !dtype.is_int() || matches!(dtype, DType::U32 | DType::U64) {
        return Err(not_implemented(if lcm { "lcm_cpu" } else { "gcd_cpu" }, dtype));
    }
    let (x, y) = (v[0], v[1]);
    let magnitude = |cx: &mut Cx, v: V| if dtype == DType::U8 { v } else { cx.g.unary("stablehlo.abs", v) };
    let (mut a, mut b) = (magnitude(cx, x), magnitude(cx, y));
    let (zero, one) = (full_like(cx, 0.0, a), full_like(cx, 1.0, a));
    let steps = (dtype.size() * 8 * 3).div_ceil(2) + 2;
    for _ in 0..steps {
        let going = cx.g.compare("NE", a, zero);
        let safe = cx.g.select(going, a, one);
        let r = cx.g.binary("stablehlo.remainder", b, safe);
        b = cx.g.select(going, a, b);
        a = cx.g.select(going, r, zero);
    }
    if !lcm {
        return finish(cx, b, dtype);
    }
    // C++ computes a / g * b of narrower types in int, then narrows |it|.
    let wide = if dtype.size() < 4 { DType::I32 } else { dtype };
    let none = cx.g.compare("EQ", b, zero);
    let safe = cx.g.select(none, one, b);
    let q = cx.g.binary("stablehlo.divide", x, safe);
    let [q, y] = [q, y].map(|v| cx.g.convert(v, wide));
    let m = cx.g.binary("stablehlo.multiply", q, y);
    let m = cx.g.unary("stablehlo.abs", m);
    let m = cx.g.convert(m, dtype);
    let r = cx.g.select(none, zero, m);
    finish(cx, r, dtype)
}

/// 2^x (XLA has no exp2).
fn exp2(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let two = full_like(cx, 2.0, x);
    let r = cx.g.binary("stablehlo.power", two, x);
    finish(cx, r, dtype)
}

/// sin(πx)/(πx), 1 at 0.
fn sinc(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let pi = full_like(cx, std::f64::consts::PI, x);
    let px = cx.g.binary("stablehlo.multiply", x, pi);
    let sin = cx.g.unary("stablehlo.sine", px);
    let r = cx.g.binary("stablehlo.divide", sin, px);
    let zero = full_like(cx, 0.0, x);
    let one = full_like(cx, 1.0, x);
    let at_zero = cx.g.compare("EQ", x, zero);
    let r = cx.g.select(at_zero, one, r);
    finish(cx, r, dtype)
}

/// Operands of a float function of two tensors, `kernel`'s on CPU (None:
/// integers compute in the default float, as CPU's kernels do).
fn float_pair(cx: &mut Cx, float_kernel: Option<&str>) -> Result<(V, V, DType)> {
    let ops = [cx.operand("self")?, cx.operand("other")?];
    let common = cx.result_type(&ops);
    if let Some(kernel) = float_kernel {
        float_only(common, kernel)?;
    }
    let dtype = if common.is_float() { common } else { DEFAULT_FLOAT };
    let v = cx.promote_to(&ops, opmath(dtype))?;
    Ok((v[0], v[1], dtype))
}

/// log(e^a + e^b) as max + log1p(e^-|a-b|), or in base 2 (`logaddexp2`:
/// max + log1p(2^-|a-b|) / ln 2); equal infinities give themselves.
fn logaddexp(cx: &mut Cx, base2: bool) -> Result<Vec<V>> {
    let kernel = if base2 { "logaddexp2_cpu" } else { "logaddexp_cpu" };
    let (a, b, dtype) = float_pair(cx, Some(kernel))?;
    let m = cx.g.binary("stablehlo.maximum", a, b);
    let d = cx.g.binary("stablehlo.subtract", a, b);
    let d = cx.g.unary("stablehlo.abs", d);
    let d = cx.g.unary("stablehlo.negate", d);
    let e = if base2 {
        let two = full_like(cx, 2.0, d);
        cx.g.binary("stablehlo.power", two, d)
    } else {
        cx.g.unary("stablehlo.exponential", d)
    };
    let mut l = cx.g.unary("stablehlo.log_plus_one", e);
    if base2 {
        let ln2 = full_like(cx, std::f64::consts::LN_2, l);
        l = cx.g.binary("stablehlo.divide", l, ln2);
    }
    let r = cx.g.binary("stablehlo.add", m, l);
    let inf = full_like(cx, f64::INFINITY, a);
    let magnitude = cx.g.unary("stablehlo.abs", a);
    let infinite = cx.g.compare("EQ", magnitude, inf);
    let same = cx.g.compare("EQ", a, b);
    let both = cx.g.binary("stablehlo.and", infinite, same);
    let r = cx.g.select(both, a, r);
    finish(cx, r, dtype)
}

/// Whether the sign bit is set: floats' bit (-0.0 and NaNs' included),
/// integers below 0, never for bools.
fn signbit(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    if t.dtype == DType::Bool {
        return Ok(vec![cx.g.full(0.0, DType::Bool, t.sizes)]);
    }
    if t.dtype.is_float() {
        return Ok(vec![negative_bit(cx, x)]);
    }
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    Ok(vec![cx.g.compare("LT", x, zero)])
}

/// The argument of a real number: π below 0, else 0 (NaN stays NaN).
/// |x|; of a complex x, its magnitude in the parts' dtype.
fn abs(cx: &mut Cx) -> Result<Vec<V>> {
    let dtype = cx.meta("self")?.dtype;
    // CPU rejects bool, CUDA keeps it as it is (so `softsign` of bool runs): tpu follows CUDA.
    if dtype == DType::Bool {
        return Ok(vec![cx.tensor("self")?]);
    }
    if !dtype.is_complex() {
        return same_unary(cx, "stablehlo.abs", not_implemented("abs_cpu", DType::Bool));
    }
    if cx.op.inplace {
        return Err(Error::runtime("In-place abs is not supported for complex tensors."));
    }
    let x = cx.tensor("self")?;
    Ok(vec![cx.g.magnitude(x)])
}

/// The complex value from two float tensors (broadcast): `complex(re, im)`,
/// or `polar(abs, angle)`.
fn complex_of(cx: &mut Cx, names: [&str; 2], polar: bool) -> Result<Vec<V>> {
    let ops = [cx.operand(names[0])?, cx.operand(names[1])?];
    let (a, b) = (ops[0].dtype, ops[1].dtype);
    if !(matches!(a, DType::F32 | DType::F64) && a == b) {
        // CPU's message; float16 would make complex32, which XLA lacks.
        let pair = |d: DType| d.torch_name();
        return Err(match a == b && a == DType::F16 {
            true => Error::fallback("complex32"),
            false if a != b => Error::runtime(format!(
                "Expected object of scalar type {} but got scalar type {} for second argument",
                pair(a),
                pair(b)
            )),
            false => Error::not_implemented(format!(
                "Expected both inputs to be Half, Float or Double tensors but got {} and {}",
                pair(a),
                pair(b)
            )),
        });
    }
    if let Some(out) = cx.meta("out").ok().filter(|o| o.dtype != a.to_complex()) {
        return Err(Error::runtime(format!(
            "Expected object of scalar type {} but got scalar type {} for argument 'out'",
            a.to_complex().torch_name(),
            out.dtype.torch_name()
        )));
    }
    let v = cx.promote_to(&ops, a)?;
    let (re, im) = match polar {
        false => (v[0], v[1]),
        true => {
            let cos = cx.g.unary("stablehlo.cosine", v[1]);
            let sin = cx.g.unary("stablehlo.sine", v[1]);
            (cx.g.binary("stablehlo.multiply", v[0], cos), cx.g.binary("stablehlo.multiply", v[0], sin))
        }
    };
    Ok(vec![cx.g.complex(re, im)])
}

fn complex(cx: &mut Cx) -> Result<Vec<V>> {
    complex_of(cx, ["real", "imag"], false)
}

fn polar(cx: &mut Cx) -> Result<Vec<V>> {
    complex_of(cx, ["abs", "angle"], true)
}

/// The angle of x: atan2(im, re) for complex x (in the parts' dtype); π
/// for negative reals, else 0 (NaN stays NaN).
fn angle(cx: &mut Cx) -> Result<Vec<V>> {
    if cx.meta("self")?.dtype.is_complex() {
        let x = cx.tensor("self")?;
        let (re, im) = (cx.g.part(x, false), cx.g.part(x, true));
        return Ok(vec![cx.g.binary("stablehlo.atan2", im, re)]);
    }
    let (x, dtype) = float_operand(cx)?;
    let zero = full_like(cx, 0.0, x);
    let pi = full_like(cx, std::f64::consts::PI, x);
    let negative = cx.g.compare("LT", x, zero);
    let r = cx.g.select(negative, pi, zero);
    let nan = cx.g.compare("NE", x, x);
    let r = cx.g.select(nan, x, r);
    finish(cx, r, dtype)
}

/// x·log(y) (`log` "stablehlo.log"; xlog1py: x·log1p(y)), 0 where x is 0
/// unless y is NaN.
fn xlogy(cx: &mut Cx, log: &'static str) -> Result<Vec<V>> {
    let (x, y, dtype) = float_pair(cx, None)?;
    let log = cx.g.unary(log, y);
    let r = cx.g.binary("stablehlo.multiply", x, log);
    let zero = full_like(cx, 0.0, x);
    let x_zero = cx.g.compare("EQ", x, zero);
    let y_number = cx.g.compare("EQ", y, y);
    let zero_term = cx.g.binary("stablehlo.and", x_zero, y_number);
    let r = cx.g.select(zero_term, zero, r);
    finish(cx, r, dtype)
}

/// fmax/fmin: a NaN operand gives the other one.
fn nan_ignoring(cx: &mut Cx, name: &'static str) -> Result<Vec<V>> {
    if !cx.operand("self")?.dtype.is_float() && !cx.operand("other")?.dtype.is_float() {
        return arith(cx, name);
    }
    let (v, dtype) = promoted(cx, &["self", "other"])?;
    let (a, b) = (v[0], v[1]);
    let r = cx.g.binary(name, a, b);
    let a_nan = cx.g.compare("NE", a, a);
    let r = cx.g.select(a_nan, b, r);
    let b_nan = cx.g.compare("NE", b, b);
    let r = cx.g.select(b_nan, a, r);
    finish(cx, r, dtype)
}

/// x - trunc(x), of floats only.
fn frac(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    float_only(t.dtype, "frac_cpu")?;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, opmath(t.dtype));
    let whole = trunc_value(cx, x);
    let r = cx.g.binary("stablehlo.subtract", x, whole);
    finish(cx, r, t.dtype)
}

/// log(x / (1 - x)), x first clamped to [eps, 1 - eps] when eps is given
/// (NaN stays NaN).
fn logit(cx: &mut Cx) -> Result<Vec<V>> {
    let (mut x, dtype) = float_operand(cx)?;
    let shape = cx.g.ty(x).shape.clone();
    if let Some((low, high)) = logit_bounds(cx, x, &shape)? {
        let below = cx.g.compare("LT", x, low);
        let above = cx.g.compare("GT", x, high);
        let capped = cx.g.select(above, high, x);
        x = cx.g.select(below, low, capped);
    }
    let one = full_like(cx, 1.0, x);
    let rest = cx.g.binary("stablehlo.subtract", one, x);
    let odds = cx.g.binary("stablehlo.divide", x, rest);
    let r = cx.g.unary("stablehlo.log", odds);
    finish(cx, r, dtype)
}

/// logit's [eps, 1 - eps], when eps is given.
fn logit_bounds(cx: &mut Cx, x: V, shape: &[i64]) -> Result<Option<(V, V)>> {
    let ct = cx.g.ty(x).dtype;
    let Some(eps) = cx.scalar_like("eps", ct, shape)? else { return Ok(None) };
    let one = full_like(cx, 1.0, x);
    Ok(Some((eps, cx.g.binary("stablehlo.subtract", one, eps))))
}

/// grad / (x (1 - x)); outside [eps, 1 - eps] 0, or without eps NaN
/// outside [0, 1].
fn logit_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (v, dtype) = promoted(cx, &["grad_output", "self"])?;
    let (grad, x) = (v[0], v[1]);
    let shape = cx.g.ty(x).shape.clone();
    let one = full_like(cx, 1.0, x);
    let rest = cx.g.binary("stablehlo.subtract", one, x);
    let slope = cx.g.binary("stablehlo.multiply", x, rest);
    let r = cx.g.binary("stablehlo.divide", grad, slope);
    let (low, high, outside) = match logit_bounds(cx, x, &shape)? {
        Some((low, high)) => (low, high, full_like(cx, 0.0, x)),
        None => (full_like(cx, 0.0, x), one, full_like(cx, f64::NAN, x)),
    };
    let below = cx.g.compare("LT", x, low);
    let above = cx.g.compare("GT", x, high);
    let out = cx.g.binary("stablehlo.or", below, above);
    let r = cx.g.select(out, outside, r);
    finish(cx, r, dtype)
}

/// The largest finite value of a float dtype.
fn finite_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.389_531_389_251_535_5e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

/// NaN, +inf and -inf replaced (by 0 and the dtype's extremes unless given);
/// other dtypes are copied.
fn nan_to_num(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    if t.dtype.is_complex() {
        // Each part replaced as a real value would be.
        let (re, im) = (cx.g.part(x, false), cx.g.part(x, true));
        let re = nan_to_num_of(cx, re, t.dtype.to_real(), t.sizes)?;
        let im = nan_to_num_of(cx, im, t.dtype.to_real(), t.sizes)?;
        return Ok(vec![cx.g.complex(re, im)]);
    }
    if !t.dtype.is_float() {
        return Ok(vec![x]);
    }
    Ok(vec![nan_to_num_of(cx, x, t.dtype, t.sizes)?])
}

/// `x` (of float `dtype`) with NaN and infinities replaced.
fn nan_to_num_of(cx: &mut Cx, x: V, dtype: DType, sizes: &[i64]) -> Result<V> {
    let replace = |cx: &mut Cx, name: &str, default: f64| -> Result<V> {
        Ok(cx.scalar_like(name, dtype, sizes)?.unwrap_or_else(|| cx.g.full(default, dtype, sizes)))
    };
    let nan = replace(cx, "nan", 0.0)?;
    let posinf = replace(cx, "posinf", finite_max(dtype))?;
    let neginf = replace(cx, "neginf", -finite_max(dtype))?;
    let inf = cx.g.full(f64::INFINITY, dtype, sizes);
    let minus_inf = cx.g.full(f64::NEG_INFINITY, dtype, sizes);
    let is_nan = cx.g.compare("NE", x, x);
    let is_posinf = cx.g.compare("EQ", x, inf);
    let is_neginf = cx.g.compare("EQ", x, minus_inf);
    let r = cx.g.select(is_nan, nan, x);
    let r = cx.g.select(is_posinf, posinf, r);
    Ok(cx.g.select(is_neginf, neginf, r))
}

/// sqrt(a² + b²), of floats only.
fn hypot(cx: &mut Cx) -> Result<Vec<V>> {
    let (a, b, dtype) = float_pair(cx, Some("hypot_cpu"))?;
    let aa = cx.g.binary("stablehlo.multiply", a, a);
    let bb = cx.g.binary("stablehlo.multiply", b, b);
    let sum = cx.g.binary("stablehlo.add", aa, bb);
    let r = cx.g.unary("stablehlo.sqrt", sum);
    finish(cx, r, dtype)
}

/// |self| with the sign bit of `other` (-0.0 and NaNs' included).
fn copysign(cx: &mut Cx) -> Result<Vec<V>> {
    let (a, b, dtype) = float_pair(cx, None)?;
    let negative = negative_bit(cx, b);
    let magnitude = cx.g.unary("stablehlo.abs", a);
    let negated = cx.g.unary("stablehlo.negate", magnitude);
    let r = cx.g.select(negative, negated, magnitude);
    finish(cx, r, dtype)
}

/// `values` where self is 0, else self > 0; the two of one dtype.
fn heaviside(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, values) = (cx.operand("self")?, cx.operand("values")?);
    if x.dtype != values.dtype {
        return Err(Error::runtime("heaviside is not yet implemented for tensors with different dtypes."));
    }
    let dtype = x.dtype;
    let v = cx.promote_to(&[x, values], dtype)?;
    let zero = full_like(cx, 0.0, v[0]);
    let at_zero = cx.g.compare("EQ", v[0], zero);
    let positive = cx.g.compare("GT", v[0], zero);
    let step = cx.g.convert(positive, dtype);
    Ok(vec![cx.g.select(at_zero, v[1], step)])
}

/// torch.equal: same shape and equal values after promotion (NaN unequal).
fn equal(cx: &mut Cx) -> Result<Vec<V>> {
    let (a, b) = (cx.meta("self")?, cx.meta("other")?);
    if a.sizes != b.sizes {
        return Ok(vec![cx.g.scalar(0.0, DType::Bool)]);
    }
    let (v, _) = promoted(cx, &["self", "other"])?;
    let same = cx.g.compare("EQ", v[0], v[1]);
    let dims: Vec<usize> = (0..a.sizes.len()).collect();
    Ok(vec![cx.g.reduce(crate::ir::ReduceKind::And, same, &dims)])
}

/// -x·ln(x) for x > 0, 0 at 0, -inf below (NaN stays NaN).
fn entr(cx: &mut Cx) -> Result<Vec<V>> {
    let (x, dtype) = float_operand(cx)?;
    let log = cx.g.unary("stablehlo.log", x);
    let xlog = cx.g.binary("stablehlo.multiply", x, log);
    let r = cx.g.unary("stablehlo.negate", xlog);
    let zero = full_like(cx, 0.0, x);
    let at_zero = cx.g.compare("EQ", x, zero);
    let r = cx.g.select(at_zero, zero, r);
    let below = cx.g.compare("LT", x, zero);
    let minus_inf = full_like(cx, f64::NEG_INFINITY, x);
    let r = cx.g.select(below, minus_inf, r);
    finish(cx, r, dtype)
}

/// The next representable value after self toward other, in the operands'
/// own float type (float16/bfloat16 step by their own ulps).
fn nextafter(cx: &mut Cx) -> Result<Vec<V>> {
    let ops = [cx.operand("self")?, cx.operand("other")?];
    let dtype = cx.result_type(&ops);
    float_only(dtype, "nextafter_cpu")?;
    let v = cx.promote_to(&ops, dtype)?;
    Ok(vec![cx.g.binary("chlo.next_after", v[0], v[1])])
}
