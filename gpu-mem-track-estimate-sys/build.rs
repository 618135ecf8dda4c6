//! Compiles the estimator's C++ (`csrc/`) exactly as gpu-mem-track-sys compiles the tracker's:
//! that crate's build script exports its include folders (its own headers first, which this C++
//! includes, then libtorch's), C++ standard and flags (`DEP_GPU_MEM_TRACK_SHIM_*`).
use std::env;

/// What gpu-mem-track-sys's build script exported under `key`.
fn from_shim(key: &str) -> String {
    let var = format!("DEP_GPU_MEM_TRACK_SHIM_{key}");
    env::var(&var).unwrap_or_else(|_| {
        panic!("gpu-mem-track-sys did not export {var}: are the two crates the same version?")
    })
}

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    let mut build = cc::Build::new();
    // Fixed flags in every profile, as the shim's: one compile command for all of them.
    build.cpp(true).pic(true).std(&from_shim("CXX_STD")).opt_level(2).debug(false);
    for (i, dir) in env::split_paths(&from_shim("CXX_INCLUDES")).enumerate() {
        // The tracker's headers (the first folder) are part of this build's input. libtorch's
        // folders hold thousands of headers, not scanned on every build: they change only with
        // another libtorch, which changes what gpu-mem-track-sys's build exports.
        if i == 0 {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        build.include(dir);
    }
    for flag in from_shim("CXX_FLAGS").split_whitespace() {
        build.flag(flag);
    }
    build
        .files([
            "csrc/torchscript.cpp",
            "csrc/exported_program.cpp",
            "csrc/tch_steps.cpp",
            "csrc/meta_allocator.cpp",
            "csrc/meta_kernels.cpp",
            "csrc/attention.cpp",
            "csrc/meta_kernel_check.cpp",
            "csrc/cudnn_rnn.cpp",
            "csrc/cpu_means_meta.cpp",
        ])
        .compile("gpu_mem_track_estimate_shim");
}
