//! Rules on the values of runtime number arguments (`normal_`'s `std >= 0`,
//! a fill value that fits its dtype). CPU checks them on every call; a plan
//! is shared by every value of such an argument, so these run per call,
//! before the plan is looked up, and raise CPU's error at once.
use super::{Cx, OpDef};
use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::Precision;
use crate::lower::args::Arg;

/// An entry's rules: an error for values CPU refuses.
pub type Rules = fn(&Cx) -> Result<()>;

/// Runs `op`'s rules, if it has any, on this call's arguments.
pub fn check(op: &OpDef, args: &[Arg], device: usize) -> Result<()> {
    match op.entry.rules {
        Some(rules) => {
            op.check_complex(args).and_then(|_| rules(&Cx::new(op, args, device, Vec::new(), Precision::Highest)))
        }
        None => Ok(()),
    }
}

/// The number argument `name` as a float, None where absent or not a number.
pub fn number(cx: &Cx, name: &str) -> Option<f64> {
    match cx.arg(name).ok()? {
        Arg::Int(i) => Some(*i as f64),
        Arg::Float(f) => Some(*f),
        Arg::Bool(b) => Some(*b as i64 as f64),
        _ => None,
    }
}

/// CPU's `c10::checked_convert` of the number argument `name` to `dtype`:
/// "value cannot be converted to type int8_t without overflow". Negative
/// integers may wrap into an unsigned type (`-1` fills a uint8 with 255);
/// infinities and NaN fit every float type.
fn fits(cx: &Cx, name: &str, dtype: DType) -> Result<()> {
    let overflows = match (cx.arg(name), dtype.int_range()) {
        (_, _) if matches!(dtype, DType::Bool | DType::F64 | DType::C128) => false,
        (Ok(Arg::Int(v)), Some((min, max))) => {
            let v = *v as i128;
            if min == 0 {
                v > max || -v > max
            } else {
                v < min || v > max
            }
        }
        (Ok(Arg::Float(f)), Some((min, max))) => !(*f >= min as f64 && *f <= max as f64),
        (Ok(Arg::Int(v)), None) => (*v as f64).abs() > float_max(dtype),
        (Ok(Arg::Float(f)), None) => f.is_finite() && f.abs() > float_max(dtype),
        _ => false,
    };
    if overflows {
        return Err(Error::runtime(format!(
            "value cannot be converted to type {} without overflow",
            checked_name(dtype)
        )));
    }
    Ok(())
}

/// A fill's number `value` fits `self`'s dtype (`fill_`, `masked_fill_`,
/// `index_fill_`, `scatter_`).
pub fn value_fits(cx: &Cx) -> Result<()> {
    fits(cx, "value", cx.meta("self")?.dtype)
}

/// The largest finite value of a float dtype (complex: of its parts).
pub fn float_max(dtype: DType) -> f64 {
    match dtype.to_real() {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

/// The element type `c10::checked_convert` names (not the TypeMeta name).
fn checked_name(dtype: DType) -> &'static str {
    match dtype {
        DType::U8 => "uint8_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int",
        DType::I64 => "int64_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
        DType::F16 => "c10::Half",
        DType::BF16 => "c10::BFloat16",
        DType::C64 => "c10::complex<float>",
        _ => "float",
    }
}

/// A float as C++'s `ostream << double` writes it in CPU's messages (six
/// significant digits, `%g`): `-1`, `0.5`, `3e+38`.
pub fn streamed(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let trim = |s: &str| s.contains('.').then(|| s.trim_end_matches('0').trim_end_matches('.').to_string());
    if x == 0.0 || (-4..6).contains(&exp) {
        let fixed = format!("{x:.*}", (5 - exp.min(5)).max(0) as usize);
        return trim(&fixed).unwrap_or(fixed);
    }
    let mantissa = trim(mantissa).unwrap_or_else(|| mantissa.to_string());
    format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

#[cfg(test)]
mod tests {
    use super::streamed;

    #[test]
    fn floats_read_as_cpus_messages_print_them() {
        let cases =
            [(-1.0, "-1"), (0.5, "0.5"), (3e38, "3e+38"), (0.0, "0"), (123456.7, "123457"), (1234567.0, "1.23457e+06")];
        for (x, s) in cases {
            assert_eq!(streamed(x), s);
        }
        assert_eq!(streamed(1e-5), "1e-05");
        assert_eq!(streamed(f64::NAN), "nan");
    }
}
