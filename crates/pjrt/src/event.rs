//! Events: completion signals the caller owns (buffer readiness, finished transfers).

use std::ptr::NonNull;

use crate::api::{call, Api};
use crate::error::Result;
use crate::ffi::Args;
use crate::sys;

/// An owned `PJRT_Event`, destroyed on drop (awaiting does not free it).
pub struct Event {
    api: &'static Api,
    raw: NonNull<sys::PJRT_Event>,
}

// SAFETY: a PJRT event is a reference-counted future, safe to query from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// Takes ownership of an event returned by the plugin; `None` if it returned none.
    pub(crate) fn from_raw(api: &'static Api, raw: *mut sys::PJRT_Event) -> Option<Event> {
        NonNull::new(raw).map(|raw| Event { api, raw })
    }

    /// Blocks until the event fires; returns the error it carries, if any.
    pub fn await_ready(&self) -> Result<()> {
        let mut args = sys::PJRT_Event_Await_Args::zeroed();
        args.event = self.raw.as_ptr();
        // SAFETY: the event is live.
        unsafe { call!(self.api, PJRT_Event_Await, &mut args) }
    }

    /// Whether the event has fired (without waiting).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = sys::PJRT_Event_IsReady_Args::zeroed();
        args.event = self.raw.as_ptr();
        // SAFETY: the event is live.
        unsafe { call!(self.api, PJRT_Event_IsReady, &mut args) }?;
        Ok(args.is_ready)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Event_Destroy_Args::zeroed();
        args.event = self.raw.as_ptr();
        // SAFETY: we own the event; a failure to destroy has nowhere to go.
        let _ = unsafe { call!(self.api, PJRT_Event_Destroy, &mut args) };
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("ready", &self.is_ready()).finish()
    }
}
