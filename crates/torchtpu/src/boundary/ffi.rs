//! The `extern "C"` functions the adapter calls (`csrc/ffi.h`). Each one
//! only converts arguments and errors; panics never cross into C++.
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::boundary::args::{self, TtArg, TtTensor};
use crate::distributed::collective;
use crate::error::{Error, Result};
use crate::exec::trace::{self, Reason};
use crate::exec::{self, compiled};
use crate::lower::args::{Arg, Tensor};
use crate::runtime::storage::Storage;
use crate::runtime::{self, event, memory};
use crate::{lower, metrics};

#[repr(C)]
pub struct TtSchemaArg {
    name: *const c_char,
    ty: *const c_char,
    is_out: u8,
    is_written: u8,
}

#[repr(C)]
pub struct TtResult {
    storage: *mut c_void,
    addr: u64,
    nbytes: i64,
    sizes: *const i64,
    /// Null where the result is contiguous.
    strides: *const i64,
    ndim: i32,
    dtype: i32,
    device: i32,
}

#[repr(C)]
pub struct TtView {
    source: i64,
    sizes: *const i64,
    strides: *const i64,
    offset: i64,
    ndim: i32,
    dtype: i32,
}

#[repr(C)]
pub struct TtGraphResults {
    storages: *const TtResult,
    nstorages: i64,
    views: *const TtView,
    nviews: i64,
}

/// Not an error: the compiled graph has no plan for this signature yet.
const TT_GRAPH_MISS: i32 = 8;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Results of the last tt_op_run on this thread, and their shapes, one
    /// after the other.
    static RESULTS: RefCell<(Vec<TtResult>, Vec<i64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// Results of the last compiled-graph call or capture on this thread:
    /// the new storages, the views and what their shapes point into.
    static GRAPH_RESULTS: RefCell<(Vec<TtResult>, Vec<TtView>, Vec<compiled::View>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    /// tt_op_run's list of decoded arguments, kept (empty) between calls so
    /// that an op allocates none.
    static ARGS: Cell<Vec<Arg<'static>>> = const { Cell::new(Vec::new()) };
    /// tt_op_run's list of result storages, kept (empty) as `ARGS`.
    static STORAGES: Cell<Vec<Option<Arc<Storage>>>> = const { Cell::new(Vec::new()) };
}

/// `list` emptied, for the next call's arguments.
fn recycle(mut list: Vec<Arg<'_>>) -> Vec<Arg<'static>> {
    list.clear();
    // SAFETY: the list is empty, so no borrow of the call's arguments
    // outlives it: only its allocation is kept.
    unsafe { std::mem::transmute::<Vec<Arg<'_>>, Vec<Arg<'static>>>(list) }
}

/// Runs `f`, turning errors and panics into a status code and a message.
fn guard(f: impl FnOnce() -> Result<()>) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(Error::runtime(format!("torchtpu internal error: {}", msg.unwrap_or_default())))
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            let kind = e.kind as i32;
            LAST_ERROR.with(|l| *l.borrow_mut() = CString::new(e.message.replace('\0', " ")).unwrap_or_default());
            kind
        }
    }
}

unsafe fn str_arg<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        ""
    } else {
        CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

#[no_mangle]
pub extern "C" fn tt_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn tt_storage_new(nbytes: i64, device: i32, storage: *mut *mut c_void, addr: *mut u64) -> i32 {
    guard(|| {
        let s = Storage::new(device as usize, nbytes, None);
        *addr = s.addr;
        *storage = Storage::into_handle(s);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_storage_release(storage: *mut c_void) {
    if !storage.is_null() {
        Storage::release(storage);
    }
}

#[no_mangle]
pub unsafe extern "C" fn tt_storage_resize(
    old: *mut c_void,
    nbytes: i64,
    storage: *mut *mut c_void,
    addr: *mut u64,
) -> i32 {
    guard(|| {
        let s = exec::resized(Storage::from_handle(old), nbytes)?;
        *addr = s.addr;
        *storage = Storage::into_handle(s);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_storage_assign(dst: *mut c_void, src: *mut c_void) -> i32 {
    guard(|| {
        let value =
            Storage::from_handle(src).value().ok_or_else(|| Error::runtime("torchtpu: assigning an unset storage"))?;
        Storage::from_handle(dst).set(value);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_op_register(
    name: *const c_char,
    overload: *const c_char,
    args: *mut TtSchemaArg,
    nargs: i64,
    op: *mut i32,
) -> i32 {
    guard(|| {
        let args = std::slice::from_raw_parts_mut(args, nargs.max(0) as usize);
        let defs: Vec<lower::ArgDef> = args
            .iter()
            .map(|a| lower::ArgDef {
                name: str_arg(a.name).into(),
                ty: str_arg(a.ty).into(),
                is_out: a.is_out != 0,
                is_written: a.is_written != 0,
            })
            .collect();
        // In-place: the first argument is written but is not an out= argument.
        // Dunder names (`__rshift__`) are not in-place forms.
        let name = str_arg(name);
        let inplace = !defs.iter().any(|a| a.is_out) && name.ends_with('_') && !name.ends_with("__");
        *op = lower::register(name, str_arg(overload), defs, inplace).unwrap_or(-1);
        if *op >= 0 {
            for (a, def) in args.iter_mut().zip(&lower::get(*op)?.args) {
                a.is_written = def.is_written as u8;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tt_op_checks_meta(op: i32) -> bool {
    lower::get(op).is_ok_and(lower::checks_meta)
}

#[no_mangle]
pub unsafe extern "C" fn tt_op_run(
    op: i32,
    args: *const TtArg,
    nargs: i64,
    results: *mut *const TtResult,
    nresults: *mut i64,
) -> i32 {
    guard(|| {
        let def = lower::get(op)?;
        let mut decoded: Vec<Arg> = ARGS.take();
        for a in std::slice::from_raw_parts(args, nargs.max(0) as usize) {
            decoded.push(args::decode(a)?);
        }
        let mut storages = STORAGES.take();
        let run = exec::run_op(def, &decoded, &mut storages);
        ARGS.set(recycle(decoded));
        let plan = run?; // run_op adds no storage when it fails
        RESULTS.with(|r| {
            let (out, shapes) = &mut *r.borrow_mut();
            out.clear();
            shapes.clear();
            let mut tys = plan.outputs.iter().zip(&plan.layouts);
            for result in storages.drain(..) {
                let Some(s) = result else {
                    out.push(TtResult {
                        storage: std::ptr::null_mut(),
                        addr: 0,
                        nbytes: 0,
                        sizes: std::ptr::null(),
                        strides: std::ptr::null(),
                        ndim: 0,
                        dtype: 0,
                        device: 0,
                    });
                    continue;
                };
                let (ty, layout) = tys.next().expect("a type per defined result");
                shapes.extend(&ty.shape);
                // Strides, where given, follow the sizes in `shapes`; the
                // pointers are set below, once `shapes` stops growing.
                let strides = layout.as_ref().map_or(std::ptr::null(), |l| {
                    shapes.extend(l);
                    std::ptr::NonNull::dangling().as_ptr()
                });
                out.push(TtResult {
                    storage: std::ptr::null_mut(),
                    addr: s.addr,
                    nbytes: s.nbytes,
                    sizes: std::ptr::null(),
                    strides,
                    ndim: ty.shape.len() as i32,
                    dtype: ty.dtype.to_c10(),
                    device: s.device as i32,
                });
                out.last_mut().unwrap().storage = Storage::into_handle(s);
            }
            let mut at = 0;
            for o in out.iter_mut() {
                o.sizes = shapes[at..].as_ptr();
                at += o.ndim as usize;
                if !o.strides.is_null() {
                    o.strides = shapes[at..].as_ptr();
                    at += o.ndim as usize;
                }
            }
            *results = out.as_ptr();
            *nresults = out.len() as i64;
        });
        STORAGES.set(storages);
        Ok(())
    })
}

/// Counts a CPU fallback and runs what fused mode recorded, which the
/// fallback's inputs may need.
#[no_mangle]
pub unsafe extern "C" fn tt_fallback(name: *const c_char) -> i32 {
    let name = str_arg(name);
    if metrics::fallback(name) && std::env::var_os("TORCHTPU_LOG").is_some() {
        eprintln!("torchtpu: {name} has no tpu lowering; it runs on the CPU (copied there and back)");
    }
    guard(|| trace::flush(Reason::Fallback))
}

#[no_mangle]
pub unsafe extern "C" fn tt_copy(src: *const TtTensor, dst: *const TtTensor) -> i32 {
    guard(|| {
        let (Some(s), Some(d)) = (args::tensor(&*src)?, args::tensor(&*dst)?) else {
            return Err(Error::runtime("torchtpu: copy of an undefined tensor"));
        };
        exec::copy(&s, &d)
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_device_count(count: *mut i32) -> i32 {
    guard(|| {
        *count = runtime::get()?.device_count() as i32;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_synchronize(_device: i32) -> i32 {
    guard(exec::synchronize)
}

// ---------------------------------------------------------------- memory

#[no_mangle]
pub unsafe extern "C" fn tt_memory_stats(device: i32, stats: *mut memory::DeviceStats) -> i32 {
    guard(|| {
        trace::flush(Reason::Query)?;
        *stats = memory::stats(device as usize)?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tt_memory_reset_peak(device: i32) {
    memory::reset_peak(device as usize)
}

#[no_mangle]
pub extern "C" fn tt_memory_reset_accumulated(device: i32) {
    memory::reset_accumulated(device as usize)
}

#[no_mangle]
pub unsafe extern "C" fn tt_memory_info(device: i32, free: *mut i64, total: *mut i64) -> i32 {
    guard(|| {
        (*free, *total) = memory::info(device as usize)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_host_pin(data: *mut c_void, size: usize) -> i32 {
    guard(|| memory::pin(data, size))
}

#[no_mangle]
pub unsafe extern "C" fn tt_host_unpin(data: *mut c_void) -> i32 {
    guard(|| memory::unpin(data))
}

// ---------------------------------------------------------------- events

#[no_mangle]
pub unsafe extern "C" fn tt_event_record(timing: u8, event: *mut *mut c_void) -> i32 {
    guard(|| {
        trace::flush(Reason::Query)?;
        *event = Arc::into_raw(event::record(timing != 0)?) as *mut c_void;
        Ok(())
    })
}

/// # Safety
/// `event` comes from `tt_event_record` and has not been destroyed.
unsafe fn event_ref<'a>(event: *mut c_void) -> &'a event::Event {
    &*(event as *const event::Event)
}

#[no_mangle]
pub unsafe extern "C" fn tt_event_destroy(event: *mut c_void) {
    drop(Arc::from_raw(event as *const event::Event));
}

#[no_mangle]
pub unsafe extern "C" fn tt_event_query(event: *mut c_void) -> u8 {
    event_ref(event).is_done() as u8
}

#[no_mangle]
pub unsafe extern "C" fn tt_event_synchronize(event: *mut c_void) -> i32 {
    guard(|| event_ref(event).synchronize())
}

#[no_mangle]
pub unsafe extern "C" fn tt_event_elapsed_ms(start: *mut c_void, end: *mut c_void, ms: *mut f64) -> i32 {
    guard(|| {
        *ms = event_ref(start).elapsed_ms(event_ref(end))?;
        Ok(())
    })
}

/// Whether all work issued so far is done (queries of any stream).
#[no_mangle]
pub unsafe extern "C" fn tt_idle(idle: *mut u8) -> i32 {
    guard(|| {
        trace::flush(Reason::Query)?;
        *idle = event::idle()? as u8;
        Ok(())
    })
}

// ---------------------------------------------------------------- compiled graphs

unsafe fn decode_args<'a>(args: *const TtArg, nargs: i64) -> Result<Vec<Arg<'a>>> {
    std::slice::from_raw_parts(args, nargs.max(0) as usize).iter().map(|a| args::decode(a)).collect()
}

/// Hands new storages and views to the adapter (valid until the next
/// compiled-graph call on this thread).
fn graph_results(storages: Vec<Arc<Storage>>, views: Vec<compiled::View>, out: &mut TtGraphResults) {
    GRAPH_RESULTS.with(|r| {
        let (results, tt_views, kept) = &mut *r.borrow_mut();
        results.clear();
        for s in storages {
            results.push(TtResult {
                storage: std::ptr::null_mut(),
                addr: s.addr,
                nbytes: s.nbytes,
                sizes: std::ptr::null(),
                strides: std::ptr::null(),
                ndim: 0,
                dtype: 0,
                device: s.device as i32,
            });
            results.last_mut().unwrap().storage = Storage::into_handle(s);
        }
        *kept = views;
        tt_views.clear();
        tt_views.extend(kept.iter().map(|v| TtView {
            source: match v.source {
                compiled::Source::New(k) => k as i64,
                compiled::Source::Arg(i) => -1 - i as i64,
            },
            sizes: v.sizes.as_ptr(),
            strides: v.strides.as_ptr(),
            offset: v.offset,
            ndim: v.sizes.len() as i32,
            dtype: v.dtype.to_c10(),
        }));
        *out = TtGraphResults {
            storages: results.as_ptr(),
            nstorages: results.len() as i64,
            views: tt_views.as_ptr(),
            nviews: tt_views.len() as i64,
        };
    })
}

/// Runs compiled graph `graph` on its tensors and numbers; TT_GRAPH_MISS
/// if it has not been captured for their signature.
#[no_mangle]
pub unsafe extern "C" fn tt_graph_call(graph: i64, args: *const TtArg, nargs: i64, out: *mut TtGraphResults) -> i32 {
    let mut missed = false;
    let status = guard(|| {
        match compiled::call(graph as u64, &decode_args(args, nargs)?)? {
            Some((storages, plan)) => graph_results(storages, plan.views.clone(), &mut *out),
            None => missed = true,
        }
        Ok(())
    });
    if missed {
        TT_GRAPH_MISS
    } else {
        status
    }
}

/// Starts capturing a compiled graph; returns the placeholders to run it on.
#[no_mangle]
pub unsafe extern "C" fn tt_capture_begin(graph: i64, args: *const TtArg, nargs: i64, out: *mut TtGraphResults) -> i32 {
    guard(|| {
        let (storages, views) = compiled::begin(graph as u64, &decode_args(args, nargs)?)?;
        graph_results(storages, views, &mut *out);
        Ok(())
    })
}

/// Ends the capture with the graph's tensor outputs.
#[no_mangle]
pub unsafe extern "C" fn tt_capture_end(outputs: *const TtTensor, n: i64) -> i32 {
    guard(|| {
        let raw = std::slice::from_raw_parts(outputs, n.max(0) as usize);
        let tensors: Vec<Tensor> =
            raw.iter().map(|t| args::tensor(t)).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect();
        compiled::end(&tensors)
    })
}

#[no_mangle]
pub extern "C" fn tt_step_end() -> i32 {
    guard(compiled::step_end)
}

/// Runs a collective over its group's local devices (`collective::run`).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tt_collective(
    kind: *const c_char,
    op: *const c_char,
    scale: f64,
    root: i64,
    pairs: *const i64,
    npairs: i64,
    devices: *const i64,
    ndevices: i64,
    inputs: *const TtTensor,
    outputs: *const TtTensor,
    n: i64,
) -> i32 {
    guard(|| {
        let text = |s: *const c_char| CStr::from_ptr(s).to_str().map_err(|e| Error::value(e.to_string()));
        let tensors = |p: *const TtTensor| -> Result<Vec<Tensor>> {
            Ok(args::slice(p, n)
                .iter()
                .map(|t| args::tensor(t))
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .flatten()
                .collect())
        };
        let call = collective::Call {
            kind: text(kind)?,
            op: text(op)?,
            scale,
            root,
            pairs: args::slice(pairs, npairs).chunks_exact(2).map(|p| (p[0], p[1])).collect(),
            devices: args::slice(devices, ndevices),
        };
        collective::run(&call, &tensors(inputs)?, &tensors(outputs)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_host_alias(tensor: *const TtTensor, access: *const c_char, address: *mut u64) -> i32 {
    guard(|| {
        let access = collective::Access::parse(str_arg(access))?;
        let alias = match args::tensor(&*tensor)? {
            Some(t) => collective::host_alias(&t, access)?,
            None => None,
        };
        *address = alias.unwrap_or(0) as u64;
        Ok(())
    })
}
