//! Rpath to libtorch for this package's binaries, examples, tests and benches, so they run without
//! LD_LIBRARY_PATH. Link arguments never reach other packages, so the libtorch folder is also
//! exported (`links = "gpu_mem_track"`): a dependent's build script reads it as
//! `DEP_GPU_MEM_TRACK_LIBTORCH_LIB` and sets its own rpath. libtorch_cuda needs nothing here: the
//! shim references it (gpu-mem-track-sys), which keeps it linked in every binary that uses the library.
//! The test cfgs `scripts/dev` passes are exported the same way, for the other packages' tests.
use std::env;

/// What this machine offers the tests, as cfgs: tests that need a GPU, Python with torch or a
/// browser are `#[cfg_attr(not(..), ignore = "why")]`, so a run without them reports them as
/// ignored (with the reason) instead of passing, and a run with them runs them. `scripts/dev`
/// finds them (`gpu-mem-track-testkit`'s probe) and passes them in `GMT_TEST_CFGS`; this only reads
/// that list, so a user's build runs nothing. Exported for the build scripts of the workspace's
/// other test-bearing packages (`DEP_GPU_MEM_TRACK_TEST_CFGS`).
fn test_cfgs() {
    for name in CFGS {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    println!("cargo:rerun-if-env-changed=GMT_TEST_CFGS");
    let asked = env::var("GMT_TEST_CFGS").unwrap_or_default();
    let found: Vec<&str> = asked.split(',').map(str::trim).filter(|c| CFGS.contains(c)).collect();
    for name in &found {
        println!("cargo:rustc-cfg={name}");
    }
    println!("cargo:test_cfgs={}", found.join(","));
}

const CFGS: [&str; 4] = ["gmt_gpu", "gmt_python_torch", "gmt_torchvision", "gmt_memory_viz"];

fn main() {
    test_cfgs();
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
