//! Compiles the C++ adapter (csrc/) against the installed PyTorch and links it
//! whole into the extension, so its static registrations run at import.
use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

fn torch_dir() -> PathBuf {
    if let Ok(dir) = env::var("TORCH_DIR") {
        return PathBuf::from(dir);
    }
    let python = env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    // Without autoloading torchtpu itself: the installed build may be the broken one.
    let out = Command::new(&python)
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__))"])
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .output()
        .unwrap_or_else(|e| panic!("running {python} to locate torch: {e}"));
    assert!(out.status.success(), "torch is not importable by {python}; set TORCH_DIR");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// "major.minor" of the torch in `torch` (its version.py): the core words the
/// messages that changed between versions as this one does.
fn torch_version(torch: &Path) -> String {
    let file = fs::read_to_string(torch.join("version.py")).expect("torch's version.py");
    let line = file.lines().find(|l| l.starts_with("__version__")).expect("torch's __version__");
    let version = line.split(['\'', '"']).nth(1).expect("a quoted version");
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// Python's C headers (the kernel fast path takes Python arguments).
fn python_include() -> PathBuf {
    let python = env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
        .output()
        .unwrap_or_else(|e| panic!("running {python} to locate Python's headers: {e}"));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The adapter's objects, compiled once per content into a directory of the
/// target directory that every profile shares: compiling against PyTorch's
/// headers takes minutes, and `cargo test` (dev) and maturin (release) would
/// otherwise each do it; an edit recompiles only the file it touches. An
/// object is named by a hash of its source, the adapter's headers, this
/// script (its flags) and the PyTorch and Python headers it is compiled against.
fn cached_objects(build: &cc::Build, sources: &[&str], torch: &Path, python: &Path) -> Vec<PathBuf> {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let cache = out.ancestors().nth(4).unwrap().join("torchtpu-adapter");
    fs::create_dir_all(&cache).unwrap();
    let mut shared = DefaultHasher::new();
    let mut headers: Vec<PathBuf> = fs::read_dir("csrc").unwrap().map(|e| e.unwrap().path()).collect();
    headers.retain(|p| p.extension().is_some_and(|e| e == "h"));
    headers.sort();
    for file in headers.iter().chain([&PathBuf::from("build.rs"), &torch.join("version.py")]) {
        fs::read(file).unwrap().hash(&mut shared);
    }
    (torch, python, env::var("CXX").ok()).hash(&mut shared);
    let objects: Vec<PathBuf> = sources
        .iter()
        .map(|src| {
            let mut h = shared.clone();
            fs::read(src).unwrap().hash(&mut h);
            let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
            cache.join(format!("{stem}-{:016x}.o", h.finish()))
        })
        .collect();
    let missing: Vec<usize> = (0..sources.len()).filter(|&i| !objects[i].exists()).collect();
    if !missing.is_empty() {
        let compiled = build.clone().files(missing.iter().map(|&i| sources[i])).compile_intermediates();
        for (&i, obj) in missing.iter().zip(compiled) {
            // Through a rename: a build beside this one sees a whole object or none.
            let tmp = objects[i].with_extension(format!("o.{}", std::process::id()));
            fs::copy(&obj, &tmp).unwrap();
            fs::rename(&tmp, &objects[i]).unwrap();
        }
    }
    objects
}

fn main() {
    let torch = torch_dir();
    let include = torch.join("include");
    let lib = torch.join("lib");
    let python = python_include();
    let sources = [
        "csrc/allocator.cpp",
        "csrc/attention.cpp",
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
        "csrc/nested.cpp",
        "csrc/precision.cpp",
        "csrc/python_backend.cpp",
        "csrc/sparse.cpp",
        "csrc/store.cpp",
    ];
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(&python)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .opt_level(2)
        .flag("-Wno-unused-parameter")
        .warnings(false)
        .link_lib_modifier("+whole-archive");
    let objects = cached_objects(&build, &sources, &torch, &python);
    build.objects(objects).compile("torchtpu_adapter");
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in ["c10", "torch_cpu", "torch", "torch_python"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    for f in sources.iter().chain(&["csrc/adapter.h", "csrc/ffi.h"]) {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rustc-env=TORCHTPU_TORCH_VERSION={}", torch_version(&torch));
    println!("cargo:rerun-if-changed={}", torch.join("version.py").display());
    println!("cargo:rerun-if-env-changed=TORCH_DIR");
}
