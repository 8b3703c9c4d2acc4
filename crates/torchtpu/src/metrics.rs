//! Counters behind `torchtpu.metrics()`.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    pub ops: AtomicU64,
    pub executions: AtomicU64,
    pub compilations: AtomicU64,
    pub compile_ns: AtomicU64,
    pub execute_ns: AtomicU64,
    pub plan_hits: AtomicU64,
    pub plan_misses: AtomicU64,
    pub program_hits: AtomicU64,
    pub program_misses: AtomicU64,
    pub disk_hits: AtomicU64,
    pub disk_misses: AtomicU64,
    pub disk_corrupt: AtomicU64,
    pub fused_hits: AtomicU64,
    pub fused_misses: AtomicU64,
    /// Fused flushes that replayed a step met before (`exec/trace.rs`).
    pub replays: AtomicU64,
    /// Loaded executables dropped from memory (the cache's bound).
    pub programs_evicted: AtomicU64,
    /// Buffers donated to fused programs (updated in place).
    pub donated: AtomicU64,
    pub transfers_to_device: AtomicU64,
    pub transfers_to_host: AtomicU64,
    /// Compiled graphs registered by the Dynamo backend, their captures
    /// (one plan per input signature) and calls.
    pub graphs: AtomicU64,
    pub graph_captures: AtomicU64,
    pub graph_calls: AtomicU64,
    /// External kernels registered (one per kernel and input signature).
    pub kernels: AtomicU64,
    /// Collective programs run (`distributed/collective.rs`).
    pub collectives: AtomicU64,
    /// Flushes run on the flush thread (`exec/overlap.rs`).
    pub overlapped: AtomicU64,
    /// Fused programs compiled for a bucket of a changing size, flushes they
    /// ran, and buffers copied through the host into (`repads`) or out of
    /// (`unpads`) a bucket's padded shape (`exec/bounded.rs`).
    pub bucketed_programs: AtomicU64,
    pub bucketed_runs: AtomicU64,
    pub repads: AtomicU64,
    pub unpads: AtomicU64,
    /// Why traces whose sizes change were not bucketed, with counts.
    pub bucket_refusals: Mutex<BTreeMap<String, u64>>,
    /// Nodes of the largest fused program run.
    pub largest_graph: AtomicU64,
    pub fallbacks: Mutex<BTreeMap<String, u64>>,
    /// Compiled graphs that run op by op, and why.
    pub eager_graphs: Mutex<BTreeMap<String, String>>,
    /// Fused-mode flushes by reason.
    pub flushes: Mutex<BTreeMap<&'static str, u64>>,
    /// Why recent fused programs missed the cache (the latest last).
    pub recompile_reasons: Mutex<Vec<String>>,
}

pub static METRICS: std::sync::LazyLock<Metrics> = std::sync::LazyLock::new(Metrics::default);

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Counts a CPU fallback; returns true the first time `op` falls back.
pub fn fallback(op: &str) -> bool {
    let mut map = METRICS.fallbacks.lock().unwrap();
    let n = map.entry(op.to_string()).or_insert(0);
    *n += 1;
    *n == 1
}

impl Metrics {
    /// Every counter by name (fallbacks separately).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("ops", get(&self.ops)),
            ("executions", get(&self.executions)),
            ("compilations", get(&self.compilations)),
            ("compile_ns", get(&self.compile_ns)),
            ("execute_ns", get(&self.execute_ns)),
            ("plan_cache_hits", get(&self.plan_hits)),
            ("plan_cache_misses", get(&self.plan_misses)),
            ("program_cache_hits", get(&self.program_hits)),
            ("program_cache_misses", get(&self.program_misses)),
            ("disk_cache_hits", get(&self.disk_hits)),
            ("disk_cache_misses", get(&self.disk_misses)),
            ("disk_cache_corrupt", get(&self.disk_corrupt)),
            ("fused_cache_hits", get(&self.fused_hits)),
            ("fused_cache_misses", get(&self.fused_misses)),
            ("fused_replays", get(&self.replays)),
            ("programs_evicted", get(&self.programs_evicted)),
            ("donated_buffers", get(&self.donated)),
            ("transfers_to_device", get(&self.transfers_to_device)),
            ("transfers_to_host", get(&self.transfers_to_host)),
            ("largest_graph", get(&self.largest_graph)),
            ("compiled_graphs", get(&self.graphs)),
            ("compiled_graph_captures", get(&self.graph_captures)),
            ("compiled_graph_calls", get(&self.graph_calls)),
            ("kernels", get(&self.kernels)),
            ("collectives", get(&self.collectives)),
            ("overlapped_flushes", get(&self.overlapped)),
            ("bucketed_programs", get(&self.bucketed_programs)),
            ("bucketed_runs", get(&self.bucketed_runs)),
            ("repads", get(&self.repads)),
            ("unpads", get(&self.unpads)),
        ]
    }

    pub fn reset(&self) {
        for c in [
            &self.ops,
            &self.executions,
            &self.compilations,
            &self.compile_ns,
            &self.execute_ns,
            &self.plan_hits,
            &self.plan_misses,
            &self.program_hits,
            &self.program_misses,
            &self.disk_hits,
            &self.disk_misses,
            &self.disk_corrupt,
            &self.fused_hits,
            &self.fused_misses,
            &self.replays,
            &self.programs_evicted,
            &self.donated,
            &self.transfers_to_device,
            &self.transfers_to_host,
            &self.largest_graph,
            &self.graphs,
            &self.graph_captures,
            &self.graph_calls,
            &self.kernels,
            &self.collectives,
            &self.overlapped,
            &self.bucketed_programs,
            &self.bucketed_runs,
            &self.repads,
            &self.unpads,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.fallbacks.lock().unwrap().clear();
        self.eager_graphs.lock().unwrap().clear();
        self.flushes.lock().unwrap().clear();
        self.recompile_reasons.lock().unwrap().clear();
        self.bucket_refusals.lock().unwrap().clear();
    }
}
