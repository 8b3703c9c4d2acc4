//! Collectives as XLA programs replicated over a group's devices (DESIGN §9):
//! the transport of torch.distributed where XLA's collectives reach every
//! member (NCCL inside the program on GPUs, ICI on TPUs), and of several
//! devices in one process.
//!
//! One program per collective, shape, dtype and group, replicated over the
//! group's devices in rank order. Each local member's input is read as a
//! whole (running what fused mode recorded: a rank's own programs never
//! hold a cross-rank op), and each result becomes its output's new value.
//! Reductions gloo and NCCL lack as one op are composed around it: AVG
//! divides the sum by the group's size, PREMUL_SUM scales before summing.
//!
//! Where the device's memory is the host's (the CPU plugin), gloo works in
//! place on a tensor's buffer when nothing else can see it (`host_alias`).
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exec;
use crate::exec::trace::Reason;
use crate::ir::dtype::DType;
use crate::ir::{Collective, Graph, Op, ReduceKind, Ty, V};
use crate::lower::args::Tensor;
use crate::metrics::{bump, METRICS};
use crate::runtime::storage::{DeviceBuffer, Value};
use crate::runtime::{self, cache, event};

/// One collective call, as the c10d backend describes it.
pub struct Call<'a> {
    /// "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
    /// "broadcast" or "permute".
    pub kind: &'a str,
    /// The reduction: "sum", "product", "max", "min", "avg" or "premul_sum".
    pub op: &'a str,
    /// PREMUL_SUM's factor.
    pub scale: f64,
    /// broadcast's source rank.
    pub root: i64,
    /// permute's (source, target) rank pairs.
    pub pairs: Vec<(i64, i64)>,
    /// Global device ids of the group, in rank order.
    pub devices: &'a [i64],
}

fn reduce_kind(op: &str, dtype: DType) -> Result<ReduceKind> {
    Ok(match op {
        "sum" | "avg" | "premul_sum" => ReduceKind::Sum,
        "product" => ReduceKind::Prod,
        "max" if dtype == DType::Bool => ReduceKind::Or,
        "min" if dtype == DType::Bool => ReduceKind::And,
        "max" => ReduceKind::Max,
        "min" => ReduceKind::Min,
        _ => return Err(Error::value(format!("torchtpu: reduce op {op} is not supported by tpu collectives"))),
    })
}

/// The program of one replica: its input (of `input`'s type) to its output.
fn graph(call: &Call, input: &Ty, output: &Ty) -> Result<Graph> {
    let n = call.devices.len() as i64;
    let dtype = input.dtype;
    let mut g = Graph::default();
    let mut x = g.param(input.clone());
    let collective = |g: &mut Graph, kind, x: V, ty: Ty| g.push(Op::Collective { kind, replicas: n }, vec![x], ty);
    let out = match call.kind {
        "all_reduce" | "reduce_scatter" => {
            let kind = reduce_kind(call.op, dtype)?;
            if call.op == "premul_sum" {
                let factor = g.full(call.scale, dtype, &input.shape);
                x = g.binary("stablehlo.multiply", x, factor);
            }
            let c =
                if call.kind == "all_reduce" { Collective::AllReduce(kind) } else { Collective::ReduceScatter(kind) };
            let reduced = collective(&mut g, c, x, output.clone());
            if call.op == "avg" {
                let size = g.full(n as f64, dtype, &output.shape);
                g.binary("stablehlo.divide", reduced, size)
            } else {
                reduced
            }
        }
        "all_gather" => collective(&mut g, Collective::AllGather, x, output.clone()),
        "all_to_all" => collective(&mut g, Collective::AllToAll, x, output.clone()),
        "broadcast" => {
            let rows = input.shape.first().copied().unwrap_or(1);
            let mut shape = input.shape.clone();
            if shape.is_empty() {
                shape.push(1);
                x = g.reshape(x, &shape);
            }
            shape[0] *= n;
            let all = collective(&mut g, Collective::AllGather, x, Ty::new(dtype, &shape));
            let mine = g.slice_dim(all, 0, call.root * rows, (call.root + 1) * rows, 1);
            g.reshape(mine, &output.shape)
        }
        "permute" => collective(&mut g, Collective::Permute(call.pairs.clone()), x, output.clone()),
        other => return Err(Error::value(format!("torchtpu: unknown collective {other}"))),
    };
    g.outputs = vec![out];
    Ok(g)
}

/// Runs `call` for the group's local members: `inputs[i]` and `outputs[i]`
/// belong to the i-th of the group's devices that this process holds.
pub fn run(call: &Call, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
    let rt = runtime::get()?;
    let local: Vec<usize> = inputs.iter().map(|t| t.device.unwrap_or(usize::MAX)).collect();
    let ids: Vec<i64> = local.iter().map(|&d| rt.device(d).map(|d| d.id() as i64)).collect::<Result<_>>()?;
    let addressable: Vec<i64> = call.devices.iter().copied().filter(|id| ids.contains(id)).collect();
    if outputs.len() != inputs.len() || ids != addressable {
        return Err(Error::value(format!(
            "torchtpu: a collective over devices {:?} needs one input and one output on each local one, in that order; \
             got inputs on {ids:?} and {} output(s)",
            call.devices,
            outputs.len()
        )));
    }
    let (Some(first), Some(out)) = (inputs.first(), outputs.first()) else { return Ok(()) };
    let (input_ty, output_ty) = (first.ty(), out.ty());
    let devices: Vec<i32> = call.devices.iter().map(|&d| d as i32).collect();
    let program = cache::compile_on(&graph(call, &input_ty, &output_ty)?, call.kind, Some(&devices))?;
    let buffers: Vec<Arc<DeviceBuffer>> = inputs
        .iter()
        .zip(&local)
        .map(|(t, &d)| {
            if t.ty() != input_ty {
                return Err(Error::value(format!(
                    "torchtpu: a collective's local inputs differ: {:?} and {:?}",
                    input_ty,
                    t.ty()
                )));
            }
            exec::contiguous(t, d, true)
        })
        .collect::<Result<_>>()?;
    let args: Vec<Vec<&pjrt::Buffer>> = buffers.iter().map(|b| vec![&*b.buf]).collect();
    let results = program.exe.execute_replicated(&args).map_err(|e| exec::launch_error(e, call.kind, local[0]))?;
    bump(&METRICS.executions);
    bump(&METRICS.collectives);
    for ((result, out), &device) in results.into_iter().zip(outputs).zip(&local) {
        let buf = DeviceBuffer::new(result.into_iter().next().expect("one output"), output_ty.clone(), device);
        event::track(std::slice::from_ref(&buf))?;
        exec::assign(buf, out, device)?;
    }
    Ok(())
}

/// What a host library (gloo) does with a tensor's memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads it and writes the result in its place.
    ReadWrite,
    /// Only reads it.
    Read,
    /// Overwrites all of it without reading it.
    Write,
}

impl Access {
    pub fn parse(name: &str) -> Result<Access> {
        match name {
            "read_write" => Ok(Access::ReadWrite),
            "read" => Ok(Access::Read),
            "write" => Ok(Access::Write),
            _ => Err(Error::value(format!("torchtpu: unknown host access {name:?}"))),
        }
    }
}

/// The host address of `t`'s elements, for gloo to work on in place, where
/// the device's memory is the host's. Only when `t` covers its whole storage;
/// then, by `access`:
/// - `Read`: its computed buffer (after the computations issued so far,
///   which may still be writing it);
/// - `ReadWrite`: the same, if the storage alone holds it (so no other
///   tensor, trace or plan sees the write);
/// - `Write`: that buffer where `ReadWrite` would take it and it is already
///   computed, else a new uninitialized buffer made the storage's value
///   (what it held before is not read).
///
/// None where that does not hold: the caller copies.
pub fn host_alias(t: &Tensor, access: Access) -> Result<Option<usize>> {
    let Some(storage) = exec::storage_of(&t) else { return Ok(None) };
    if !t.view().is_whole(storage.nbytes / t.dtype.size() as i64) {
        return Ok(None);
    }
    if access != Access::Write {
        // Computing a pending value leaves the storage its only holder.
        drop(exec::storage_buffer(storage, Reason::HostRead)?);
    }
    if let Some(Value::Ready(buf)) = storage.value() {
        // Two holders: the storage's slot and `buf` here.
        let alone = Arc::strong_count(&buf) == 2;
        if buf.ty.dtype == t.dtype && buf.padded.is_none() && (access == Access::Read || alone) {
            if let Some(address) = buf.buf.host_address() {
                exec::synchronize()?;
                return Ok(Some(address as usize));
            }
        }
    }
    if access != Access::Write {
        return Ok(None);
    }
    let (rt, device) = (runtime::get()?, t.device.unwrap_or(0));
    let raw = rt.client.uninitialized_buffer(t.dtype.element_type(), t.sizes, rt.device(device)?)?;
    let Some(address) = raw.host_address() else { return Ok(None) };
    // Issued work may still read the storage's old value, never this buffer.
    storage.set(Value::Ready(DeviceBuffer::new(raw, Ty::new(t.dtype, t.sizes), device)));
    Ok(Some(address as usize))
}
