//! torchtpu's core: ATen operators lowered to StableHLO and run through PJRT.
//!
//! Layers (see docs/ARCHITECTURE.md): the C++ adapter (`csrc/`) calls [`ffi`];
//! operators are looked up in the [`lower`] table, built as [`ir`] graphs,
//! printed by [`emit`], compiled once by [`cache`] and run by [`exec`] on the
//! [`runtime`]'s PJRT client. Tensors' bytes live in [`storage`]. Fused mode
//! records into a [`trace`]; torch.compile's graphs become [`compiled`] plans;
//! JAX and Pallas kernels are [`kernel`]s called from programs; torch.distributed's
//! collectives run as replicated [`collective`] programs where XLA's collectives
//! reach every member.
pub mod args;
pub mod bounded;
pub mod cache;
pub mod collective;
pub mod compiled;
pub mod dtype;
pub mod emit;
pub mod error;
pub mod event;
pub mod exec;
pub mod ffi;
pub mod ir;
pub mod kernel;
pub mod lower;
pub mod memory;
pub mod metrics;
pub mod overlap;
mod python;
pub mod runtime;
pub mod simplify;
pub mod storage;
pub mod store;
pub mod trace;
pub mod view;
