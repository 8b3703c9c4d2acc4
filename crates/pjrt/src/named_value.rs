//! `PJRT_NamedValue`: the typed key/value pairs of client options and plugin attributes.

use std::os::raw::c_char;

use crate::ffi::{self, Args};
use crate::sys;

#[derive(Clone, Debug, PartialEq)]
pub enum NamedValue {
    Str(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f32),
    Bool(bool),
}

impl NamedValue {
    /// The C form of `name = self`, borrowing both.
    pub(crate) fn to_raw(&self, name: &str) -> sys::PJRT_NamedValue {
        let mut raw = sys::PJRT_NamedValue::zeroed();
        raw.name = name.as_ptr().cast::<c_char>();
        raw.name_size = name.len();
        raw.value_size = 1;
        match self {
            NamedValue::Str(s) => {
                raw.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kString;
                raw.__bindgen_anon_1.string_value = s.as_ptr().cast::<c_char>();
                raw.value_size = s.len();
            }
            NamedValue::Int64(v) => {
                raw.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
                raw.__bindgen_anon_1.int64_value = *v;
            }
            NamedValue::Int64List(v) => {
                raw.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64List;
                raw.__bindgen_anon_1.int64_array_value = v.as_ptr();
                raw.value_size = v.len();
            }
            NamedValue::Float(v) => {
                raw.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kFloat;
                raw.__bindgen_anon_1.float_value = *v;
            }
            NamedValue::Bool(v) => {
                raw.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kBool;
                raw.__bindgen_anon_1.bool_value = *v;
            }
        }
        raw
    }

    /// Copies a value returned by the plugin; `None` for a type newer than our header.
    ///
    /// # Safety
    /// `raw`'s pointers must be valid for their sizes.
    pub(crate) unsafe fn from_raw(raw: &sys::PJRT_NamedValue) -> Option<(String, NamedValue)> {
        let name = unsafe { ffi::string(raw.name, raw.name_size) };
        // SAFETY: `type_` says which union member is set.
        let value = unsafe {
            let v = &raw.__bindgen_anon_1;
            match raw.type_ {
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kString => {
                    NamedValue::Str(ffi::string(v.string_value, raw.value_size))
                }
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64 => NamedValue::Int64(v.int64_value),
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64List => {
                    NamedValue::Int64List(ffi::slice(v.int64_array_value, raw.value_size).to_vec())
                }
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kFloat => NamedValue::Float(v.float_value),
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kBool => NamedValue::Bool(v.bool_value),
                _ => return None,
            }
        };
        Some((name, value))
    }
}
