//! Compiles the C++ shim against the libtorch that torch-sys found, and passes the library folder
//! on (`DEP_GPU_MEM_TRACK_SHIM_LIBTORCH_LIB`) so the main crate can set rpath and link
//! libtorch_cuda (link arguments only apply to a package's own targets).
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn cxx11_abi() -> String {
    if let Ok(v) = env::var("LIBTORCH_CXX11_ABI") {
        return v;
    }
    if env::var_os("LIBTORCH").is_none() && env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        // Same interpreter choice as torch-sys.
        let python = if env::var_os("VIRTUAL_ENV").is_some() { "python" } else { "python3" };
        if let Ok(out) = Command::new(python)
            .args(["-c", "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"])
            .output()
        {
            let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if out.status.success() && (s == "0" || s == "1") {
                return s;
            }
        }
    }
    "1".to_owned()
}

fn main() {
    for var in ["LIBTORCH", "LIBTORCH_USE_PYTORCH", "LIBTORCH_CXX11_ABI", "VIRTUAL_ENV"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=csrc");
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB"),
    );
    let include = lib.join("..").join("include");
    let abi = cxx11_abi();

    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        .opt_level(2)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-c++20-extensions")
        .flag_if_supported("-Wno-unused-parameter")
        .files([
            "csrc/registry.cpp",
            "csrc/allocator.cpp",
            "csrc/cuda.cpp",
            "csrc/recorder.cpp",
            "csrc/meta_kernels.cpp",
            "csrc/script.cpp",
            "csrc/saved.cpp",
        ])
        .compile("gpu_mem_track_shim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:libtorch_lib={}", lib.display());
    // For this crate's own tests.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
