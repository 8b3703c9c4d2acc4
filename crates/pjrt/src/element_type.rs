//! Element types of buffers, and their `PJRT_Buffer_Type` codes.

use crate::error::Error;
use crate::sys;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

/// Each type with its C code and its size in bytes.
const TABLE: [(ElementType, sys::PJRT_Buffer_Type, usize); 15] = [
    (ElementType::Pred, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED, 1),
    (ElementType::S8, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S8, 1),
    (ElementType::S16, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S16, 2),
    (ElementType::S32, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S32, 4),
    (ElementType::S64, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S64, 8),
    (ElementType::U8, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U8, 1),
    (ElementType::U16, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U16, 2),
    (ElementType::U32, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U32, 4),
    (ElementType::U64, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U64, 8),
    (ElementType::F16, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F16, 2),
    (ElementType::BF16, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16, 2),
    (ElementType::F32, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F32, 4),
    (ElementType::F64, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F64, 8),
    (ElementType::C64, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C64, 8),
    (ElementType::C128, sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C128, 16),
];

impl ElementType {
    /// Bytes per element (PRED is one byte).
    pub fn byte_size(self) -> usize {
        TABLE[self as usize].2
    }
}

impl From<ElementType> for sys::PJRT_Buffer_Type {
    fn from(ty: ElementType) -> Self {
        TABLE[ty as usize].1
    }
}

impl TryFrom<sys::PJRT_Buffer_Type> for ElementType {
    type Error = Error;

    fn try_from(code: sys::PJRT_Buffer_Type) -> Result<Self, Error> {
        TABLE.iter().find(|(_, c, _)| *c == code).map(|(ty, _, _)| *ty).ok_or_else(|| {
            Error::new(
                sys::PJRT_Error_Code_PJRT_Error_Code_UNIMPLEMENTED,
                format!("unsupported PJRT_Buffer_Type {code}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_indexed_by_discriminant_and_round_trips() {
        for (i, (ty, code, _)) in TABLE.iter().enumerate() {
            assert_eq!(*ty as usize, i);
            assert_eq!(ElementType::try_from(*code).unwrap(), *ty);
        }
        assert!(ElementType::try_from(sys::PJRT_Buffer_Type_PJRT_Buffer_Type_INVALID).is_err());
    }
}
