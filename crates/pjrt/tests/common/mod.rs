//! Finding the plugin the tests run against (shared by unit and integration tests).

use std::path::PathBuf;

/// `$TORCHTPU_PJRT_PLUGIN`, else the CPU plugin in the workspace's `.venv`.
pub fn plugin_path() -> PathBuf {
    if let Some(path) = std::env::var_os("TORCHTPU_PJRT_PLUGIN") {
        return path.into();
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3."))
        .map(|entry| entry.path().join("site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"))
        .find(|path| path.exists())
        .unwrap_or_else(|| {
            panic!(
                "no lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so under {}/python3.*/site-packages: \
                 install the lammps-jax-pjrt-cpu wheel into the workspace .venv or set TORCHTPU_PJRT_PLUGIN",
                lib.display()
            )
        })
}
