//! The boundary: what the outside calls. The C ABI of the adapter ([`ffi`])
//! and its marshalled arguments ([`args`]), and the `torchtpu._C` Python
//! module ([`python`]). It only converts arguments, results and errors; it
//! may use every layer, and no layer uses it.
pub mod args;
pub mod ffi;
mod python;
