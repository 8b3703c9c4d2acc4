//! Fused mode (DESIGN §5): operators are recorded into one trace and flushed
//! as one program.
//!
//! Recording an op notes its cached plan and where each of its inputs comes
//! from ([`Operand`]): a result of an earlier op of the trace (a value still
//! pending) or a trace parameter (a computed buffer; numbers and random keys
//! are parameters of their own, so their values never reach the program's
//! text). Its results are [`Pending`] values. Nothing is lowered or built
//! per op: the plans are spliced into one graph only when a flush needs it.
//!
//! A flush first looks the recorded ops up among the steps met before
//! ([`Replay`]: the same plans, wired the same way, the same values still
//! held): a step met again launches its known program at once. Otherwise the
//! trace becomes a program whose outputs are the pending values somebody
//! still holds (dead intermediates are never materialized) and whose
//! parameters are the buffers it reads. A parameter buffer that nothing else
//! holds any more (a storage overwritten by the trace, such as a weight
//! updated by the optimizer) is donated to an output of its type, so XLA
//! updates it in place. The program is looked up by the trace's structure and
//! launched without waiting: Python records the next step meanwhile.
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use crate::error::{Error, Kind, Result};
use crate::exec::{self, bounded, overlap, simplify, FxHasher, FxMap, Plan};
use crate::ir::{Graph, Op, V};
use crate::lower::args::Arg;
use crate::lower::{Check, Input};
use crate::metrics::{add, bump, METRICS};
use crate::runtime::cache::{self, Program};
use crate::runtime::storage::{DeviceBuffer, Pending, Replaced, Value};
use crate::runtime::{self, event};

/// Why a trace was flushed (counted per kind in the metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// The host reads a value (`item`, `.cpu()`, printing).
    HostRead,
    Synchronize,
    /// After `optimizer.step()`.
    Step,
    /// The trace reached its size bound.
    Size,
    /// A long step is flushed in parts, so that the device starts on one
    /// while Python records the next.
    Part,
    /// A step met before begins again without having been read.
    Repeat,
    /// An operator without a lowering runs on the CPU.
    Fallback,
    /// An op on another device than the trace's.
    Device,
    /// The mode changes, or a strict/debug op needs a pending value.
    Mode,
    Resize,
    /// An op whose result's shape depends on values (`nonzero`).
    DataDependent,
    /// An event is recorded, a stream queried or memory statistics read: the
    /// work recorded before is issued.
    Query,
    /// A compiled graph is captured (on its first call with a signature).
    Capture,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::HostRead => "host_read",
            Reason::Synchronize => "synchronize",
            Reason::Step => "optimizer_step",
            Reason::Size => "size_limit",
            Reason::Part => "part",
            Reason::Repeat => "step_repeat",
            Reason::Fallback => "cpu_fallback",
            Reason::Device => "device_change",
            Reason::Mode => "mode_change",
            Reason::Resize => "resize",
            Reason::DataDependent => "data_dependent",
            Reason::Query => "device_query",
            Reason::Capture => "graph_capture",
        }
    }

    pub fn parse(name: &str) -> Result<Reason> {
        [
            Reason::HostRead,
            Reason::Synchronize,
            Reason::Step,
            Reason::Size,
            Reason::Part,
            Reason::Repeat,
            Reason::Fallback,
            Reason::Device,
            Reason::Mode,
            Reason::Resize,
            Reason::DataDependent,
            Reason::Query,
            Reason::Capture,
        ]
        .into_iter()
        .find(|r| r.name() == name)
        .ok_or_else(|| Error::value(format!("torchtpu: unknown flush reason '{name}'")))
    }
}

/// What a trace parameter stands for: a buffer, the value of a flush still
/// running on the flush thread (its buffer, once launched), or (in a
/// capture) an input of the compiled graph's plan, supplied at each call.
pub enum Param {
    Buffer(Arc<DeviceBuffer>),
    Future(Arc<Pending>),
    Input(Input, crate::ir::Ty),
}

impl Param {
    fn ty(&self) -> &crate::ir::Ty {
        match self {
            Param::Buffer(b) => &b.ty,
            Param::Future(p) => &p.ty,
            Param::Input(_, ty) => ty,
        }
    }
}

/// Where a recorded op's input comes from: result `k` of the trace (in the
/// order ops produced them) or trace parameter `n`. A [`Pending`] value's
/// `node` is its operand's word.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Operand {
    Result(usize),
    Param(usize),
}

impl Operand {
    fn word(self) -> usize {
        match self {
            Operand::Result(k) => k << 1,
            Operand::Param(n) => n << 1 | 1,
        }
    }

    fn of(word: usize) -> Operand {
        match word & 1 {
            0 => Operand::Result(word >> 1),
            _ => Operand::Param(word >> 1),
        }
    }
}

/// One recorded op.
struct Record {
    plan: Arc<Plan>,
    /// Its operands, one per plan input, from `Trace::operands[operands]` on.
    operands: usize,
    /// The user's source line, captured when `TORCHTPU_LOG` is set (for
    /// explaining recompilations).
    source: Option<String>,
}

#[derive(Default)]
pub struct Trace {
    pub epoch: u64,
    device: usize,
    /// What the parameters stand for, in order.
    pub params: Vec<Param>,
    records: Vec<Record>,
    operands: Vec<Operand>,
    /// The results, pending, in order (`Operand::Result` indexes them). The
    /// trace holds them: a result nobody else holds at the flush is not
    /// computed, and its allocation serves a later result (`spare`), so that
    /// a step recorded again allocates no pending values.
    pending: Vec<Arc<Pending>>,
    spare: Vec<Arc<Pending>>,
    /// Nodes the recorded plans hold, for the size bound.
    nodes: usize,
    /// The recorded plans' product FLOPs, for parts.
    flops: u64,
    /// Recording a compiled graph's plan (see `begin_capture`): nothing may
    /// flush, and random keys are drawn afresh at each call.
    capture: bool,
    /// Storage buffers already made parameters (one parameter per buffer:
    /// sharing is part of the program's structure), by address.
    param_of: FxMap<usize, usize>,
    /// The same for values of flushes still running (by the value's
    /// address), and those of them not yet known by their buffer.
    future_of: FxMap<usize, usize>,
    unsettled: Vec<usize>,
    /// The recorded plans spliced into one graph (`splice`): the graph node
    /// of each parameter, of each result, and the records spliced so far.
    graph: Graph,
    param_nodes: Vec<V>,
    result_nodes: Vec<V>,
    spliced: usize,
    /// Data-dependent errors of spliced ops, as graph nodes.
    checks: Vec<Check>,
    /// The step being recorded, across its parts: ops since the last flush
    /// at a boundary of the user's (a read, a synchronize, an optimizer
    /// step, ...), the address of the plan that began it and whether that
    /// plan is a compiled graph's; and the steps met so far, as (first plan,
    /// ops).
    since: usize,
    first: usize,
    first_compiled: bool,
    steps: Vec<(usize, usize)>,
}

static TRACE: Mutex<Option<Trace>> = Mutex::new(None);
/// The trace of a compiled graph being captured, and whether there is one.
static CAPTURE: Mutex<Option<Trace>> = Mutex::new(None);
static CAPTURING: AtomicBool = AtomicBool::new(false);
/// Epochs are unique across the main trace and captures.
static EPOCH: AtomicU64 = AtomicU64::new(0);

fn next_epoch() -> u64 {
    EPOCH.fetch_add(1, Ordering::Relaxed) + 1
}

pub fn capturing() -> bool {
    CAPTURING.load(Ordering::Relaxed)
}

/// Starts capturing a compiled graph: what was recorded so far runs, and
/// ops record into a trace of their own until `end_capture`.
pub fn begin_capture(device: usize) -> Result<()> {
    flush(Reason::Capture)?;
    let t = Trace { epoch: next_epoch(), device, capture: true, ..Trace::default() };
    *CAPTURE.lock().unwrap() = Some(t);
    CAPTURING.store(true, Ordering::Relaxed);
    Ok(())
}

/// A parameter of the capture standing for `input`: the value of a
/// placeholder storage.
pub fn placeholder(ty: crate::ir::Ty, input: Input) -> Result<Arc<Pending>> {
    let mut guard = CAPTURE.lock().unwrap();
    let t = guard.as_mut().ok_or_else(|| Error::runtime("torchtpu: no graph is being captured"))?;
    t.params.push(Param::Input(input, ty.clone()));
    Ok(Pending::new(t.epoch, Operand::Param(t.params.len() - 1).word(), Arc::new(ty)))
}

/// The captured trace (None if no capture was running).
pub fn end_capture() -> Option<Trace> {
    CAPTURING.store(false, Ordering::Relaxed);
    CAPTURE.lock().unwrap().take()
}

/// Checks of programs already launched, verified where the host waits anyway.
static LAUNCHED_CHECKS: Mutex<Vec<(Arc<DeviceBuffer>, Option<Arc<DeviceBuffer>>, Kind, String)>> =
    Mutex::new(Vec::new());

fn env_usize(name: &str, default: impl FnOnce() -> usize, cell: &'static OnceLock<usize>) -> usize {
    *cell.get_or_init(|| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or_else(default))
}

/// Nodes after which a trace is flushed, bounding compile time and memory.
fn size_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    env_usize("TORCHTPU_FUSE_LIMIT", || 40_000, &LIMIT)
}

/// Ops after which a step is flushed in parts (`TORCHTPU_PART_OPS`, 0 for
/// none). None on XLA:CPU, whose device is the cores Python records on:
/// there a synced step already costs what a pipelined one does, and a cut
/// only costs fusion (bench/RESULTS.md, 2026-11-26).
fn part_ops() -> usize {
    static OPS: OnceLock<usize> = OnceLock::new();
    let on_cpu = || runtime::get().is_ok_and(|rt| rt.client.platform_name() == "cpu");
    match env_usize("TORCHTPU_PART_OPS", || if on_cpu() { 0 } else { 128 }, &OPS) {
        0 => usize::MAX,
        n => n,
    }
}

/// Product FLOPs a part must hold (`TORCHTPU_PART_FLOPS`). A cut cost
/// 0.4-0.9 ms of a synced step on an H200 (a decoding step, a small CNN's
/// step: both ran faster whole), so a part pays only where its device time
/// is longer: 2^38 FLOP is ~1 ms of an H100's TF32 products.
fn part_flops() -> u64 {
    static FLOPS: OnceLock<usize> = OnceLock::new();
    env_usize("TORCHTPU_PART_FLOPS", || 1 << 38, &FLOPS) as u64
}

pub fn logging() -> bool {
    static LOG: OnceLock<bool> = OnceLock::new();
    *LOG.get_or_init(|| std::env::var("TORCHTPU_LOG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

impl Trace {
    /// A trace recording after `t` was flushed: its lists sized as `t`'s
    /// were, so that a step recorded again does not grow them op by op.
    fn after(t: &mut Trace) -> Trace {
        Trace {
            epoch: next_epoch(),
            params: Vec::with_capacity(t.params.len()),
            records: Vec::with_capacity(t.records.len()),
            operands: Vec::with_capacity(t.operands.len()),
            pending: Vec::with_capacity(t.pending.len()),
            spare: std::mem::take(&mut t.spare),
            since: t.since,
            first: t.first,
            first_compiled: t.first_compiled,
            steps: std::mem::take(&mut t.steps),
            ..Trace::default()
        }
    }

    /// A flush for `reason` ends the step being recorded unless it cuts the
    /// step itself (a part, the size bound): the step is then one met,
    /// unless it is a single op. Cut at each repeat, a one-op step would
    /// make every later use of its op a program of its own (`x = a + b`
    /// read once, then in a loop: 6.7 µs per op against 1.4 recorded).
    /// A compiled graph's call is a whole program by itself, so a step of
    /// one is met too: an unread loop of calls (inference under
    /// `torch.compile`) runs the program a read call compiled, where it
    /// fused calls in pairs, a program more to compile in the loop.
    fn end_step(&mut self, reason: Reason) {
        if matches!(reason, Reason::Part | Reason::Size) || self.since == 0 {
            return;
        }
        let step = (self.first, self.since);
        self.since = 0;
        if (step.1 > 1 || self.first_compiled) && !self.steps.contains(&step) {
            if self.steps.len() == 8 {
                self.steps.remove(0);
            }
            self.steps.push(step);
        }
    }

    /// Why the trace ends before `plan` is recorded, if it does. Cuts fall
    /// where they fall again at the next step, so that each part is a
    /// program met again (a replay) and the device runs one part while
    /// Python records the next:
    /// - a step met before begins again: a loop that never reads its values
    ///   runs the programs of one that does;
    /// - past half the part size (or half the size bound), before the op
    ///   that began the trace comes round again: a repeated structure (a
    ///   layer, an iteration) is cut whole;
    /// - at the part size regardless;
    /// parts only once they hold enough products for the device to pay a cut.
    fn cut_before(&self, plan: &Arc<Plan>) -> Option<Reason> {
        if self.capture || self.records.is_empty() {
            return None;
        }
        let at = Arc::as_ptr(plan) as usize;
        if self.first == at && self.steps.contains(&(at, self.since)) {
            return Some(Reason::Repeat);
        }
        let recurs = Arc::ptr_eq(&self.records[0].plan, plan);
        if recurs && self.nodes > size_limit() / 2 {
            return Some(Reason::Size);
        }
        let n = self.records.len();
        let long = n >= part_ops() || recurs && n >= part_ops() / 2;
        (long && self.flops >= part_flops()).then_some(Reason::Part)
    }

    fn param(&mut self, param: Param) -> Operand {
        self.params.push(param);
        Operand::Param(self.params.len() - 1)
    }

    /// A parameter holding `buf` (a value computed before a capture).
    pub fn buffer_param(&mut self, buf: Arc<DeviceBuffer>) -> V {
        self.param(Param::Buffer(buf));
        self.splice();
        *self.param_nodes.last().expect("a parameter was just added")
    }

    /// The buffer of parameter `n` (every parameter of a trace that runs is
    /// one once its futures are resolved).
    fn buffer(&self, n: usize) -> &Arc<DeviceBuffer> {
        match &self.params[n] {
            Param::Buffer(b) => b,
            Param::Future(_) => unreachable!("futures are resolved before a trace is lowered"),
            Param::Input(..) => unreachable!("a captured graph's trace is never run"),
        }
    }

    /// Futures whose flush has launched are known by their buffer from now
    /// on, so that a storage read again (now holding that buffer) is the
    /// same parameter.
    fn settle(&mut self) {
        let (params, param_of) = (&self.params, &mut self.param_of);
        self.unsettled.retain(|&n| match &params[n] {
            Param::Future(p) => match p.ready() {
                Some(b) => {
                    param_of.insert(Arc::as_ptr(b) as usize, n);
                    false
                }
                None => true,
            },
            _ => false,
        });
    }

    /// Where a plan input comes from.
    fn operand(&mut self, plan: &Plan, input: &Input, args: &[Arg], device: usize) -> Result<Operand> {
        if self.capture && matches!(input, Input::Seed { .. }) {
            // A compiled graph draws fresh random numbers at every call.
            let ty = crate::ir::Ty::new(crate::ir::dtype::DType::U64, &[2]);
            return Ok(self.param(Param::Input(Input::Seed { arg: None }, ty)));
        }
        let Input::Storage { arg, item } = *input else {
            // Numbers, host scalars and random keys: always a parameter of
            // their own, so that equal values never change the structure.
            return Ok(self.param(Param::Buffer(exec::input(plan, input, args, device)?)));
        };
        let storage = exec::storage_of(&exec::tensor_at(args, arg, item)?);
        let value =
            storage.and_then(|s| s.value()).ok_or_else(|| Error::runtime("torchtpu: a storage lost its value"))?;
        match value {
            Value::Pending(p) if p.epoch == self.epoch && p.result.get().is_none() => Ok(Operand::of(p.node)),
            // Recording goes on while the flush computing it runs.
            Value::Pending(p) if !self.capture && p.result.get().is_none() && p.flushed.load(Ordering::Acquire) => {
                let key = Arc::as_ptr(&p) as usize;
                if let Some(&n) = self.future_of.get(&key) {
                    return Ok(Operand::Param(n));
                }
                self.unsettled.push(self.params.len());
                self.future_of.insert(key, self.params.len());
                Ok(self.param(Param::Future(p)))
            }
            value => {
                let buf = value
                    .buffer()
                    .unwrap_or_else(|| Err(Error::runtime("torchtpu: a value of an earlier trace was lost")))?;
                let key = Arc::as_ptr(&buf) as usize;
                if !self.unsettled.is_empty() && !self.param_of.contains_key(&key) {
                    self.settle();
                }
                if let Some(&n) = self.param_of.get(&key) {
                    return Ok(Operand::Param(n));
                }
                self.param_of.insert(key, self.params.len());
                Ok(self.param(Param::Buffer(buf)))
            }
        }
    }

    /// Splices the plans recorded since the last call into the trace's
    /// graph.
    fn splice(&mut self) {
        let Trace { graph, params, param_nodes, result_nodes, records, operands, checks, spliced, .. } = self;
        for param in &params[param_nodes.len()..] {
            param_nodes.push(graph.param(param.ty().clone()));
        }
        for r in &records[*spliced..] {
            let g = &r.plan.graph;
            let mut map: Vec<V> = Vec::with_capacity(g.nodes.len());
            for node in &g.nodes {
                let v = match node.op {
                    Op::Param(n) => match operands[r.operands + n] {
                        Operand::Result(k) => result_nodes[k],
                        Operand::Param(n) => param_nodes[n],
                    },
                    _ => graph.push(node.op.clone(), node.args.iter().map(|&a| map[a]).collect(), node.ty.clone()),
                };
                map.push(v);
            }
            result_nodes.extend(g.outputs[..r.plan.outputs.len()].iter().map(|&out| map[out]));
            for c in &r.plan.checks {
                let (flag, value) = (map[g.outputs[c.flag]], c.value.map(|v| map[g.outputs[v]]));
                checks.push(Check { flag, value, kind: c.kind, message: c.message.clone() });
            }
        }
        *spliced = records.len();
    }

    /// The graph, every recorded op spliced in.
    pub fn graph(&mut self) -> &Graph {
        self.splice();
        &self.graph
    }

    /// The graph node of a pending value of this trace (after `graph`).
    pub fn node(&self, p: &Pending) -> V {
        match Operand::of(p.node) {
            Operand::Result(k) => self.result_nodes[k],
            Operand::Param(n) => self.param_nodes[n],
        }
    }

    /// The spliced checks' flag and value nodes.
    pub fn check_nodes(&self) -> impl Iterator<Item = V> + '_ {
        self.checks.iter().flat_map(|c| std::iter::once(c.flag).chain(c.value))
    }

    pub fn checks(&self) -> &[Check] {
        &self.checks
    }
}

/// Records `plan` applied to `args`; its results, pending, go to `out`.
pub fn record(plan: &Arc<Plan>, args: &[Arg], device: usize, out: &mut Vec<Value>) -> Result<()> {
    // Before locking: this takes the GIL, which an op's caller may hold.
    let source = if logging() { source_line() } else { None };
    let mut guard = if capturing() { CAPTURE.lock().unwrap() } else { TRACE.lock().unwrap() };
    if guard.as_ref().is_some_and(|t| t.device != device && !t.records.is_empty()) {
        flush_locked(&mut guard, Reason::Device)?;
    }
    if let Some(reason) = guard.as_ref().and_then(|t| t.cut_before(plan)) {
        flush_locked(&mut guard, reason)?;
    }
    let t = guard.get_or_insert_with(Trace::default);
    t.device = device;
    let first = t.operands.len();
    for input in &plan.inputs {
        let operand = t.operand(plan, input, args, device)?;
        t.operands.push(operand);
    }
    t.records.push(Record { plan: plan.clone(), operands: first, source });
    t.nodes += plan.graph.nodes.len();
    t.flops += plan.flops;
    if t.since == 0 {
        t.first = Arc::as_ptr(plan) as usize;
        t.first_compiled = plan.compiled;
    }
    t.since += 1;
    for ty in plan.stored.iter() {
        let node = Operand::Result(t.pending.len()).word();
        let p = match t.spare.pop() {
            Some(spare) => Pending::reuse(spare, t.epoch, node, ty.clone()),
            None => Pending::new(t.epoch, node, ty.clone()),
        };
        t.pending.push(p.clone());
        out.push(Value::Pending(p));
    }
    if t.nodes > size_limit() && !t.capture {
        flush_locked(&mut guard, Reason::Size)?;
    }
    Ok(())
}

/// Runs everything recorded so far (without waiting for it; at a step's
/// end or the size bound, on the flush thread).
pub fn flush(reason: Reason) -> Result<()> {
    if capturing() {
        return Err(uncapturable(reason));
    }
    flush_locked(&mut TRACE.lock().unwrap(), reason)
}

/// Why a compiled graph cannot be one program: something in it needs a
/// flush (the host reads a value, an op runs on the CPU, ...).
fn uncapturable(reason: Reason) -> Error {
    Error::runtime(format!("torchtpu: this graph cannot run as one program (it needs a flush: {})", reason.name()))
}

fn flush_locked(slot: &mut Option<Trace>, reason: Reason) -> Result<()> {
    // Only where Python goes on recording (and the trace likely compiles);
    // the others launch in order after the flushes already queued.
    let overlapped = matches!(reason, Reason::Step | Reason::Size | Reason::Part | Reason::Repeat)
        && slot.as_ref().is_some_and(|t| {
            !t.capture && overlap::first_time(t.records.iter().map(|r| Arc::as_ptr(&r.plan) as usize))
        });
    if !overlapped {
        overlap::drain()?;
    }
    let Some(t) = slot.as_mut() else {
        return Ok(());
    };
    if t.capture && !t.records.is_empty() {
        return Err(uncapturable(reason));
    }
    t.end_step(reason);
    if t.records.is_empty() {
        return Ok(());
    }
    let next = Trace::after(t);
    let mut trace = std::mem::replace(t, next);
    *METRICS.flushes.lock().unwrap().entry(reason.name()).or_insert(0) += 1;
    let recorded = trace.pending.len();
    let mut live: Vec<Arc<Pending>> = Vec::with_capacity(recorded);
    for mut p in std::mem::take(&mut trace.pending) {
        if Arc::get_mut(&mut p).is_none() {
            p.flushed.store(true, Ordering::Release);
            live.push(p);
        } else if t.spare.len() < recorded {
            t.spare.push(p);
        }
    }
    let flushed = Flushed(live);
    if !overlapped {
        return flushed.run(trace);
    }
    bump(&METRICS.overlapped);
    let checks = LAUNCHED_CHECKS.lock().unwrap().len();
    overlap::submit(Box::new(move || match flushed.run(trace) {
        // Reading one of its values raises the error.
        Err(_) if flushed.lost() => Ok(()),
        result => result,
    }))?;
    // A loop that never reads a value still learns of a failed check.
    verify(checks > 256)
}

/// The values a flush computes. Whatever stops it (an error, a panic), none
/// is left empty: readers wait for them.
struct Flushed(Vec<Arc<Pending>>);

impl Flushed {
    fn run(&self, trace: Trace) -> Result<()> {
        let result = run(trace, &self.0);
        if let Err(e) = &result {
            self.lose(e);
        }
        result
    }

    /// The values are lost, not wrong: reading one raises `e`.
    fn lose(&self, e: &Error) {
        for p in &self.0 {
            let _ = p.result.set(Err(e.clone()));
        }
    }

    fn lost(&self) -> bool {
        self.0.iter().any(|p| matches!(p.result.get(), Some(Err(_))))
    }
}

impl Drop for Flushed {
    fn drop(&mut self) {
        self.lose(&Error::runtime("torchtpu internal error: a flush stopped before computing this value"));
    }
}

/// The program of a trace: what it computes for `live`, with donations.
struct Lowered {
    graph: Graph,
    /// Trace parameter index of each program parameter.
    params: Vec<usize>,
    /// For each live value: a program output, or a parameter passed through.
    sources: Vec<Source>,
    checks: Vec<(usize, Option<usize>, Kind, String)>,
}

#[derive(Clone)]
enum Source {
    Output(usize),
    Param(usize),
}

/// The part of `graph` that `roots` need, simplified: the new graph, the
/// original parameter index of each of its parameters, and where each
/// original node went (`usize::MAX`: dropped). Its outputs are left empty.
pub fn prune(graph: &Graph, roots: impl Iterator<Item = V>) -> (Graph, Vec<usize>, Vec<V>) {
    let nodes = &graph.nodes;
    let mut used = vec![false; nodes.len()];
    for v in roots {
        used[v] = true;
    }
    for v in (0..nodes.len()).rev() {
        if used[v] {
            for &a in &nodes[v].args {
                used[a] = true;
            }
        }
    }
    let mut g = Graph::default();
    let mut params = Vec::new();
    let mut map = vec![usize::MAX; nodes.len()];
    for (v, node) in nodes.iter().enumerate().filter(|(v, _)| used[*v]) {
        map[v] = match node.op {
            Op::Param(n) => {
                params.push(n);
                g.param(node.ty.clone())
            }
            _ => simplify::push(&mut g, node.op.clone(), node.args.iter().map(|&a| map[a]).collect(), node.ty.clone()),
        };
    }
    (g, params, map)
}

/// Resolves the trace's futures into buffers (their flushes have launched by
/// now); a value nothing else holds any more lets its buffer go, so that the
/// buffer may be donated as one read from a storage would be. Returns each
/// future's buffer address by its value's.
fn resolve_futures(trace: &mut Trace) -> Result<FxMap<usize, usize>> {
    let mut resolved = FxMap::default();
    for param in &mut trace.params {
        if let Param::Future(p) = param {
            let buf =
                p.buffer().unwrap_or_else(|| Err(Error::runtime("torchtpu: a value of an earlier trace was lost")))?;
            resolved.insert(Arc::as_ptr(p) as usize, Arc::as_ptr(&buf) as usize);
            *param = Param::Buffer(buf);
        }
    }
    Ok(resolved)
}

/// `resolved`: the buffer address of each value of an earlier flush the
/// trace read while that flush ran (`resolve_futures`).
fn lower_trace(trace: &mut Trace, live: &[Arc<Pending>], resolved: &FxMap<usize, usize>) -> Lowered {
    trace.graph();
    let roots = live.iter().map(|p| trace.node(p)).chain(trace.check_nodes());
    let (mut g, params, map) = prune(&trace.graph, roots);
    let output = |g: &mut Graph, v: V| {
        g.outputs.push(map[v]);
        g.outputs.len() - 1
    };
    let sources: Vec<Source> = live
        .iter()
        .map(|p| match trace.graph.nodes[trace.node(p)].op {
            Op::Param(n) => Source::Param(n),
            _ => Source::Output(output(&mut g, trace.node(p))),
        })
        .collect();
    let checks = trace
        .checks
        .iter()
        .map(|c| (output(&mut g, c.flag), c.value.map(|v| output(&mut g, v)), c.kind, c.message.clone()))
        .collect();
    simplify::prune(&mut g);
    let outputs: Vec<&crate::ir::Ty> = g.outputs.iter().map(|&v| g.ty(v)).collect();
    g.donors = donors(trace, &params, &sources, &outputs, live, resolved);
    Lowered { graph: g, params, sources, checks }
}

/// What each program parameter (trace parameter `params[k]`) is donated to.
/// A parameter nobody else holds (nor will: passed through) goes to the
/// value that replaced it in its storage, so that XLA can update it in
/// place, else to any output of the same type (its memory is reused).
fn donors(
    trace: &Trace,
    params: &[usize],
    sources: &[Source],
    outputs: &[&crate::ir::Ty],
    live: &[Arc<Pending>],
    resolved: &FxMap<usize, usize>,
) -> Vec<Option<usize>> {
    let mut donors = vec![None; params.len()];
    let mut taken = vec![false; outputs.len()];
    let donatable: Vec<usize> = (0..params.len())
        .filter(|&k| {
            let n = params[k];
            let passed = sources.iter().any(|s| matches!(s, Source::Param(m) if *m == n));
            !passed && Arc::strong_count(trace.buffer(n)) == 1
        })
        .collect();
    let param_of: FxMap<usize, usize> =
        donatable.iter().map(|&k| (Arc::as_ptr(trace.buffer(params[k])) as usize, k)).collect();
    let ty = |k: usize| &*trace.buffer(params[k]).ty;
    for (p, source) in live.iter().zip(sources) {
        let replaced = p.replaces.get().and_then(|r| match *r {
            Replaced::Buffer(addr) => Some(addr),
            Replaced::Pending(value) => resolved.get(&value).copied(),
        });
        if let (Some(addr), Source::Output(o)) = (replaced, source) {
            if let Some(&k) = param_of.get(&addr) {
                if donors[k].is_none() && !taken[*o] && outputs[*o] == ty(k) {
                    taken[*o] = true;
                    donors[k] = Some(*o);
                }
            }
        }
    }
    for k in donatable {
        if donors[k].is_some() {
            continue;
        }
        if let Some(o) = (0..outputs.len()).find(|&o| !taken[o] && outputs[o] == ty(k)) {
            taken[o] = true;
            donors[k] = Some(o);
        }
    }
    donors
}

/// A step met before: the program a trace of the same ops, wired the same
/// way and with the same results still held, was lowered to, and how its
/// parameters and outputs map to the trace's. Found by the trace's
/// [`tape`], a flush launches it without splicing, lowering or hashing a
/// graph; any difference (another op, another operand, a value kept or
/// dropped, other donations) misses and lowers the trace as it is.
struct Replay {
    /// The ops' plans, weakly: their addresses in the tape stay theirs (a
    /// weak reference keeps the allocation) while what a dropped plan holds
    /// (a compiled graph's constant tensors) is freed with it.
    _plans: Vec<Weak<Plan>>,
    program: Weak<Program>,
    params: Vec<usize>,
    sources: Vec<Source>,
    checks: Vec<(usize, Option<usize>, Kind, String)>,
    /// The trace graph's donations, which a flush must make again to match.
    donors: Vec<Option<usize>>,
    outputs: Vec<crate::ir::Ty>,
    nodes: usize,
    /// Each parameter's padding (a bucketed program's output read back):
    /// the same ops on other paddings take another bucket's launch.
    padded: Vec<Option<Vec<i64>>>,
    /// The bucket the program runs the trace in, if it is a bucket's.
    bucket: Option<Arc<bounded::Launch>>,
}

/// Replays by their tape (one key may hold several donation patterns).
static REPLAYS: Mutex<Option<FxMap<Vec<u64>, Vec<Arc<Replay>>>>> = Mutex::new(None);

/// The trace's identity for replays: each op's plan and operands, then the
/// results still held.
fn tape(trace: &Trace, live: &[Arc<Pending>]) -> Vec<u64> {
    let mut words = Vec::with_capacity(trace.records.len() + trace.operands.len() + live.len() + 1);
    for r in &trace.records {
        words.push(Arc::as_ptr(&r.plan) as u64);
        let operands = &trace.operands[r.operands..r.operands + r.plan.inputs.len()];
        words.extend(operands.iter().map(|o| o.word() as u64));
    }
    words.push(u64::MAX);
    words.extend(live.iter().map(|p| p.node as u64));
    words
}

/// The replay of `tape` whose donations are those of this flush.
fn replay(
    trace: &Trace,
    tape: &[u64],
    live: &[Arc<Pending>],
    resolved: &FxMap<usize, usize>,
) -> Option<(Arc<Replay>, Arc<Program>)> {
    let replays = REPLAYS.lock().unwrap();
    let found = replays.as_ref()?.get(tape)?.iter().find_map(|r| {
        let outputs: Vec<&crate::ir::Ty> = r.outputs.iter().collect();
        let padded = r.params.iter().map(|&n| trace.buffer(n).padded.as_deref());
        let same = padded.eq(r.padded.iter().map(Option::as_deref))
            && donors(trace, &r.params, &r.sources, &outputs, live, resolved) == r.donors;
        Some((r.clone(), r.program.upgrade().filter(|_| same)?))
    });
    found
}

fn remember(
    tape: Vec<u64>,
    trace: &Trace,
    lowered: &Lowered,
    outputs: &[crate::ir::Ty],
    program: &Arc<Program>,
    bucket: Option<&Arc<bounded::Launch>>,
) {
    let g = &lowered.graph;
    let replay = Arc::new(Replay {
        _plans: trace.records.iter().map(|r| Arc::downgrade(&r.plan)).collect(),
        program: Arc::downgrade(program),
        params: lowered.params.clone(),
        sources: lowered.sources.clone(),
        checks: lowered.checks.clone(),
        donors: g.donors.clone(),
        outputs: outputs.to_vec(),
        nodes: g.nodes.len(),
        padded: lowered.params.iter().map(|&n| trace.buffer(n).padded.clone()).collect(),
        bucket: bucket.cloned(),
    });
    let mut replays = REPLAYS.lock().unwrap();
    let replays = replays.get_or_insert_with(FxMap::default);
    if replays.len() >= 1024 {
        replays.clear();
    }
    let known = replays.entry(tape).or_default();
    known.retain(|r| r.program.strong_count() > 0);
    if known.len() >= 4 {
        known.remove(0);
    }
    known.push(replay);
}

/// Compiled fused programs by the structure of their graph, and what each
/// was recorded from (for explaining the next miss).
#[derive(Default)]
struct Programs {
    /// Owned by the cache, which may evict them.
    by_key: FxMap<(u64, u64), Weak<Program>>,
    /// Bucketed programs XLA failed to compile.
    failed_buckets: std::collections::HashSet<(u64, u64)>,
    /// The bucket program and launch of each graph (by its structure and
    /// its inputs' padded shapes) that was bucketed: a decoding loop meets
    /// the same graphs again at each call, and building a bucket's graph
    /// only to find its program costs as much as recording the step.
    launches: FxMap<((u64, u64), Vec<Option<Vec<i64>>>), (Weak<Program>, Arc<bounded::Launch>)>,
    /// Weakly: what a dropped plan holds (a compiled graph's constant
    /// tensors) goes with it.
    history: Vec<Vec<(Weak<Plan>, Option<String>)>>,
}

static PROGRAMS: Mutex<Option<Programs>> = Mutex::new(None);

fn structure_key(g: &Graph) -> (u64, u64) {
    let mut a = FxHasher::default();
    g.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    g.hash(&mut b);
    (a.finish(), b.finish())
}

/// The compiled program of `g` (whose parameters are trace parameters
/// `params`): its own, or (where `g` has padded inputs or misses, and its
/// sizes change from an earlier trace of its structure) the program of its
/// bucket.
fn program(trace: &Trace, g: &Graph, params: &[usize]) -> Result<(Arc<Program>, Option<Arc<bounded::Launch>>)> {
    let mut guard = PROGRAMS.lock().unwrap();
    let programs = guard.get_or_insert_with(Programs::default);
    let hit = |programs: &Programs, key| {
        let p = programs.by_key.get(&key).and_then(Weak::upgrade)?;
        bump(&METRICS.fused_hits);
        p.touch();
        Some(p)
    };
    let key = structure_key(g);
    let padded: Vec<Option<&[i64]>> = params.iter().map(|&n| trace.buffer(n).padded.as_deref()).collect();
    let padded_inputs = padded.iter().any(Option::is_some);
    if !padded_inputs {
        if let Some(p) = hit(programs, key) {
            return Ok((p, None));
        }
    }
    let seen = (key, padded.iter().map(|p| p.map(<[i64]>::to_vec)).collect());
    if let Some((p, launch)) = programs.launches.get(&seen).and_then(|(p, l)| Some((p.upgrade()?, l.clone()))) {
        bump(&METRICS.fused_hits);
        p.touch();
        return Ok((p, Some(launch)));
    }
    if let Some(b) = bounded::enabled().then(|| bounded::generalize(g, &padded)).flatten() {
        // Rather than a bucket, the trace's own program where it was compiled
        // before: a run of a script whose sizes an earlier run compiled as
        // they were. A fit saved by a run that met other sizes once (a last,
        // smaller batch) would otherwise pad these sizes' inputs through the
        // host at every step, even where the bucket's program is on disk.
        if let Some(p) = (!padded_inputs).then(|| cache::compiled(g)).transpose()?.flatten() {
            bump(&METRICS.fused_misses);
            programs.by_key.insert(key, Arc::downgrade(&p));
            return Ok((p, None));
        }
        let bkey = structure_key(&b.graph);
        let mut found = hit(programs, bkey);
        if found.is_none() {
            found = cache::compiled(&b.graph)?;
            if let Some(p) = &found {
                bump(&METRICS.fused_misses);
                programs.by_key.insert(bkey, Arc::downgrade(p));
            }
        }
        // A bucket XLA cannot compile (an op its padding does not take)
        // falls back to the trace's own program, and is not tried again.
        if found.is_none() && !programs.failed_buckets.contains(&bkey) {
            match cache::compile(&b.graph, "bucketed fused program") {
                Ok(p) => {
                    if logging() {
                        eprintln!("torchtpu: new bucketed program: sizes {:?} in buckets {:?}", b.sizes, b.buckets);
                    }
                    bump(&METRICS.fused_misses);
                    bump(&METRICS.bucketed_programs);
                    programs.by_key.insert(bkey, Arc::downgrade(&p));
                    found = Some(p);
                }
                Err(e) => {
                    programs.failed_buckets.insert(bkey);
                    bounded::refused(&format!("XLA: {}", e.message.lines().next().unwrap_or_default()));
                }
            }
        }
        if let Some(p) = found {
            let launch = Arc::new(b.launch());
            if programs.launches.len() >= 4096 {
                programs.launches.clear();
            }
            programs.launches.insert(seen, (Arc::downgrade(&p), launch.clone()));
            return Ok((p, Some(launch)));
        }
    }
    if let Some(p) = padded_inputs.then(|| hit(programs, key)).flatten() {
        return Ok((p, None));
    }
    bump(&METRICS.fused_misses);
    let ops: Vec<(Weak<Plan>, Option<String>)> =
        trace.records.iter().map(|r| (Arc::downgrade(&r.plan), r.source.clone())).collect();
    if !programs.history.is_empty() {
        let why = explain(&ops, &programs.history);
        let mut reasons = METRICS.recompile_reasons.lock().unwrap();
        if reasons.len() >= 16 {
            reasons.remove(0);
        }
        reasons.push(why.clone());
        if logging() {
            eprintln!("torchtpu: new fused program ({} ops, {} nodes): {why}", ops.len(), g.nodes.len());
        }
    }
    let p = cache::compile(g, "fused program")?;
    programs.by_key.retain(|_, p| p.strong_count() > 0);
    programs.by_key.insert(key, Arc::downgrade(&p));
    if programs.history.len() >= 32 {
        programs.history.remove(0);
    }
    programs.history.push(ops);
    Ok((p, None))
}

/// Why `ops` missed the cache: its first difference from the nearest
/// program compiled before (the one sharing the longest prefix of ops).
fn explain(ops: &[(Weak<Plan>, Option<String>)], history: &[Vec<(Weak<Plan>, Option<String>)>]) -> String {
    let prefix =
        |h: &[(Weak<Plan>, Option<String>)]| ops.iter().zip(h).take_while(|(a, b)| Weak::ptr_eq(&a.0, &b.0)).count();
    let describe = |p: &Weak<Plan>| p.upgrade().map_or_else(|| "an op since freed".to_string(), |p| p.describe());
    let nearest = history.iter().max_by_key(|h| prefix(h)).expect("a compiled program");
    let i = prefix(nearest);
    let at = |src: &Option<String>| match src {
        Some(s) => format!(" at {s}"),
        None if logging() => String::from(" (no source line outside torch and torchtpu)"),
        None => String::from(" (set TORCHTPU_LOG=1 for source lines)"),
    };
    match (ops.get(i), nearest.get(i)) {
        (Some((mine, src)), Some((theirs, _))) => {
            let (mine, theirs) = (describe(mine), describe(theirs));
            // Same types: the plans differ in what the description leaves out.
            let how = if mine == theirs {
                format!(
                    "{mine} in both, with other values of its non-tensor arguments (a view's offset or \
                     strides, a number, a list of sizes or indices)"
                )
            } else {
                format!("{mine} here, {theirs} there")
            };
            format!("op {i} differs from the nearest cached program: {how}; recorded{}", at(src))
        }
        (Some((mine, src)), None) => format!(
            "the nearest cached program ends after {i} ops; this one goes on with {}{}",
            describe(mine),
            at(src)
        ),
        (None, Some((theirs, _))) => {
            format!("this trace ends after {i} ops; the nearest cached program goes on with {}", describe(theirs))
        }
        (None, None) => format!(
            "same {i} ops as a cached program, but other values are still alive, aliased or donated \
             (a tensor kept or dropped between steps)"
        ),
    }
}

fn run(mut trace: Trace, live: &[Arc<Pending>]) -> Result<()> {
    let resolved = resolve_futures(&mut trace)?;
    if live.is_empty() && trace.records.iter().all(|r| r.plan.checks.is_empty()) {
        return Ok(()); // nothing held, nothing to verify: nothing to compute
    }
    let tape = tape(&trace, live);
    if let Some((r, program)) = replay(&trace, &tape, live, &resolved) {
        bump(&METRICS.fused_hits);
        bump(&METRICS.replays);
        program.touch();
        let outputs = Outputs::of(&r.outputs, r.bucket.as_ref(), &r.donors, r.nodes);
        return launch(&trace, live, &r.params, &r.sources, r.checks.clone(), outputs, &program, r.bucket.as_ref());
    }
    let lowered = lower_trace(&mut trace, live, &resolved);
    if lowered.graph.outputs.is_empty() {
        pass_through(&trace, live, &lowered.sources);
        return Ok(());
    }
    let (program, launched) = program(&trace, &lowered.graph, &lowered.params)?;
    let g = &lowered.graph;
    let tys: Vec<crate::ir::Ty> = g.outputs.iter().map(|&v| g.ty(v).clone()).collect();
    remember(tape, &trace, &lowered, &tys, &program, launched.as_ref());
    let outputs = Outputs::of(&tys, launched.as_ref(), &g.donors, g.nodes.len());
    launch(&trace, live, &lowered.params, &lowered.sources, lowered.checks, outputs, &program, launched.as_ref())
}

/// Live values the program only passes through: their parameters' buffers.
fn pass_through(trace: &Trace, live: &[Arc<Pending>], sources: &[Source]) {
    for (p, s) in live.iter().zip(sources) {
        if let Source::Param(n) = s {
            let _ = p.result.set(Ok(trace.buffer(*n).clone()));
        }
    }
}

/// A program's outputs: their types, what each parameter is donated to,
/// and the program's size (for the metrics).
struct Outputs<'a> {
    tys: &'a [crate::ir::Ty],
    donors: &'a [Option<usize>],
    nodes: usize,
}

impl<'a> Outputs<'a> {
    /// The trace graph's donations and size, or its bucket's where it runs in one.
    fn of(
        tys: &'a [crate::ir::Ty],
        bucket: Option<&'a Arc<bounded::Launch>>,
        donors: &'a [Option<usize>],
        nodes: usize,
    ) -> Outputs<'a> {
        match bucket {
            Some(l) => Outputs { tys, donors: &l.donors, nodes: l.nodes },
            None => Outputs { tys, donors, nodes },
        }
    }
}

/// Launches `program` on the trace's parameters `params` (its bucket's
/// shapes where `bucket` says) and hands each live value its result.
#[allow(clippy::too_many_arguments)]
fn launch(
    trace: &Trace,
    live: &[Arc<Pending>],
    params: &[usize],
    sources: &[Source],
    checks: Vec<(usize, Option<usize>, Kind, String)>,
    outputs: Outputs,
    program: &Program,
    bucket: Option<&Arc<bounded::Launch>>,
) -> Result<()> {
    pass_through(trace, live, sources);
    let rt = runtime::get()?;
    // Inputs in the shapes the program takes: its bucket's, or exact.
    let mut inputs: Vec<Arc<DeviceBuffer>> = Vec::with_capacity(params.len() + 1);
    for (k, &n) in params.iter().enumerate() {
        let buf = trace.buffer(n);
        inputs.push(match bucket {
            Some(l) => bounded::repad(buf, &l.shapes[k])?,
            None => bounded::unpad(buf)?,
        });
    }
    if let Some(l) = bucket {
        for &s in &l.sizes {
            inputs.push(exec::upload_scalar(&(s as i32).to_le_bytes(), crate::ir::dtype::DType::I32, trace.device)?);
        }
        bump(&METRICS.bucketed_runs);
    }
    let args: Vec<&pjrt::Buffer> = inputs.iter().map(|b| &*b.buf).collect();
    let kept: Vec<i64> = (0..args.len()).filter(|&k| outputs.donors[k].is_none()).map(|k| k as i64).collect();
    add(&METRICS.donated, (args.len() - kept.len()) as u64);
    METRICS.largest_graph.fetch_max(outputs.nodes as u64, std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    let raw = program
        .exe
        .execute(&args, rt.device(trace.device)?, &kept)
        .map_err(|e| exec::launch_error(e, "a fused program", trace.device))?;
    add(&METRICS.execute_ns, start.elapsed().as_nanos() as u64);
    bump(&METRICS.executions);
    let outs: Vec<Arc<DeviceBuffer>> = raw
        .into_iter()
        .zip(outputs.tys)
        .enumerate()
        .map(|(o, (b, ty))| {
            let padded = bucket.and_then(|l| l.padded[o].clone());
            DeviceBuffer::with_shape(b, ty.clone(), padded, trace.device)
        })
        .collect();
    event::track(&outs)?;
    for (p, s) in live.iter().zip(sources) {
        if let Source::Output(o) = s {
            let _ = p.result.set(Ok(outs[*o].clone()));
        }
    }
    let mut launched = LAUNCHED_CHECKS.lock().unwrap();
    for (flag, value, kind, message) in checks {
        launched.push((outs[flag].clone(), value.map(|v| outs[v].clone()), kind, message));
    }
    // A loop that never reads a value still learns of a failed check, and
    // the list stays short.
    let many = launched.len() > 256;
    drop(launched);
    verify(many)
}

/// Raises the first failed data-dependent check of launched programs,
/// waiting for them (and for the flush thread to launch its own).
pub fn verify_checks() -> Result<()> {
    overlap::drain()?;
    verify(true)
}

/// Verifies the checks whose programs have finished (all of them if `wait`).
fn verify(wait: bool) -> Result<()> {
    let mut launched = LAUNCHED_CHECKS.lock().unwrap();
    let (checks, later): (Vec<_>, Vec<_>) = std::mem::take(&mut *launched)
        .into_iter()
        .partition(|c| wait || c.0.buf.ready_event().and_then(|e| e.is_ready()).unwrap_or(true));
    *launched = later;
    drop(launched);
    for (flag, value, kind, message) in checks {
        if exec::read_bool(&flag)? {
            let message = exec::check_message(&message, value.as_deref())?;
            return Err(Error { kind, message });
        }
    }
    Ok(())
}

/// Ops recorded and not yet flushed.
pub fn recorded() -> usize {
    TRACE.lock().unwrap().as_ref().map_or(0, |t| t.records.len())
}

/// `file.py:42` of the innermost Python frame outside torch and torchtpu
/// (`<string>:3` for `python -c`; not Python's frozen modules nor torch.fx's
/// generated code).
pub(super) fn source_line() -> Option<String> {
    use pyo3::prelude::*;
    Python::attach(|py| {
        let mut frame = py.import("sys").ok()?.call_method1("_getframe", (0,)).ok()?;
        loop {
            let code = frame.getattr("f_code").ok()?;
            let file: String = code.getattr("co_filename").ok()?.extract().ok()?;
            let generated = file.starts_with("<frozen") || file.starts_with("<eval_with_key");
            if !file.contains("/torch/") && !file.contains("/torchtpu/") && !generated {
                let line: i64 = frame.getattr("f_lineno").ok()?.extract().ok()?;
                return Some(format!("{file}:{line}"));
            }
            frame = frame.getattr("f_back").ok().filter(|f| !f.is_none())?;
        }
    })
}
