//! Operator arguments as lowerings see them (the boundary decodes them from
//! the adapter's C structs).
use std::any::Any;

use crate::ir::dtype::DType;
use crate::ir::view::View;
use crate::ir::Ty;

/// What a lowering sees of a tensor's storage (the runtime's storages are
/// these): its size, and the type of its current value, which the program
/// takes as an input.
pub trait Backing: Any + Sync {
    fn nbytes(&self) -> i64;
    /// None while it was never written (its bytes read as zeros).
    fn value_ty(&self) -> Option<Ty>;
}

/// A tensor argument: a tpu view of a storage, or a CPU tensor.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    pub storage: Option<&'a dyn Backing>,
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
    /// A complex number: real and imaginary parts.
    Complex(f64, f64),
    Bool(bool),
    Ints(&'a [i64]),
    Floats(&'a [f64]),
    Bools(Vec<bool>),
    Str(&'a str),
    Seed(u64),
    Other,
}
