//! Element types and PyTorch's type-promotion rules (one place for all ops).
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
    U32,
    U64,
    /// complex64 and complex128: stored and moved like any dtype; only the
    /// lowerings that declare complex support accept them (`Entry::complex`).
    C64,
    C128,
    /// complex32: storage only. Its values move as 32-bit words (copies,
    /// views); every op on it runs on the CPU (the adapter routes it there),
    /// since XLA has no complex32.
    C32,
    /// The float8 types (e5m2, e4m3fn, e5m2fnuz, e4m3fnuz): storage only,
    /// as complex32, their values moved as bytes; every op on them, and every
    /// conversion, runs on the CPU (counted).
    F8E5M2,
    F8E4M3FN,
    F8E5M2FNUZ,
    F8E4M3FNUZ,
}

use DType::*;

/// The default floating dtype (`torch.get_default_dtype()` is float32 unless changed).
pub const DEFAULT_FLOAT: DType = F32;

impl DType {
    /// The smallest and largest value of bool and the integer types.
    pub fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            Bool => (0, 1),
            U8 => (0, u8::MAX as i128),
            I8 => (i8::MIN as i128, i8::MAX as i128),
            I16 => (i16::MIN as i128, i16::MAX as i128),
            I32 => (i32::MIN as i128, i32::MAX as i128),
            U32 => (0, u32::MAX as i128),
            I64 => (i64::MIN as i128, i64::MAX as i128),
            U64 => (0, u64::MAX as i128),
            _ => return None,
        })
    }

    /// From `c10::ScalarType`'s numbering.
    pub fn from_c10(code: i32) -> Result<DType> {
        Ok(match code {
            0 => U8,
            1 => I8,
            2 => I16,
            3 => I32,
            4 => I64,
            5 => F16,
            6 => F32,
            7 => F64,
            11 => Bool,
            15 => BF16,
            28 => U32,
            29 => U64,
            9 => C64,
            10 => C128,
            8 => C32,
            23 => F8E5M2,
            24 => F8E4M3FN,
            25 => F8E5M2FNUZ,
            26 => F8E4M3FNUZ,
            _ => return Err(Error::type_error(format!("tpu does not support dtype {}", c10_name(code)))),
        })
    }

    pub fn to_c10(self) -> i32 {
        match self {
            U8 => 0,
            I8 => 1,
            I16 => 2,
            I32 => 3,
            I64 => 4,
            F16 => 5,
            F32 => 6,
            F64 => 7,
            Bool => 11,
            BF16 => 15,
            U32 => 28,
            U64 => 29,
            C64 => 9,
            C128 => 10,
            C32 => 8,
            F8E5M2 => 23,
            F8E4M3FN => 24,
            F8E5M2FNUZ => 25,
            F8E4M3FNUZ => 26,
        }
    }

    pub fn size(self) -> usize {
        match self {
            Bool | U8 | I8 | F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ => 1,
            I16 | F16 | BF16 => 2,
            I32 | F32 | U32 | C32 => 4,
            I64 | F64 | U64 | C64 => 8,
            C128 => 16,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, F16 | BF16 | F32 | F64)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, C64 | C128)
    }

    /// Whether constants of this dtype are written as floating-point numbers.
    pub fn has_float_values(self) -> bool {
        self.is_float() || self.is_complex()
    }

    /// The complex dtype with this real part (float16/bfloat16: complex64).
    pub fn to_complex(self) -> DType {
        match self {
            F64 | C128 => C128,
            _ => C64,
        }
    }

    /// The dtype of a complex dtype's parts (others are their own).
    pub fn to_real(self) -> DType {
        match self {
            C64 => F32,
            C128 => F64,
            d => d,
        }
    }

    /// Types XLA does not compute in (complex32, float8): their values only
    /// move; ops on them run on the CPU.
    pub fn is_storage_only(self) -> bool {
        matches!(self, C32 | F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ)
    }

    pub fn is_int(self) -> bool {
        matches!(self, U8 | I8 | I16 | I32 | I64 | U32 | U64)
    }

    pub fn mlir(self) -> &'static str {
        match self {
            Bool => "i1",
            U8 => "ui8",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F16 => "f16",
            BF16 => "bf16",
            F32 => "f32",
            F64 => "f64",
            U32 | C32 => "ui32",
            F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ => "ui8",
            U64 => "ui64",
            C64 => "complex<f32>",
            C128 => "complex<f64>",
        }
    }

    /// From an MLIR element type (complex32 and float8 have none of their own).
    pub fn from_mlir(name: &str) -> Result<DType> {
        [Bool, U8, I8, I16, I32, I64, F16, BF16, F32, F64, U32, U64, C64, C128]
            .into_iter()
            .find(|d| d.mlir() == name)
            .ok_or_else(|| Error::type_error(format!("tpu has no dtype for the element type {name}")))
    }

    pub fn element_type(self) -> pjrt::ElementType {
        use pjrt::ElementType as E;
        match self {
            Bool => E::Pred,
            U8 => E::U8,
            I8 => E::S8,
            I16 => E::S16,
            I32 => E::S32,
            I64 => E::S64,
            F16 => E::F16,
            BF16 => E::BF16,
            F32 => E::F32,
            F64 => E::F64,
            U32 | C32 => E::U32,
            F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ => E::U8,
            U64 => E::U64,
            C64 => E::C64,
            C128 => E::C128,
        }
    }

    /// PyTorch's name, as error messages print it.
    pub fn torch_name(self) -> &'static str {
        c10_name(self.to_c10())
    }
}

fn c10_name(code: i32) -> &'static str {
    const NAMES: [&str; 30] = [
        "Byte",
        "Char",
        "Short",
        "Int",
        "Long",
        "Half",
        "Float",
        "Double",
        "ComplexHalf",
        "ComplexFloat",
        "ComplexDouble",
        "Bool",
        "QInt8",
        "QUInt8",
        "QInt32",
        "BFloat16",
        "QUInt4x2",
        "QUInt2x4",
        "Bits1x8",
        "Bits2x4",
        "Bits4x2",
        "Bits8",
        "Bits16",
        "Float8_e5m2",
        "Float8_e4m3fn",
        "Float8_e5m2fnuz",
        "Float8_e4m3fnuz",
        "UInt16",
        "UInt32",
        "UInt64",
    ];
    NAMES.get(code as usize).copied().unwrap_or("this dtype")
}

/// `c10::promoteTypes` restricted to the supported dtypes.
pub fn promote(a: DType, b: DType) -> DType {
    if a == b {
        return a;
    }
    if a.is_complex() || b.is_complex() {
        return promote(a.to_real(), b.to_real()).to_complex();
    }
    if a.is_float() || b.is_float() {
        return match (a.is_float(), b.is_float()) {
            (true, false) => a,
            (false, true) => b,
            _ if matches!((a, b), (F16, BF16) | (BF16, F16)) => F32,
            _ => a.max(b),
        };
    }
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        (U8, I8) | (I8, U8) => I16,
        (U8, x) | (x, U8) => x,
        _ => a.max(b),
    }
}

/// How an operand takes part in `at::result_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Priority {
    /// A tensor with at least one dimension.
    Dim,
    /// A zero-dimensional tensor.
    ZeroDim,
    /// A Python number: a `Scalar` argument or a wrapped-number tensor.
    Wrapped,
}

/// `at::result_type` over operands given as (dtype, priority).
pub fn result_type(operands: &[(DType, Priority)]) -> DType {
    let mut state: [Option<DType>; 3] = [None; 3];
    for &(dtype, priority) in operands {
        let (slot, dtype) = match priority {
            Priority::Dim => (0, dtype),
            Priority::ZeroDim => (1, dtype),
            Priority::Wrapped => (
                2,
                if dtype.is_float() {
                    DEFAULT_FLOAT
                } else if dtype.is_complex() {
                    C64
                } else {
                    dtype
                },
            ),
        };
        state[slot] = Some(state[slot].map_or(dtype, |d| promote(d, dtype)));
    }
    let lower = combine(state[1], state[2]);
    combine(state[0], lower).unwrap_or(DEFAULT_FLOAT)
}

fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(l)) => {
            if h.is_complex() || h.is_float() && !l.is_complex() {
                Some(h)
            } else if h == Bool || l.is_float() || l.is_complex() {
                Some(promote(h, l))
            } else {
                Some(h)
            }
        }
    }
}

/// `c10::canCast`: no complex to non-complex, no float to integral, no
/// non-bool to bool.
pub fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_complex() && !to.is_complex() || from.is_float() && !to.has_float_values() || from != Bool && to == Bool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_matches_pytorch() {
        assert_eq!(promote(U8, I8), I16);
        assert_eq!(promote(F16, BF16), F32);
        assert_eq!(promote(I64, F16), F16);
        assert_eq!(promote(Bool, I32), I32);
        // int tensor + float scalar -> default float; float16 tensor + float scalar stays.
        assert_eq!(result_type(&[(I64, Priority::Dim), (F64, Priority::Wrapped)]), F32);
        assert_eq!(result_type(&[(F16, Priority::Dim), (F64, Priority::Wrapped)]), F16);
        // zero-dim tensors do not promote within a category.
        assert_eq!(result_type(&[(F32, Priority::Dim), (F64, Priority::ZeroDim)]), F32);
        assert_eq!(result_type(&[(I32, Priority::Dim), (F64, Priority::ZeroDim)]), F64);
        assert_eq!(result_type(&[(Bool, Priority::Dim), (I64, Priority::Wrapped)]), I64);
    }
}

/// float16/bfloat16 are computed in float32 (PyTorch's "opmath" type).
pub fn opmath(dtype: DType) -> DType {
    if matches!(dtype, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dtype
    }
}
