//! This package's binaries find libtorch through their rpath (no LD_LIBRARY_PATH, see build.rs)
//! and keep libtorch_cuda linked when the install has it, so CUDA is usable on a GPU machine.
//! tests/fixtures/dependent/tests/dependent.rs checks the same for a crate that depends on gpu-mem-track.
use std::path::Path;

const LIBTORCH_LIB: &str = env!("GMT_LIBTORCH_LIB");

/// Uses the library as every tracking program does. Libraries are linked only when referenced, and
/// libtorch_cuda is referenced by the shim code this reaches (gpu-mem-track-sys's
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

/// `capabilities()` reports the libtorch this binary really runs on, the tch of this build (the
/// torch-sys version the workspace's lockfile picked), and whether CUDA is in, each checked here
/// against a second source.
#[test]
fn capabilities_name_the_libtorch_tch_and_cuda_of_this_build() {
    let caps = gpu_mem_track::capabilities();
    let loaded = caps.libtorch_loaded_from.as_deref().expect("the loader names libtorch_cpu");
    assert!(
        Path::new(loaded).canonicalize().unwrap()
            == Path::new(LIBTORCH_LIB).join("libtorch_cpu.so").canonicalize().unwrap(),
        "{loaded} is not in {LIBTORCH_LIB}"
    );
    // The Python package beside the library states its version in version.py.
    let version_py = Path::new(LIBTORCH_LIB).join("../version.py");
    if let Ok(text) = std::fs::read_to_string(&version_py) {
        let line = text.lines().find(|l| l.starts_with("__version__")).expect("__version__ in version.py");
        let python_version = line.split('\'').nth(1).expect("quoted version").split('+').next().unwrap();
        assert_eq!(caps.libtorch_version, python_version, "{line}");
    }
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).unwrap();
    let torch_sys = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"torch-sys\""))
        .expect("torch-sys in Cargo.lock");
    assert!(
        torch_sys.contains(&format!("version = \"{}\"", caps.tch_version.expect("found the lockfile"))),
        "{torch_sys}"
    );
    assert_eq!(caps.cuda_compiled, Path::new(LIBTORCH_LIB).join("libtorch_cuda.so").exists());
    assert_eq!(caps.cuda_memory_info, !caps.libtorch_version.starts_with("2.9."));
    // What is left out says why; the text names each part.
    if !caps.cuda_history_compiled && caps.cuda_compiled {
        assert!(caps.cuda_history_missing.is_some_and(|why| why.contains("CUDA")), "{caps:?}");
    }
    let text = caps.to_string();
    for part in ["libtorch", "tch", "CUDA history", "NVML"] {
        assert!(text.contains(part), "{text}");
    }
}
