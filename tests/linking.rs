//! This package's binaries find libtorch through their rpath (no LD_LIBRARY_PATH, see build.rs)
//! and keep libtorch_cuda linked when the install has it, so CUDA is usable on a GPU machine.
//! tests/dependent.rs checks the same for a crate that depends on gpu-mem-track.
use std::path::Path;

const LIBTORCH_LIB: &str = env!("GMT_LIBTORCH_LIB");

/// Uses the library as every tracking program does. Libraries are linked only when referenced, and
/// libtorch_cuda is referenced by the shim code this reaches (tracker-sys's
/// `gmt_torch_cuda_linked`); a binary that never uses the library links no libtorch at all.
fn use_the_library() {
    gpu_mem_track::install().expect("install the registry and the CPU allocator");
}

#[test]
fn libtorch_is_found_through_the_rpath() {
    use_the_library();
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    assert!(
        !ld.split(':').any(|p| Path::new(p) == Path::new(LIBTORCH_LIB)),
        "LD_LIBRARY_PATH must not be needed"
    );
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let torch_cpu = Path::new(LIBTORCH_LIB).join("libtorch_cpu.so");
    let canonical = torch_cpu.canonicalize().unwrap();
    assert!(maps.contains(&*canonical.to_string_lossy()), "libtorch_cpu.so is loaded from {LIBTORCH_LIB}");
}

#[test]
fn libtorch_cuda_is_linked_when_the_install_has_it() {
    use_the_library();
    let cuda = Path::new(LIBTORCH_LIB).join("libtorch_cuda.so");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    if cuda.exists() {
        assert!(
            maps.contains("libtorch_cuda.so"),
            "libtorch_cuda.so was dropped by --as-needed: nothing references it"
        );
    } else {
        println!("skipped: this libtorch has no libtorch_cuda.so (CPU-only build)");
        assert!(!maps.contains("libtorch_cuda.so"));
    }
}
