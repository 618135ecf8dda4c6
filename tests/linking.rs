//! Binaries find libtorch through their rpath (no LD_LIBRARY_PATH) and keep libtorch_cuda linked
//! when the install has it, so CUDA is usable on a GPU machine.
use std::path::Path;

const LIBTORCH_LIB: &str = env!("GMT_LIBTORCH_LIB");

#[test]
fn libtorch_is_found_through_the_rpath() {
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
    let cuda = Path::new(LIBTORCH_LIB).join("libtorch_cuda.so");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    if cuda.exists() {
        assert!(maps.contains("libtorch_cuda.so"), "libtorch_cuda.so was dropped by --as-needed");
    } else {
        println!("skipped: this libtorch has no libtorch_cuda.so (CPU-only build)");
        assert!(!maps.contains("libtorch_cuda.so"));
    }
}
