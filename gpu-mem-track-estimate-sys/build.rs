//! Compiles the estimator's C++ (`csrc/`) exactly as gpu-mem-track-sys compiles the tracker's: the
//! same libtorch headers, C++ standard and ABI, which that crate's build script exports
//! (`DEP_GPU_MEM_TRACK_SHIM_*`) with the folder of its own headers, which this C++ includes.
use std::env;
use std::path::PathBuf;

/// What gpu-mem-track-sys's build script exported under `key`.
fn from_shim(key: &str) -> String {
    let var = format!("DEP_GPU_MEM_TRACK_SHIM_{key}");
    env::var(&var).unwrap_or_else(|_| {
        panic!("gpu-mem-track-sys did not export {var}: are the two crates the same version?")
    })
}

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    let shim_include = PathBuf::from(from_shim("SHIM_INCLUDE"));
    // The tracker's headers are part of this build's input.
    println!("cargo:rerun-if-changed={}", shim_include.display());
    let include = PathBuf::from(from_shim("LIBTORCH_INCLUDE"));
    let abi = from_shim("CXX11_ABI");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std(&from_shim("CXX_STD"))
        .opt_level(2)
        .include(&shim_include)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-c++20-extensions")
        .flag_if_supported("-Wno-unused-parameter")
        .files([
            "csrc/torchscript.cpp",
            "csrc/native_steps.cpp",
            "csrc/meta_allocator.cpp",
            "csrc/meta_kernels.cpp",
            "csrc/meta_kernel_check.cpp",
            "csrc/cudnn_rnn.cpp",
            "csrc/cpu_means_meta.cpp",
        ])
        .compile("gpu_mem_track_estimate_shim");
    // For this crate's own tests (link arguments reach no dependent).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", from_shim("LIBTORCH_LIB"));
}
