//! Devices of a client, described once when the client is created.

use std::fmt;

use crate::api::{call, Api};
use crate::error::Result;
use crate::ffi::{self, Args};
use crate::sys;

/// One of a client's addressable devices. Cheap to copy; borrows its [`Client`](crate::Client).
#[derive(Clone, Copy)]
pub struct Device<'c> {
    info: &'c DeviceInfo,
}

/// What is known about a device, fetched once (its description never changes).
pub(crate) struct DeviceInfo {
    pub(crate) raw: *mut sys::PJRT_Device,
    id: i32,
    local_hardware_id: i32,
    kind: String,
    debug_string: String,
}

// SAFETY: a PJRT_Device is immutable and owned by the client, which outlives the info.
unsafe impl Send for DeviceInfo {}
unsafe impl Sync for DeviceInfo {}

impl DeviceInfo {
    pub(crate) fn query(api: &Api, raw: *mut sys::PJRT_Device) -> Result<DeviceInfo> {
        let mut desc = sys::PJRT_Device_GetDescription_Args::zeroed();
        desc.device = raw;
        let mut id = sys::PJRT_DeviceDescription_Id_Args::zeroed();
        let mut kind = sys::PJRT_DeviceDescription_Kind_Args::zeroed();
        let mut debug = sys::PJRT_DeviceDescription_DebugString_Args::zeroed();
        let mut hardware = sys::PJRT_Device_LocalHardwareId_Args::zeroed();
        hardware.device = raw;
        // SAFETY: the device belongs to a live client; the returned strings are owned by
        // its description and copied before returning.
        unsafe {
            call!(api, PJRT_Device_GetDescription, &mut desc)?;
            id.device_description = desc.device_description;
            kind.device_description = desc.device_description;
            debug.device_description = desc.device_description;
            call!(api, PJRT_DeviceDescription_Id, &mut id)?;
            call!(api, PJRT_DeviceDescription_Kind, &mut kind)?;
            call!(api, PJRT_DeviceDescription_DebugString, &mut debug)?;
            call!(api, PJRT_Device_LocalHardwareId, &mut hardware)?;
            Ok(DeviceInfo {
                raw,
                id: id.id,
                local_hardware_id: hardware.local_hardware_id,
                kind: ffi::string(kind.device_kind, kind.device_kind_size),
                debug_string: ffi::string(debug.debug_string, debug.debug_string_size),
            })
        }
    }
}

impl<'c> Device<'c> {
    pub(crate) fn new(info: &'c DeviceInfo) -> Self {
        Device { info }
    }

    pub(crate) fn raw(self) -> *mut sys::PJRT_Device {
        self.info.raw
    }

    /// The device's global id.
    pub fn id(self) -> i32 {
        self.info.id
    }

    /// The device's number on its host (a GPU's CUDA ordinal), or -1 where the
    /// plugin has none.
    pub fn local_hardware_id(self) -> i32 {
        self.info.local_hardware_id
    }

    /// The device kind, e.g. `"cpu"`.
    pub fn kind(self) -> &'c str {
        &self.info.kind
    }

    /// A human-readable name, e.g. `"TFRT_CPU_0"`.
    pub fn debug_string(self) -> &'c str {
        &self.info.debug_string
    }
}

impl PartialEq for Device<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.info.raw == other.info.raw
    }
}

impl Eq for Device<'_> {}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.debug_string())
    }
}
