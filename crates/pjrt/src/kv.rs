//! Key-value stores through which the processes of one multi-process client meet.
//!
//! A plugin that spans several processes (the CUDA plugin with `num_nodes` > 1)
//! exchanges its topology and collective ids through a store the caller provides
//! (`PJRT_Client_Create`'s `kv_*` callbacks), rather than through a coordination
//! service of its own. [`KeyValueStore`] is that store; the callbacks here adapt it
//! to the C ABI. They may be called from any of the plugin's threads, during client
//! creation and whenever a program's collectives first run.

use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::sys;

/// A store shared by the processes of one client.
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to put it
    /// (an error with code DEADLINE_EXCEEDED after that).
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, Error>;
    /// The value of `key` if it is there now, else `None`.
    fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error>;
}

/// A store as the plugin's callbacks see it: its address is their `user_arg`,
/// so it stays where it is for the client's life (the client holds it).
pub(crate) type Shared = Box<Arc<dyn KeyValueStore>>;

/// Points `args`' callbacks at `store`.
pub(crate) fn install(args: &mut sys::PJRT_Client_Create_Args, store: &Shared) {
    let user_arg = (store as &Arc<dyn KeyValueStore> as *const Arc<dyn KeyValueStore>).cast_mut().cast::<c_void>();
    args.kv_get_callback = Some(get);
    args.kv_get_user_arg = user_arg;
    args.kv_try_get_callback = Some(try_get);
    args.kv_try_get_user_arg = user_arg;
    args.kv_put_callback = Some(put);
    args.kv_put_user_arg = user_arg;
}

/// Runs `f` on the store behind `user_arg`; an error or a panic becomes the
/// plugin's error, made by its `callback_error` (no panic may cross the C ABI).
unsafe fn serve(
    user_arg: *mut c_void,
    callback_error: *mut sys::PJRT_CallbackError,
    f: impl FnOnce(&dyn KeyValueStore) -> Result<(), Error>,
) -> *mut sys::PJRT_Error {
    // SAFETY: `user_arg` is the `Shared` that `install` pointed it at, alive with the client.
    let store = unsafe { &*user_arg.cast::<Arc<dyn KeyValueStore>>() };
    let result = catch_unwind(AssertUnwindSafe(|| f(store.as_ref()))).unwrap_or_else(|_| {
        Err(Error::new(sys::PJRT_Error_Code_PJRT_Error_Code_INTERNAL, "the key-value store panicked"))
    });
    match result {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: the plugin passes its error constructor with every call.
        Err(e) => match unsafe { callback_error.as_ref() }.copied().flatten() {
            Some(make) => unsafe { make(e.code as sys::PJRT_Error_Code, e.message.as_ptr().cast(), e.message.len()) },
            None => std::ptr::null_mut(),
        },
    }
}

/// Hands `bytes` to the plugin as a callback's value, which it frees with
/// [`delete_value`]: the length is kept in front of the bytes, since the
/// deleter is given only the pointer.
fn give(
    bytes: &[u8],
    value: &mut *mut c_char,
    size: &mut usize,
    deleter: &mut sys::PJRT_KeyValueGetCallback_ValueDeleter,
) {
    let mut block = Vec::with_capacity(size_of::<usize>() + bytes.len());
    block.extend_from_slice(&bytes.len().to_ne_bytes());
    block.extend_from_slice(bytes);
    let block = Box::into_raw(block.into_boxed_slice()).cast::<u8>();
    // SAFETY: the block holds the length prefix, then the bytes.
    *value = unsafe { block.add(size_of::<usize>()) }.cast::<c_char>();
    *size = bytes.len();
    *deleter = Some(delete_value);
}

unsafe extern "C" fn delete_value(value: *mut c_char) {
    // SAFETY: `value` was made by `give`, whose block starts a usize before it.
    unsafe {
        let block = value.cast::<u8>().sub(size_of::<usize>());
        let len = usize::from_ne_bytes(*block.cast::<[u8; size_of::<usize>()]>());
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(block, size_of::<usize>() + len)));
    }
}

unsafe fn key<'a>(key: *const c_char, size: usize) -> &'a [u8] {
    if size == 0 {
        &[]
    } else {
        // SAFETY: the plugin passes `size` bytes at `key`, alive for the call.
        unsafe { std::slice::from_raw_parts(key.cast::<u8>(), size) }
    }
}

unsafe extern "C" fn get(args: *mut sys::PJRT_KeyValueGetCallback_Args) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes its live arguments.
    let args = unsafe { &mut *args };
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    unsafe {
        serve(args.user_arg, args.callback_error, |store| {
            let value = store.get(key(args.key, args.key_size), timeout)?;
            give(&value, &mut args.value, &mut args.value_size, &mut args.value_deleter_callback);
            Ok(())
        })
    }
}

unsafe extern "C" fn try_get(args: *mut sys::PJRT_KeyValueTryGetCallback_Args) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes its live arguments.
    let args = unsafe { &mut *args };
    unsafe {
        serve(args.user_arg, args.callback_error, |store| {
            let k = key(args.key, args.key_size);
            let value = store.try_get(k)?.ok_or_else(|| {
                let name = String::from_utf8_lossy(k);
                Error::new(sys::PJRT_Error_Code_PJRT_Error_Code_NOT_FOUND, format!("key {name} not found"))
            })?;
            give(&value, &mut args.value, &mut args.value_size, &mut args.value_deleter_callback);
            Ok(())
        })
    }
}

unsafe extern "C" fn put(args: *mut sys::PJRT_KeyValuePutCallback_Args) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes its live arguments.
    let args = unsafe { &mut *args };
    unsafe {
        serve(args.user_arg, args.callback_error, |store| {
            store.put(key(args.key, args.key_size), key(args.value, args.value_size))
        })
    }
}

#[cfg(test)]
mod tests {
    //! The callbacks driven as a plugin drives them (XLA's `CApiKeyValueStore`).
    use std::collections::HashMap;
    use std::sync::{Condvar, Mutex};

    use super::*;

    #[derive(Default)]
    struct Memory {
        values: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
        changed: Condvar,
    }

    impl KeyValueStore for Memory {
        fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
            let values = self.values.lock().unwrap();
            let (values, _) = self.changed.wait_timeout_while(values, timeout, |v| !v.contains_key(key)).unwrap();
            values
                .get(key)
                .cloned()
                .ok_or_else(|| Error::new(sys::PJRT_Error_Code_PJRT_Error_Code_DEADLINE_EXCEEDED, "timed out"))
        }
        fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
            Ok(self.values.lock().unwrap().get(key).cloned())
        }
        fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
            if value == b"refused" {
                panic!("a store that panics");
            }
            self.values.lock().unwrap().insert(key.to_vec(), value.to_vec());
            self.changed.notify_all();
            Ok(())
        }
    }

    /// The plugin's side: its errors are the codes and messages it was given.
    struct PluginError(i32, String);

    unsafe extern "C" fn make_error(
        code: sys::PJRT_Error_Code,
        message: *const c_char,
        size: usize,
    ) -> *mut sys::PJRT_Error {
        let message = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(message.cast::<u8>(), size) });
        Box::into_raw(Box::new(PluginError(code as i32, message.into_owned()))).cast()
    }

    fn taken(error: *mut sys::PJRT_Error) -> Result<(), (i32, String)> {
        if error.is_null() {
            return Ok(());
        }
        let PluginError(code, message) = *unsafe { Box::from_raw(error.cast::<PluginError>()) };
        Err((code, message))
    }

    /// The callbacks a plugin was given, which its threads share.
    struct Callbacks(sys::PJRT_Client_Create_Args);
    // SAFETY: only the callbacks and their store (Sync) are used.
    unsafe impl Sync for Callbacks {}

    fn callbacks() -> (Callbacks, Shared) {
        let store: Shared = Box::new(Arc::new(Memory::default()));
        let mut args: sys::PJRT_Client_Create_Args = unsafe { std::mem::zeroed() };
        install(&mut args, &store);
        (Callbacks(args), store)
    }

    fn plugin_put(Callbacks(c): &Callbacks, k: &[u8], v: &[u8]) -> Result<(), (i32, String)> {
        let mut make: sys::PJRT_CallbackError = Some(make_error);
        let mut a: sys::PJRT_KeyValuePutCallback_Args = unsafe { std::mem::zeroed() };
        (a.key, a.key_size, a.value, a.value_size) = (k.as_ptr().cast(), k.len(), v.as_ptr().cast(), v.len());
        (a.callback_error, a.user_arg) = (&mut make, c.kv_put_user_arg);
        taken(unsafe { c.kv_put_callback.unwrap()(&mut a) })
    }

    fn plugin_get(Callbacks(c): &Callbacks, k: &[u8], timeout_ms: i32) -> Result<Vec<u8>, (i32, String)> {
        let mut make: sys::PJRT_CallbackError = Some(make_error);
        let mut a: sys::PJRT_KeyValueGetCallback_Args = unsafe { std::mem::zeroed() };
        (a.key, a.key_size, a.timeout_in_ms) = (k.as_ptr().cast(), k.len(), timeout_ms);
        (a.callback_error, a.user_arg) = (&mut make, c.kv_get_user_arg);
        taken(unsafe { c.kv_get_callback.unwrap()(&mut a) })?;
        let value = unsafe { std::slice::from_raw_parts(a.value.cast::<u8>(), a.value_size) }.to_vec();
        unsafe { a.value_deleter_callback.unwrap()(a.value) };
        Ok(value)
    }

    fn plugin_try_get(Callbacks(c): &Callbacks, k: &[u8]) -> Result<Vec<u8>, (i32, String)> {
        let mut make: sys::PJRT_CallbackError = Some(make_error);
        let mut a: sys::PJRT_KeyValueTryGetCallback_Args = unsafe { std::mem::zeroed() };
        (a.key, a.key_size, a.callback_error, a.user_arg) =
            (k.as_ptr().cast(), k.len(), &mut make, c.kv_try_get_user_arg);
        taken(unsafe { c.kv_try_get_callback.unwrap()(&mut a) })?;
        let value = unsafe { std::slice::from_raw_parts(a.value.cast::<u8>(), a.value_size) }.to_vec();
        unsafe { a.value_deleter_callback.unwrap()(a.value) };
        Ok(value)
    }

    #[test]
    fn values_put_by_one_thread_are_read_by_another() {
        let (c, _store) = callbacks();
        plugin_put(&c, b"node/0", b"\x00topology\xff").unwrap();
        assert_eq!(plugin_get(&c, b"node/0", 0).unwrap(), b"\x00topology\xff");
        assert_eq!(plugin_try_get(&c, b"node/0").unwrap(), b"\x00topology\xff");
        plugin_put(&c, b"empty", b"").unwrap();
        assert_eq!(plugin_get(&c, b"empty", 0).unwrap(), b"");
        // A get waits for a put made while it waits.
        let waiting = std::thread::scope(|s| {
            let reader = s.spawn(|| plugin_get(&c, b"node/1", 10_000));
            std::thread::sleep(Duration::from_millis(20));
            plugin_put(&c, b"node/1", b"late").unwrap();
            reader.join().unwrap()
        });
        assert_eq!(waiting.unwrap(), b"late");
    }

    #[test]
    fn missing_keys_and_failures_reach_the_plugin_as_its_errors() {
        let (c, _store) = callbacks();
        let not_found = sys::PJRT_Error_Code_PJRT_Error_Code_NOT_FOUND as i32;
        assert_eq!(plugin_try_get(&c, b"absent"), Err((not_found, "key absent not found".into())));
        let deadline = sys::PJRT_Error_Code_PJRT_Error_Code_DEADLINE_EXCEEDED as i32;
        assert_eq!(plugin_get(&c, b"absent", 10), Err((deadline, "timed out".into())));
        let internal = sys::PJRT_Error_Code_PJRT_Error_Code_INTERNAL as i32;
        assert_eq!(plugin_put(&c, b"k", b"refused"), Err((internal, "the key-value store panicked".into())));
    }
}
