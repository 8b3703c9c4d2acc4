//! The flush thread: a trace flushed at an optimizer step's end (or at its
//! size bound) whose ops were never flushed in that order before, and so
//! likely compiles, is lowered, compiled and launched here while Python
//! records the next step. A step met again launches from the caller's
//! thread, as before: on this 2-core machine, handing every step over cost a
//! loop that reads its loss each step ~10% of its steps/s.
//!
//! Flushes run one at a time, in order, so each may take the values of the
//! ones before as inputs (`trace::Param::Future`). Every other flush, and
//! everything that waits for the device (events, `synchronize`, checks),
//! first waits here for the queue to empty. A flush that fails here marks its
//! values lost, as on the main thread (reading one raises its error); an
//! error no value carries (a failed check) is raised by the next flush or
//! synchronisation point, as CUDA reports an asynchronous error.
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::exec::FxHasher;

type Job = Box<dyn FnOnce() -> Result<()> + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    /// A job is running.
    busy: bool,
    /// The first error of a job nobody has been told of yet.
    failed: Option<Error>,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { jobs: VecDeque::new(), busy: false, failed: None });
/// Signalled when a job is queued.
static WORK: Condvar = Condvar::new();
/// Signalled when the queue empties.
static IDLE: Condvar = Condvar::new();

/// Whether step-end flushes run on the flush thread (`TORCHTPU_OVERLAP=0`
/// runs every flush on the caller's thread).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHTPU_OVERLAP").map_or(true, |v| v != "0"))
}

/// Whether a flush of the ops `ops` (their plans' addresses, in order) goes
/// to the flush thread: the first time they are met.
pub fn first_time(ops: impl Iterator<Item = usize>) -> bool {
    static MET: Mutex<Option<HashSet<u64, BuildHasherDefault<FxHasher>>>> = Mutex::new(None);
    if !enabled() {
        return false;
    }
    let mut h = FxHasher::default();
    ops.for_each(|op| h.write_usize(op));
    let mut met = MET.lock().unwrap();
    let met = met.get_or_insert_with(Default::default);
    if met.len() >= 4096 {
        met.clear();
    }
    met.insert(h.finish())
}

/// Queues `job`; then raises the error of an earlier job, if one failed.
pub fn submit(job: Job) -> Result<()> {
    static THREAD: OnceLock<()> = OnceLock::new();
    THREAD.get_or_init(|| {
        std::thread::Builder::new().name("torchtpu-flush".into()).spawn(work).expect("spawning the flush thread");
    });
    let mut q = QUEUE.lock().unwrap();
    q.jobs.push_back(job);
    WORK.notify_one();
    q.failed.take().map_or(Ok(()), Err)
}

/// Waits until every queued flush has launched.
pub fn wait() {
    let mut q = QUEUE.lock().unwrap();
    while q.busy || !q.jobs.is_empty() {
        q = IDLE.wait(q).unwrap();
    }
}

/// Waits as `wait` does, then raises the error of a job that failed.
pub fn drain() -> Result<()> {
    wait();
    QUEUE.lock().unwrap().failed.take().map_or(Ok(()), Err)
}

fn work() {
    loop {
        let job = {
            let mut q = QUEUE.lock().unwrap();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    q.busy = true;
                    break job;
                }
                q = WORK.wait(q).unwrap();
            }
        };
        let result = catch_unwind(AssertUnwindSafe(job))
            .unwrap_or_else(|_| Err(Error::runtime("torchtpu internal error: a flush panicked")));
        let mut q = QUEUE.lock().unwrap();
        q.busy = false;
        if let Err(e) = result {
            q.failed.get_or_insert(e);
        }
        if q.jobs.is_empty() {
            IDLE.notify_all();
        }
    }
}
