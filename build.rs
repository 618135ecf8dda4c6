//! Rpath to libtorch for this package's binaries, examples, tests and benches, so they run without
//! LD_LIBRARY_PATH. Link arguments never reach other packages, so the libtorch folder is also
//! exported (`links = "gpu_mem_track"`): a dependent's build script reads it as
//! `DEP_GPU_MEM_TRACK_LIBTORCH_LIB` and sets its own rpath. libtorch_cuda needs nothing here: the
//! shim references it (tracker-sys), which keeps it linked in every binary that uses the library.
use std::env;

fn main() {
    // The libtorch folder follows these (through torch-sys and tracker-sys); rerunning on them
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
