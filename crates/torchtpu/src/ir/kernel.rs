//! External kernels: StableHLO functions lowered elsewhere (JAX, Pallas) and
//! called from our programs.
//!
//! The front end lowers a kernel once per input signature and registers its
//! functions here; the `torchtpu::kernel` operator (`lower/kernel.rs`) then
//! calls the entry function as one IR node, so the kernel joins a fused trace
//! or a compiled graph like any op, and `emit` prints its functions beside
//! `@main`.
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use crate::error::{Error, Result};
use crate::ir::Ty;
use crate::metrics::{bump, METRICS};

#[derive(Debug)]
pub struct Kernel {
    /// The user's name for it, for error messages.
    pub name: String,
    /// The symbol `func.call` calls; unique per registration (the front end
    /// prefixes every symbol of the kernel with a fingerprint of its text).
    pub entry: String,
    /// Private `func.func` definitions (MLIR, generic syntax), the entry among them.
    pub functions: String,
    pub inputs: Vec<Ty>,
    pub outputs: Vec<Ty>,
}

// A kernel is identified by its entry symbol: hashing the IR (plan and
// program keys) never walks the functions' text.
impl PartialEq for Kernel {
    fn eq(&self, other: &Self) -> bool {
        self.entry == other.entry
    }
}

impl Eq for Kernel {}

impl Hash for Kernel {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.entry.hash(state);
    }
}

static KERNELS: RwLock<Vec<Arc<Kernel>>> = RwLock::new(Vec::new());

/// Registers a lowered kernel; returns its id (the same id for the same entry).
pub fn register(kernel: Kernel) -> Result<i64> {
    if kernel.outputs.is_empty() {
        return Err(Error::value(format!("kernel {} returns no arrays", kernel.name)));
    }
    let mut kernels = KERNELS.write().unwrap();
    if let Some(id) = kernels.iter().position(|k| k.entry == kernel.entry) {
        return Ok(id as i64);
    }
    bump(&METRICS.kernels);
    kernels.push(Arc::new(kernel));
    Ok(kernels.len() as i64 - 1)
}

pub fn get(id: i64) -> Result<Arc<Kernel>> {
    let kernels = KERNELS.read().unwrap();
    usize::try_from(id)
        .ok()
        .and_then(|i| kernels.get(i).cloned())
        .ok_or_else(|| Error::value(format!("torchtpu: no kernel with id {id}")))
}
