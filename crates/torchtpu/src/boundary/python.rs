//! The `torchtpu._C` Python module: configuration, modes and diagnostics.
//! Per-op work never passes through here (it goes adapter -> `ffi`); custom
//! kernels' fast path only hands Python's arguments on to the adapter.
use pyo3::exceptions::{PyIndexError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::error::{Error, Kind};
use crate::exec::{self, compiled, trace};
use crate::ir::dtype::DType;
use crate::ir::{kernel, Ty};
use crate::metrics::METRICS;
use crate::runtime::{self, cache, storage};

fn py_err(e: Error) -> PyErr {
    match e.kind {
        Kind::Value => PyValueError::new_err(e.message),
        Kind::Index => PyIndexError::new_err(e.message),
        Kind::Type => PyTypeError::new_err(e.message),
        Kind::NotImplemented => PyNotImplementedError::new_err(e.message),
        _ => PyRuntimeError::new_err(e.message),
    }
}

/// Chooses the PJRT plugin and its client's options (bool, int, float, str
/// or a list of ints each); returns False if the runtime already started.
#[pyfunction]
fn configure(plugin: std::path::PathBuf, options: &Bound<'_, PyDict>) -> PyResult<bool> {
    let mut named = Vec::with_capacity(options.len());
    for (name, value) in options.iter() {
        // bool before int: Python's bools are ints (extracting a bool takes only bools).
        let value = if let Ok(b) = value.extract::<bool>() {
            pjrt::NamedValue::Bool(b)
        } else if let Ok(i) = value.extract::<i64>() {
            pjrt::NamedValue::Int64(i)
        } else if let Ok(f) = value.extract::<f64>() {
            pjrt::NamedValue::Float(f as f32)
        } else if let Ok(s) = value.extract::<String>() {
            pjrt::NamedValue::Str(s)
        } else {
            pjrt::NamedValue::Int64List(value.extract::<Vec<i64>>()?)
        };
        named.push((name.extract::<String>()?, value));
    }
    Ok(runtime::configure(plugin, named))
}

#[pyfunction]
fn device_count() -> usize {
    runtime::get().map_or(0, |rt| rt.device_count())
}

/// Starts the runtime, raising the plugin's error if it cannot.
#[pyfunction]
fn init() -> PyResult<String> {
    let rt = runtime::get().map_err(py_err)?;
    Ok(format!("{} ({})", rt.client.platform_name(), rt.plugin.display()))
}

/// Starts the runtime as process `node_id` of `num_nodes`, holding local
/// device `local_device`, the processes meeting through `store` (a
/// torch.distributed Store) within `timeout` seconds; the global id of each
/// one's device (`runtime::join`). `tell_plugin`: the PJRT client is made for
/// the group (GPUs).
#[pyfunction]
fn join(
    py: Python<'_>,
    store: &Bound<'_, PyAny>,
    node_id: i64,
    num_nodes: i64,
    local_device: i64,
    timeout: f64,
    tell_plugin: bool,
) -> PyResult<Vec<i64>> {
    // SAFETY: `store` is a live object and the GIL is held.
    let store = unsafe { crate::distributed::store::GroupStore::adopt(store.as_ptr().cast()) }.map_err(py_err)?;
    let group = runtime::Group { node_id, num_nodes, local_device, store: std::sync::Arc::new(store), tell_plugin };
    // The processes meet while the client is made; the store may need the GIL.
    let timeout = std::time::Duration::from_secs_f64(timeout.max(0.0));
    py.detach(|| runtime::join(group, timeout)).map_err(py_err)
}

/// The global id of device `index`: what a collective program over several
/// processes' devices names it by.
#[pyfunction]
fn device_id(index: usize) -> PyResult<i64> {
    let rt = runtime::get().map_err(py_err)?;
    Ok(rt.device(index).map_err(py_err)?.id() as i64)
}

#[pyfunction]
fn is_initialized() -> bool {
    runtime::started()
}

/// (device kind, platform) of a device, as its plugin names them: the
/// accelerator's model where the plugin knows it ("cpu" on XLA:CPU).
#[pyfunction]
fn device_name(index: usize) -> PyResult<(String, String)> {
    let rt = runtime::get().map_err(py_err)?;
    let device = rt.device(index).map_err(py_err)?;
    Ok((device.kind().to_string(), rt.client.platform_name().to_string()))
}

#[pyfunction]
fn synchronize() -> PyResult<()> {
    exec::synchronize().map_err(py_err)
}

/// Runs what fused mode has recorded (without waiting for it); `reason` is
/// counted under the metrics' "flushes".
#[pyfunction]
fn flush(reason: &str) -> PyResult<()> {
    trace::flush(trace::Reason::parse(reason).map_err(py_err)?).map_err(py_err)
}

#[pyfunction]
fn set_mode(mode: &str) -> PyResult<()> {
    exec::set_mode(mode).map_err(py_err)
}

#[pyfunction]
fn get_mode() -> &'static str {
    exec::mode_name()
}

/// Counters, and CPU fallbacks by operator name.
#[pyfunction]
fn metrics(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    // Counts include the flushes queued so far.
    crate::exec::overlap::wait();
    let d = PyDict::new(py);
    for (name, value) in METRICS.counters() {
        d.set_item(name, value)?;
    }
    let fallbacks = PyDict::new(py);
    for (op, n) in METRICS.fallbacks.lock().unwrap().iter() {
        fallbacks.set_item(op, n)?;
    }
    d.set_item("fallbacks", fallbacks)?;
    d.set_item("eager_graphs", METRICS.eager_graphs.lock().unwrap().clone().into_pyobject(py)?)?;
    let (storages, buffers) = storage::live_counts();
    d.set_item("live_storages", storages)?;
    d.set_item("live_buffers", buffers)?;
    d.set_item("cached_scalars", exec::cached_scalars())?;
    d.set_item("flushes", METRICS.flushes.lock().unwrap().clone().into_pyobject(py)?)?;
    d.set_item("recompile_reasons", METRICS.recompile_reasons.lock().unwrap().clone())?;
    d.set_item("bucket_refusals", METRICS.bucket_refusals.lock().unwrap().clone().into_pyobject(py)?)?;
    d.set_item("ops_pending", trace::recorded())?;
    Ok(d)
}

/// The matrix products and convolutions whose shapes a TPU pads or
/// under-fills (`exec::advice`), the most wasteful first.
#[pyfunction]
fn advice(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    exec::advice::findings()
        .into_iter()
        .map(|f| {
            let d = PyDict::new(py);
            d.set_item("kind", f.kind)?;
            d.set_item("op", f.op)?;
            d.set_item("source", f.source)?;
            d.set_item("dtype", f.dtype.torch_name())?;
            d.set_item("shapes", (f.lhs, f.rhs))?;
            d.set_item("rows_contracting_columns", f.mkn.to_vec())?;
            d.set_item("wasted", f.wasted)?;
            d.set_item("reasons", f.reasons)?;
            d.set_item("count", f.count)?;
            Ok(d)
        })
        .collect()
}

#[pyfunction]
fn clear_advice() {
    exec::advice::clear();
}

#[pyfunction]
fn reset_metrics() {
    crate::exec::overlap::wait();
    METRICS.reset();
}

/// Base names of the ATen operators the op table lowers (all overloads,
/// in-place and out= forms of a name reach the same lowering).
#[pyfunction]
fn lowered_ops() -> Vec<&'static str> {
    crate::lower::lowered_names()
}

/// Registers a graph of the Dynamo backend; returns its id.
#[pyfunction]
fn graph_new(name: &str) -> u64 {
    compiled::new(name)
}

#[pyfunction]
fn graph_free(id: u64) {
    compiled::free(id)
}

/// Notes that compiled graph `name` runs op by op, and why.
#[pyfunction]
fn graph_eager(name: &str, reason: &str) {
    METRICS.eager_graphs.lock().unwrap().insert(name.to_string(), reason.to_string());
}

/// Abandons the capture in progress (its graph runs op by op instead).
#[pyfunction]
fn capture_abort() {
    compiled::abort()
}

/// The plugin's platform ("cpu", "cuda", "tpu") and the StableHLO version
/// it reads ("1.13.3"; None if it does not say).
#[pyfunction]
fn platform() -> PyResult<(String, Option<String>)> {
    let rt = runtime::get().map_err(py_err)?;
    let version = rt.client.api().attributes().iter().find_map(|(k, v)| match (k.as_str(), v) {
        ("stablehlo_current_version", pjrt::NamedValue::Int64List(v)) => {
            Some(v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("."))
        }
        _ => None,
    });
    Ok((rt.client.platform_name().to_string(), version))
}

type Avals = Vec<(String, Vec<i64>)>;

/// Registers a kernel lowered by the front end: its private functions, the
/// entry's symbol and its (element type, shape) inputs and outputs.
#[pyfunction]
fn kernel_register(name: &str, entry: &str, functions: String, inputs: Avals, outputs: Avals) -> PyResult<i64> {
    let types = |avals: Avals| -> crate::error::Result<Vec<Ty>> {
        avals.into_iter().map(|(dtype, shape)| Ok(Ty::new(DType::from_mlir(&dtype)?, &shape))).collect()
    };
    let kernel = kernel::Kernel {
        name: name.to_string(),
        entry: entry.to_string(),
        functions,
        inputs: types(inputs).map_err(py_err)?,
        outputs: types(outputs).map_err(py_err)?,
    };
    kernel::register(kernel).map_err(py_err)
}

// The adapter's functions of Python objects: custom kernels' fast path
// (csrc/kernel.cpp), the default generators (csrc/generator.cpp) and the
// c10d Backend of older torch (csrc/python_backend.cpp).
extern "C" {
    fn tt_kernel_table_new() -> i64;
    fn tt_kernel_table_put(table: i64, args: *mut std::ffi::c_void, kernel: i64);
    fn tt_kernel_table_call(table: i64, args: *mut std::ffi::c_void) -> *mut std::ffi::c_void;
    fn tt_default_generator(device: i32) -> *mut std::ffi::c_void;
    fn tt_seed_when_made(device: i32, seed: u64) -> bool;
    fn tt_python_backend(backend: *mut std::ffi::c_void) -> *mut std::ffi::c_void;
    fn tt_python_backend_impl(backend: *mut std::ffi::c_void) -> *mut std::ffi::c_void;
    fn tt_premul_factor(op: *mut std::ffi::c_void) -> *mut std::ffi::c_void;
}

/// An adapter call's new reference, or the Python error it set.
fn owned<'py>(py: Python<'py>, out: *mut std::ffi::c_void) -> PyResult<Bound<'py, PyAny>> {
    if out.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a non-null result is a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
}

/// Keeps `seed` for tpu:`device` (-1: all; -2: the current one) until the
/// default generators are made, without starting the runtime; false if they are.
#[pyfunction]
fn seed_when_made(device: i32, seed: u64) -> bool {
    // SAFETY: plain values; the adapter locks its own state.
    unsafe { tt_seed_when_made(device, seed) }
}

/// tpu:`device`'s default generator, a torch.Generator (csrc/generator.cpp).
#[pyfunction]
fn default_generator(py: Python<'_>, device: i32) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: the GIL is held.
    owned(py, unsafe { tt_default_generator(device) })
}

/// `backend` (torchtpu.distributed's, a Python object) as a c10d Backend, on
/// a torch whose Python cannot subclass c10d's (before 2.15).
#[pyfunction]
fn python_backend<'py>(py: Python<'py>, backend: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `backend` is a live object and the GIL is held.
    owned(py, unsafe { tt_python_backend(backend.as_ptr().cast()) })
}

/// The Python object a `python_backend` carries; None for any other object.
#[pyfunction]
fn python_backend_impl<'py>(py: Python<'py>, backend: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `backend` is a live object and the GIL is held.
    owned(py, unsafe { tt_python_backend_impl(backend.as_ptr().cast()) })
}

/// A PREMUL_SUM ReduceOp's factor, where this torch's Python does not show it
/// (before 2.15).
#[pyfunction]
fn premul_factor<'py>(py: Python<'py>, op: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `op` is a live object and the GIL is held.
    owned(py, unsafe { tt_premul_factor(op.as_ptr().cast()) })
}

/// A new table of a custom kernel's lowered call signatures, for its fast
/// path (`csrc/kernel.cpp`).
#[pyfunction]
fn kernel_table() -> i64 {
    // SAFETY: called with the GIL held, as the adapter's tables require.
    unsafe { tt_kernel_table_new() }
}

/// Records that calls with the signature of `args` run lowered kernel `kernel`.
#[pyfunction]
fn kernel_table_put(table: i64, args: &Bound<'_, PyTuple>, kernel: i64) {
    // SAFETY: `args` is a live tuple and the GIL is held.
    unsafe { tt_kernel_table_put(table, args.as_ptr().cast(), kernel) }
}

/// The kernel's output for `args` where their signature was recorded, else None.
#[pyfunction]
fn kernel_call<'py>(py: Python<'py>, table: i64, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `args` is a live tuple and the GIL is held; a non-null result is
    // a new reference.
    let out = unsafe { tt_kernel_table_call(table, args.as_ptr().cast()) };
    if out.is_null() {
        return match PyErr::take(py) {
            Some(e) => Err(e),
            None => Ok(py.None().into_bound(py)),
        };
    }
    Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
}

/// Writes the compilation cache's entries to one file (`torchtpu.cache.export`).
#[pyfunction]
fn cache_export(path: std::path::PathBuf) -> PyResult<usize> {
    // With the programs the flush thread is compiling.
    crate::exec::overlap::wait();
    cache::export(&path).map_err(py_err)
}

/// Adds a bundle's entries to the compilation cache (`torchtpu.cache.import_`).
#[pyfunction]
fn cache_import(path: std::path::PathBuf) -> PyResult<usize> {
    cache::import(&path).map_err(py_err)
}

/// At exit: no thread of ours may be inside XLA while its statics go, so
/// the flush thread finishes its queue and an import's preload stops.
#[pyfunction]
fn settle(py: Python<'_>) {
    py.detach(|| {
        crate::exec::overlap::wait();
        cache::settle();
    })
}

/// Compiles every bucket up to `up_to` of the changing sizes met so far,
/// on `threads` threads (`torchtpu.cache.warm_buckets`).
#[pyfunction]
fn warm_buckets(py: Python<'_>, up_to: i64, threads: usize) -> usize {
    py.detach(|| crate::exec::bounded::warm(up_to, threads))
}

/// The bucket a changing size of `s` compiles for (`exec/bounded.rs`).
#[pyfunction]
fn bucket(s: i64) -> i64 {
    crate::exec::bounded::bucket(s)
}

#[pymodule]
#[pyo3(name = "_C")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(advice, m)?)?;
    m.add_function(wrap_pyfunction!(clear_advice, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(join, m)?)?;
    m.add_function(wrap_pyfunction!(device_id, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(device_name, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(flush, m)?)?;
    m.add_function(wrap_pyfunction!(set_mode, m)?)?;
    m.add_function(wrap_pyfunction!(get_mode, m)?)?;
    m.add_function(wrap_pyfunction!(metrics, m)?)?;
    m.add_function(wrap_pyfunction!(reset_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(lowered_ops, m)?)?;
    m.add_function(wrap_pyfunction!(graph_new, m)?)?;
    m.add_function(wrap_pyfunction!(graph_free, m)?)?;
    m.add_function(wrap_pyfunction!(capture_abort, m)?)?;
    m.add_function(wrap_pyfunction!(graph_eager, m)?)?;
    m.add_function(wrap_pyfunction!(platform, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_register, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_table, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_table_put, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_call, m)?)?;
    m.add_function(wrap_pyfunction!(default_generator, m)?)?;
    m.add_function(wrap_pyfunction!(python_backend, m)?)?;
    m.add_function(wrap_pyfunction!(python_backend_impl, m)?)?;
    m.add_function(wrap_pyfunction!(premul_factor, m)?)?;
    m.add_function(wrap_pyfunction!(seed_when_made, m)?)?;
    m.add_function(wrap_pyfunction!(cache_export, m)?)?;
    m.add_function(wrap_pyfunction!(cache_import, m)?)?;
    m.add_function(wrap_pyfunction!(settle, m)?)?;
    m.add_function(wrap_pyfunction!(warm_buckets, m)?)?;
    m.add_function(wrap_pyfunction!(bucket, m)?)?;
    Ok(())
}
