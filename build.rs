//! Link settings for this package's binaries, examples, tests and benches: an rpath to libtorch so
//! they run without LD_LIBRARY_PATH, and libtorch_cuda kept as a dependency even though no symbol of
//! it is referenced (otherwise `--as-needed` drops it and CUDA is silently unavailable).
use std::env;
use std::path::PathBuf;

fn main() {
    let Ok(lib) = env::var("DEP_GPU_MEM_TRACK_SHIM_LIBTORCH_LIB") else {
        return;
    };
    let lib = PathBuf::from(lib);
    // Tests check the linking against this folder.
    println!("cargo:rustc-env=GMT_LIBTORCH_LIB={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-L{}", lib.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
