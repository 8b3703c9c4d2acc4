//! Compiles the C++ adapter (csrc/) against the installed PyTorch and links it
//! whole into the extension, so its static registrations run at import.
use std::path::PathBuf;
use std::process::Command;

fn torch_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("TORCH_DIR") {
        return PathBuf::from(dir);
    }
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    // Without autoloading torchtpu itself: the installed build may be the broken one.
    let out = Command::new(&python)
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__))"])
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .output()
        .unwrap_or_else(|e| panic!("running {python} to locate torch: {e}"));
    assert!(out.status.success(), "torch is not importable by {python}; set TORCH_DIR");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Python's C headers (the kernel fast path takes Python arguments).
fn python_include() -> PathBuf {
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
        .output()
        .unwrap_or_else(|e| panic!("running {python} to locate Python's headers: {e}"));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn main() {
    let torch = torch_dir();
    let include = torch.join("include");
    let lib = torch.join("lib");
    let sources = [
        "csrc/allocator.cpp",
        "csrc/autocast.cpp",
        "csrc/collective.cpp",
        "csrc/ddp_timer.cpp",
        "csrc/device.cpp",
        "csrc/dispatch.cpp",
        "csrc/generator.cpp",
        "csrc/graph.cpp",
        "csrc/guard.cpp",
        "csrc/hooks.cpp",
        "csrc/host_allocator.cpp",
        "csrc/kernel.cpp",
        "csrc/precision.cpp",
        "csrc/store.cpp",
    ];
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .files(sources)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(python_include())
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .opt_level(2)
        .flag("-Wno-unused-parameter")
        .warnings(false)
        .link_lib_modifier("+whole-archive")
        .compile("torchtpu_adapter");
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in ["c10", "torch_cpu", "torch", "torch_python"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    for f in sources.iter().chain(&["csrc/adapter.h", "csrc/ffi.h"]) {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=TORCH_DIR");
}
