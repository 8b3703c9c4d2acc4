//! Compiled graphs (torch.compile, DESIGN §9): an FX graph from the Dynamo
//! backend reaches the same op table as eager ops. On its first call with an
//! input signature the graph is captured: its ops run once, on placeholder
//! storages standing for the inputs, into a trace of their own, which
//! becomes one plan. Later calls with that signature cost the signature,
//! gathering buffers and one execution; in fused mode the plan is recorded
//! into the trace like an op's, so eager code around it fuses with it.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::error::{Error, Result};
use crate::exec::trace::{self, Param, Trace};
use crate::exec::{self, FxMap, Plan};
use crate::ir::dtype::DType;
use crate::ir::V;
use crate::lower::args::{Arg, Tensor};
use crate::lower::{self, Input};
use crate::metrics::{bump, METRICS};
use crate::runtime::storage::{Storage, Value};

/// Where an output view's storage comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// The call's k-th new storage.
    New(usize),
    /// The storage of tensor argument i (an output aliasing an input).
    Arg(usize),
}

/// A tensor a call returns: a view of a new storage or of an input's.
#[derive(Clone, Debug)]
pub struct View {
    pub source: Source,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
    pub dtype: DType,
}

impl View {
    fn of(t: &Tensor, source: Source) -> View {
        View { source, sizes: t.sizes.to_vec(), strides: t.strides.to_vec(), offset: t.offset, dtype: t.dtype }
    }
}

/// A graph lowered for one input signature.
pub struct GraphPlan {
    plan: Arc<Plan>,
    /// Bytes of each new storage, and the plan output holding its value
    /// (None for an empty one).
    storages: Vec<(i64, Option<usize>)>,
    /// Tensor arguments whose storage the graph writes (input mutations:
    /// BatchNorm's running statistics, a compiled optimizer's parameters),
    /// and the plan output holding the storage's next value.
    writes: Vec<(usize, usize)>,
    pub views: Vec<View>,
    /// The graph ends an optimizer step: fused mode flushes after it.
    ends_step: bool,
}

struct Graph {
    name: String,
    plans: FxMap<Vec<u64>, Arc<GraphPlan>>,
}

static GRAPHS: LazyLock<Mutex<FxMap<u64, Graph>>> = LazyLock::new(Default::default);
/// Graph ids start far above op ids, so that signatures never collide.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 32);

/// Registers a graph handed over by the Dynamo backend; returns its id.
pub fn new(name: &str) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    GRAPHS.lock().unwrap().insert(id, Graph { name: name.to_string(), plans: Default::default() });
    bump(&METRICS.graphs);
    id
}

/// Forgets a graph (Dynamo dropped it) and its plans.
pub fn free(id: u64) {
    GRAPHS.lock().unwrap().remove(&id);
}

/// Numbers are part of a graph's signature: a graph may do Python
/// arithmetic on them, which capture would bake in. So is the float32
/// matmul setting its dots were captured with.
fn signature(id: u64, args: &[Arg]) -> Vec<u64> {
    let mut key = exec::signature(id, |_| false, args);
    key.push(exec::f32_precision() as u64);
    key
}

/// Runs graph `id` on `args` (its tensors, then its numbers): the new
/// storages its outputs view, and the plan saying which views; None if the
/// graph has not been captured for this signature yet.
pub fn call(id: u64, args: &[Arg]) -> Result<Option<(Vec<Arc<Storage>>, Arc<GraphPlan>)>> {
    let key = signature(id, args);
    let Some(gp) = GRAPHS.lock().unwrap().get(&id).and_then(|g| g.plans.get(&key).cloned()) else {
        return Ok(None);
    };
    let device = exec::device_of(&gp.plan.name, args)?;
    bump(&METRICS.graph_calls);
    let mut values = Vec::with_capacity(gp.plan.outputs.len());
    exec::apply(&gp.plan, &gp.plan.name, args, device, &mut values)?;
    for &(arg, out) in &gp.writes {
        let storage = exec::storage_of(&exec::tensor_at(args, arg, 0)?).expect("a written argument is on the device");
        storage.set(values[out].clone());
    }
    let storages =
        gp.storages.iter().map(|&(n, out)| Storage::new(device, n, out.map(|o| values[o].clone()))).collect();
    if gp.ends_step {
        trace::flush(trace::Reason::Step)?;
    }
    Ok(Some((storages, gp)))
}

/// The capture in progress: which graph and signature, and the placeholder
/// storage of each tensor argument with the value it started with.
struct Capture {
    id: u64,
    key: Vec<u64>,
    placeholders: Vec<Placeholder>,
    ends_step: bool,
}

struct Placeholder {
    arg: usize,
    storage: Arc<Storage>,
    initial: Option<Value>,
    /// Stands for a CPU tensor, uploaded at each call.
    host: bool,
}

static CAPTURE: Mutex<Option<Capture>> = Mutex::new(None);

/// Starts capturing graph `id` for the signature of `args`: returns the
/// placeholder storages and the views the graph is to run on, one per
/// tensor argument (arguments sharing a storage share a placeholder).
pub fn begin(id: u64, args: &[Arg]) -> Result<(Vec<Arc<Storage>>, Vec<View>)> {
    if trace::capturing() {
        return Err(Error::runtime("torchtpu: a graph is captured while another one is"));
    }
    let device = exec::device_of("a compiled graph", args)?;
    trace::begin_capture(device)?;
    let mut placeholders: Vec<Placeholder> = Vec::new();
    // The real storage of each placeholder (null for CPU tensors).
    let mut real: Vec<*const Storage> = Vec::new();
    let mut views = Vec::new();
    for (arg, a) in args.iter().enumerate() {
        let Arg::Tensor(t) = a else { continue };
        let shared = exec::storage_of(&t).and_then(|s| real.iter().position(|&r| std::ptr::eq(r, s)));
        let k = match shared {
            Some(k) => k,
            None => {
                let (host, nbytes, value) = match (t.device, exec::storage_of(&t)) {
                    (None, _) => {
                        let ty = t.ty();
                        let bytes = ty.numel() * t.dtype.size() as i64;
                        (true, bytes, Some(trace::placeholder(ty, Input::Host { arg, item: 0 })?))
                    }
                    (Some(_), Some(s)) => {
                        let value = match s.value() {
                            Some(v) => Some(trace::placeholder(v.ty().clone(), Input::Storage { arg, item: 0 })?),
                            None => None,
                        };
                        (false, s.nbytes, value)
                    }
                    (Some(_), None) => (false, 0, None), // an empty tensor
                };
                let initial = value.map(Value::Pending);
                let storage = Storage::new(device, nbytes, initial.clone());
                placeholders.push(Placeholder { arg, storage, initial, host });
                real.push(exec::storage_of(&t).map_or(std::ptr::null(), |s| s as *const Storage));
                placeholders.len() - 1
            }
        };
        let mut view = View::of(t, Source::New(k));
        if placeholders[k].host {
            view.strides = crate::ir::view::contiguous_strides(t.sizes);
            view.offset = 0;
        }
        views.push(view);
    }
    let storages = placeholders.iter().map(|p| p.storage.clone()).collect();
    *CAPTURE.lock().unwrap() = Some(Capture { id, key: signature(id, args), placeholders, ends_step: false });
    Ok((storages, views))
}

/// Abandons the capture in progress (the graph could not be captured).
pub fn abort() {
    trace::end_capture();
    CAPTURE.lock().unwrap().take();
}

/// Ends the capture: `outputs` are the graph's tensor results, computed on
/// the placeholders. Builds and keeps the plan for the captured signature.
pub fn end(outputs: &[Tensor]) -> Result<()> {
    let capture = CAPTURE.lock().unwrap().take();
    let trace = trace::end_capture();
    let (Some(capture), Some(mut trace)) = (capture, trace) else {
        return Err(Error::runtime("torchtpu: no graph is being captured"));
    };
    trace.graph(); // the recorded plans spliced: `node` reads their nodes
    let placeholder = |s: &Storage| capture.placeholders.iter().find(|p| std::ptr::eq(Arc::as_ptr(&p.storage), s));
    let mut roots: Vec<V> = Vec::new();
    let mut storages: Vec<(*const Storage, i64, Option<usize>)> = Vec::new();
    let mut views = Vec::new();
    for t in outputs {
        if t.device.is_none() {
            return Err(uncapturable("it returns a CPU tensor"));
        }
        let Some(storage) = exec::storage_of(&t) else {
            storages.push((std::ptr::null(), 0, None)); // an empty tensor
            views.push(View::of(t, Source::New(storages.len() - 1)));
            continue;
        };
        if let Some(p) = placeholder(storage) {
            if p.host {
                return Err(uncapturable("it returns a view of a CPU input"));
            }
            views.push(View::of(t, Source::Arg(p.arg)));
            continue;
        }
        let k = match storages.iter().position(|&(s, ..)| std::ptr::eq(s, storage)) {
            Some(k) => k,
            None => {
                let out = match storage.value() {
                    Some(value) => {
                        roots.push(node(&mut trace, &value)?);
                        Some(roots.len() - 1)
                    }
                    None if storage.nbytes == 0 => None,
                    None => return Err(uncapturable("it returns uninitialized memory")),
                };
                storages.push((storage, storage.nbytes, out));
                storages.len() - 1
            }
        };
        views.push(View::of(t, Source::New(k)));
    }
    let mut writes = Vec::new();
    for p in &capture.placeholders {
        let value = p.storage.value();
        let same = match (&value, &p.initial) {
            (Some(Value::Pending(a)), Some(Value::Pending(b))) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if same {
            continue;
        }
        if p.host {
            return Err(uncapturable("it writes a CPU input"));
        }
        let value = value.ok_or_else(|| uncapturable("it unsets an input"))?;
        writes.push((p.arg, roots.len()));
        roots.push(node(&mut trace, &value)?);
    }
    let checks: Vec<V> = trace.check_nodes().collect();
    let (mut g, params, map) = trace::prune(trace.graph(), roots.iter().copied().chain(checks));
    g.outputs = roots.iter().map(|&v| map[v]).collect();
    let outputs = g.outputs.iter().map(|&v| g.ty(v).clone()).collect();
    let mut plan_checks = Vec::new();
    for c in trace.checks() {
        g.outputs.push(map[c.flag]);
        let flag = g.outputs.len() - 1;
        let value = c.value.map(|v| {
            g.outputs.push(map[v]);
            g.outputs.len() - 1
        });
        plan_checks.push(lower::Check { flag, value, kind: c.kind, message: c.message.clone() });
    }
    let mut constants = Vec::new();
    let inputs = params
        .iter()
        .map(|&n| match &trace.params[n] {
            Param::Input(input, _) => input.clone(),
            Param::Buffer(b) => {
                constants.push(b.clone());
                Input::Constant(constants.len() - 1)
            }
            Param::Future(_) => unreachable!("a capture starts with a flush that waits for the flush thread"),
        })
        .collect();
    let mut graphs = GRAPHS.lock().unwrap();
    let graph = graphs.get_mut(&capture.id).ok_or_else(|| Error::runtime("torchtpu: the graph was freed"))?;
    let plan = Plan::new(format!("compiled graph {}", graph.name), g, inputs, outputs, plan_checks, constants);
    let storages = storages.into_iter().map(|(_, n, out)| (n, out)).collect();
    let gp = GraphPlan { plan: Arc::new(plan), storages, writes, views, ends_step: capture.ends_step };
    graph.plans.insert(capture.key, Arc::new(gp));
    bump(&METRICS.graph_captures);
    Ok(())
}

/// The end of an optimizer step (`torchtpu::step_end`, which the step hook
/// puts into compiled steps): fused mode's flush, or, while a graph is
/// captured, a mark that the graph flushes after each call.
pub fn step_end() -> Result<()> {
    if let Some(capture) = CAPTURE.lock().unwrap().as_mut() {
        capture.ends_step = true;
        return Ok(());
    }
    trace::flush(trace::Reason::Step)
}

/// The capture's node holding `value`: one it computed, or a constant
/// parameter (a tensor the graph holds, or a value computed before).
fn node(trace: &mut Trace, value: &Value) -> Result<V> {
    if let Value::Pending(p) = value {
        if p.epoch == trace.epoch {
            return Ok(trace.node(p));
        }
    }
    Ok(trace.buffer_param(exec::resolve(value, trace::Reason::Capture)?))
}

fn uncapturable(why: &str) -> Error {
    Error::runtime(format!("torchtpu: this graph cannot run as one program: {why}"))
}
