//! torchtpu's core: ATen operators lowered to StableHLO and run through PJRT.
//!
//! One folder per layer (DESIGN §2, docs/ARCHITECTURE.md); each uses only the
//! layers listed before it:
//! - [`error`] and [`metrics`]: the error type and the counters every layer uses;
//! - [`ir`]: the typed graph, dtypes and promotion, strided views, StableHLO
//!   text, and the external kernels (JAX, Pallas) a graph may call;
//! - [`lower`]: the op table, ATen operator -> IR;
//! - [`runtime`]: the PJRT client and devices, storages and their values,
//!   memory statistics, the device's queue and its events, the compilation cache;
//! - [`exec`]: running operators in the three modes: the per-op path, the fused
//!   recorder and what rewrites and buckets a flushed trace, the flush thread,
//!   torch.compile's graphs;
//! - [`distributed`]: torch.distributed's collectives as programs, the group's store;
//! - [`boundary`]: the C ABI the adapter calls, its arguments decoded, the Python module.
pub mod boundary;
pub mod distributed;
pub mod error;
pub mod exec;
pub mod ir;
pub mod lower;
pub mod metrics;
pub mod runtime;
