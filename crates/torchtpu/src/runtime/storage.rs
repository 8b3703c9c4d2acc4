//! Storages: the current value of a tensor storage's bytes (DESIGN §3).
//!
//! A storage is one flat array. Its value is an immutable PJRT buffer (of any
//! shape whose bytes are the storage's bytes), a pending value that fused mode
//! has recorded but not yet run, or nothing yet; writing a storage replaces its
//! value. Addresses handed to PyTorch are unique, never dereferenced, and the
//! ranges of live storages never overlap.
use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ir::{Ty, V};
use crate::runtime::memory;

static LIVE_STORAGES: AtomicI64 = AtomicI64::new(0);
static LIVE_BUFFERS: AtomicI64 = AtomicI64::new(0);
static NEXT_ADDR: AtomicU64 = AtomicU64::new(1 << 44);

/// A device buffer together with the IR type of its contents.
pub struct DeviceBuffer {
    pub buf: ManuallyDrop<pjrt::Buffer>,
    /// Shared with the plan that computed it: an op's result allocates no shape.
    pub ty: Arc<Ty>,
    /// The buffer's shape where it is larger than `ty`'s: the output of a
    /// program compiled for a bucket (`exec/bounded.rs`), whose contents are the
    /// box `ty.shape` at its origin; the rest is padding nobody reads.
    pub padded: Option<Vec<i64>>,
    pub device: usize,
    /// Known to be computed (its program had finished when it was tracked):
    /// freeing it asks the plugin nothing.
    computed: AtomicBool,
}

impl DeviceBuffer {
    pub fn new(buf: pjrt::Buffer, ty: impl Into<Arc<Ty>>, device: usize) -> Arc<DeviceBuffer> {
        DeviceBuffer::with_shape(buf, ty, None, device)
    }

    pub fn with_shape(
        buf: pjrt::Buffer,
        ty: impl Into<Arc<Ty>>,
        padded: Option<Vec<i64>>,
        device: usize,
    ) -> Arc<DeviceBuffer> {
        LIVE_BUFFERS.fetch_add(1, Ordering::Relaxed);
        let buffer = DeviceBuffer {
            buf: ManuallyDrop::new(buf),
            ty: ty.into(),
            padded,
            device,
            computed: AtomicBool::new(false),
        };
        memory::allocated(device, buffer.bytes());
        Arc::new(buffer)
    }

    /// The buffer's own shape.
    pub fn shape(&self) -> &[i64] {
        self.padded.as_deref().unwrap_or(&self.ty.shape)
    }

    /// What it holds on the device (counted by `memory`): its size, known
    /// from its type without asking the plugin on every op.
    fn bytes(&self) -> i64 {
        self.shape().iter().product::<i64>() * self.ty.dtype.size() as i64
    }

    pub fn set_computed(&self) {
        self.computed.store(true, Ordering::Relaxed);
    }

    /// Copies the buffer's bytes into `out`. A plugin that allocates as the
    /// program runs (XLA's GPU plugin) reports a program's failure, out of
    /// memory included, only here, when its result is read.
    pub fn to_host(&self, out: &mut [u8]) -> Result<()> {
        self.buf.to_host(out).map_err(|e| Error::on_device(e, "computing a value read back", self.device))
    }
}

/// Freeing a PJRT buffer waits for the programs still using it, so buffers
/// are freed on a thread of their own: dropping a tensor (or flushing a
/// trace) never waits for the device. They go in batches: waking the thread
/// for each buffer cost a decoding loop more than its tiny programs.
struct Frees {
    buffers: Vec<pjrt::Buffer>,
    bytes: i64,
}

static FREES: Mutex<Frees> = Mutex::new(Frees { buffers: Vec::new(), bytes: 0 });
static FREEING: Condvar = Condvar::new();
/// A batch is freed once it holds this many buffers or bytes, or has waited
/// `FREE_DELAY`, whichever comes first.
const FREE_BATCH: usize = 64;
const FREE_BYTES: i64 = 64 << 20;
const FREE_DELAY: Duration = Duration::from_millis(2);

/// Whether a computed buffer is freed at once, on the thread dropping it.
/// XLA:CPU's destroy does not wait for programs still reading the buffer
/// (0.0 ms while a 300 ms product read it), and its frees then stay off the
/// freeing thread, which otherwise meets the main thread's allocations on
/// glibc's arena lock (strict `a + b`: 6.7 -> 5.8 µs; bench/RESULTS.md,
/// 2026-11-27). Other plugins keep the thread for every buffer.
fn frees_computed_at_once(buf: &pjrt::Buffer, computed: bool) -> bool {
    static ON_CPU: OnceLock<bool> = OnceLock::new();
    *ON_CPU.get_or_init(|| super::get().is_ok_and(|rt| rt.client.platform_name() == "cpu"))
        && (computed || buf.ready_event().and_then(|e| e.is_ready()).unwrap_or(false))
}

fn free(buf: pjrt::Buffer, bytes: i64, computed: bool) {
    if frees_computed_at_once(&buf, computed) {
        return drop(buf);
    }
    static THREAD: OnceLock<()> = OnceLock::new();
    THREAD.get_or_init(|| {
        std::thread::Builder::new()
            .name("torchtpu-free".into())
            .spawn(|| loop {
                let mut frees = FREES.lock().unwrap();
                while frees.buffers.is_empty() {
                    frees = FREEING.wait(frees).unwrap();
                }
                let filling = |f: &mut Frees| f.buffers.len() < FREE_BATCH && f.bytes < FREE_BYTES;
                let (mut frees, _) = FREEING.wait_timeout_while(frees, FREE_DELAY, filling).unwrap();
                let batch = std::mem::take(&mut frees.buffers);
                frees.bytes = 0;
                drop(frees);
                drop(batch);
            })
            .expect("spawning the buffer-freeing thread");
    });
    let mut frees = FREES.lock().unwrap();
    frees.buffers.push(buf);
    frees.bytes += bytes;
    // The thread sleeps until a batch starts, then until it fills.
    if frees.buffers.len() == 1 || frees.buffers.len() >= FREE_BATCH || frees.bytes >= FREE_BYTES {
        FREEING.notify_one();
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        LIVE_BUFFERS.fetch_sub(1, Ordering::Relaxed);
        memory::freed(self.device, self.bytes());
        // SAFETY: `buf` is not used after this.
        free(unsafe { ManuallyDrop::take(&mut self.buf) }, self.bytes(), *self.computed.get_mut());
    }
}

/// A value recorded in fused mode's trace: node `node` of trace `epoch`.
/// Whoever holds it keeps it alive, which is what makes the flushed program
/// output it; the flush then fills `result`, at once or (a trace flushed at
/// a step's end, `exec/overlap.rs`) on the flush thread.
pub struct Pending {
    pub epoch: u64,
    pub node: V,
    /// Shared with its plan: recording a result allocates no shape.
    pub ty: Arc<Ty>,
    pub result: OnceLock<Result<Arc<DeviceBuffer>>>,
    /// Its trace was flushed: `result` is filled now or soon, never left empty.
    pub flushed: AtomicBool,
    /// What this value replaced in its storage: the flush donates that
    /// buffer to this value, so XLA updates it in place rather than copying
    /// it first.
    pub replaces: OnceLock<Replaced>,
}

/// Identities (addresses) of what a pending value replaced.
#[derive(Clone, Copy)]
pub enum Replaced {
    Buffer(usize),
    /// A value whose flush has not finished yet: its buffer, once known.
    Pending(usize),
}

impl Pending {
    pub fn new(epoch: u64, node: V, ty: Arc<Ty>) -> Arc<Pending> {
        Arc::new(Pending::fresh(epoch, node, ty))
    }

    /// `spare` (a value nobody holds any more) as a new pending value, in
    /// place of an allocation.
    pub fn reuse(mut spare: Arc<Pending>, epoch: u64, node: V, ty: Arc<Ty>) -> Arc<Pending> {
        *Arc::get_mut(&mut spare).expect("a spare pending value is unshared") = Pending::fresh(epoch, node, ty);
        spare
    }

    fn fresh(epoch: u64, node: V, ty: Arc<Ty>) -> Pending {
        Pending { epoch, node, ty, result: OnceLock::new(), flushed: AtomicBool::new(false), replaces: OnceLock::new() }
    }

    /// The computed buffer: None if its trace was not flushed yet; waits for
    /// a flush still running.
    pub fn buffer(&self) -> Option<Result<Arc<DeviceBuffer>>> {
        let result = match self.flushed.load(Ordering::Acquire) {
            true => Some(self.result.wait()),
            false => self.result.get(),
        };
        result.map(|r| {
            r.clone()
                .map_err(|e| Error { message: format!("torchtpu: this tensor's value was lost: {}", e.message), ..e })
        })
    }

    /// The computed buffer, if there is one already.
    pub fn ready(&self) -> Option<&Arc<DeviceBuffer>> {
        self.result.get().and_then(|r| r.as_ref().ok())
    }
}

#[derive(Clone)]
pub enum Value {
    Ready(Arc<DeviceBuffer>),
    Pending(Arc<Pending>),
}

impl Value {
    pub fn ty(&self) -> &Ty {
        match self {
            Value::Ready(b) => &b.ty,
            Value::Pending(p) => &p.ty,
        }
    }

    /// The buffer, if it has been computed (or the error that lost it).
    pub fn buffer(&self) -> Option<Result<Arc<DeviceBuffer>>> {
        match self {
            Value::Ready(b) => Some(Ok(b.clone())),
            Value::Pending(p) => p.buffer(),
        }
    }
}

pub struct Storage {
    pub device: usize,
    pub nbytes: i64,
    pub addr: u64,
    value: Mutex<Option<Value>>,
}

/// Storages released on a thread, kept for the next ones it makes, so that
/// a step recorded again allocates none. Counted as freed while kept.
struct Spares(Vec<Arc<Storage>>);

const SPARES: usize = 256;

impl Drop for Spares {
    fn drop(&mut self) {
        // Their drops below count them freed a second time.
        LIVE_STORAGES.fetch_add(self.0.len() as i64, Ordering::Relaxed);
    }
}

thread_local! {
    static SPARE: RefCell<Spares> = const { RefCell::new(Spares(Vec::new())) };
}

impl Storage {
    pub fn new(device: usize, nbytes: i64, value: Option<Value>) -> Arc<Storage> {
        LIVE_STORAGES.fetch_add(1, Ordering::Relaxed);
        let span = (nbytes.max(1) as u64).div_ceil(64) * 64;
        let addr = NEXT_ADDR.fetch_add(span, Ordering::Relaxed);
        let spare = SPARE.try_with(|s| s.borrow_mut().0.pop()).ok().flatten();
        match spare {
            Some(mut s) => {
                let storage = Arc::get_mut(&mut s).expect("a spare storage is unshared");
                (storage.device, storage.nbytes, storage.addr) = (device, nbytes, addr);
                *storage.value.get_mut().unwrap_or_else(|e| e.into_inner()) = value;
                s
            }
            None => Arc::new(Storage { device, nbytes, addr, value: Mutex::new(value) }),
        }
    }

    pub fn value(&self) -> Option<Value> {
        let mut slot = self.value.lock().unwrap();
        // A computed pending value becomes a plain buffer, so that the
        // storage alone holds it (and a later program may donate it).
        if let Some(Value::Pending(p)) = &*slot {
            if let Some(b) = p.ready() {
                *slot = Some(Value::Ready(b.clone()));
            }
        }
        slot.clone()
    }

    pub fn set(&self, value: Value) {
        let mut slot = self.value.lock().unwrap();
        if let (Value::Pending(new), Some(old)) = (&value, slot.as_ref()) {
            let replaced = match old {
                Value::Ready(b) => Some(Replaced::Buffer(Arc::as_ptr(b) as usize)),
                Value::Pending(p) => match p.ready() {
                    Some(b) => Some(Replaced::Buffer(Arc::as_ptr(b) as usize)),
                    None if p.flushed.load(Ordering::Acquire) => Some(Replaced::Pending(Arc::as_ptr(p) as usize)),
                    None => p.replaces.get().copied(),
                },
            };
            if let Some(addr) = replaced {
                let _ = new.replaces.set(addr);
            }
        }
        *slot = Some(value);
    }

    /// Replaces the computed buffer `old` by `new`, holding the same elements
    /// (an unpadded copy), unless the storage's value changed meanwhile.
    pub fn exchange(&self, old: &Arc<DeviceBuffer>, new: Arc<DeviceBuffer>) {
        let mut slot = self.value.lock().unwrap();
        let holds_old = match &*slot {
            Some(Value::Ready(b)) => Arc::ptr_eq(b, old),
            Some(Value::Pending(p)) => p.ready().is_some_and(|b| Arc::ptr_eq(b, old)),
            None => false,
        };
        if holds_old {
            *slot = Some(Value::Ready(new));
        }
    }

    /// Hands a storage to C++ as an opaque handle (one strong reference).
    pub fn into_handle(s: Arc<Storage>) -> *mut std::ffi::c_void {
        Arc::into_raw(s) as *mut _
    }

    /// Borrows the storage behind a handle.
    ///
    /// # Safety
    /// `h` comes from `into_handle` and has not been released.
    pub unsafe fn from_handle<'a>(h: *const std::ffi::c_void) -> &'a Storage {
        &*(h as *const Storage)
    }

    /// # Safety
    /// `h` comes from `into_handle`; it is released once.
    pub unsafe fn release(h: *const std::ffi::c_void) {
        let mut s = Arc::from_raw(h as *const Storage);
        // Held elsewhere too: only this reference goes.
        let Some(storage) = Arc::get_mut(&mut s) else { return };
        // Its value goes now, as it would with the storage.
        *storage.value.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        let _ = SPARE.try_with(move |spare| {
            let spare = &mut spare.borrow_mut().0;
            if spare.len() < SPARES {
                LIVE_STORAGES.fetch_sub(1, Ordering::Relaxed);
                spare.push(s);
            }
        });
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        LIVE_STORAGES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// (live storages, live device buffers): what leak tests watch.
pub fn live_counts() -> (i64, i64) {
    (LIVE_STORAGES.load(Ordering::Relaxed), LIVE_BUFFERS.load(Ordering::Relaxed))
}
