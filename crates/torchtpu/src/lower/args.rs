//! Operator arguments as the core sees them, decoded from the adapter's C
//! structs (`csrc/ffi.h`).
use std::ffi::{c_char, c_void, CStr};

use crate::dtype::DType;
use crate::error::Result;
use crate::ir::Ty;
use crate::storage::Storage;
use crate::view::View;

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
}

/// A tensor argument: a tpu view of a storage, or a CPU tensor.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    pub storage: Option<&'a Storage>,
    pub host: *const u8,
    pub sizes: &'a [i64],
    pub strides: &'a [i64],
    pub offset: i64,
    pub dtype: DType,
    /// tpu device index; None for a CPU tensor.
    pub device: Option<usize>,
    pub wrapped: bool,
}

impl<'a> Tensor<'a> {
    pub fn ty(&self) -> Ty {
        Ty::new(self.dtype, self.sizes)
    }
    pub fn view(&self) -> View<'a> {
        View { sizes: self.sizes, strides: self.strides, offset: self.offset, dtype: self.dtype }
    }
    pub fn numel(&self) -> i64 {
        self.sizes.iter().product()
    }
    /// Bytes of the view's elements on the host (CPU tensors only).
    pub fn host_bytes(&self) -> &'a [u8] {
        let n = self.numel() as usize * self.dtype.size();
        if n == 0 {
            return &[];
        }
        // SAFETY: the adapter passes contiguous CPU tensors that outlive the call.
        unsafe { std::slice::from_raw_parts(self.host, n) }
    }
}

impl Tensor<'_> {
    /// The view's elements on the host in row-major order (CPU tensors,
    /// whose `host` points at the view's first element).
    pub fn host_elements(&self) -> Vec<u8> {
        let size = self.dtype.size();
        let mut out = Vec::with_capacity(self.numel() as usize * size);
        if self.numel() == 0 {
            return out;
        }
        let mut at = vec![0i64; self.sizes.len()];
        loop {
            let offset: i64 = at.iter().zip(self.strides).map(|(i, s)| i * s).sum();
            // SAFETY: the element lies within the CPU tensor, which outlives the call.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(self.host.offset(offset as isize * size as isize), size)
            });
            let mut d = self.sizes.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                at[d] += 1;
                if at[d] < self.sizes[d] {
                    break;
                }
                at[d] = 0;
            }
        }
    }
}

#[derive(Clone)]
pub enum Arg<'a> {
    None,
    Tensor(Tensor<'a>),
    Tensors(Vec<Option<Tensor<'a>>>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(&'a [i64]),
    Floats(&'a [f64]),
    Bools(Vec<bool>),
    Str(&'a str),
    Seed(u64),
    Other,
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
        storage: (!t.storage.is_null()).then(|| Storage::from_handle(t.storage)),
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
        _ => Arg::None,
    })
}
