//! Events: points in the device's one in-order queue, with CUDA events'
//! semantics (`torch.Event`, `torch.tpu.Event`). Every tpu stream maps onto
//! that queue, so an event stands for all the work issued before it was
//! recorded: recording watches every computation issued since the last
//! synchronize and not yet done when its execute call returned (whether or
//! not its outputs are still alive; the boundary first issues what fused
//! mode has recorded); the event completes when the last one is done, and
//! the time it did is kept for `elapsed_time`.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::runtime::storage::DeviceBuffer;

/// One completion event per computation issued since the last synchronize,
/// for `synchronize` and events. Kept even when the computation's outputs are
/// dropped: a loop that discards its results must still be waited for.
static ISSUED: Mutex<Vec<Arc<pjrt::Event>>> = Mutex::new(Vec::new());

/// Remembers the computation that produces `outputs` (all of one execute,
/// ready together) until it is waited for, unless it is done already and
/// did not fail (a small program on XLA:CPU runs within its execute call).
pub fn track(outputs: &[Arc<DeviceBuffer>]) -> Result<()> {
    let Some(first) = outputs.first() else { return Ok(()) };
    let ready = first.buf.ready_event()?;
    if ready.is_ready()? && ready.error().is_ok() {
        outputs.iter().for_each(|b| b.set_computed());
        return Ok(());
    }
    let mut issued = ISSUED.lock().unwrap();
    if issued.len() > 4096 {
        issued.retain(|e| !e.is_ready().unwrap_or(true));
    }
    issued.push(Arc::new(ready));
    Ok(())
}

/// The computations issued since the last synchronize: what an event
/// recorded now waits for.
fn issued() -> Vec<Arc<pjrt::Event>> {
    ISSUED.lock().unwrap().clone()
}

/// Waits for every computation issued so far.
pub fn wait_issued() -> Result<()> {
    let issued = std::mem::take(&mut *ISSUED.lock().unwrap());
    for e in issued {
        e.await_ready()?;
    }
    Ok(())
}

pub struct Event {
    pub timing: bool,
    /// Ready events still to fire, plus one while recording.
    remaining: AtomicUsize,
    done_at: OnceLock<Instant>,
    error: Mutex<Option<String>>,
    /// The plugin's events the callbacks hang on, kept until this is dropped.
    watched: Mutex<Vec<Arc<pjrt::Event>>>,
}

impl Event {
    fn finish(&self, status: std::result::Result<(), pjrt::Error>) {
        if let Err(e) = status {
            self.error.lock().unwrap().get_or_insert(e.to_string());
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.done_at.set(Instant::now());
        }
    }

    /// Whether the work before the event is done. Once the plugin's events
    /// have all fired, only their callbacks may still be running: it waits
    /// for those, so a query after `synchronize()` reads true, as on CUDA.
    pub fn is_done(&self) -> bool {
        if self.done_at.get().is_some() {
            return true;
        }
        if !self.watched.lock().unwrap().iter().all(|e| e.is_ready().unwrap_or(true)) {
            return false;
        }
        while self.done_at.get().is_none() {
            std::thread::yield_now();
        }
        true
    }

    /// Blocks until the work before the event is done; the error of a
    /// computation it waited for, if one failed.
    pub fn synchronize(&self) -> Result<()> {
        for e in self.watched.lock().unwrap().iter() {
            let _ = e.await_ready();
        }
        self.is_done(); // the last callbacks may still be running
        match self.error.lock().unwrap().clone() {
            Some(e) => Err(Error::runtime(format!("torchtpu: work before this event failed: {e}"))),
            None => Ok(()),
        }
    }

    /// Milliseconds from `self`'s completion to `end`'s, as CUDA's `elapsed_time`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64> {
        if !(self.timing && end.timing) {
            return Err(Error::value("Both events must be created with argument 'enable_timing=True'."));
        }
        let _ = (self.is_done(), end.is_done());
        match (self.done_at.get(), end.done_at.get()) {
            (Some(a), Some(b)) => Ok((b.saturating_duration_since(*a).as_secs_f64()
                - a.saturating_duration_since(*b).as_secs_f64())
                * 1e3),
            _ => Err(Error::value("Both events must be completed before calculating elapsed time.")),
        }
    }
}

/// Records an event after all work issued so far (the caller first issues
/// what fused mode recorded).
pub fn record(timing: bool) -> Result<Arc<Event>> {
    let issued = issued();
    let event = Arc::new(Event {
        timing,
        remaining: AtomicUsize::new(issued.len() + 1),
        done_at: OnceLock::new(),
        error: Mutex::new(None),
        watched: Mutex::new(Vec::with_capacity(issued.len())),
    });
    for ready in issued {
        let e = event.clone();
        if let Err(err) = ready.on_ready(move |status| e.finish(status)) {
            event.finish(Err(err));
        }
        event.watched.lock().unwrap().push(ready);
    }
    event.finish(Ok(()));
    Ok(event)
}

/// Whether all work issued so far is done (`Stream.query()`).
pub fn idle() -> Result<bool> {
    for e in issued() {
        if !e.is_ready()? {
            return Ok(false);
        }
    }
    Ok(true)
}
