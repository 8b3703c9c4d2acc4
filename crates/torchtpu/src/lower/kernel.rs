//! `torchtpu::kernel(int kernel, Tensor[] inputs) -> Tensor[]`: a call of a
//! registered external kernel (`ir/kernel.rs`) on tpu tensors; the front end's
//! `differentiable_kernel` (the same call, with autograd) lowers the same.
use super::{op, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[op("torchtpu::kernel", call), op("torchtpu::differentiable_kernel", call)];

fn call(cx: &mut Cx) -> Result<Vec<V>> {
    let kernel = crate::ir::kernel::get(cx.int("kernel")?)?;
    let metas = cx.metas("inputs")?;
    let given: Vec<_> = metas.iter().map(|t| t.map(|t| t.ty())).collect();
    let expected: Vec<_> = kernel.inputs.iter().cloned().map(Some).collect();
    if given != expected {
        return Err(Error::value(format!(
            "kernel {} was lowered for inputs {:?}, called with {:?}",
            kernel.name, kernel.inputs, given
        )));
    }
    let args = cx.tensors("inputs")?.into_iter().flatten().collect::<Vec<_>>();
    Ok(cx.g.call(&kernel, &args))
}
