//! The adapter's marshalled arguments (`TtArg`, `TtTensor` in `csrc/ffi.h`)
//! decoded into the arguments lowerings see.
use std::ffi::{c_char, c_void, CStr};

use crate::error::Result;
use crate::ir::dtype::DType;
use crate::lower::args::{Arg, Tensor};
use crate::runtime::storage::Storage;

#[repr(C)]
pub struct TtTensor {
    pub storage: *mut c_void,
    pub host: *const c_void,
    pub sizes: *const i64,
    pub strides: *const i64,
    pub offset: i64,
    pub ndim: i32,
    pub dtype: i32,
    pub device: i32,
    pub wrapped_number: u8,
    pub defined: u8,
}

#[repr(C)]
pub struct TtArg {
    pub kind: i32,
    pub i: i64,
    pub f: f64,
    pub tensors: *const TtTensor,
    pub ints: *const i64,
    pub floats: *const f64,
    pub len: i64,
    pub str: *const c_char,
    pub imag: f64,
}

/// `n` elements at `p` (none when `p` is null).
///
/// # Safety
/// `p` points to `n` live elements, or is null.
pub unsafe fn slice<'a, T>(p: *const T, n: i64) -> &'a [T] {
    if n <= 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p, n as usize)
    }
}

/// # Safety
/// `t` comes from the adapter and its pointers are valid for the call.
pub unsafe fn tensor<'a>(t: &'a TtTensor) -> Result<Option<Tensor<'a>>> {
    if t.defined == 0 {
        return Ok(None);
    }
    Ok(Some(Tensor {
        storage: (!t.storage.is_null()).then(|| Storage::from_handle(t.storage) as _),
        host: t.host as *const u8,
        sizes: slice(t.sizes, t.ndim as i64),
        strides: slice(t.strides, t.ndim as i64),
        offset: t.offset,
        dtype: DType::from_c10(t.dtype)?,
        device: (t.device >= 0).then_some(t.device as usize),
        wrapped: t.wrapped_number != 0,
    }))
}

/// # Safety
/// `a` comes from the adapter and its pointers are valid for the call.
pub unsafe fn decode<'a>(a: &'a TtArg) -> Result<Arg<'a>> {
    Ok(match a.kind {
        1 => tensor(&*a.tensors)?.map_or(Arg::None, Arg::Tensor),
        2 => Arg::Tensors(slice(a.tensors, a.len).iter().map(|t| tensor(t)).collect::<Result<_>>()?),
        3 => Arg::Int(a.i),
        4 => Arg::Float(a.f),
        5 => Arg::Bool(a.i != 0),
        6 => Arg::Ints(slice(a.ints, a.len)),
        7 => Arg::Floats(slice(a.floats, a.len)),
        8 => Arg::Bools(slice(a.ints, a.len).iter().map(|&b| b != 0).collect()),
        9 => Arg::Str(CStr::from_ptr(a.str).to_str().unwrap_or("")),
        10 => Arg::Seed(a.i as u64),
        11 => Arg::Other,
        12 => Arg::Complex(a.f, a.imag),
        _ => Arg::None,
    })
}
