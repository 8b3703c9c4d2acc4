//! Safe wrapper of the PJRT C API, the plugin interface through which XLA drives
//! CPUs, GPUs and TPUs.
//!
//! The raw bindings ([`sys`]) were generated once from the `pjrt_c_api.h` shipped in the
//! `xla-cpu-pjrt` 0.0.1 wheel (see `regen-bindings.sh`); [`load_plugin`] checks at run
//! time that a plugin is at least that version (newer plugins keep the C API compatible).
//!
//! Lifetimes: buffers and executables keep their client alive, so they may be dropped
//! in any order; a [`Device`] borrows its [`Client`].
//!
//! ```no_run
//! # fn main() -> pjrt::Result<()> {
//! use pjrt::{Client, ElementType, NamedValue};
//!
//! let api = pjrt::load_plugin("pjrt_c_api_cpu_plugin.so".as_ref())?;
//! let client = Client::new(api, &[("cpu_device_count", NamedValue::Int64(1))])?;
//! let device = client.addressable_devices()[0];
//! let exe = client.compile(
//!     "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
//!        %0 = stablehlo.add %x, %x : tensor<2xf32>
//!        return %0 : tensor<2xf32>
//!      }",
//! )?;
//! let x = client.buffer_from_host(&[0u8; 8], ElementType::F32, &[2], device)?;
//! let out = exe.execute(&[&x], device, &[])?;
//! let mut bytes = [0u8; 8];
//! out[0].to_host(&mut bytes)?;
//! # Ok(())
//! # }
//! ```

mod api;
mod buffer;
mod client;
mod device;
mod element_type;
mod error;
mod event;
mod executable;
mod ffi;
mod kv;
mod named_value;
mod options;

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]
#[rustfmt::skip]
pub mod sys;

#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_plugin;

pub use api::{load_plugin, Api};
pub use buffer::Buffer;
pub use client::{Client, MemoryStats};
pub use device::Device;
pub use element_type::ElementType;
pub use error::{Error, Result};
pub use event::Event;
pub use executable::LoadedExecutable;
pub use kv::KeyValueStore;
pub use named_value::NamedValue;
