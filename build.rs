//! Rpath to libtorch for this package's binaries, examples, tests and benches, so they run without
//! LD_LIBRARY_PATH. Link arguments never reach other packages, so the libtorch folder is also
//! exported (`links = "gpu_mem_track"`): a dependent's build script reads it as
//! `DEP_GPU_MEM_TRACK_LIBTORCH_LIB` and sets its own rpath. libtorch_cuda needs nothing here: the
//! shim references it (gpu-mem-track-sys), which keeps it linked in every binary that uses the library.
//! The test cfgs found here are exported the same way, for the estimator's tests.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What this machine offers the tests, as cfgs: tests that need a GPU, Python with torch or a
/// browser are `#[cfg_attr(not(..), ignore = "why")]`, so a run without them reports them as
/// ignored (with the reason) instead of passing, and a run with them runs them.
fn probe_test_environment() {
    for name in CFGS {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    for var in ["VIRTUAL_ENV", "PATH", "GMT_MEMORY_VIZ_JS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // An NVIDIA driver with a device: its control node and the per-GPU entries in /proc.
    let gpu = Path::new("/dev/nvidiactl").exists()
        && std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut d| d.next().is_some());
    let python = python_with(&["torch"]);
    let torchvision = python && python_with(&["torch", "torchvision"]);
    let memory_viz = env::var_os("GMT_MEMORY_VIZ_JS").is_some_and(|p| Path::new(&p).is_file())
        && Path::new("/usr/share/nodejs/d3").exists()
        && env::var_os("PATH").is_some_and(|p| env::split_paths(&p).any(|d| d.join("chromium").is_file()));
    let found: Vec<&str> = [
        ("gmt_gpu", gpu),
        ("gmt_python_torch", python),
        ("gmt_torchvision", torchvision),
        ("gmt_memory_viz", memory_viz),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    for name in &found {
        println!("cargo:rustc-cfg={name}");
    }
    // For the estimator's build script (DEP_GPU_MEM_TRACK_TEST_CFGS): its tests need the same.
    println!("cargo:test_cfgs={}", found.join(","));
}

const CFGS: [&str; 4] = ["gmt_gpu", "gmt_python_torch", "gmt_torchvision", "gmt_memory_viz"];

/// Whether the Python the tests use (the virtualenv's, the project's `.venv`, or `python3`) can
/// import these modules.
fn python_with(modules: &[&str]) -> bool {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(venv) = env::var_os("VIRTUAL_ENV") {
        candidates.push(Path::new(&venv).join("bin/python"));
    }
    if let Some(dir) = env::var_os("CARGO_MANIFEST_DIR") {
        candidates.push(Path::new(&dir).join(".venv/bin/python"));
    }
    candidates.push("python3".into());
    let code = format!("import {}", modules.join(", "));
    candidates.iter().any(|p| Command::new(p).args(["-c", &code]).output().is_ok_and(|o| o.status.success()))
}

fn main() {
    probe_test_environment();
    // The libtorch folder follows these (through torch-sys and gpu-mem-track-sys); rerunning on them
    // keeps a moved checkout or a new venv from keeping an rpath into the old one.
    for var in ["LIBTORCH", "LIBTORCH_USE_PYTORCH", "VIRTUAL_ENV", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let Ok(lib) = env::var("DEP_GPU_MEM_TRACK_SHIM_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:libtorch_lib={lib}");
    // Tests check the linking against this folder.
    println!("cargo:rustc-env=GMT_LIBTORCH_LIB={lib}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
}
