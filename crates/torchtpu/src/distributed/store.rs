//! The process group's store (a torch.distributed Store, held by the adapter)
//! as the key-value store of a PJRT client spanning the group's processes.
use std::os::raw::{c_char, c_void};
use std::ptr::NonNull;
use std::time::Duration;

use pjrt::sys;

use crate::error::{Error, Result};

// The adapter's side (csrc/store.cpp).
extern "C" {
    fn tt_store_adopt(store_object: *mut c_void) -> *mut c_void;
    fn tt_store_release(store: *mut c_void);
    fn tt_store_get(
        store: *mut c_void,
        key: *const c_char,
        key_size: usize,
        timeout_ms: i64,
        bytes: *mut *mut c_char,
        size: *mut usize,
    ) -> i32;
    fn tt_store_try_get(
        store: *mut c_void,
        key: *const c_char,
        key_size: usize,
        bytes: *mut *mut c_char,
        size: *mut usize,
    ) -> i32;
    fn tt_store_put(
        store: *mut c_void,
        key: *const c_char,
        key_size: usize,
        value: *const c_char,
        value_size: usize,
        bytes: *mut *mut c_char,
        size: *mut usize,
    ) -> i32;
    fn tt_store_free(bytes: *mut c_char);
}

// Its answers (`TT_STORE_*` in csrc/ffi.h).
const TT_STORE_MISSING: i32 = 1;
const TT_STORE_TIMEOUT: i32 = 2;

pub struct GroupStore(NonNull<c_void>);

// SAFETY: c10d stores are thread-safe; the adapter's calls take no GIL.
unsafe impl Send for GroupStore {}
unsafe impl Sync for GroupStore {}

impl GroupStore {
    /// The store of a Python `torch.distributed.Store`.
    ///
    /// # Safety
    /// `object` is a live Python object, and the GIL is held.
    pub unsafe fn adopt(object: *mut c_void) -> Result<GroupStore> {
        NonNull::new(unsafe { tt_store_adopt(object) })
            .map(GroupStore)
            .ok_or_else(|| Error::type_error("torchtpu: expected a torch.distributed.Store".to_string()))
    }
}

impl Drop for GroupStore {
    fn drop(&mut self) {
        // SAFETY: adopted, released once.
        unsafe { tt_store_release(self.0.as_ptr()) }
    }
}

/// The bytes (or message) of an adapter call returning `code`.
fn answer(code: i32, bytes: *mut c_char, size: usize) -> std::result::Result<Vec<u8>, pjrt::Error> {
    // SAFETY: the adapter returns `size` bytes at `bytes`, ours to free.
    let data = unsafe {
        let data =
            if bytes.is_null() { Vec::new() } else { std::slice::from_raw_parts(bytes.cast::<u8>(), size).to_vec() };
        tt_store_free(bytes);
        data
    };
    let status = match code {
        0 => return Ok(data),
        TT_STORE_MISSING => sys::PJRT_Error_Code_PJRT_Error_Code_NOT_FOUND,
        TT_STORE_TIMEOUT => sys::PJRT_Error_Code_PJRT_Error_Code_DEADLINE_EXCEEDED,
        _ => sys::PJRT_Error_Code_PJRT_Error_Code_UNAVAILABLE,
    };
    Err(pjrt::Error { code: status as i32, message: String::from_utf8_lossy(&data).into_owned() })
}

impl pjrt::KeyValueStore for GroupStore {
    fn get(&self, key: &[u8], timeout: Duration) -> std::result::Result<Vec<u8>, pjrt::Error> {
        let (mut bytes, mut size) = (std::ptr::null_mut(), 0);
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        // SAFETY: the key is `key.len()` bytes, alive for the call.
        let code = unsafe { tt_store_get(self.0.as_ptr(), key.as_ptr().cast(), key.len(), ms, &mut bytes, &mut size) };
        answer(code, bytes, size)
    }

    fn try_get(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, pjrt::Error> {
        let (mut bytes, mut size) = (std::ptr::null_mut(), 0);
        // SAFETY: as in `get`.
        let code = unsafe { tt_store_try_get(self.0.as_ptr(), key.as_ptr().cast(), key.len(), &mut bytes, &mut size) };
        match answer(code, bytes, size) {
            Ok(value) => Ok(Some(value)),
            Err(_) if code == TT_STORE_MISSING => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn put(&self, key: &[u8], value: &[u8]) -> std::result::Result<(), pjrt::Error> {
        let (mut bytes, mut size) = (std::ptr::null_mut(), 0);
        // SAFETY: key and value are alive for the call.
        let code = unsafe {
            tt_store_put(
                self.0.as_ptr(),
                key.as_ptr().cast(),
                key.len(),
                value.as_ptr().cast(),
                value.len(),
                &mut bytes,
                &mut size,
            )
        };
        answer(code, bytes, size).map(drop)
    }
}
