//! Helpers for crossing the C ABI: argument structs and borrowed C data.

use std::os::raw::c_char;

use crate::sys;

/// A C API struct that starts with `size_t struct_size` and is valid when zeroed.
///
/// # Safety
/// Implementors must be plain C data (integers, raw pointers, optional function
/// pointers) for which all-zero bytes are a valid value.
pub(crate) unsafe trait Args: Sized {
    /// The header's `<Name>_STRUCT_SIZE`: the offset of the last field plus its size,
    /// which is *not* `size_of` (the plugin rejects any other value).
    const STRUCT_SIZE: usize;

    /// Zeroed, with `struct_size` set: what the plugin expects from a caller that
    /// leaves every optional field unset.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract.
        let mut args: Self = unsafe { std::mem::zeroed() };
        // SAFETY: `struct_size` is the first field of every such `repr(C)` struct.
        unsafe { (&mut args as *mut Self).cast::<usize>().write(Self::STRUCT_SIZE) };
        args
    }
}

macro_rules! impl_args {
    ($($name:ident => $size:ident,)*) => {$(
        // SAFETY: bindgen output for a C struct of integers, pointers and bools.
        unsafe impl Args for sys::$name {
            const STRUCT_SIZE: usize = sys::$size as usize;
        }
    )*};
}

impl_args! {
    PJRT_Error_Destroy_Args => PJRT_Error_Destroy_Args_STRUCT_SIZE,
    PJRT_Error_Message_Args => PJRT_Error_Message_Args_STRUCT_SIZE,
    PJRT_Error_GetCode_Args => PJRT_Error_GetCode_Args_STRUCT_SIZE,
    PJRT_NamedValue => PJRT_NamedValue_STRUCT_SIZE,
    PJRT_Plugin_Initialize_Args => PJRT_Plugin_Initialize_Args_STRUCT_SIZE,
    PJRT_Plugin_Attributes_Args => PJRT_Plugin_Attributes_Args_STRUCT_SIZE,
    PJRT_Event_Destroy_Args => PJRT_Event_Destroy_Args_STRUCT_SIZE,
    PJRT_Event_IsReady_Args => PJRT_Event_IsReady_Args_STRUCT_SIZE,
    PJRT_Event_Await_Args => PJRT_Event_Await_Args_STRUCT_SIZE,
    PJRT_Event_Error_Args => PJRT_Event_Error_Args_STRUCT_SIZE,
    PJRT_Event_OnReady_Args => PJRT_Event_OnReady_Args_STRUCT_SIZE,
    PJRT_Client_Create_Args => PJRT_Client_Create_Args_STRUCT_SIZE,
    PJRT_Client_Destroy_Args => PJRT_Client_Destroy_Args_STRUCT_SIZE,
    PJRT_Client_PlatformName_Args => PJRT_Client_PlatformName_Args_STRUCT_SIZE,
    PJRT_Client_PlatformVersion_Args => PJRT_Client_PlatformVersion_Args_STRUCT_SIZE,
    PJRT_Client_AddressableDevices_Args => PJRT_Client_AddressableDevices_Args_STRUCT_SIZE,
    PJRT_Client_Compile_Args => PJRT_Client_Compile_Args_STRUCT_SIZE,
    PJRT_Client_BufferFromHostBuffer_Args => PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
    PJRT_Client_DmaMap_Args => PJRT_Client_DmaMap_Args_STRUCT_SIZE,
    PJRT_Client_DmaUnmap_Args => PJRT_Client_DmaUnmap_Args_STRUCT_SIZE,
    PJRT_Device_MemoryStats_Args => PJRT_Device_MemoryStats_Args_STRUCT_SIZE,
    PJRT_Program => PJRT_Program_STRUCT_SIZE,
    PJRT_Device_GetDescription_Args => PJRT_Device_GetDescription_Args_STRUCT_SIZE,
    PJRT_Device_LocalHardwareId_Args => PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE,
    PJRT_Client_CreateUninitializedBuffer_Args => PJRT_Client_CreateUninitializedBuffer_Args_STRUCT_SIZE,
    PJRT_DeviceDescription_Id_Args => PJRT_DeviceDescription_Id_Args_STRUCT_SIZE,
    PJRT_DeviceDescription_Kind_Args => PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE,
    PJRT_DeviceDescription_DebugString_Args => PJRT_DeviceDescription_DebugString_Args_STRUCT_SIZE,
    PJRT_Executable_Destroy_Args => PJRT_Executable_Destroy_Args_STRUCT_SIZE,
    PJRT_Executable_NumOutputs_Args => PJRT_Executable_NumOutputs_Args_STRUCT_SIZE,
    PJRT_Executable_Fingerprint_Args => PJRT_Executable_Fingerprint_Args_STRUCT_SIZE,
    PJRT_Executable_Serialize_Args => PJRT_Executable_Serialize_Args_STRUCT_SIZE,
    PJRT_Executable_DeserializeAndLoad_Args => PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_Destroy_Args => PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_GetExecutable_Args => PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_AddressableDevices_Args => PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_Execute_Args => PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
    PJRT_ExecuteOptions => PJRT_ExecuteOptions_STRUCT_SIZE,
    PJRT_Buffer_Destroy_Args => PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
    PJRT_Buffer_ElementType_Args => PJRT_Buffer_ElementType_Args_STRUCT_SIZE,
    PJRT_Buffer_Dimensions_Args => PJRT_Buffer_Dimensions_Args_STRUCT_SIZE,
    PJRT_Buffer_OnDeviceSizeInBytes_Args => PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE,
    PJRT_Buffer_IsDeleted_Args => PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE,
    PJRT_Buffer_ReadyEvent_Args => PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE,
    PJRT_Buffer_ToHostBuffer_Args => PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
    PJRT_Buffer_UnsafePointer_Args => PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE,
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args => PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE,
    PJRT_Buffer_IncreaseExternalReferenceCount_Args => PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE,
    PJRT_Buffer_DecreaseExternalReferenceCount_Args => PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE,
}

/// Views a (pointer, length) array returned by the plugin; null means empty.
///
/// # Safety
/// If non-null, `ptr` must point to `len` readable values.
pub(crate) unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// Copies a (pointer, length) string returned by the plugin, replacing invalid UTF-8.
///
/// # Safety
/// As for [`slice`].
pub(crate) unsafe fn string(ptr: *const c_char, len: usize) -> String {
    String::from_utf8_lossy(unsafe { slice(ptr.cast::<u8>(), len) }).into_owned()
}
