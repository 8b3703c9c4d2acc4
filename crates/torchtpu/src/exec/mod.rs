//! Execution: running operators in the three modes. This file holds the
//! per-signature plans every mode shares, the per-op path of strict and
//! debug modes, program inputs, and copies between views and the host.
//! Fused mode records plans into a [`trace`], whose flushed program
//! [`simplify`] rewrites and [`bounded`] compiles per bucket of a changing
//! size, on the flush thread of [`overlap`]; torch.compile's graphs are
//! [`compiled`] plans. This layer uses the op table, the IR and the runtime.
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock, Weak};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::{Precision, Ty};
use crate::lower::args::{Arg, Backing, Tensor};
use crate::lower::{self, Cx, Input, OpDef};
use crate::metrics::{add, bump, METRICS};
use crate::runtime::cache::{self, Program};
use crate::runtime::storage::{DeviceBuffer, Storage, Value};
use crate::runtime::{self, event};
use trace::Reason;

pub mod advice;
pub mod bounded;
pub mod compiled;
pub mod overlap;
pub mod simplify;
pub mod trace;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each op compiled alone and run synchronously, results checked.
    Debug = 0,
    /// Each op compiled alone (cached per signature), run asynchronously.
    Strict = 1,
    /// Ops recorded into a trace, flushed as one program (see `trace`).
    Fused = 2,
}

static MODE: AtomicU8 = AtomicU8::new(Mode::Fused as u8);

pub fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        0 => Mode::Debug,
        1 => Mode::Strict,
        _ => Mode::Fused,
    }
}

pub fn set_mode(name: &str) -> Result<()> {
    let m = match name {
        "debug" => Mode::Debug,
        "strict" => Mode::Strict,
        "fused" => Mode::Fused,
        _ => {
            return Err(Error::value(format!("torchtpu: unknown mode '{name}'; expected 'fused', 'strict' or 'debug'")))
        }
    };
    // What was recorded so far runs under the mode that recorded it.
    trace::flush(Reason::Mode)?;
    MODE.store(m as u8, Ordering::Relaxed);
    Ok(())
}

pub fn mode_name() -> &'static str {
    match mode() {
        Mode::Debug => "debug",
        Mode::Strict => "strict",
        Mode::Fused => "fused",
    }
}

/// An operator signature lowered once: its graph (whose parameters are
/// `inputs`) and, once some mode runs it alone, its compiled program.
pub struct Plan {
    pub name: String,
    /// The tensor arguments' types, for explanations.
    arg_types: Vec<Ty>,
    pub graph: crate::ir::Graph,
    /// Its graph's product FLOPs, for where fused mode cuts a step in parts.
    pub flops: u64,
    pub inputs: Vec<Input>,
    /// The op's defined results (the first `outputs.len()` graph outputs
    /// hold them flat).
    pub outputs: Vec<Ty>,
    /// Those graph outputs' flat types, as recorded results share them.
    pub stored: Vec<Arc<Ty>>,
    /// Per result, its strides where it is stored in a permuted order (an
    /// elementwise op's over a channels-last operand); None: contiguous.
    pub layouts: Vec<Option<Vec<i64>>>,
    /// Positions of undefined results among the lowering's results (the
    /// graph computes only the others).
    undefined: Vec<usize>,
    /// Data-dependent errors, with graph output indices for their flag and value.
    pub checks: Vec<lower::Check>,
    /// Buffers behind `Input::Constant`s.
    pub constants: Vec<Arc<DeviceBuffer>>,
    /// Built for sizes measured on the device (`nonzero`'s count).
    measured: bool,
    /// A compiled graph's (`Plan::new`), not one op's: a program of its own
    /// even where it is all a step does.
    pub compiled: bool,
    /// Run alone (strict, debug): its programs, one per padding of its inputs.
    alone: Mutex<Vec<Alone>>,
}

/// How a plan runs alone for one padding of its inputs: in its bucket, where
/// plans of its structure differ in sizes or offsets (a prefix `pe[:L]`, a
/// window sliding over a tensor, what follows a `nonzero`), so that one
/// program serves a bucket's plans; else as it is.
struct Alone {
    padded: Vec<Option<Vec<i64>>>,
    bucket: Option<Arc<bounded::Bucketed>>,
    /// Owned by the cache, which may evict it.
    program: Weak<Program>,
}

fn stored_types(g: &crate::ir::Graph, results: usize) -> Vec<Arc<Ty>> {
    g.outputs[..results].iter().map(|&out| Arc::new(g.ty(out).clone())).collect()
}

impl Plan {
    /// A plan built elsewhere than by a lowering (a compiled graph's).
    pub fn new(
        name: String,
        graph: crate::ir::Graph,
        inputs: Vec<Input>,
        outputs: Vec<Ty>,
        checks: Vec<lower::Check>,
        constants: Vec<Arc<DeviceBuffer>>,
    ) -> Plan {
        Plan {
            name,
            arg_types: Vec::new(),
            flops: graph.product_flops(),
            stored: stored_types(&graph, outputs.len()),
            layouts: vec![None; outputs.len()],
            graph,
            inputs,
            outputs,
            undefined: Vec::new(),
            checks,
            constants,
            measured: false,
            compiled: true,
            alone: Mutex::new(Vec::new()),
        }
    }

    /// Its program for inputs `held` (padded where bucketed programs made
    /// them), and the bucket it runs in.
    fn alone(&self, held: &[Arc<DeviceBuffer>]) -> Result<(Arc<Program>, Option<Arc<bounded::Bucketed>>)> {
        let mut alone = self.alone.lock().unwrap();
        let same = |a: &Alone| a.padded.iter().zip(held).all(|(p, b)| p.as_deref() == b.padded.as_deref());
        let i = match alone.iter().position(same) {
            Some(i) => i,
            None => {
                let padded: Vec<Option<&[i64]>> = held.iter().map(|b| b.padded.as_deref()).collect();
                let bucket = bounded::enabled().then(|| bounded::per_op(&self.graph, &padded, self.measured)).flatten();
                let padded = padded.iter().map(|p| p.map(<[i64]>::to_vec)).collect();
                alone.push(Alone { padded, bucket: bucket.map(Arc::new), program: Weak::new() });
                alone.len() - 1
            }
        };
        let a = &mut alone[i];
        if let Some(p) = a.program.upgrade() {
            p.touch();
            return Ok((p, a.bucket.clone()));
        }
        if let Some(b) = &a.bucket {
            match cache::compile(&b.graph, &self.name) {
                Ok(p) => {
                    a.program = Arc::downgrade(&p);
                    return Ok((p, a.bucket.clone()));
                }
                // A bucket XLA cannot compile runs as it is.
                Err(e) => {
                    bounded::refused(&format!("XLA: {}", e.message.lines().next().unwrap_or_default()));
                    a.bucket = None;
                }
            }
        }
        let p = cache::compile(&self.graph, &self.name)?;
        a.program = Arc::downgrade(&p);
        Ok((p, None))
    }

    /// `aten::mm(f32[2, 3], f32[3, 4]) -> f32[2, 4]`, for explanations.
    pub fn describe(&self) -> String {
        let tys =
            |t: &[Ty]| t.iter().map(|t| format!("{}{:?}", t.dtype.mlir(), t.shape)).collect::<Vec<_>>().join(", ");
        format!("{}({}) -> {}", self.name, tys(&self.arg_types), tys(&self.outputs))
    }
}

type Key = Vec<u64>;

/// FxHash: keys here are short runs of integers on the per-op path, where
/// SipHash's DoS resistance buys nothing.
#[derive(Default)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Whole words read as they are (a key is a run of u64s): copying
        // each through a buffer of the chunk's length cost a call per word.
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.write_u64(u64::from_le_bytes(word.try_into().unwrap()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

static PLANS: LazyLock<RwLock<FxMap<Key, Arc<Plan>>>> = LazyLock::new(Default::default);

/// The cache key of a call: the op (or compiled graph) `id` and everything
/// its program depends on, never the values of `runtime` operands.
pub fn signature(id: u64, runtime: impl Fn(usize) -> bool, args: &[Arg]) -> Key {
    let mut key = Vec::with_capacity(64);
    write_signature(&mut key, id, runtime, args);
    key
}

/// `signature`, appended to `key`.
fn write_signature(key: &mut Key, id: u64, runtime: impl Fn(usize) -> bool, args: &[Arg]) {
    key.push(id);
    // The storages met so far, in a list kept per thread (no allocation per call).
    thread_local!(static STORAGES: std::cell::RefCell<Vec<*const Storage>> = const { std::cell::RefCell::new(Vec::new()) });
    STORAGES.with_borrow_mut(|storages| {
        storages.clear();
        let mut tensor = |key: &mut Key, t: &Option<Tensor>| {
            let Some(t) = t else { return key.push(0) };
            key.extend([
                1,
                t.dtype as u64,
                t.device.map_or(u64::MAX, |d| d as u64),
                t.wrapped as u64,
                t.sizes.len() as u64,
            ]);
            key.extend(t.sizes.iter().map(|&s| s as u64));
            if t.device.is_none() {
                return;
            }
            key.extend(t.strides.iter().map(|&s| s as u64));
            key.push(t.offset as u64);
            match storage_of(&t) {
                None => key.push(u64::MAX),
                Some(s) => {
                    // Aliasing decides the program's parameters: which earlier tensor shares the storage.
                    let p = s as *const Storage;
                    let first = storages.iter().position(|&q| q == p).unwrap_or(storages.len());
                    storages.push(p);
                    key.push(first as u64);
                    key.push(s.nbytes as u64);
                    match s.value() {
                        None => key.push(u64::MAX - 1),
                        Some(v) => {
                            let ty = v.ty();
                            key.push(ty.dtype as u64);
                            key.extend(ty.shape.iter().map(|&d| d as u64));
                            key.push(u64::MAX - 2);
                        }
                    }
                }
            }
        };
        for (i, a) in args.iter().enumerate() {
            let runtime = runtime(i);
            // A runtime number's tag alone; a constant's next tag and its bits.
            let scalar = |key: &mut Key, tag: u64, bits: u64| match runtime {
                true => key.push(tag),
                false => key.extend([tag + 1, bits]),
            };
            match a {
                Arg::None => key.push(100),
                Arg::Tensor(t) => tensor(key, &Some(*t)),
                Arg::Tensors(ts) => {
                    key.extend([102, ts.len() as u64]);
                    for t in ts {
                        tensor(key, t);
                    }
                }
                Arg::Int(v) => scalar(key, 103, *v as u64),
                Arg::Float(f) => scalar(key, 105, f.to_bits()),
                Arg::Complex(re, im) => {
                    scalar(key, 113, re.to_bits());
                    if !runtime {
                        key.push(im.to_bits());
                    }
                }
                Arg::Bool(b) => scalar(key, 107, *b as u64),
                // Data (CTC's lengths): the values are the program's input.
                Arg::Ints(v) if runtime => key.extend([114, v.len() as u64]),
                Arg::Ints(v) => {
                    key.extend([109, v.len() as u64]);
                    key.extend(v.iter().map(|&x| x as u64));
                }
                Arg::Floats(v) => {
                    key.extend([110, v.len() as u64]);
                    key.extend(v.iter().map(|x| x.to_bits()));
                }
                Arg::Bools(v) => {
                    key.extend([111, v.len() as u64]);
                    key.extend(v.iter().map(|&x| x as u64));
                }
                Arg::Str(s) => {
                    key.extend([112, s.len() as u64]);
                    key.extend(s.bytes().map(|b| b as u64));
                }
                Arg::Seed(_) => key.push(113),
                Arg::Other => key.push(114),
            }
        }
    });
}

fn build(
    op: &OpDef,
    lower: lower::Lowering,
    args: &[Arg],
    device: usize,
    sizes: Vec<i64>,
    precision: Precision,
) -> Result<Plan> {
    op.check_complex(args)?;
    let measured = !sizes.is_empty();
    let mut cx = Cx::new(op, args, device, sizes, precision);
    let results = lower(&mut cx)?;
    let undefined = (0..results.len()).filter(|&i| results[i] == lower::UNDEFINED).collect();
    let outputs: Vec<_> = results.into_iter().filter(|&v| v != lower::UNDEFINED).collect();
    let mut g = std::mem::take(&mut cx.g);
    advice::note(&op.name, &g);
    let logical: Vec<Ty> = outputs.iter().map(|&v| g.ty(v).clone()).collect();
    // A result laid out in a permuted order is stored in that order.
    let layouts: Vec<Option<(Vec<i64>, Vec<i64>)>> = logical
        .iter()
        .map(|t| {
            let strides = lower::result_layout(op, args, &t.shape)?;
            let order = crate::ir::view::View { sizes: &t.shape, strides: &strides, offset: 0, dtype: t.dtype }
                .memory_order()?;
            Some((strides, order))
        })
        .collect();
    // Values are stored flat, so that a storage's value type never depends
    // on the shape of the op that wrote it last (a training step recorded
    // twice is the same program, whichever op produced each buffer).
    g.outputs = outputs
        .iter()
        .zip(&layouts)
        .map(|(&v, layout)| {
            let v = layout.as_ref().map_or(v, |(_, order)| g.transpose(v, order));
            g.reshape(v, &[g.ty(v).numel()])
        })
        .collect();
    let mut checks = Vec::new();
    for mut check in std::mem::take(&mut cx.checks) {
        g.outputs.push(check.flag);
        check.flag = g.outputs.len() - 1;
        if let Some(v) = check.value {
            g.outputs.push(v);
            check.value = Some(g.outputs.len() - 1);
        }
        checks.push(check);
    }
    Ok(Plan {
        name: op.name.clone(),
        arg_types: args
            .iter()
            .flat_map(|a| match a {
                Arg::Tensor(t) => vec![t.ty()],
                Arg::Tensors(ts) => ts.iter().flatten().map(|t| t.ty()).collect(),
                _ => vec![],
            })
            .collect(),
        flops: g.product_flops(),
        stored: stored_types(&g, logical.len()),
        layouts: layouts.into_iter().map(|l| l.map(|(strides, _)| strides)).collect(),
        graph: g,
        inputs: cx.inputs,
        outputs: logical,
        undefined,
        checks,
        constants: Vec::new(),
        measured,
        compiled: false,
        alone: Mutex::new(Vec::new()),
    })
}

pub fn plan(op: &OpDef, args: &[Arg], device: usize) -> Result<Arc<Plan>> {
    cached(op, op.entry.lower, args, device, Vec::new(), &[])
}

/// The plan of `lower` for this call, built once per signature (extended
/// by `tag`: the measured sizes, or a mark for the measuring lowering).
fn cached(
    op: &OpDef,
    lower: lower::Lowering,
    args: &[Arg],
    device: usize,
    sizes: Vec<i64>,
    tag: &[u64],
) -> Result<Arc<Plan>> {
    // Each call's key is written into one buffer, allocated once per thread.
    thread_local!(static KEY: std::cell::RefCell<Key> = std::cell::RefCell::new(Vec::with_capacity(64)));
    // The setting is read only for overloads that have built float32 dots:
    // plans cached before the first one never depended on it.
    let follows = op.follows_precision.load(Ordering::Relaxed);
    let precision = follows.then(f32_precision);
    let hit = KEY.with_borrow_mut(|key| {
        key.clear();
        write_signature(key, op.id as u64, |i| op.is_runtime(i), args);
        key.extend(tag);
        key.extend(sizes.iter().map(|&s| s as u64));
        key.extend(precision.map(|p| p as u64));
        PLANS.read().unwrap().get(key.as_slice()).cloned()
    });
    if let Some(p) = hit {
        bump(&METRICS.plan_hits);
        return Ok(p);
    }
    bump(&METRICS.plan_misses);
    let key = KEY.with_borrow(Key::clone);
    let p = Arc::new(build(op, lower, args, device, sizes, precision.unwrap_or_else(f32_precision))?);
    if !follows && p.graph.uses_f32_precision() {
        op.follows_precision.store(true, Ordering::Relaxed);
    }
    PLANS.write().unwrap().insert(key, p.clone());
    Ok(p)
}

/// The sizes an operator with data-dependent result shapes needs, computed
/// now on the device and read (fused mode flushes its trace first).
fn measure(op: &OpDef, measure: lower::Lowering, args: &[Arg], device: usize) -> Result<Vec<i64>> {
    let plan = cached(op, measure, args, device, Vec::new(), &[u64::MAX - 3])?;
    if plan.outputs.is_empty() {
        return Ok(Vec::new());
    }
    trace::flush(Reason::DataDependent)?;
    let mut outs = Vec::with_capacity(1);
    execute(&plan, &op.name, args, device, &mut outs)?;
    let Some(Value::Ready(out)) = outs.into_iter().next() else {
        unreachable!("an executed program's outputs are ready")
    };
    let mut bytes = vec![0u8; out.ty.numel() as usize * 8];
    out.to_host(&mut bytes)?;
    bump(&METRICS.transfers_to_host);
    Ok(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())
}

// ------------------------------------------------------------------ inputs

extern "C" {
    /// A seed drawn from tpu:`device`'s default generator (the adapter's).
    fn tt_adapter_default_seed(device: i32) -> u64;
    /// PyTorch's float32 matmul setting (`TT_PRECISION_*`, csrc/precision.cpp).
    fn tt_adapter_f32_precision() -> i32;
}

/// What float32 dots and convolutions recorded now carry.
pub fn f32_precision() -> Precision {
    // SAFETY: reads PyTorch's global settings; no argument.
    Precision::from_code(unsafe { tt_adapter_f32_precision() })
}

/// Small uploads (scalars) reused by value: a constant `alpha` or learning
/// rate costs no transfer after its first use.
static SCALARS: LazyLock<Mutex<FxMap<(usize, DType, u64), Arc<DeviceBuffer>>>> = LazyLock::new(Default::default);

/// How many scalar buffers the cache keeps alive (for leak accounting).
pub fn cached_scalars() -> usize {
    SCALARS.lock().unwrap().len()
}

pub fn upload(bytes: &[u8], ty: Ty, device: usize) -> Result<Arc<DeviceBuffer>> {
    let rt = runtime::get()?;
    let buf = rt
        .client
        .buffer_from_host(bytes, ty.dtype.element_type(), &ty.shape, rt.device(device)?)
        .map_err(|e| Error::on_device(e, &format!("allocating {} bytes", bytes.len()), device))?;
    bump(&METRICS.transfers_to_device);
    Ok(DeviceBuffer::new(buf, ty, device))
}

pub fn upload_scalar(bytes: &[u8], dtype: DType, device: usize) -> Result<Arc<DeviceBuffer>> {
    if bytes.len() > 8 {
        return upload(bytes, Ty::new(dtype, &[]), device); // complex128: not worth a wider key
    }
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    let key = (device, dtype, u64::from_le_bytes(word));
    if let Some(b) = SCALARS.lock().unwrap().get(&key) {
        return Ok(b.clone());
    }
    let b = upload(bytes, Ty::new(dtype, &[]), device)?;
    let mut cache = SCALARS.lock().unwrap();
    if cache.len() >= 4096 {
        cache.clear();
    }
    cache.insert(key, b.clone());
    Ok(b)
}

// Lowerings see the runtime's storages through the op table's own trait.
impl Backing for Storage {
    fn nbytes(&self) -> i64 {
        self.nbytes
    }

    fn value_ty(&self) -> Option<Ty> {
        self.value().map(|v| v.ty().clone())
    }
}

/// The storage behind a tensor argument (None for CPU tensors and for
/// storages never allocated).
pub fn storage_of<'a>(t: &Tensor<'a>) -> Option<&'a Storage> {
    t.storage.map(|s| (s as &dyn Any).downcast_ref().expect("tensors are backed by the runtime's storages"))
}

pub fn tensor_at<'a>(args: &'a [Arg<'a>], arg: usize, item: usize) -> Result<Tensor<'a>> {
    match &args[arg] {
        Arg::Tensor(t) if item == 0 => Ok(*t),
        Arg::Tensors(ts) => {
            ts.get(item).copied().flatten().ok_or_else(|| Error::runtime("torchtpu: missing tensor input"))
        }
        _ => Err(Error::runtime("torchtpu: input is not a tensor")),
    }
}

/// The buffer holding `value`, running the fused trace first if it has
/// not been computed yet.
pub fn resolve(value: &Value, reason: Reason) -> Result<Arc<DeviceBuffer>> {
    crate::exec::bounded::unpad(&computed(value, reason)?)
}

/// `value`'s buffer as computed (padded where a bucketed program made it).
fn computed(value: &Value, reason: Reason) -> Result<Arc<DeviceBuffer>> {
    match value.buffer() {
        Some(b) => b,
        None => {
            trace::flush(reason)?;
            value.buffer().unwrap_or_else(|| Err(Error::runtime("torchtpu: a pending value was not computed")))
        }
    }
}

/// The buffer of `storage`'s value, computed and unpadded. A padded buffer's
/// unpadded copy becomes the storage's value, so that later readers other
/// than bucketed programs (host reads, strict mode, collectives) do not copy
/// it again.
pub fn storage_buffer(storage: &Storage, reason: Reason) -> Result<Option<Arc<DeviceBuffer>>> {
    let Some(value) = storage.value() else { return Ok(None) };
    let buf = computed(&value, reason)?;
    drop(value);
    if buf.padded.is_none() {
        return Ok(Some(buf));
    }
    let unpadded = crate::exec::bounded::unpad(&buf)?;
    storage.exchange(&buf, unpadded.clone());
    Ok(Some(unpadded))
}

/// A plan input's buffer, unpadded.
pub fn input(plan: &Plan, input: &Input, args: &[Arg], device: usize) -> Result<Arc<DeviceBuffer>> {
    input_buffer(plan, input, args, device, false)
}

/// A plan input's buffer, padded where a bucketed program made it (for a
/// program that may run in its bucket).
fn input_as_computed(plan: &Plan, input: &Input, args: &[Arg], device: usize) -> Result<Arc<DeviceBuffer>> {
    input_buffer(plan, input, args, device, true)
}

fn input_buffer(plan: &Plan, input: &Input, args: &[Arg], device: usize, padded: bool) -> Result<Arc<DeviceBuffer>> {
    match *input {
        Input::Constant(k) => Ok(plan.constants[k].clone()),
        Input::Storage { arg, item } => {
            let buf = match storage_of(&tensor_at(args, arg, item)?) {
                Some(s) if padded => s.value().map(|v| computed(&v, Reason::Mode)).transpose()?,
                Some(s) => storage_buffer(s, Reason::Mode)?,
                None => None,
            };
            buf.ok_or_else(|| Error::runtime("torchtpu: a storage lost its value"))
        }
        Input::Host { arg, item } => {
            let t = tensor_at(args, arg, item)?;
            if t.sizes.is_empty() {
                upload_scalar(t.host_bytes(), t.dtype, device)
            } else {
                upload(&t.host_elements(), t.ty(), device)
            }
        }
        Input::Scalar { arg, dtype } => {
            let mut bytes = [0u8; 16];
            let n = match &args[arg] {
                Arg::Int(v) => {
                    bytes[..8].copy_from_slice(&v.to_le_bytes());
                    8
                }
                Arg::Float(f) => {
                    bytes[..8].copy_from_slice(&f.to_le_bytes());
                    8
                }
                Arg::Complex(re, im) => {
                    bytes[..8].copy_from_slice(&re.to_le_bytes());
                    bytes[8..].copy_from_slice(&im.to_le_bytes());
                    16
                }
                Arg::Bool(b) => {
                    bytes[0] = *b as u8;
                    1
                }
                _ => return Err(Error::runtime("torchtpu: scalar input is not a number")),
            };
            upload_scalar(&bytes[..n], dtype, device)
        }
        Input::Ints { arg } => match &args[arg] {
            Arg::Ints(v) => upload(
                &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
                Ty::new(DType::I64, &[v.len() as i64]),
                device,
            ),
            _ => Err(Error::runtime("torchtpu: a data input is not an int list")),
        },
        Input::Seed { arg } => {
            let seed = match arg.map(|a| &args[a]) {
                Some(Arg::Seed(s)) => *s,
                _ => unsafe { tt_adapter_default_seed(device as i32) },
            };
            let key: Vec<u8> = [seed, 0u64].iter().flat_map(|w| w.to_le_bytes()).collect();
            upload(&key, Ty::new(DType::U64, &[2]), device)
        }
    }
}

// ------------------------------------------------------------------ execution

/// Runs what fused mode recorded and waits for every computation issued so far.
pub fn synchronize() -> Result<()> {
    trace::flush(Reason::Synchronize)?;
    trace::verify_checks()?;
    event::wait_issued()
}

/// A failed check's message, its `{}`s replaced by the numbers of `values`
/// (an i64 array), in order.
pub fn check_message(message: &str, values: Option<&DeviceBuffer>) -> Result<String> {
    let Some(values) = values else { return Ok(message.to_string()) };
    let mut bytes = vec![0u8; values.buf.on_device_size()?];
    values.to_host(&mut bytes)?;
    Ok(bytes.chunks_exact(8).fold(message.to_string(), |m, word| {
        let word = i64::from_le_bytes(word.try_into().unwrap());
        match m.contains("{f}") {
            true => m.replacen("{f}", &lower::rules::streamed(f64::from_bits(word as u64)), 1),
            false => m.replacen("{}", &word.to_string(), 1),
        }
    }))
}

pub fn read_bool(b: &DeviceBuffer) -> Result<bool> {
    let mut byte = [0u8; 1];
    b.to_host(&mut byte)?;
    Ok(byte[0] != 0)
}

thread_local! {
    /// `execute`'s buffers (the inputs, then the outputs) and the plugin's
    /// outputs, kept (empty) between calls so that running an op allocates
    /// no list.
    static HELD: std::cell::Cell<Vec<Arc<DeviceBuffer>>> = const { std::cell::Cell::new(Vec::new()) };
    static RAW: std::cell::Cell<Vec<pjrt::Buffer>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs a plan's program alone; its results' values go to `out`.
fn execute(plan: &Plan, what: &str, args: &[Arg], device: usize, out: &mut Vec<Value>) -> Result<()> {
    let rt = runtime::get()?;
    let mut held = HELD.take();
    for i in &plan.inputs {
        held.push(input_as_computed(plan, i, args, device)?);
    }
    let (program, bucket) = plan.alone(&held)?;
    for (k, buf) in held.iter_mut().enumerate() {
        match &bucket {
            Some(b) => *buf = bounded::repad(buf, &b.graph.params[k].shape)?,
            None if buf.padded.is_some() => *buf = input(plan, &plan.inputs[k], args, device)?,
            None => {}
        }
    }
    if let Some(b) = &bucket {
        for &s in &b.sizes {
            held.push(upload_scalar(&(s as i32).to_le_bytes(), DType::I32, device)?);
        }
        bump(&METRICS.bucketed_runs);
    }
    let mut raw = RAW.take();
    let start = Instant::now();
    program
        .exe
        .execute_into(held.iter().map(|b| &*b.buf), rt.device(device)?, &[], &mut raw)
        .map_err(|e| launch_error(e, what, device))?;
    add(&METRICS.execute_ns, start.elapsed().as_nanos() as u64);
    bump(&METRICS.executions);
    held.clear();
    for (i, buf) in raw.drain(..).enumerate() {
        let ty = plan.stored.get(i).map_or_else(|| Arc::new(Ty::new(DType::Bool, &[])), Arc::clone);
        let padded = bucket.as_ref().and_then(|b| b.padded[i].clone());
        held.push(DeviceBuffer::with_shape(buf, ty, padded, device));
    }
    RAW.set(raw);
    for check in &plan.checks {
        if read_bool(&held[check.flag])? {
            let message = check_message(&check.message, check.value.map(|v| &*held[v]))?;
            return Err(Error { kind: check.kind, message });
        }
    }
    held.truncate(plan.outputs.len());
    if mode() == Mode::Debug {
        for b in &held {
            b.buf.await_ready().map_err(|e| launch_error(e, what, device))?;
        }
        if std::env::var("TORCHTPU_DEBUG_NANS").is_ok_and(|v| v == "1") {
            check_finite(&held, what, device)?;
        }
    } else {
        event::track(&held)?;
    }
    out.extend(held.drain(..).map(Value::Ready));
    HELD.set(held);
    Ok(())
}

/// PJRT's error launching `what`, with what the user can do about it.
pub fn launch_error(e: pjrt::Error, what: &str, device: usize) -> Error {
    Error::on_device(e, &format!("running {what}"), device)
}

/// Debug mode's NaN/Inf check of an op's floating outputs.
fn check_finite(outs: &[Arc<DeviceBuffer>], what: &str, device: usize) -> Result<()> {
    for b in outs.iter().filter(|b| b.ty.dtype.is_float()) {
        let b = bounded::unpad(b)?;
        let mut bytes = vec![0u8; b.ty.numel() as usize * b.ty.dtype.size()];
        b.to_host(&mut bytes)?;
        let bad = match b.ty.dtype {
            DType::F32 => bytes.chunks_exact(4).any(|c| !f32::from_le_bytes(c.try_into().unwrap()).is_finite()),
            DType::F64 => bytes.chunks_exact(8).any(|c| !f64::from_le_bytes(c.try_into().unwrap()).is_finite()),
            // f16/bf16: exponent bits all ones.
            DType::BF16 => bytes.chunks_exact(2).any(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
            _ => bytes.chunks_exact(2).any(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
        };
        if bad {
            return Err(Error::runtime(format!(
                "torchtpu debug mode: {what} produced NaN or Inf on tpu:{device} (TORCHTPU_DEBUG_NANS=1)"
            )));
        }
    }
    Ok(())
}

/// The device an op (or graph) `what` runs on: that of its tpu tensors
/// (which must agree).
pub fn device_of(what: &str, args: &[Arg]) -> Result<usize> {
    let mut found: Option<usize> = None;
    let mut check = |t: &Tensor| -> Result<()> {
        if let Some(d) = t.device {
            match found {
                Some(f) if f != d => Err(Error::runtime(format!(
                    "Expected all tensors to be on the same device, but found at least two devices, tpu:{f} and tpu:{d}! ({what})"
                ))),
                _ => {
                    found = Some(d);
                    Ok(())
                }
            }
        } else {
            Ok(())
        }
    };
    for a in args {
        match a {
            Arg::Tensor(t) => check(t)?,
            Arg::Tensors(ts) => ts.iter().flatten().try_for_each(&mut check)?,
            _ => {}
        }
    }
    Ok(found.unwrap_or(0))
}

/// Runs a plan (or, in fused mode or while a graph is captured, records
/// it); the results' values go to `out`.
pub fn apply(plan: &Arc<Plan>, what: &str, args: &[Arg], device: usize, out: &mut Vec<Value>) -> Result<()> {
    bump(&METRICS.ops);
    if mode() == Mode::Fused || trace::capturing() {
        return trace::record(plan, args, device, out);
    }
    execute(plan, what, args, device, out)
}

/// [`apply`] for a plan of one result.
fn apply_one(plan: &Arc<Plan>, what: &str, args: &[Arg], device: usize) -> Result<Value> {
    let mut out = Vec::with_capacity(1);
    apply(plan, what, args, device, &mut out)?;
    Ok(out.remove(0))
}

thread_local! {
    /// `run_op`'s values, kept (empty) between calls so that an op
    /// allocates no list.
    static VALUES: std::cell::Cell<Vec<Value>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs a functional operator: its plan, and its results as fresh storages
/// in `results` (None for undefined ones; the defined ones have the plan's
/// `outputs` types, in order).
pub fn run_op(op: &OpDef, args: &[Arg], results: &mut Vec<Option<Arc<Storage>>>) -> Result<Arc<Plan>> {
    let device = device_of(&op.name, args)?;
    lower::rules::check(op, args, device)?;
    let plan = match op.entry.measure {
        None => plan(op, args, device)?,
        Some(m) => {
            let sizes = measure(op, m, args, device)?;
            cached(op, op.entry.lower, args, device, sizes, &[])?
        }
    };
    let mut values = VALUES.take();
    let applied = apply(&plan, &op.name, args, device, &mut values);
    let start = results.len();
    if applied.is_ok() {
        let storage = |(v, ty): (Value, &Ty)| Some(Storage::new(device, ty.numel() * ty.dtype.size() as i64, Some(v)));
        results.extend(values.drain(..).zip(&plan.outputs).map(storage));
    }
    values.clear();
    VALUES.set(values);
    applied?;
    for &i in &plan.undefined {
        results.insert(start + i, None);
    }
    Ok(plan)
}

// ------------------------------------------------------------------ copies

static COPY: LazyLock<OpDef> = LazyLock::new(|| lower::internal("torchtpu::copy", -2));
static CONTIGUOUS: LazyLock<OpDef> = LazyLock::new(|| lower::internal("torchtpu::contiguous", -3));

/// The view `t` as a contiguous device buffer of its dtype and shape (its
/// storage's buffer itself where that holds the same elements; of exactly
/// `t`'s shape if `exact`), for the host to read.
pub fn contiguous(t: &Tensor, device: usize, exact: bool) -> Result<Arc<DeviceBuffer>> {
    let buf = match storage_of(&t).and_then(|s| s.value().map(|v| (s, v))) {
        Some((storage, v))
            if v.ty().dtype == t.dtype && t.view().is_whole(v.ty().numel()) && (!exact || v.ty().shape == t.sizes) =>
        {
            drop(v);
            storage_buffer(storage, Reason::HostRead)?
                .ok_or_else(|| Error::runtime("torchtpu: a storage lost its value"))?
        }
        _ => {
            let args = [Arg::Tensor(*t), Arg::None];
            let plan = plan(&CONTIGUOUS, &args, device)?;
            resolve(&apply_one(&plan, "copy", &args, device)?, Reason::HostRead)?
        }
    };
    trace::verify_checks()?;
    Ok(buf)
}

/// `dst.copy_(src)` where each is a tpu view or a contiguous host tensor
/// (host sources arrive in dst's dtype and shape, host destinations in src's).
pub fn copy(src: &Tensor, dst: &Tensor) -> Result<()> {
    if dst.numel() == 0 {
        return Ok(());
    }
    match (src.device, dst.device) {
        (Some(device), None) => {
            let buf = contiguous(src, device, false)?;
            let n = dst.numel() as usize * dst.dtype.size();
            // SAFETY: the adapter passes a contiguous, writable host tensor of n bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.host as *mut u8, n) };
            buf.to_host(out)?;
            bump(&METRICS.transfers_to_host);
            Ok(())
        }
        (None, Some(device)) => {
            let buf = upload(src.host_bytes(), dst.ty().flat(), device)?;
            assign(buf, dst, device)
        }
        (Some(device), Some(_)) => copy_device(src, dst, device),
        (None, None) => Err(Error::runtime("torchtpu: host-to-host copy reached the tpu runtime")),
    }
}

/// `buf` (the elements of `dst`, in order) becomes the value of the view
/// `dst`: the storage's whole value when `dst` covers it.
pub fn assign(buf: Arc<DeviceBuffer>, dst: &Tensor, device: usize) -> Result<()> {
    let storage = storage_of(&dst).ok_or_else(|| Error::runtime("torchtpu: copy into a tensor without storage"))?;
    if dst.view().is_whole(storage.nbytes / dst.dtype.size() as i64) {
        storage.set(Value::Ready(buf));
        return Ok(());
    }
    let staged = Storage::new(device, buf.ty.numel() * dst.dtype.size() as i64, Some(Value::Ready(buf)));
    let strides = crate::ir::view::contiguous_strides(dst.sizes);
    let src =
        Tensor { storage: Some(&*staged as &dyn Backing), strides: &strides, offset: 0, device: Some(device), ..*dst };
    copy_device(&src, dst, device)
}

fn copy_device(src: &Tensor, dst: &Tensor, device: usize) -> Result<()> {
    let storage = storage_of(&dst).ok_or_else(|| Error::runtime("torchtpu: copy into a tensor without storage"))?;
    let whole = dst.view().is_whole(storage.nbytes / dst.dtype.size() as i64);
    // Same bytes, whole storages: share the immutable buffer.
    if let Some(v) = storage_of(&src).and_then(|s| s.value()) {
        if whole && src.dtype == dst.dtype && src.numel() == dst.numel() && src.view().is_whole(v.ty().numel()) {
            storage.set(v);
            return Ok(());
        }
    }
    let args = [Arg::Tensor(*src), Arg::Tensor(*dst)];
    let plan = plan(&COPY, &args, device)?;
    let out = apply_one(&plan, "copy_", &args, device)?;
    storage.set(out);
    Ok(())
}

/// A new storage of `nbytes` holding `old`'s bytes (the rest zero).
pub fn resized(old: &Storage, nbytes: i64) -> Result<Arc<Storage>> {
    let Some(value) = old.value() else {
        return Ok(Storage::new(old.device, nbytes, None));
    };
    let value = resolve(&value, Reason::Resize)?;
    let dtype = if nbytes % value.ty.dtype.size() as i64 == 0 { value.ty.dtype } else { DType::U8 };
    let (have, want) = (old.nbytes / dtype.size() as i64, nbytes / dtype.size() as i64);
    let mut g = crate::ir::Graph::default();
    let p = g.param((*value.ty).clone());
    let flat = crate::ir::view::flat(&mut g, p, dtype);
    let kept = g.slice(flat, &[0], &[have.min(want)], &[1]);
    let zero = g.scalar(0.0, dtype);
    g.outputs = vec![g.pad(kept, zero, &[0], &[(want - have).max(0)], &[0])];
    let program = cache::compile(&g, "resize_")?;
    let rt = runtime::get()?;
    let out = program.exe.execute(&[&value.buf], rt.device(old.device)?, &[])?.remove(0);
    bump(&METRICS.executions);
    Ok(Storage::new(
        old.device,
        nbytes,
        Some(Value::Ready(DeviceBuffer::new(out, Ty::new(dtype, &[want]), old.device))),
    ))
}
