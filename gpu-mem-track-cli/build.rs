//! With feature `estimate` (the binary that links libtorch): the rpath to libtorch for this
//! package's binaries and tests (link arguments reach only the package that prints them), and the
//! test cfgs the tracker's build script found (Python with torch, torchvision, a GPU). Both come
//! from `gpu-mem-track`'s build script through its `links` metadata; the lean build gets neither.
use std::env;

fn main() {
    for name in ["gmt_gpu", "gmt_python_torch", "gmt_torchvision", "gmt_memory_viz"] {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    for var in ["DEP_GPU_MEM_TRACK_TEST_CFGS", "DEP_GPU_MEM_TRACK_LIBTORCH_LIB"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for name in
        env::var("DEP_GPU_MEM_TRACK_TEST_CFGS").unwrap_or_default().split(',').filter(|s| !s.is_empty())
    {
        println!("cargo:rustc-cfg={name}");
    }
    if let Ok(lib) = env::var("DEP_GPU_MEM_TRACK_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
