//! The process's PJRT plugin and client, created on first use.
//!
//! The plugin is chosen at start-up, never at build time: the Python front
//! passes `TORCHTPU_PJRT_PLUGIN` or the auto-detected plugin. A plugin that
//! cannot be loaded leaves the process usable: the device count reads 0 and
//! every tpu operation raises the loading error.
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

pub struct Runtime {
    pub client: pjrt::Client,
    pub plugin: PathBuf,
    /// The client's devices, listed once (every op launch needs one).
    devices: OnceLock<Vec<pjrt::Device<'static>>>,
}

struct Config {
    plugin: Option<PathBuf>,
    cpu_device_count: Option<i64>,
}

static CONFIG: Mutex<Config> = Mutex::new(Config { plugin: None, cpu_device_count: None });
static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// Sets the plugin (and, for the CPU plugin, how many devices it exposes);
/// takes effect if the runtime has not started yet.
pub fn configure(plugin: PathBuf, cpu_device_count: Option<i64>) -> bool {
    *CONFIG.lock().unwrap() = Config { plugin: Some(plugin), cpu_device_count };
    RUNTIME.get().is_none()
}

fn start() -> std::result::Result<Runtime, String> {
    let config = CONFIG.lock().unwrap();
    let plugin = config.plugin.clone().ok_or_else(|| {
        "torchtpu: no PJRT plugin configured; import torchtpu (it finds the xla-cpu-pjrt plugin) \
         or set TORCHTPU_PJRT_PLUGIN=/path/to/plugin.so"
            .to_string()
    })?;
    let hint = "Install the pinned plugin (pip install xla-cpu-pjrt==0.0.1) or point \
                TORCHTPU_PJRT_PLUGIN at a PJRT plugin .so";
    let api = pjrt::load_plugin(&plugin).map_err(|e| format!("torchtpu: {e}. {hint}"))?;
    let options: Vec<(&str, pjrt::NamedValue)> =
        config.cpu_device_count.map(|n| ("cpu_device_count", pjrt::NamedValue::Int64(n))).into_iter().collect();
    let client = pjrt::Client::new(api, &options)
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
    fn devices(&'static self) -> &'static [pjrt::Device<'static>] {
        self.devices.get_or_init(|| self.client.addressable_devices())
    }

    pub fn device(&'static self, index: usize) -> Result<pjrt::Device<'static>> {
        let devices = self.devices();
        devices.get(index).copied().ok_or_else(|| {
            Error::runtime(format!("Invalid device index {index}: torchtpu has {} device(s)", devices.len()))
        })
    }

    pub fn device_count(&'static self) -> usize {
        self.devices().len()
    }
}
