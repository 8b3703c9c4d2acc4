//! The compilation cache shared by every mode: one executable per distinct
//! StableHLO program, compiled once per process.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::metrics::{add, bump, METRICS};
use crate::{emit, runtime};

pub struct Program {
    pub exe: pjrt::LoadedExecutable,
}

static PROGRAMS: Mutex<Option<HashMap<String, Arc<Program>>>> = Mutex::new(None);

fn dump_dir() -> PathBuf {
    std::env::var_os("TORCHTPU_DUMP_DIR").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("torchtpu"))
}

/// Writes `mlir` under the dump directory; returns the file's path.
fn dump(mlir: &str, what: &str) -> Option<PathBuf> {
    let dir = dump_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let hash = mlir.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let path = dir.join(format!("{what}-{hash:016x}.mlir"));
    std::fs::write(&path, mlir).ok()?;
    Some(path)
}

/// The executable of `graph`, compiled on first sight. `what` names the
/// operation in error messages.
pub fn compile(graph: &Graph, what: &str) -> Result<Arc<Program>> {
    let mlir = emit::emit(graph);
    if let Some(p) = PROGRAMS.lock().unwrap().get_or_insert_with(HashMap::new).get(&mlir) {
        bump(&METRICS.program_hits);
        return Ok(p.clone());
    }
    let rt = runtime::get()?;
    let start = Instant::now();
    // With several devices one portable executable serves them all.
    let exe = rt.client.compile_with(&mlir, rt.device_count() > 1).map_err(|e| {
        let name = what.replace([':', '.', '/'], "_");
        let file = dump(&mlir, &name).map_or("(could not write the dump)".into(), |p| p.display().to_string());
        Error::runtime(format!("torchtpu: XLA failed to compile {what}: {e}\nStableHLO written to {file}"))
    })?;
    add(&METRICS.compile_ns, start.elapsed().as_nanos() as u64);
    bump(&METRICS.compilations);
    METRICS.largest_graph.fetch_max(graph.nodes.len() as u64, std::sync::atomic::Ordering::Relaxed);
    if std::env::var_os("TORCHTPU_DUMP_DIR").is_some() {
        dump(&mlir, &what.replace([':', '.', '/'], "_"));
    }
    let program = Arc::new(Program { exe });
    PROGRAMS.lock().unwrap().get_or_insert_with(HashMap::new).insert(mlir, program.clone());
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ir::{Op, Ty};

    #[test]
    fn failed_compilation_names_its_dump() {
        let Ok(plugin) = std::env::var("TORCHTPU_PJRT_PLUGIN") else { return eprintln!("no plugin: skipped") };
        runtime::configure(plugin.into(), Some(1));
        // Contracting 3 against 4 passes our IR builder but not XLA's verifier.
        let mut g = Graph::default();
        let a = g.param(Ty::new(DType::F32, &[2, 3]));
        let b = g.param(Ty::new(DType::F32, &[4, 5]));
        let op = Op::DotGeneral { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![1], rhs_contract: vec![0] };
        g.outputs = vec![g.push(op, vec![a, b], Ty::new(DType::F32, &[2, 5]))];
        let err = compile(&g, "aten::mm").err().expect("XLA rejects the program");
        let path = err.message.rsplit("StableHLO written to ").next().unwrap().trim();
        assert!(err.message.contains("XLA failed to compile aten::mm"), "{}", err.message);
        assert!(std::fs::read_to_string(path).unwrap().contains("stablehlo.dot_general"));
    }
}
