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

    /// The error a fired event carries, if any (call only once it is ready).
    pub fn error(&self) -> Result<()> {
        let mut args = sys::PJRT_Event_Error_Args::zeroed();
        args.event = self.raw.as_ptr();
        // SAFETY: the event is live.
        unsafe { call!(self.api, PJRT_Event_Error, &mut args) }
    }
}

type Callback = Box<dyn FnOnce(Result<()>) + Send>;

impl Event {
    /// Calls `f` with the event's status once it fires (at once if it has), on a
    /// thread of the plugin's: `f` must be quick and must not block.
    pub fn on_ready(&self, f: impl FnOnce(Result<()>) + Send + 'static) -> Result<()> {
        unsafe extern "C" fn fire(error: *mut sys::PJRT_Error, user_arg: *mut std::ffi::c_void) {
            // SAFETY: `user_arg` is the box leaked below, handed to exactly one call.
            let (api, f) = unsafe { *Box::from_raw(user_arg.cast::<(&'static Api, Callback)>()) };
            // SAFETY: the callback owns `error` and must destroy it; `check` does.
            f(unsafe { api.check(error) });
        }
        let user_arg = Box::into_raw(Box::new((self.api, Box::new(f) as Callback)));
        let mut args = sys::PJRT_Event_OnReady_Args::zeroed();
        args.event = self.raw.as_ptr();
        args.callback = Some(fire);
        args.user_arg = user_arg.cast();
        // SAFETY: the event is live; on success the plugin calls `fire` exactly once.
        let result = unsafe { call!(self.api, PJRT_Event_OnReady, &mut args) };
        if result.is_err() {
            // SAFETY: not registered, so `fire` will never take it.
            drop(unsafe { Box::from_raw(user_arg) });
        }
        result
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
