//! Loading a plugin, checking its version, and calling through its function table.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use libloading::Library;

use crate::error::{Error, Result};
use crate::ffi::{self, Args};
use crate::named_value::NamedValue;
use crate::sys;

/// A loaded plugin's function table. Lives for the rest of the process.
pub struct Api {
    raw: &'static sys::PJRT_Api,
    path: PathBuf,
    attributes: Vec<(String, NamedValue)>,
    // Never unloaded: `dlclose` while a client is alive crashes the process at exit,
    // and `Api`s are leaked anyway.
    _library: Library,
}

// SAFETY: the function table is immutable and the PJRT C API is thread-safe.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

/// Calls `PJRT_Api::$f` with `$args` (a `&mut` args struct), returning the plugin's
/// `PJRT_Error` as `Err`. Must be used inside `unsafe`: the args' pointers must be valid
/// for that call.
macro_rules! call {
    ($api:expr, $f:ident, $args:expr) => {{
        let api: &$crate::api::Api = $api;
        api.call(api.raw().$f, stringify!($f), $args)
    }};
}
pub(crate) use call;

/// Loads the plugin at `path` once per process (later calls with the same file return
/// the same `Api`), checks that it implements at least the PJRT API version of the
/// header the bindings come from, and initializes it.
pub fn load_plugin(path: &Path) -> Result<&'static Api> {
    static LOADED: Mutex<Vec<(PathBuf, &'static Api)>> = Mutex::new(Vec::new());

    let key = std::fs::canonicalize(path).map_err(|e| load_error(path, e))?;
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, api)) = loaded.iter().find(|(p, _)| *p == key) {
        return Ok(api);
    }
    let api: &'static Api = Box::leak(Box::new(Api::load(path.to_owned())?));
    loaded.push((key, api));
    Ok(api)
}

fn load_error(path: &Path, cause: impl std::fmt::Display) -> Error {
    Error::new(
        sys::PJRT_Error_Code_PJRT_Error_Code_FAILED_PRECONDITION,
        format!("cannot load PJRT plugin {}: {cause}", path.display()),
    )
}

impl Api {
    fn load(path: PathBuf) -> Result<Api> {
        // SAFETY: running the plugin's initializers is the point of loading it.
        let library = unsafe { Library::new(&path) }.map_err(|e| load_error(&path, e))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let raw = unsafe {
            let get_api = library
                .get::<unsafe extern "C" fn() -> *const sys::PJRT_Api>(b"GetPjrtApi")
                .map_err(|e| load_error(&path, format!("no GetPjrtApi symbol ({e})")))?;
            get_api()
        };
        if raw.is_null() {
            return Err(load_error(&path, "GetPjrtApi returned null"));
        }
        // Read only the header of the table before trusting its size: an older plugin's
        // table is shorter than ours.
        // SAFETY: every PJRT_Api starts with struct_size, extension_start and version.
        let (size, version) = unsafe { ((*raw).struct_size, (*raw).pjrt_api_version) };
        let (major, minor) = (version.major_version, version.minor_version);
        if major != sys::PJRT_API_MAJOR as i32
            || minor < sys::PJRT_API_MINOR as i32
            || size < sys::PJRT_Api_STRUCT_SIZE as usize
        {
            return Err(load_error(
                &path,
                format!(
                    "it implements PJRT API {major}.{minor} (function table of {size} bytes), \
                     this build needs {}.{} or a later {0}.x (table of at least {} bytes)",
                    sys::PJRT_API_MAJOR,
                    sys::PJRT_API_MINOR,
                    sys::PJRT_Api_STRUCT_SIZE
                ),
            ));
        }
        let shown = path.display().to_string();
        let with_path = |e: Error| Error { message: format!("PJRT plugin {shown}: {}", e.message), ..e };
        let mut api = Api {
            // SAFETY: checked above that the table is at least as large as our struct.
            raw: unsafe { &*raw },
            path,
            attributes: Vec::new(),
            _library: library,
        };
        // SAFETY: the args structs hold no pointers of ours.
        unsafe { call!(&api, PJRT_Plugin_Initialize, &mut Args::zeroed()) }.map_err(with_path)?;
        let mut args = sys::PJRT_Plugin_Attributes_Args::zeroed();
        unsafe { call!(&api, PJRT_Plugin_Attributes, &mut args) }.map_err(with_path)?;
        // SAFETY: the plugin owns the attribute array for its lifetime.
        api.attributes = unsafe { ffi::slice(args.attributes, args.num_attributes) }
            .iter()
            .filter_map(|v| unsafe { NamedValue::from_raw(v) })
            .collect();
        Ok(api)
    }

    /// The PJRT C API version the plugin implements, `(major, minor)`.
    pub fn version(&self) -> (i32, i32) {
        let v = self.raw.pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    /// The plugin's attributes, e.g. `xla_version` and `stablehlo_current_version`.
    pub fn attributes(&self) -> &[(String, NamedValue)] {
        &self.attributes
    }

    /// The plugin file, as first passed to [`load_plugin`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn raw(&self) -> &sys::PJRT_Api {
        self.raw
    }

    /// Calls one entry of the function table; see [`call!`].
    ///
    /// # Safety
    /// `args` must hold pointers valid for `f`.
    pub(crate) unsafe fn call<A>(
        &self,
        f: Option<unsafe extern "C" fn(*mut A) -> *mut sys::PJRT_Error>,
        name: &str,
        args: &mut A,
    ) -> Result<()> {
        let f = f.ok_or_else(|| {
            Error::new(
                sys::PJRT_Error_Code_PJRT_Error_Code_UNIMPLEMENTED,
                format!("PJRT plugin {} does not implement {name}", self.path.display()),
            )
        })?;
        // SAFETY: the caller's contract.
        unsafe { self.check(f(args)) }
    }

    /// Turns a returned `PJRT_Error*` (null on success) into a `Result`, destroying it.
    ///
    /// # Safety
    /// `error` must be null or an error returned by this plugin and not yet destroyed.
    pub(crate) unsafe fn check(&self, error: *mut sys::PJRT_Error) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        // The message lives only as long as the error: copy it first.
        let mut message = sys::PJRT_Error_Message_Args::zeroed();
        message.error = error;
        let mut code = sys::PJRT_Error_GetCode_Args::zeroed();
        code.error = error;
        let mut destroy = sys::PJRT_Error_Destroy_Args::zeroed();
        destroy.error = error;
        // SAFETY: `error` is live until the destroy call, the last one here.
        unsafe {
            if let Some(f) = self.raw.PJRT_Error_Message {
                f(&mut message);
            }
            let code_error = match self.raw.PJRT_Error_GetCode {
                Some(f) => f(&mut code),
                None => std::ptr::null_mut(),
            };
            let text = ffi::string(message.message, message.message_size);
            let code = if code_error.is_null() {
                code.code
            } else {
                // Keep the original message, code unknown; dispose of the new error.
                let _ = self.check(code_error);
                sys::PJRT_Error_Code_PJRT_Error_Code_UNKNOWN
            };
            if let Some(f) = self.raw.PJRT_Error_Destroy {
                f(&mut destroy);
            }
            Err(Error::new(code, text))
        }
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.version();
        write!(f, "Api({}, PJRT {major}.{minor})", self.path.display())
    }
}
