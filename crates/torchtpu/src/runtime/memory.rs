//! Memory as PyTorch's allocator statistics see it: the bytes held by live
//! device buffers, per device, with peaks since the last reset
//! (`torch.tpu.memory_allocated`, `memory_stats`, ...), the device's free and
//! total memory, and host memory registered ("pinned") for transfers.
use std::sync::Mutex;

use crate::error::Result;
use crate::runtime;

/// One statistic, as c10's `Stat`: current and peak value, and the amounts
/// added and removed since the last reset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    fn increase(&mut self, n: i64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }

    fn decrease(&mut self, n: i64) {
        self.current -= n;
        self.freed += n;
    }
}

/// A device's statistics: live buffers (count and bytes), and what the
/// device's allocator reserves (XLA:CPU reserves nothing beyond its buffers;
/// GPU and TPU plugins report their pools).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceStats {
    pub buffers: Stat,
    pub bytes: Stat,
    pub reserved: Stat,
}

static STATS: Mutex<Vec<DeviceStats>> = Mutex::new(Vec::new());

fn with_stats<T>(device: usize, f: impl FnOnce(&mut DeviceStats) -> T) -> T {
    let mut stats = STATS.lock().unwrap();
    if stats.len() <= device {
        stats.resize(device + 1, DeviceStats::default());
    }
    f(&mut stats[device])
}

/// A device buffer of `bytes` was created.
pub fn allocated(device: usize, bytes: i64) {
    with_stats(device, |s| {
        s.buffers.increase(1);
        s.bytes.increase(bytes);
    })
}

/// A device buffer of `bytes` was dropped.
pub fn freed(device: usize, bytes: i64) {
    with_stats(device, |s| {
        s.buffers.decrease(1);
        s.bytes.decrease(bytes);
    })
}

/// The statistics of the buffers issued so far. The boundary first issues
/// what fused mode recorded (its live results are then buffers, as CUDA
/// tensors are allocated when created).
pub fn stats(device: usize) -> Result<DeviceStats> {
    let rt = runtime::get()?;
    let plugin = rt.client.memory_stats(rt.device(device)?).ok();
    Ok(with_stats(device, |s| {
        let mut out = *s;
        // What the allocator holds: its pool where it has one (XLA's BFC on
        // GPUs reports `bytes_reserved` 0 beside it), never less than the live
        // buffers, as PyTorch's reserved is never below allocated.
        let held = plugin.and_then(|p| {
            p.pool_bytes.map(|b| (b, p.peak_pool_bytes)).or(p.bytes_reserved.map(|b| (b, p.peak_bytes_reserved)))
        });
        let (current, peak) = held.map_or((0, 0), |(current, peak)| (current, peak.unwrap_or(current)));
        out.reserved = Stat { current: current.max(s.bytes.current), peak: peak.max(s.bytes.peak), ..Stat::default() };
        out
    }))
}

pub fn reset_peak(device: usize) {
    with_stats(device, |s| {
        s.buffers.peak = s.buffers.current;
        s.bytes.peak = s.bytes.current;
    })
}

pub fn reset_accumulated(device: usize) {
    with_stats(device, |s| {
        for stat in [&mut s.buffers, &mut s.bytes] {
            stat.allocated = 0;
            stat.freed = 0;
        }
    })
}

/// (free, total) bytes of the device: its allocator's limit where the plugin
/// reports one, else (XLA:CPU, whose device memory is the host's) the host's
/// available and total memory.
pub fn info(device: usize) -> Result<(i64, i64)> {
    let rt = runtime::get()?;
    if let Ok(p) = rt.client.memory_stats(rt.device(device)?) {
        if let Some(limit) = p.bytes_limit {
            return Ok((limit - p.bytes_in_use, limit));
        }
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> i64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<i64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok((field("MemAvailable:"), field("MemTotal:")))
}

/// Registers host memory for transfers (`pin_memory()`): PJRT's DMA mapping
/// where the plugin has one (page-locking on GPUs). The CPU plugin reads host
/// memory directly and does not implement it, which is no error.
///
/// # Safety
/// `data..data+size` stays allocated until `unpin`.
pub unsafe fn pin(data: *mut std::ffi::c_void, size: usize) -> Result<()> {
    match unsafe { runtime::get()?.client.dma_map(data, size) } {
        Err(e) if e.code_name() != "UNIMPLEMENTED" => Err(e.into()),
        _ => Ok(()),
    }
}

/// # Safety
/// `data` was pinned by `pin`, and no transfer reads it any more.
pub unsafe fn unpin(data: *mut std::ffi::c_void) -> Result<()> {
    match unsafe { runtime::get()?.client.dma_unmap(data) } {
        Err(e) if e.code_name() != "UNIMPLEMENTED" => Err(e.into()),
        _ => Ok(()),
    }
}
