//! The compilation cache shared by every mode: one executable per distinct
//! StableHLO program, in memory and in a persistent directory (DESIGN §6).
//!
//! An entry's key hashes the program text, the plugin's identity and the
//! compile options, so a changed plugin or `XLA_FLAGS` never reuses a stale
//! executable. Entries are written atomically (a temporary file renamed into
//! place) with a checksum; one that fails to verify or load is reported,
//! recompiled and replaced, never trusted. The directory is kept under a size
//! bound by evicting the least recently used entries.
//!
//! Loaded executables are bounded too: each keeps its JIT-compiled code in
//! memory mappings of its own, and a process that reaches the kernel's limit
//! on mappings (`vm.max_map_count`, 65530 by default) fails to compile, then
//! crashes. The cache owns them; plans and fused traces hold weak references
//! and come back here once theirs was evicted (a disk hit, not a compile).
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use crate::error::{Error, Result};
use crate::ir::{emit, Graph};
use crate::metrics::{add, bump, METRICS};
use crate::runtime;

pub struct Program {
    pub exe: pjrt::LoadedExecutable,
    /// When it was last used, on the clock below: the least recent is evicted.
    used: AtomicU64,
}

/// Counts uses of programs.
static CLOCK: AtomicU64 = AtomicU64::new(0);

impl Program {
    /// Marks the program as just used.
    pub fn touch(&self) {
        self.used.store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }
}

pub type Key = (u64, u64);

static PROGRAMS: Mutex<Option<HashMap<Key, Arc<Program>>>> = Mutex::new(None);

/// Loaded executables kept in memory (`TORCHTPU_MAX_PROGRAMS`). A program
/// takes 3 to ~30 mappings (XLA splits large ones into several libraries).
fn max_programs() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| std::env::var("TORCHTPU_MAX_PROGRAMS").ok().and_then(|v| v.parse().ok()).unwrap_or(512))
}

fn dump_dir() -> PathBuf {
    std::env::var_os("TORCHTPU_DUMP_DIR").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("torchtpu"))
}

/// 64-bit FNV-1a, continued from `h`.
fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

const FNV_START: u64 = 0xcbf29ce484222325;

/// Writes `mlir` under the dump directory; returns the file's path.
fn dump(mlir: &str, what: &str) -> Option<PathBuf> {
    let dir = dump_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let path =
        dir.join(format!("{}-{:016x}.mlir", what.replace([':', '.', '/', ' '], "_"), fnv(FNV_START, mlir.as_bytes())));
    std::fs::write(&path, mlir).ok()?;
    Some(path)
}

/// Everything besides the program text and placement that decides an
/// executable, as `name=value` lines (a bundle's manifest): never a path, so
/// a cache moves between directories and virtualenvs.
struct Identity {
    manifest: Vec<(&'static str, String)>,
    text: String,
    /// Written in each disk entry, so that `export` picks this identity's.
    fingerprint: u64,
}

fn identity(rt: &runtime::Runtime) -> &'static Identity {
    static IDENTITY: OnceLock<Identity> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let platform = rt.client.platform_name();
        let mut manifest = vec![
            ("format", "torchtpu-cache-2".to_string()),
            ("torchtpu", env!("CARGO_PKG_VERSION").to_string()),
            ("platform", format!("{platform} {}", rt.client.platform_version())),
            ("plugin", plugin_fingerprint(&rt.plugin)),
            ("xla_flags", std::env::var("XLA_FLAGS").unwrap_or_default()),
        ];
        // XLA:CPU compiles for the host's instruction set.
        if platform == "cpu" {
            manifest.push(("cpu_features", cpu_features()));
        }
        let text: String = manifest.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        let fingerprint = fnv(FNV_START, text.as_bytes());
        Identity { manifest, text, fingerprint }
    })
}

/// The plugin file's size and a hash of its first and last MiB: which build
/// it is, wherever it is installed (hashing all of a ~250 MB plugin would
/// cost a few hundred ms at start-up).
fn plugin_fingerprint(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const SPAN: u64 = 1 << 20;
    let sample = || -> std::io::Result<(u64, u64)> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        let mut head = Vec::new();
        Read::by_ref(&mut f).take(SPAN).read_to_end(&mut head)?;
        f.seek(SeekFrom::Start(len.saturating_sub(SPAN)))?;
        let mut tail = Vec::new();
        f.read_to_end(&mut tail)?;
        Ok((len, fnv(fnv(FNV_START, &head), &tail)))
    };
    match sample() {
        Ok((len, hash)) => format!("{len}:{hash:016x}"),
        Err(e) => format!("unreadable ({e})"),
    }
}

/// The host CPU's feature flags (`/proc/cpuinfo`), hashed.
fn cpu_features() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let mut words: Vec<&str> = flags.split_whitespace().skip(2).collect();
    words.sort_unstable();
    format!("{:016x}", fnv(FNV_START, words.join(" ").as_bytes()))
}

/// The executable of `graph`, compiled on first sight (in this process or,
/// through the disk cache, an earlier one). `what` names the operation in
/// error messages.
pub fn compile(graph: &Graph, what: &str) -> Result<Arc<Program>> {
    compile_on(graph, what, None)
}

/// [`compile`] for one device (`replicas` None: with several devices one
/// portable executable serves them all) or replicated over `replicas`
/// (global device ids, in replica order).
pub fn compile_on(graph: &Graph, what: &str, replicas: Option<&[i32]>) -> Result<Arc<Program>> {
    find_or_compile(graph, what, replicas, true).map(|p| p.expect("compiled"))
}

/// The executable of `graph` if it was compiled before (in this process or,
/// through the disk cache, an earlier one); None rather than compiling.
pub fn compiled(graph: &Graph) -> Result<Option<Arc<Program>>> {
    find_or_compile(graph, "", None, false)
}

fn find_or_compile(graph: &Graph, what: &str, replicas: Option<&[i32]>, compile: bool) -> Result<Option<Arc<Program>>> {
    let mlir = emit::emit(graph);
    let rt = runtime::get()?;
    let portable = replicas.is_none() && rt.device_count() > 1;
    let id = format!("{}portable={portable}\nreplicas={replicas:?}", identity(rt).text);
    let key = (
        fnv(fnv(FNV_START, id.as_bytes()), mlir.as_bytes()),
        fnv(fnv(0x84222325cbf29ce4, mlir.as_bytes()), id.as_bytes()),
    );
    if let Some(p) = loaded(key) {
        bump(&METRICS.program_hits);
        p.touch();
        return Ok(Some(p));
    }
    bump(&METRICS.program_misses);
    make_room()?;
    let disk = disk();
    let exe = match disk.as_ref().and_then(|d| d.load(key, rt)) {
        Some(exe) => exe,
        None if !compile => return Ok(None),
        None => {
            let start = Instant::now();
            let exe = match replicas {
                Some(devices) => rt.client.compile_replicated(&mlir, devices),
                None => rt.client.compile_with(&mlir, portable),
            };
            let exe = exe.map_err(|e| {
                // XLA's GPU compiler allocates the program's arguments to
                // autotune it: an argument too large for the device fails here.
                if e.code == crate::error::RESOURCE_EXHAUSTED {
                    let device = replicas.and_then(|r| r.first()).map_or(0, |&d| d as usize);
                    return Error::on_device(e, &format!("compiling {what}"), device);
                }
                let file = dump(&mlir, what).map_or("(could not write the dump)".into(), |p| p.display().to_string());
                Error::runtime(format!("torchtpu: XLA failed to compile {what}: {e}\nStableHLO written to {file}"))
            })?;
            add(&METRICS.compile_ns, start.elapsed().as_nanos() as u64);
            bump(&METRICS.compilations);
            if std::env::var_os("TORCHTPU_DUMP_DIR").is_some() {
                dump(&mlir, what);
            }
            if let Some(d) = &disk {
                d.store(identity(rt).fingerprint, key, &exe);
            }
            exe
        }
    };
    Ok(Some(keep(key, exe)))
}

/// The program under `key` in memory, waiting for it where an import's
/// preload is loading it now.
fn loaded(key: Key) -> Option<Arc<Program>> {
    let mut loading = LOADING.lock().unwrap();
    while loading.contains(&key) {
        loading = PRELOADED.wait(loading).unwrap();
    }
    drop(loading);
    PROGRAMS.lock().unwrap().get_or_insert_with(HashMap::new).get(&key).cloned()
}

/// Keeps `exe` in memory as the program under `key`, within the bound.
fn keep(key: Key, exe: pjrt::LoadedExecutable) -> Arc<Program> {
    let program = Arc::new(Program { exe, used: AtomicU64::new(0) });
    program.touch();
    let mut guard = PROGRAMS.lock().unwrap();
    let programs = guard.get_or_insert_with(HashMap::new);
    programs.insert(key, program.clone());
    evict_to(programs, max_programs());
    program
}

/// Stores `data` in the persistent cache under `key`, beside the programs
/// (exported and imported with them): what a program's compilation was
/// derived from, such as a structure's fit of its changing sizes.
pub fn save(key: Key, data: &[u8]) {
    let (Some(disk), Ok(rt)) = (disk(), runtime::get()) else { return };
    if let Err(e) = disk.write(key, &entry(DATA, identity(rt).fingerprint, key, data)) {
        warn(format!("could not write to the compilation cache in {}: {e}", disk.dir.display()));
    }
}

/// The data [`save`]d under `key`, in this or an earlier process (a damaged
/// entry is reported and removed).
pub fn saved(key: Key) -> Option<Vec<u8>> {
    let disk = disk()?;
    let path = disk.path(key);
    let bytes = std::fs::read(&path).ok()?;
    match verify(&bytes, key, &[DATA]) {
        Ok(payload) => Some(payload.to_vec()),
        Err(why) => {
            warn(format!("compilation cache entry {} is unusable ({why}); removing it", path.display()));
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// Evicts the least recently used programs until `keep` stay loaded. Runs
/// only after a miss, so a linear scan costs nothing.
fn evict_to(programs: &mut HashMap<Key, Arc<Program>>, keep: usize) {
    while programs.len() > keep {
        let oldest = *programs.iter().min_by_key(|(_, p)| p.used.load(Ordering::Relaxed)).unwrap().0;
        programs.remove(&oldest);
        bump(&METRICS.programs_evicted);
    }
}

/// Misses between two counts of the process's mappings: counting reads
/// /proc/self/maps, ~1 ms per 1000 mappings.
const MAPPING_CHECK_EVERY: u64 = 32;

/// Mappings kept free for loading the programs until the next count (each
/// maps its code in a few regions; compiling maps thread stacks and arenas).
const MAPPING_HEADROOM: usize = 2048;

/// (mappings in use, the kernel's limit), where the kernel says.
fn mappings() -> Option<(usize, usize)> {
    static MAX: OnceLock<Option<usize>> = OnceLock::new();
    let max = (*MAX.get_or_init(|| std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()))?;
    let used = std::fs::read("/proc/self/maps").ok()?.iter().filter(|&&b| b == b'\n').count();
    Some((used, max))
}

/// Before loading another executable: near the limit on mappings XLA's JIT
/// fails and leaves the unwinder's frame tables broken, so that the next
/// exception anywhere in the process crashes it. Sheds every loaded program
/// there, and refuses with a clear error if that is not enough.
fn make_room() -> Result<()> {
    static MISSES: AtomicU64 = AtomicU64::new(0);
    if MISSES.fetch_add(1, Ordering::Relaxed) % MAPPING_CHECK_EVERY != 0 {
        return Ok(());
    }
    let near = |m: Option<(usize, usize)>| m.is_some_and(|(used, max)| used + MAPPING_HEADROOM > max);
    if !near(mappings()) {
        return Ok(());
    }
    evict_to(PROGRAMS.lock().unwrap().get_or_insert_with(HashMap::new), 0);
    match mappings() {
        Some((used, max)) if near(Some((used, max))) => Err(Error::runtime(format!(
            "torchtpu: the process uses {used} of the kernel's {max} memory mappings (vm.max_map_count), too \
             many for XLA to load another program; free what holds them, or raise the limit \
             (sysctl -w vm.max_map_count=...)"
        ))),
        _ => Ok(()),
    }
}

// ------------------------------------------------------------------ disk

/// The persistent directory: `TORCHTPU_CACHE_DIR` (empty disables it), else
/// `$XDG_CACHE_HOME/torchtpu` or `~/.cache/torchtpu`.
struct Disk {
    dir: PathBuf,
    max_bytes: u64,
}

fn disk() -> Option<&'static Disk> {
    static DISK: OnceLock<Option<Disk>> = OnceLock::new();
    DISK.get_or_init(|| {
        let dir = match std::env::var_os("TORCHTPU_CACHE_DIR") {
            Some(d) if d.is_empty() => return None,
            Some(d) => PathBuf::from(d),
            None => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?
                .join("torchtpu"),
        };
        let mb = std::env::var("TORCHTPU_CACHE_SIZE_MB").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(4096);
        Some(Disk { dir, max_bytes: mb << 20 })
    })
    .as_ref()
}

/// An entry's first bytes: a serialized executable, or other data [`save`]d
/// beside the programs.
const PROGRAM: &[u8; 8] = b"TTPUEXE2";
const DATA: &[u8; 8] = b"TTPUDAT2";

/// Entry layout: magic, identity fingerprint, key (2 x u64), payload length,
/// payload checksum, payload.
const HEADER: usize = 8 + 8 + 16 + 8 + 8;

/// A disk entry of `payload`.
fn entry(magic: &[u8; 8], identity: u64, key: Key, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(magic);
    for word in [identity, key.0, key.1, payload.len() as u64, fnv(FNV_START, payload)] {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes.extend_from_slice(payload);
    bytes
}

fn word(bytes: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap())
}

fn warn(message: String) {
    eprintln!("torchtpu: warning: {message}");
}

impl Disk {
    fn path(&self, key: Key) -> PathBuf {
        self.dir.join(format!("{:016x}{:016x}.xla", key.0, key.1))
    }

    /// A verified entry, or None (a bad one is reported and removed).
    fn load(&self, key: Key, rt: &runtime::Runtime) -> Option<pjrt::LoadedExecutable> {
        let path = self.path(key);
        let Ok(bytes) = std::fs::read(&path) else {
            bump(&METRICS.disk_misses);
            return None;
        };
        let verified = verify(&bytes, key, &[PROGRAM])
            .and_then(|payload| rt.client.deserialize(payload).map_err(|e| e.to_string()));
        match verified {
            Ok(exe) => {
                bump(&METRICS.disk_hits);
                // Recency for eviction.
                if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(exe)
            }
            Err(why) => {
                bump(&METRICS.disk_corrupt);
                bump(&METRICS.disk_misses);
                warn(format!(
                    "compilation cache entry {} is unusable ({why}); recompiling and replacing it",
                    path.display()
                ));
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn store(&self, identity: u64, key: Key, exe: &pjrt::LoadedExecutable) {
        let written = exe
            .serialize()
            .map_err(|e| e.to_string())
            .and_then(|p| self.write(key, &entry(PROGRAM, identity, key, &p)));
        match written {
            Ok(()) => self.evict(),
            Err(e) => warn(format!("could not write to the compilation cache in {}: {e}", self.dir.display())),
        }
    }

    /// Writes an entry aside and renames it into place: readers see a whole
    /// entry or none.
    fn write(&self, key: Key, bytes: &[u8]) -> std::result::Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let tmp = self.dir.join(format!(".{:016x}{:016x}.{}.tmp", key.0, key.1, std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| e.to_string())?;
        f.write_all(bytes).map_err(|e| e.to_string())?;
        drop(f);
        std::fs::rename(&tmp, self.path(key)).map_err(|e| e.to_string())
    }

    /// The entries in the directory (files ending in .xla).
    fn entries(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        dir.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "xla")).collect()
    }

    /// Removes least recently used entries until the directory fits its bound.
    fn evict(&self) {
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = self
            .entries()
            .into_iter()
            .filter_map(|path| {
                let m = path.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), path))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

// ------------------------------------------------------------------ bundles

/// A bundle: this line, the manifest's `name=value` lines, an empty line,
/// then each disk entry after its length (u64).
const BUNDLE_MAGIC: &[u8] = b"torchtpu compilation cache bundle\n";

fn cache_dir() -> Result<&'static Disk> {
    disk().ok_or_else(|| Error::runtime("torchtpu: the compilation cache is disabled (TORCHTPU_CACHE_DIR is empty)"))
}

/// Writes the cache directory's entries of this process's identity to `path`
/// as one file; returns how many.
pub fn export(path: &Path) -> Result<usize> {
    let id = identity(runtime::get()?);
    let disk = cache_dir()?;
    let mut out = BUNDLE_MAGIC.to_vec();
    out.extend_from_slice(id.text.as_bytes());
    out.push(b'\n');
    let mut count = 0;
    // Most recently used first: what an import preloads.
    let mut paths: Vec<(SystemTime, PathBuf)> =
        disk.entries().into_iter().filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p))).collect();
    paths.sort_by(|a, b| b.0.cmp(&a.0));
    for entry in paths.iter().filter_map(|(_, p)| std::fs::read(p).ok()) {
        if entry.len() >= HEADER
            && [PROGRAM, DATA].iter().any(|&k| &entry[..8] == k)
            && word(&entry, 8) == id.fingerprint
        {
            out.extend_from_slice(&(entry.len() as u64).to_le_bytes());
            out.extend_from_slice(&entry);
            count += 1;
        }
    }
    std::fs::write(path, out)
        .map_err(|e| Error::runtime(format!("torchtpu: cannot write the cache bundle {}: {e}", path.display())))?;
    Ok(count)
}

/// Adds the entries of a bundle written by [`export`] to the cache directory;
/// returns how many. A bundle made under another identity (torchtpu version,
/// plugin build, XLA flags, CPU features) or damaged is refused, naming why,
/// and nothing is written.
pub fn import(path: &Path) -> Result<usize> {
    let id = identity(runtime::get()?);
    let bytes = std::fs::read(path)
        .map_err(|e| Error::value(format!("torchtpu: cannot read the cache bundle {}: {e}", path.display())))?;
    let bad = |why: &str| Error::value(format!("torchtpu: {} is not a usable cache bundle: {why}", path.display()));
    let rest = bytes.strip_prefix(BUNDLE_MAGIC).ok_or_else(|| bad("it does not start as one"))?;
    let end = rest.windows(2).position(|w| w == b"\n\n").ok_or_else(|| bad("its manifest is cut off"))?;
    let manifest = std::str::from_utf8(&rest[..end]).map_err(|_| bad("its manifest is not text"))?;
    let theirs: HashMap<&str, &str> = manifest.lines().filter_map(|l| l.split_once('=')).collect();
    for (name, ours) in &id.manifest {
        let their = theirs.get(name).copied().unwrap_or("(none)");
        if their != ours {
            return Err(Error::value(format!(
                "torchtpu: the cache bundle {} was made with {name} = {their}, this process has {name} = {ours}; \
                 its programs cannot be used here (export a bundle where they will run)",
                path.display()
            )));
        }
    }
    let mut body = &rest[end + 2..];
    let mut entries = Vec::new();
    while !body.is_empty() {
        let len = body.get(..8).map(|w| word(w, 0) as usize).ok_or_else(|| bad("truncated"))?;
        let entry = body.get(8..8 + len).filter(|e| e.len() >= HEADER).ok_or_else(|| bad("truncated"))?;
        let key = (word(entry, 16), word(entry, 24));
        verify(entry, key, &[PROGRAM, DATA]).map_err(|why| bad(&why))?;
        if word(entry, 8) != id.fingerprint {
            return Err(bad("it holds an entry of another identity"));
        }
        entries.push((key, entry));
        body = &body[8 + len..];
    }
    let disk = cache_dir()?;
    for (key, entry) in &entries {
        disk.write(*key, entry).map_err(|e| {
            Error::runtime(format!("torchtpu: cannot write to the compilation cache in {}: {e}", disk.dir.display()))
        })?;
    }
    disk.evict();
    let programs = entries.iter().filter(|(_, e)| &e[..8] == PROGRAM).map(|(key, _)| *key);
    preload(programs.take(PRELOAD.min(max_programs())).collect());
    Ok(entries.len())
}

// ------------------------------------------------------------------ preloading

/// Programs an import loads into memory in the background, the bundle's most
/// recently used first: a script builds its model and data meanwhile, and its
/// first step finds its program loaded (deserializing one takes ~150 ms for a
/// small transformer's training step).
const PRELOAD: usize = 16;

/// Keys being preloaded; [`loaded`] waits for them rather than load twice.
static LOADING: Mutex<Vec<Key>> = Mutex::new(Vec::new());
static PRELOADED: Condvar = Condvar::new();
static PRELOADER: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);
static STOP_PRELOADING: AtomicBool = AtomicBool::new(false);

fn preload(keys: Vec<Key>) {
    let (Some(disk), Ok(rt)) = (disk(), runtime::get()) else { return };
    settle();
    STOP_PRELOADING.store(false, Ordering::Relaxed);
    let keys: Vec<Key> = {
        let programs = PROGRAMS.lock().unwrap();
        keys.into_iter().filter(|k| !programs.as_ref().is_some_and(|p| p.contains_key(k))).collect()
    };
    if keys.is_empty() {
        return;
    }
    *LOADING.lock().unwrap() = keys.clone();
    let thread = std::thread::spawn(move || {
        for key in keys {
            if !STOP_PRELOADING.load(Ordering::Relaxed) {
                if let Some(exe) = disk.load(key, rt) {
                    keep(key, exe);
                }
            }
            LOADING.lock().unwrap().retain(|k| *k != key);
            PRELOADED.notify_all();
        }
    });
    *PRELOADER.lock().unwrap() = Some(thread);
}

/// Stops an import's preload after the program it is loading (before the
/// process exits: XLA's statics must not go while a thread is in XLA).
pub fn settle() {
    STOP_PRELOADING.store(true, Ordering::Relaxed);
    if let Some(thread) = PRELOADER.lock().unwrap().take() {
        let _ = thread.join();
    }
}

/// The payload of an entry of one of `kinds`, if its header and checksum hold.
fn verify<'a>(bytes: &'a [u8], key: Key, kinds: &[&[u8; 8]]) -> std::result::Result<&'a [u8], String> {
    if bytes.len() < HEADER || !kinds.iter().any(|&k| &bytes[..8] == k) {
        return Err("not a torchtpu cache entry".into());
    }
    if (word(bytes, 16), word(bytes, 24)) != key {
        return Err("written for another program".into());
    }
    let payload = &bytes[HEADER..];
    if word(bytes, 32) != payload.len() as u64 {
        return Err(format!("truncated: {} of {} bytes", payload.len(), word(bytes, 32)));
    }
    if word(bytes, 40) != fnv(FNV_START, payload) {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::dtype::DType;
    use crate::ir::{Op, Precision, Ty};

    #[test]
    fn failed_compilation_names_its_dump() {
        let Ok(plugin) = std::env::var("TORCHTPU_PJRT_PLUGIN") else {
            return eprintln!("no plugin: skipped");
        };
        runtime::configure(plugin.into(), vec![("cpu_device_count".into(), pjrt::NamedValue::Int64(1))]);
        // Contracting 3 against 4 passes our IR builder but not XLA's verifier.
        let mut g = Graph::default();
        let a = g.param(Ty::new(DType::F32, &[2, 3]));
        let b = g.param(Ty::new(DType::F32, &[4, 5]));
        let op = Op::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            precision: Precision::Highest,
        };
        g.outputs = vec![g.push(op, vec![a, b], Ty::new(DType::F32, &[2, 5]))];
        let err = compile(&g, "aten::mm").err().expect("XLA rejects the program");
        let path = err.message.rsplit("StableHLO written to ").next().unwrap().trim();
        assert!(err.message.contains("XLA failed to compile aten::mm"), "{}", err.message);
        assert!(std::fs::read_to_string(path).unwrap().contains("stablehlo.dot_general"));
    }

    #[test]
    fn damaged_entries_never_verify() {
        let key = (1, 2);
        let payload = b"executable bytes";
        let entry = entry(PROGRAM, 7, key, payload);
        let verify = |bytes: &[u8], key| verify(bytes, key, &[PROGRAM]).map(<[u8]>::to_vec);
        assert_eq!(verify(&entry, key), Ok(payload.to_vec()));
        assert!(verify(&entry, (1, 3)).unwrap_err().contains("another program"));
        assert!(verify(&entry[..entry.len() - 1], key).unwrap_err().contains("truncated"));
        let mut flipped = entry.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(verify(&flipped, key).unwrap_err().contains("checksum"));
        assert!(verify(b"garbage", key).is_err());
        assert!(verify(&super::entry(DATA, 7, key, payload), key).is_err());
    }
}
