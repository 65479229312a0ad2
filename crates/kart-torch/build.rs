//! Compiles the C++ shim (`shim/`) against the libtorch torch-sys links, the way torch-sys compiles
//! its own wrapper: c10d's Gloo always, NCCL and the CUDA device queries when the torch is a CUDA
//! build and the CUDA and NCCL headers are at hand (the `nvidia-*` wheels beside a PyPI torch,
//! `$CUDA_HOME`, or `/usr/local/cuda`).

use std::env;
use std::path::{Path, PathBuf};

/// Headers the CUDA part of the shim includes, each to be found in one of the include folders.
const CUDA_HEADERS: [&str; 4] = ["cuda_runtime_api.h", "crt/host_config.h", "nv/target", "nccl.h"];

fn main() {
    let lib =
        PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys names its libtorch lib folder"));
    let torch = lib.parent().expect("libtorch's lib folder has a parent");
    let include = torch.join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++20")
        // The shim forwards to libtorch, where the work is: -O1 halves its compile time against
        // -O3 (c10d.cpp: 28 s against 53 s) and changes nothing kart waits on.
        .opt_level(1)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(gloo_headers())
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .define("USE_C10D_GLOO", None)
        .file("shim/runtime.cpp")
        .file("shim/autograd.cpp")
        .file("shim/c10d.cpp")
        .file("shim/memory.cpp")
        .file("shim/nccl.cpp")
        .file("shim/onednn.cpp");
    let cuda = lib.join("libtorch_cuda.so").exists().then(|| cuda_headers(torch)).flatten();
    if let Some(dirs) = &cuda {
        build.define("KART_CUDA", None).define("USE_C10D_NCCL", None).includes(dirs);
    } else {
        println!(
            "cargo:warning=kart-torch: no CUDA build of torch with CUDA and NCCL headers; NCCL is left out"
        );
    }
    build.compile("kart_torch");
    println!("cargo:rustc-link-search=native={}", lib.display());
    if cuda.is_some() {
        // libc10_cuda holds the CUDA caching allocator whose statistics the shim reads.
        for l in ["torch_cuda", "c10_cuda"] {
            println!("cargo:rustc-link-lib={l}");
        }
    }
    for l in ["torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib={l}");
    }
    for f in [
        "shim/kart_torch.h",
        "shim/error.hpp",
        "shim/runtime.cpp",
        "shim/autograd.cpp",
        "shim/c10d.cpp",
        "shim/memory.cpp",
        "shim/nccl.cpp",
        "shim/onednn.cpp",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=KART_GLOO_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
}

/// The folder holding `gloo/` headers: torch's wheel leaves them out, though c10d's Gloo header
/// includes them (Debian's `libgloo-dev` has them; no gloo code is called from them).
fn gloo_headers() -> PathBuf {
    let dir = env::var_os("KART_GLOO_INCLUDE").map_or_else(|| PathBuf::from("/usr/include"), PathBuf::from);
    if !dir.join("gloo/rendezvous/store.h").exists() {
        panic!(
            "kart-torch: no gloo headers in {} (install Debian's libgloo-dev, as scripts/setup.sh does, or set KART_GLOO_INCLUDE)",
            dir.display()
        );
    }
    dir
}

/// Include folders holding every header of `CUDA_HEADERS`, or `None` when one is missing.
fn cuda_headers(torch: &Path) -> Option<Vec<PathBuf>> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(Ok(wheels)) = torch.parent().map(|site| std::fs::read_dir(site.join("nvidia"))) {
        let mut dirs: Vec<PathBuf> = wheels.flatten().map(|e| e.path().join("include")).collect();
        dirs.sort();
        candidates.extend(dirs);
    }
    if let Some(home) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    let mut chosen: Vec<PathBuf> = Vec::new();
    for header in CUDA_HEADERS {
        let dir = candidates.iter().find(|d| d.join(header).exists())?;
        if !chosen.contains(dir) {
            chosen.push(dir.clone());
        }
    }
    Some(chosen)
}
