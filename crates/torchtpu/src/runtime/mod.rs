//! The runtime: the process's PJRT plugin and client, created on first use
//! (this file); storages and their values ([`storage`]), the bytes they hold
//! ([`memory`]), the device's queue of issued work and its events ([`event`]),
//! and the compilation cache every mode shares ([`cache`]). It uses the IR
//! (the types of values, the graphs it compiles) and never the op table or a
//! mode: what must first issue fused mode's work (memory statistics, events)
//! is flushed by its caller.
//!
//! The plugin is chosen at start-up, never at build time: the Python front
//! passes `TORCHTPU_PJRT_PLUGIN` or the auto-detected plugin. A plugin that
//! cannot be loaded leaves the process usable: the device count reads 0 and
//! every tpu operation raises the loading error.
//!
//! On GPUs, a process of a torch.distributed group makes its client for the
//! group (`join`, before the first tpu tensor): one client spanning every
//! process, each holding its local rank's GPU, so that XLA's collectives
//! reach all of them. The processes meet through the group's store.
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};

pub mod cache;
pub mod event;
pub mod memory;
pub mod storage;

pub struct Runtime {
    pub client: pjrt::Client,
    pub plugin: PathBuf,
    /// The client's devices by tpu index, listed once (every op launch needs
    /// one). `tpu:i` is the device with local hardware id i, as `cuda:i` is
    /// GPU i: a process of a group holds only its local rank's GPU, still
    /// `tpu:<local rank>`, and the indices below it are other processes'.
    devices: OnceLock<Vec<Option<pjrt::Device<'static>>>>,
}

/// This process's place in a client spanning a group's processes.
pub struct Group {
    pub node_id: i64,
    pub num_nodes: i64,
    /// The local device this process holds: its local rank.
    pub local_device: i64,
    pub store: Arc<dyn pjrt::KeyValueStore>,
    /// Whether the plugin is told of the group (GPUs); libtpu finds a TPU
    /// slice's hosts itself, and XLA:CPU runs in one process.
    pub tell_plugin: bool,
}

struct Config {
    plugin: Option<PathBuf>,
    /// The plugin's client options (`cpu_device_count`, a GPU's allocator ...).
    options: Vec<(String, pjrt::NamedValue)>,
    group: Option<Group>,
}

static CONFIG: Mutex<Config> = Mutex::new(Config { plugin: None, options: Vec::new(), group: None });
static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// Sets the plugin and its client's options (the Python front chooses
/// them: how many devices the CPU plugin exposes, how a GPU's memory is
/// allocated); takes effect if the runtime has not started yet.
pub fn configure(plugin: PathBuf, options: Vec<(String, pjrt::NamedValue)>) -> bool {
    *CONFIG.lock().unwrap() = Config { plugin: Some(plugin), options, group: None };
    RUNTIME.get().is_none()
}

/// Starts the runtime as one process of `group` (where the plugin is told of
/// it; elsewhere a started runtime serves), then meets the group's other
/// processes through its store: they must run the same platform. Returns the
/// global id of each process's device, by node.
pub fn join(group: Group, timeout: Duration) -> Result<Vec<i64>> {
    let (node, nodes, local, store) = (group.node_id, group.num_nodes, group.local_device, group.store.clone());
    let tell_plugin = group.tell_plugin;
    if tell_plugin && RUNTIME.get().is_none() {
        CONFIG.lock().unwrap().group = Some(group);
    }
    let rt = get()?;
    // A group made again (after destroy_process_group) finds the client made for its first.
    let made_for_it = CONFIG.lock().unwrap().group.as_ref().is_some_and(|g| g.node_id == node && g.num_nodes == nodes);
    if tell_plugin && !made_for_it {
        return Err(Error::runtime(format!(
            "torchtpu: on {}, torch.distributed.init_process_group() must come before the first use of the tpu \
             device: each process's PJRT client is made once, for the whole group (process {node} of {nodes})",
            rt.client.platform_name()
        )));
    }
    // -1: no such device here (XLA:CPU outside torchrun), which only programs would name.
    let id = usize::try_from(local).ok().and_then(|i| rt.device(i).ok()).map_or(-1, |d| d.id());
    let platform = format!("{} {}", rt.client.platform_name(), rt.client.platform_version());
    let key = |n: i64| format!("torchtpu/runtime/{n}").into_bytes();
    let failed = |n: i64| {
        move |e: pjrt::Error| Error::runtime(format!("torchtpu: meeting process {n} of the group's {nodes}: {e}"))
    };
    store.put(&key(node), format!("{id} {platform}").as_bytes()).map_err(failed(node))?;
    let mut ids = Vec::with_capacity(nodes as usize);
    for n in 0..nodes {
        let said = String::from_utf8_lossy(&store.get(&key(n), timeout).map_err(failed(n))?).into_owned();
        let (their_id, theirs) = said.split_once(' ').unwrap_or(("", ""));
        if theirs != platform {
            return Err(Error::runtime(format!(
                "torchtpu: the group's processes run different PJRT platforms: process {node} runs {platform}, \
                 process {n} runs {theirs} (is TORCHTPU_PJRT_PLUGIN, or the plugins installed, the same on \
                 every host?)"
            )));
        }
        ids.push(their_id.parse().map_err(|_| Error::runtime(format!("torchtpu: process {n} said {said:?}")))?);
    }
    Ok(ids)
}

fn start() -> std::result::Result<Runtime, String> {
    let config = CONFIG.lock().unwrap();
    let plugin = config.plugin.clone().ok_or_else(|| {
        "torchtpu: no PJRT plugin configured; import torchtpu (it finds the CPU plugin of lammps-jax-pjrt-cpu) \
         or set TORCHTPU_PJRT_PLUGIN=/path/to/plugin.so"
            .to_string()
    })?;
    let hint = "Install the pinned plugin (pip install lammps-jax-pjrt-cpu==0.11.2) or point \
                TORCHTPU_PJRT_PLUGIN at a PJRT plugin .so";
    let api = pjrt::load_plugin(&plugin).map_err(|e| format!("torchtpu: {e}. {hint}"))?;
    let mut options: Vec<(&str, pjrt::NamedValue)> =
        config.options.iter().map(|(name, value)| (name.as_str(), value.clone())).collect();
    let client = match &config.group {
        None => pjrt::Client::new(api, &options),
        Some(group) => {
            // XLA:CPU's client (sized by cpu_device_count) runs each process
            // alone and refuses the group's options.
            if !options.iter().any(|(name, _)| *name == "cpu_device_count") {
                options.extend([
                    ("node_id", pjrt::NamedValue::Int64(group.node_id)),
                    ("num_nodes", pjrt::NamedValue::Int64(group.num_nodes)),
                    ("visible_devices", pjrt::NamedValue::Int64List(vec![group.local_device])),
                ]);
            }
            pjrt::Client::with_store(api, &options, group.store.clone())
        }
    }
    .map_err(|e| format!("torchtpu: creating a PJRT client of {}: {e}", plugin.display()))?;
    Ok(Runtime { client, plugin, devices: OnceLock::new() })
}

/// Whether the runtime has started (and its plugin loaded).
pub fn started() -> bool {
    RUNTIME.get().is_some_and(|r| r.is_ok())
}

pub fn get() -> Result<&'static Runtime> {
    RUNTIME.get_or_init(start).as_ref().map_err(|e| Error::runtime(e.clone()))
}

impl Runtime {
    fn devices(&'static self) -> &'static [Option<pjrt::Device<'static>>] {
        self.devices.get_or_init(|| {
            let devices = self.client.addressable_devices();
            let mut ids: Vec<usize> =
                devices.iter().filter_map(|d| usize::try_from(d.local_hardware_id()).ok()).collect();
            ids.sort_unstable();
            ids.dedup();
            if ids.len() != devices.len() {
                // No (distinct) hardware ids: the client's order.
                return devices.into_iter().map(Some).collect();
            }
            let mut slots = vec![None; ids.last().map_or(0, |&last| last + 1)];
            for d in devices {
                slots[d.local_hardware_id() as usize] = Some(d);
            }
            slots
        })
    }

    pub fn device(&'static self, index: usize) -> Result<pjrt::Device<'static>> {
        match self.devices().get(index) {
            Some(Some(device)) => Ok(*device),
            Some(None) => {
                let mine: Vec<String> = (0..self.device_count())
                    .filter(|&i| self.devices()[i].is_some())
                    .map(|i| format!("tpu:{i}"))
                    .collect();
                Err(Error::runtime(format!(
                    "torchtpu: tpu:{index} is another process's device (each process of the group holds its local \
                     rank's); this one holds {}",
                    mine.join(", ")
                )))
            }
            None => Err(Error::runtime(format!(
                "Invalid device index {index}: torchtpu has {} device(s)",
                self.device_count()
            ))),
        }
    }

    pub fn device_count(&'static self) -> usize {
        self.devices().len()
    }
}
