//! Compiles the C++ shim against the libtorch that torch-sys found, makes libtorch_cuda a real
//! dependency of binaries that use the shim (see `csrc/torch_cuda_link.cpp`), and passes the
//! library folder on (`DEP_GPU_MEM_TRACK_SHIM_LIBTORCH_LIB`) so the main crate can set rpaths
//! (link arguments only apply to a package's own targets).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the Python interpreter torch-sys uses reports about its torch.
struct PythonTorch {
    /// `_GLIBCXX_USE_CXX11_ABI`, "0" or "1".
    abi: String,
    /// The lib folder, found as torch-sys finds it (the last of `library_paths()`).
    lib: PathBuf,
}

/// `None` outside torch-sys's Python mode (`LIBTORCH_USE_PYTORCH`) or when Python fails.
fn python_torch() -> Option<PythonTorch> {
    env::var_os("LIBTORCH_USE_PYTORCH")?;
    // Same interpreter choice as torch-sys.
    let python = if env::var_os("VIRTUAL_ENV").is_some() { "python" } else { "python3" };
    let script = "import torch; from torch.utils import cpp_extension; \
                  print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(cpp_extension.library_paths()[-1])";
    let out = Command::new(python).args(["-c", script]).output().ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines().map(str::trim);
    let abi = lines.next().filter(|s| *s == "0" || *s == "1")?.to_owned();
    let lib = PathBuf::from(lines.next()?);
    out.status.success().then_some(PythonTorch { abi, lib })
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Include folders for the CUDA runtime headers that `c10/cuda` needs (`cuda_runtime_api.h` and
/// the `crt/host_config.h` it includes), or `None`. Looks in `CUDA_HOME`/`CUDA_PATH`, the NVIDIA
/// wheels beside the torch wheel, and `/usr/local/cuda`.
fn cuda_include_dirs(libtorch_lib: &Path) -> Option<Vec<PathBuf>> {
    // The wheels beside torch first: their headers match the CUDA libtorch was built with.
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(site) = libtorch_lib.parent().and_then(Path::parent) {
        if let Ok(entries) = std::fs::read_dir(site.join("nvidia")) {
            let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("include")).collect();
            dirs.sort();
            candidates.extend(dirs);
        }
    }
    candidates.extend(
        ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(env::var_os).map(|p| PathBuf::from(p).join("include")),
    );
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    let has = |d: &PathBuf, f: &str| d.join(f).exists();
    // One folder with both keeps runtime and crt of one release together.
    if let Some(d) = candidates.iter().find(|d| has(d, "cuda_runtime_api.h") && has(d, "crt/host_config.h")) {
        return Some(vec![d.clone()]);
    }
    let runtime = candidates.iter().find(|d| has(d, "cuda_runtime_api.h"))?;
    let crt = candidates.iter().find(|d| has(d, "crt/host_config.h"))?;
    Some(vec![runtime.clone(), crt.clone()])
}

fn main() {
    // PATH and VIRTUAL_ENV pick the Python interpreter, which picks the torch in Python mode.
    for var in [
        "LIBTORCH",
        "LIBTORCH_USE_PYTORCH",
        "LIBTORCH_CXX11_ABI",
        "VIRTUAL_ENV",
        "PATH",
        "CUDA_HOME",
        "CUDA_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=csrc");
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB"),
    );
    let python = python_torch();
    // torch-sys reruns only when a LIBTORCH* variable changes, so after a new venv or a moved
    // checkout it still links the old libtorch; going on would bake rpaths into the old folder.
    if let Some(py) = &python {
        assert!(
            same_dir(&py.lib, &lib),
            "torch-sys was built against the libtorch in {}, but Python now imports torch from {} \
             (torch-sys does not notice a changed PATH or VIRTUAL_ENV): run `cargo clean -p torch-sys` \
             and build again",
            lib.display(),
            py.lib.display()
        );
    }
    let include = lib.join("..").join("include");
    let abi = env::var("LIBTORCH_CXX11_ABI")
        .ok()
        .or_else(|| python.map(|py| py.abi))
        .unwrap_or_else(|| "1".to_owned());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .std("c++17")
        .opt_level(2)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-c++20-extensions")
        .flag_if_supported("-Wno-unused-parameter");
    // CUDA history hooks the caching allocator, whose header needs the CUDA runtime headers; the
    // rest of the shim does not, so only cuda_history.cpp gets them.
    let cuda_dirs = if lib.join("libc10_cuda.so").exists() { cuda_include_dirs(&lib) } else { None };
    let mut cuda_build = build.clone();
    match &cuda_dirs {
        Some(dirs) => {
            cuda_build.define("GMT_HAVE_CUDA_HEADERS", None);
            for d in dirs {
                cuda_build.include(d);
            }
        }
        None => println!(
            "cargo:warning=no CUDA runtime headers or libc10_cuda found: CUDA memory history is left out of this build"
        ),
    }
    // CUDA history is optional: headers that do not compile leave it out, not the whole build.
    let mut with_cuda = cuda_dirs.is_some();
    if let Err(e) = cuda_build.file("csrc/cuda_history.cpp").try_compile("gpu_mem_track_cuda_history") {
        println!("cargo:warning=CUDA memory history left out: csrc/cuda_history.cpp failed with the CUDA headers found ({e})");
        build.clone().file("csrc/cuda_history.cpp").compile("gpu_mem_track_cuda_history");
        with_cuda = false;
    }
    if with_cuda {
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    // Only torch_cuda_link.cpp reads the define.
    let have_torch_cuda = lib.join("libtorch_cuda.so").exists();
    if have_torch_cuda {
        build.define("GMT_HAVE_TORCH_CUDA", None);
    }
    build
        .files([
            "csrc/registry.cpp",
            "csrc/allocator.cpp",
            "csrc/cuda.cpp",
            "csrc/recorder.cpp",
            "csrc/meta_kernels.cpp",
            "csrc/script.cpp",
            "csrc/saved.cpp",
            "csrc/torch_cuda_link.cpp",
        ])
        .compile("gpu_mem_track_shim");

    if have_torch_cuda {
        // Satisfies the shim's reference; torch-sys links it too, but this does not rely on that.
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:libtorch_lib={}", lib.display());
    // For this crate's own tests.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
