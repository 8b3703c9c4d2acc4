//! Clients: one plugin's view of its devices; they compile programs and own buffers.

use std::fmt;
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::api::{call, Api};
use crate::buffer::Buffer;
use crate::device::{Device, DeviceInfo};
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::executable::LoadedExecutable;
use crate::ffi::{self, Args};
use crate::kv::{self, KeyValueStore};
use crate::named_value::NamedValue;
use crate::{options, sys};

/// A PJRT client. Buffers and executables keep it alive, so it is destroyed when the
/// last of them and this handle are dropped.
pub struct Client {
    inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) api: &'static Api,
    pub(crate) raw: NonNull<sys::PJRT_Client>,
    platform_name: String,
    platform_version: String,
    devices: Vec<DeviceInfo>,
    /// Its buffers are in host memory, so their device pointers can be read directly.
    pub(crate) host_memory: bool,
    /// The store of a multi-process client, which its callbacks point at.
    _store: Option<kv::Shared>,
}

// SAFETY: the PJRT C API is thread-safe for clients and everything they own.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

/// Create options whose value must be an Int64. The CPU plugin does not check option
/// types: another type throws a C++ exception across the C ABI, aborting the process.
const INT64_OPTIONS: &[&str] = &["cpu_device_count"];

impl Client {
    /// Creates a client with the plugin-specific `options` (the CPU plugin knows only
    /// `cpu_device_count`, default 4, and silently ignores unknown names).
    pub fn new(api: &'static Api, options: &[(&str, NamedValue)]) -> Result<Client> {
        Self::create(api, options, None)
    }

    /// Creates a client of one of several processes, which meet through `store` (the
    /// plugin's options say which process this is: `node_id` and `num_nodes` on GPUs).
    pub fn with_store(
        api: &'static Api,
        options: &[(&str, NamedValue)],
        store: Arc<dyn KeyValueStore>,
    ) -> Result<Client> {
        Self::create(api, options, Some(Box::new(store)))
    }

    fn create(api: &'static Api, options: &[(&str, NamedValue)], store: Option<kv::Shared>) -> Result<Client> {
        for (name, value) in options {
            if INT64_OPTIONS.contains(name) && !matches!(value, NamedValue::Int64(_)) {
                return Err(Error::invalid_argument(format!("client option {name} must be an Int64, got {value:?}")));
            }
        }
        let raw_options: Vec<_> = options.iter().map(|(n, v)| v.to_raw(n)).collect();
        let mut args = sys::PJRT_Client_Create_Args::zeroed();
        args.create_options = raw_options.as_ptr();
        args.num_options = raw_options.len();
        if let Some(store) = &store {
            kv::install(&mut args, store);
        }
        // SAFETY: the options borrow `options`, alive for the call; the store lives
        // with the client.
        unsafe { call!(api, PJRT_Client_Create, &mut args) }?;
        let raw = NonNull::new(args.client).ok_or_else(|| no_result(api, "client"))?;
        // Owned from here on, so that an error below still destroys it.
        let mut inner = ClientInner {
            api,
            raw,
            platform_name: String::new(),
            platform_version: String::new(),
            devices: Vec::new(),
            host_memory: false,
            _store: store,
        };
        inner.describe()?;
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The plugin this client runs on.
    pub fn api(&self) -> &'static Api {
        self.inner.api
    }

    /// The platform, e.g. `"cpu"`, `"cuda"` or `"tpu"`.
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    pub fn addressable_devices(&self) -> Vec<Device<'_>> {
        self.inner.devices.iter().map(Device::new).collect()
    }

    /// Compiles StableHLO (or MHLO) MLIR text for one device.
    pub fn compile(&self, mlir_text: &str) -> Result<LoadedExecutable> {
        self.compile_with(mlir_text, false)
    }

    /// [`compile`](Self::compile), optionally as a portable executable that runs on
    /// any of the client's devices (about 0.1 µs more per launch on the CPU plugin).
    pub fn compile_with(&self, mlir_text: &str, portable: bool) -> Result<LoadedExecutable> {
        self.compile_options(mlir_text, &options::single_device(portable))
    }

    /// Compiles a program replicated over `devices` (global device ids, one replica
    /// each, in replica order); its collectives span the replicas. Launched with
    /// [`LoadedExecutable::execute_replicated`] on the addressable ones.
    pub fn compile_replicated(&self, mlir_text: &str, devices: &[i32]) -> Result<LoadedExecutable> {
        self.compile_options(mlir_text, &options::replicated(devices))
    }

    fn compile_options(&self, mlir_text: &str, options: &[u8]) -> Result<LoadedExecutable> {
        const FORMAT: &str = "mlir";
        let mut program = sys::PJRT_Program::zeroed();
        // The plugin only reads the code; the C field is non-const for historical reasons.
        program.code = mlir_text.as_ptr().cast::<c_char>().cast_mut();
        program.code_size = mlir_text.len();
        program.format = FORMAT.as_ptr().cast::<c_char>();
        program.format_size = FORMAT.len();
        let mut args = sys::PJRT_Client_Compile_Args::zeroed();
        args.client = self.inner.raw.as_ptr();
        args.program = &program;
        args.compile_options = options.as_ptr().cast::<c_char>();
        args.compile_options_size = options.len();
        // SAFETY: program text and options outlive the call.
        unsafe { call!(self.inner.api, PJRT_Client_Compile, &mut args) }?;
        LoadedExecutable::from_raw(self.inner.clone(), args.executable)
    }

    /// Loads an executable serialized by [`LoadedExecutable::serialize`] with the same
    /// plugin build (the format is not stable across versions).
    pub fn deserialize(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        let mut args = sys::PJRT_Executable_DeserializeAndLoad_Args::zeroed();
        args.client = self.inner.raw.as_ptr();
        args.serialized_executable = bytes.as_ptr().cast::<c_char>();
        args.serialized_executable_size = bytes.len();
        // SAFETY: `bytes` outlives the call.
        unsafe { call!(self.inner.api, PJRT_Executable_DeserializeAndLoad, &mut args) }?;
        LoadedExecutable::from_raw(self.inner.clone(), args.loaded_executable)
    }

    /// Copies dense row-major host `data` into a new buffer on `device`. The copy is
    /// complete when this returns, so `data` may be reused at once.
    pub fn buffer_from_host(&self, data: &[u8], ty: ElementType, dims: &[i64], device: Device<'_>) -> Result<Buffer> {
        self.inner.check_device(device)?;
        let size =
            dims.iter().try_fold(ty.byte_size(), |size, &d| usize::try_from(d).ok().and_then(|d| size.checked_mul(d)));
        if size != Some(data.len()) {
            return Err(Error::invalid_argument(format!(
                "host data of {} bytes does not match a {ty:?}{dims:?} buffer",
                data.len()
            )));
        }
        let mut args = sys::PJRT_Client_BufferFromHostBuffer_Args::zeroed();
        args.client = self.inner.raw.as_ptr();
        args.data = data.as_ptr().cast();
        args.type_ = ty.into();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = device.raw();
        // SAFETY: `data` holds exactly the bytes described and outlives the call, the
        // only time the plugin may read it under these semantics.
        unsafe { call!(self.inner.api, PJRT_Client_BufferFromHostBuffer, &mut args) }?;
        let done = Event::from_raw(self.inner.api, args.done_with_host_buffer);
        let buffer = Buffer::from_raw(self.inner.clone(), args.buffer)?;
        // Already fired with these semantics; awaiting costs nothing and is what the
        // API asks before the host memory is reused.
        if let Some(done) = done {
            done.await_ready()?;
        }
        Ok(buffer)
    }

    /// A new buffer on `device` whose contents are whatever its memory held: for a
    /// result written into it in place (see [`Buffer::host_address`]).
    pub fn uninitialized_buffer(&self, ty: ElementType, dims: &[i64], device: Device<'_>) -> Result<Buffer> {
        self.inner.check_device(device)?;
        let mut args = sys::PJRT_Client_CreateUninitializedBuffer_Args::zeroed();
        args.client = self.inner.raw.as_ptr();
        args.shape_dims = dims.as_ptr();
        args.shape_num_dims = dims.len();
        args.shape_element_type = ty.into();
        args.device = device.raw();
        // SAFETY: `dims` outlives the call.
        unsafe { call!(self.inner.api, PJRT_Client_CreateUninitializedBuffer, &mut args) }?;
        Buffer::from_raw(self.inner.clone(), args.buffer)
    }

    /// What the device's allocator reports; fields a plugin does not track are `None`
    /// (the CPU plugin implements none of this: UNIMPLEMENTED).
    pub fn memory_stats(&self, device: Device<'_>) -> Result<MemoryStats> {
        self.inner.check_device(device)?;
        let mut args = sys::PJRT_Device_MemoryStats_Args::zeroed();
        args.device = device.raw();
        // SAFETY: the device belongs to this live client.
        unsafe { call!(self.inner.api, PJRT_Device_MemoryStats, &mut args) }?;
        let set = |value: i64, is_set: bool| is_set.then_some(value);
        Ok(MemoryStats {
            bytes_in_use: args.bytes_in_use,
            peak_bytes_in_use: set(args.peak_bytes_in_use, args.peak_bytes_in_use_is_set),
            bytes_limit: set(args.bytes_limit, args.bytes_limit_is_set),
            bytes_reserved: set(args.bytes_reserved, args.bytes_reserved_is_set),
            peak_bytes_reserved: set(args.peak_bytes_reserved, args.peak_bytes_reserved_is_set),
            pool_bytes: set(args.pool_bytes, args.pool_bytes_is_set),
            peak_pool_bytes: set(args.peak_pool_bytes, args.peak_pool_bytes_is_set),
        })
    }

    /// Registers host memory for direct transfers (page-locked on GPUs) until
    /// [`dma_unmap`](Self::dma_unmap).
    ///
    /// # Safety
    /// `data..data+size` is memory of the caller's that stays allocated until unmapped.
    pub unsafe fn dma_map(&self, data: *mut std::ffi::c_void, size: usize) -> Result<()> {
        let mut args = sys::PJRT_Client_DmaMap_Args::zeroed();
        args.client = self.inner.raw.as_ptr();
        args.data = data;
        args.size = size;
        // SAFETY: the caller's contract.
        unsafe { call!(self.inner.api, PJRT_Client_DmaMap, &mut args) }
    }

    /// # Safety
    /// `data` was mapped by [`dma_map`](Self::dma_map) and no transfer uses it any more.
    pub unsafe fn dma_unmap(&self, data: *mut std::ffi::c_void) -> Result<()> {
        let mut args = sys::PJRT_Client_DmaUnmap_Args::zeroed();
        args.client = self.inner.raw.as_ptr();
        args.data = data;
        // SAFETY: the caller's contract.
        unsafe { call!(self.inner.api, PJRT_Client_DmaUnmap, &mut args) }
    }
}

/// A device allocator's figures, in bytes (`PJRT_Device_MemoryStats`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStats {
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: Option<i64>,
    pub bytes_limit: Option<i64>,
    pub bytes_reserved: Option<i64>,
    pub peak_bytes_reserved: Option<i64>,
    /// What a pooling allocator (XLA's BFC on GPUs) holds from the device.
    pub pool_bytes: Option<i64>,
    pub peak_pool_bytes: Option<i64>,
}

impl ClientInner {
    /// Fetches the platform and device descriptions, which never change.
    fn describe(&mut self) -> Result<()> {
        let (api, client) = (self.api, self.raw.as_ptr());
        let mut name = sys::PJRT_Client_PlatformName_Args::zeroed();
        name.client = client;
        let mut version = sys::PJRT_Client_PlatformVersion_Args::zeroed();
        version.client = client;
        let mut devices = sys::PJRT_Client_AddressableDevices_Args::zeroed();
        devices.client = client;
        // SAFETY: the client is live; the strings and device array it returns are owned
        // by it and copied here.
        unsafe {
            call!(api, PJRT_Client_PlatformName, &mut name)?;
            call!(api, PJRT_Client_PlatformVersion, &mut version)?;
            call!(api, PJRT_Client_AddressableDevices, &mut devices)?;
            self.platform_name = ffi::string(name.platform_name, name.platform_name_size);
            self.platform_version = ffi::string(version.platform_version, version.platform_version_size);
            self.devices = ffi::slice(devices.addressable_devices, devices.num_addressable_devices)
                .iter()
                .map(|&d| DeviceInfo::query(api, d))
                .collect::<Result<_>>()?;
        }
        self.host_memory = self.platform_name == "cpu";
        Ok(())
    }

    /// Rejects a device of another client, which the plugin would not check.
    pub(crate) fn check_device(&self, device: Device<'_>) -> Result<()> {
        if self.devices.iter().any(|d| d.raw == device.raw()) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!("device {device:?} is not an addressable device of this client")))
        }
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Client_Destroy_Args::zeroed();
        args.client = self.raw.as_ptr();
        // SAFETY: the last owner (buffers and executables hold an `Arc` to this).
        let _ = unsafe { call!(self.api, PJRT_Client_Destroy, &mut args) };
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.platform_name())
            .field("devices", &self.addressable_devices())
            .finish()
    }
}

/// A call that succeeded without returning the object it creates.
pub(crate) fn no_result(api: &Api, what: &str) -> Error {
    Error::new(
        sys::PJRT_Error_Code_PJRT_Error_Code_INTERNAL,
        format!("PJRT plugin {} returned no {what}", api.path().display()),
    )
}
