//! Compiled programs, ready to run on the client's devices.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::api::call;
use crate::buffer::Buffer;
use crate::client::{no_result, ClientInner};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ffi::{self, Args};
use crate::sys;

/// An owned `PJRT_LoadedExecutable`, destroyed on drop.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: NonNull<sys::PJRT_LoadedExecutable>,
    /// Its `PJRT_Executable` view (needed for outputs, serialization, fingerprint);
    /// a separate object that must be destroyed too.
    executable: *mut sys::PJRT_Executable,
    num_outputs: usize,
    /// The devices it was compiled for (empty for a portable executable).
    devices: Vec<*mut sys::PJRT_Device>,
}

// SAFETY: PJRT executables are thread-safe; their client is kept alive by `client`.
unsafe impl Send for LoadedExecutable {}
unsafe impl Sync for LoadedExecutable {}

impl LoadedExecutable {
    /// Takes ownership of an executable returned by the plugin.
    pub(crate) fn from_raw(client: Arc<ClientInner>, raw: *mut sys::PJRT_LoadedExecutable) -> Result<LoadedExecutable> {
        let raw = NonNull::new(raw).ok_or_else(|| no_result(client.api, "executable"))?;
        // Owned from here on, so that an error below still destroys it.
        let mut exe =
            LoadedExecutable { client, raw, executable: ptr::null_mut(), num_outputs: 0, devices: Vec::new() };
        let api = exe.client.api;
        let mut get = sys::PJRT_LoadedExecutable_GetExecutable_Args::zeroed();
        get.loaded_executable = raw.as_ptr();
        let mut outputs = sys::PJRT_Executable_NumOutputs_Args::zeroed();
        let mut devices = sys::PJRT_LoadedExecutable_AddressableDevices_Args::zeroed();
        devices.executable = raw.as_ptr();
        // SAFETY: the executable is live; the device array is owned by it.
        unsafe {
            call!(api, PJRT_LoadedExecutable_GetExecutable, &mut get)?;
            exe.executable = get.executable;
            outputs.executable = get.executable;
            call!(api, PJRT_Executable_NumOutputs, &mut outputs)?;
            call!(api, PJRT_LoadedExecutable_AddressableDevices, &mut devices)?;
            exe.devices = ffi::slice(devices.addressable_devices, devices.num_addressable_devices).to_vec();
        }
        exe.num_outputs = outputs.num_outputs;
        Ok(exe)
    }

    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Runs the program on `device` and returns its outputs without waiting for them
    /// (each output's ready event tells when it is computed).
    ///
    /// Arguments that the program marks as donors (`jax.buffer_donor` or
    /// `tf.aliasing_output`) are consumed, so they read as deleted afterwards, unless
    /// their index is in `non_donatable`. Passing the same buffer twice to donated
    /// parameters is an error: mark the duplicates non-donatable.
    pub fn execute(&self, args: &[&Buffer], device: Device<'_>, non_donatable: &[i64]) -> Result<Vec<Buffer>> {
        let mut outputs = Vec::with_capacity(self.num_outputs);
        self.execute_into(args.iter().copied(), device, non_donatable, &mut outputs)?;
        Ok(outputs)
    }

    /// [`execute`](Self::execute) that appends the outputs to `outputs`, for a
    /// caller that runs programs per op and keeps its lists between calls.
    pub fn execute_into<'a>(
        &self,
        args: impl ExactSizeIterator<Item = &'a Buffer>,
        device: Device<'_>,
        non_donatable: &[i64],
        outputs: &mut Vec<Buffer>,
    ) -> Result<()> {
        let execute_device = self.launch_device(device)?;
        let count = args.len();
        self.launch(args, count, 1, execute_device, non_donatable, outputs)
    }

    /// Runs a replicated program (see
    /// [`Client::compile_replicated`](crate::Client::compile_replicated)) on its
    /// addressable devices: `args[i]` are the arguments of the i-th, in replica
    /// order; returns each one's outputs. No argument is donated.
    pub fn execute_replicated(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        if args.len() != self.devices.len() {
            return Err(Error::invalid_argument(format!(
                "the program runs on {} addressable device(s), got arguments for {}",
                self.devices.len(),
                args.len()
            )));
        }
        let per_device = args.first().map_or(0, Vec::len);
        if args.iter().any(|a| a.len() != per_device) {
            return Err(Error::invalid_argument("every replica takes the same number of arguments"));
        }
        let all: Vec<i64> = (0..per_device as i64).collect();
        let mut outputs = Vec::new();
        let flat = args.iter().flatten().copied();
        self.launch(flat, args.len() * per_device, args.len(), ptr::null_mut(), &all, &mut outputs)?;
        let mut outputs = outputs.into_iter();
        Ok((0..args.len()).map(|_| outputs.by_ref().take(self.num_outputs).collect()).collect())
    }

    /// One execute call: `count` arguments, `count / devices` for each device
    /// in turn (or for `execute_device`); appends the devices' outputs one
    /// device after the other. Its pointer arrays are on the stack where short,
    /// as this runs per op.
    fn launch<'a>(
        &self,
        args: impl Iterator<Item = &'a Buffer>,
        count: usize,
        devices: usize,
        execute_device: *mut sys::PJRT_Device,
        non_donatable: &[i64],
        outputs: &mut Vec<Buffer>,
    ) -> Result<()> {
        let per_device = count.checked_div(devices).unwrap_or(0);
        let mut inputs = Slots::new(count, ptr::null_mut());
        for (i, (slot, b)) in inputs.iter_mut().zip(args).enumerate() {
            if !Arc::ptr_eq(b.client(), &self.client) {
                return Err(Error::invalid_argument(format!("argument {i} belongs to another client")));
            }
            *slot = b.raw();
        }
        let mut raw = Slots::new(devices * self.num_outputs, ptr::null_mut());
        let mut input_lists = Slots::new(devices, ptr::null());
        let mut output_lists = Slots::new(devices, ptr::null_mut());
        for d in 0..devices {
            input_lists[d] = inputs[d * per_device..].as_ptr();
            output_lists[d] = raw[d * self.num_outputs..].as_mut_ptr();
        }

        let mut options = sys::PJRT_ExecuteOptions::zeroed();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let mut exec = sys::PJRT_LoadedExecutable_Execute_Args::zeroed();
        exec.executable = self.raw.as_ptr();
        exec.options = &mut options;
        exec.argument_lists = input_lists.as_ptr();
        exec.num_devices = devices;
        exec.num_args = per_device;
        exec.output_lists = output_lists.as_ptr();
        exec.execute_device = execute_device;
        // SAFETY: all pointers refer to locals that outlive the call; each output
        // list has room for `num_outputs` buffers.
        unsafe { call!(self.client.api, PJRT_LoadedExecutable_Execute, &mut exec) }?;
        outputs.reserve(raw.len());
        for &b in raw.iter() {
            outputs.push(Buffer::from_raw(self.client.clone(), b)?);
        }
        Ok(())
    }

    /// The `execute_device` to pass: none for the device the program was compiled for
    /// (the plain, fastest path); `device` itself for a portable executable (one
    /// compiled for no device in particular, which has no addressable devices).
    fn launch_device(&self, device: Device<'_>) -> Result<*mut sys::PJRT_Device> {
        match self.devices.as_slice() {
            [only] if *only == device.raw() => Ok(ptr::null_mut()),
            [] => {
                self.client.check_device(device)?;
                Ok(device.raw())
            }
            _ => {
                Err(Error::invalid_argument(format!("the executable was compiled for another device than {device:?}")))
            }
        }
    }

    /// The compiled program in the plugin's serialization format, for
    /// [`Client::deserialize`](crate::Client::deserialize) with the same plugin build.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let mut args = sys::PJRT_Executable_Serialize_Args::zeroed();
        args.executable = self.executable;
        // SAFETY: the executable is live; the bytes live until the deleter is called.
        unsafe {
            call!(self.client.api, PJRT_Executable_Serialize, &mut args)?;
            let bytes = ffi::slice(args.serialized_bytes.cast::<u8>(), args.serialized_bytes_size).to_vec();
            if let Some(delete) = args.serialized_executable_deleter {
                delete(args.serialized_executable);
            }
            Ok(bytes)
        }
    }

    /// A fingerprint of the compiled program, as computed by the plugin.
    pub fn fingerprint(&self) -> Result<Vec<u8>> {
        let mut args = sys::PJRT_Executable_Fingerprint_Args::zeroed();
        args.executable = self.executable;
        // SAFETY: the executable is live and owns the returned bytes.
        unsafe {
            call!(self.client.api, PJRT_Executable_Fingerprint, &mut args)?;
            Ok(ffi::slice(args.executable_fingerprint.cast::<u8>(), args.executable_fingerprint_size).to_vec())
        }
    }
}

/// A short array on the stack, a longer one on the heap.
struct Slots<T: Copy> {
    inline: [T; 8],
    heap: Vec<T>,
    len: usize,
}

impl<T: Copy> Slots<T> {
    fn new(len: usize, fill: T) -> Slots<T> {
        let heap = if len > 8 { vec![fill; len] } else { Vec::new() };
        Slots { inline: [fill; 8], heap, len }
    }
}

impl<T: Copy> std::ops::Deref for Slots<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len > 8 {
            &self.heap
        } else {
            &self.inline[..self.len]
        }
    }
}

impl<T: Copy> std::ops::DerefMut for Slots<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len > 8 {
            &mut self.heap
        } else {
            &mut self.inline[..self.len]
        }
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let api = self.client.api;
        // SAFETY: we own both objects; failures to destroy have nowhere to go.
        unsafe {
            if !self.executable.is_null() {
                let mut args = sys::PJRT_Executable_Destroy_Args::zeroed();
                args.executable = self.executable;
                let _ = call!(api, PJRT_Executable_Destroy, &mut args);
            }
            let mut args = sys::PJRT_LoadedExecutable_Destroy_Args::zeroed();
            args.executable = self.raw.as_ptr();
            let _ = call!(api, PJRT_LoadedExecutable_Destroy, &mut args);
        }
    }
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable").field("num_outputs", &self.num_outputs).finish_non_exhaustive()
    }
}
