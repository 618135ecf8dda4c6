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
    python_torch_of(python.as_ref()).ok()
}

/// What `python` reports about its torch, or why it could not.
fn python_torch_of(python: &std::ffi::OsStr) -> Result<PythonTorch, String> {
    let script = "import torch, os; print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); \
                  print(os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), 'lib'))";
    let out = Command::new(python)
        .args(["-c", script])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.to_string_lossy()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines().map(str::trim);
    match (out.status.success(), lines.next().filter(|s| *s == "0" || *s == "1"), lines.next()) {
        (true, Some(abi), Some(lib)) => Ok(PythonTorch { abi: abi.to_owned(), lib: PathBuf::from(lib) }),
        _ => Err(format!(
            "{} cannot import torch: {}",
            python.to_string_lossy(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("no output")
        )),
    }
}

/// The libtorch to build against without torch-sys (the `tch` feature off, as the Python package
/// builds): `LIBTORCH` when set, else the torch of the Python that builds us (`PYO3_PYTHON`, which
/// maturin sets, else the virtualenv's `python`, else `python3`). Links libtorch itself.
fn libtorch_without_torch_sys() -> (PathBuf, Option<PythonTorch>) {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let found = if let Some(dir) = env::var_os("LIBTORCH") {
        (
            env::var_os("LIBTORCH_LIB").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(dir)).join("lib"),
            None,
        )
    } else {
        let python = env::var_os("PYO3_PYTHON")
            .or_else(|| {
                env::var_os("VIRTUAL_ENV").map(|v| PathBuf::from(v).join("bin/python").into_os_string())
            })
            .unwrap_or_else(|| "python3".into());
        match python_torch_of(&python) {
            Ok(py) => (py.lib.clone(), Some(py)),
            Err(why) => panic!(
                "gpu-mem-track-sys without the `tch` feature builds against the torch of a Python or LIBTORCH, \
                 and found neither: {why}. Install torch into the Python that builds this (pip's build \
                 isolation hides it: `pip install --no-build-isolation`), point PYO3_PYTHON at a Python \
                 with torch, or set LIBTORCH to a libtorch folder"
            ),
        }
    };
    for name in ["torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={name}");
    }
    found
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Include folders for the CUDA runtime headers that `c10/cuda` needs (`cuda_runtime_api.h` and
/// the `crt/host_config.h` it includes), or why there are none. Looks in the NVIDIA wheels beside
/// the torch wheel (their headers match the CUDA libtorch was built with), `CUDA_HOME`/`CUDA_PATH`,
/// a conda environment, and the usual toolkit folders.
fn cuda_include_dirs(libtorch_lib: &Path) -> Result<Vec<PathBuf>, String> {
    let has = |d: &PathBuf, f: &str| d.join(f).exists();
    // The wheels first, as a pair if need be (CUDA 12 wheels split runtime and compiler headers
    // into two packages): their headers match the CUDA libtorch was built with.
    let mut wheels: Vec<PathBuf> = Vec::new();
    if let Some(site) = libtorch_lib.parent().and_then(Path::parent) {
        let nvidia = site.join("nvidia");
        if let Ok(entries) = std::fs::read_dir(&nvidia) {
            // Headers installed later (nvidia-cuda-crt, nvidia-cuda-nvcc-cu12) must reach a build
            // made without them: a new package adds a folder here, a new file lands in an include.
            println!("cargo:rerun-if-changed={}", nvidia.display());
            wheels = entries.flatten().map(|e| e.path().join("include")).filter(|d| d.is_dir()).collect();
            wheels.sort();
            for d in &wheels {
                println!("cargo:rerun-if-changed={}", d.display());
            }
        }
    }
    let runtime = wheels.iter().find(|d| has(d, "cuda_runtime_api.h"));
    let crt = wheels.iter().find(|d| has(d, "crt/host_config.h"));
    if let (Some(r), Some(c)) = (runtime, crt) {
        return Ok(if r == c { vec![r.clone()] } else { vec![r.clone(), c.clone()] });
    }
    let mut candidates = wheels.clone();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(p) = env::var_os(var) {
            candidates.push(PathBuf::from(p).join("include"));
        }
    }
    if let Some(conda) = env::var_os("CONDA_PREFIX") {
        candidates.push(PathBuf::from(&conda).join("targets/x86_64-linux/include"));
        candidates.push(PathBuf::from(conda).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    // Versioned toolkits, newest first.
    if let Ok(entries) = std::fs::read_dir("/usr/local") {
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cuda-"))
            .map(|e| e.path().join("include"))
            .collect();
        dirs.sort();
        candidates.extend(dirs.into_iter().rev());
    }
    candidates.push(PathBuf::from("/opt/cuda/include"));
    candidates.push(PathBuf::from("/usr/include"));
    // One folder with both keeps runtime and crt of one release together.
    if let Some(d) = candidates.iter().find(|d| has(d, "cuda_runtime_api.h") && has(d, "crt/host_config.h")) {
        return Ok(vec![d.clone()]);
    }
    let runtime = candidates.iter().find(|d| has(d, "cuda_runtime_api.h"));
    let crt = candidates.iter().find(|d| has(d, "crt/host_config.h"));
    match (runtime, crt) {
        (Some(r), Some(c)) => Ok(vec![r.clone(), c.clone()]),
        (Some(r), None) => Err(format!(
            "{} has cuda_runtime_api.h but no CUDA compiler headers (crt/host_config.h) were found: \
             pip install the CUDA compiler headers of torch's CUDA version (CUDA 13: `nvidia-cuda-crt`, 0.1 MB; \
             CUDA 12: `nvidia-cuda-nvcc-cu12`) or set CUDA_HOME to a CUDA toolkit, then build again",
            r.display()
        )),
        (None, _) => Err("no CUDA runtime headers (cuda_runtime_api.h) were found in the NVIDIA wheels beside torch, \
                          CUDA_HOME, CUDA_PATH, CONDA_PREFIX or /usr/local/cuda*: set CUDA_HOME to a CUDA toolkit \
                          and build again"
            .to_owned()),
    }
}

/// The libtorch version from its headers (`torch/version.h`, which moved to `torch/headeronly` in
/// 2.11): (major, minor, patch).
fn libtorch_version(include: &Path) -> (u32, u32, u32) {
    let files =
        [include.join("torch/headeronly/version.h"), include.join("torch/csrc/api/include/torch/version.h")];
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let field = |name: &str| {
            text.lines().find_map(|l| {
                let rest = l.trim().strip_prefix("#define ")?.strip_prefix(name)?;
                rest.trim().parse::<u32>().ok()
            })
        };
        if let (Some(major), Some(minor)) = (field("TORCH_VERSION_MAJOR"), field("TORCH_VERSION_MINOR")) {
            return (major, minor, field("TORCH_VERSION_PATCH").unwrap_or(0));
        }
    }
    panic!(
        "no TORCH_VERSION_MAJOR/MINOR in {} or {}: is this a libtorch include folder?",
        files[0].display(),
        files[1].display()
    )
}

/// The C++ standard libtorch's headers need: C++20 from the release whose `ATen/ATen.h` says so
/// (2.15), C++17 before.
fn cxx_standard(include: &Path) -> &'static str {
    let aten = std::fs::read_to_string(include.join("ATen/ATen.h")).unwrap_or_default();
    if aten.contains("C++20 or later") {
        "c++20"
    } else {
        "c++17"
    }
}

/// The torch-sys (so tch) version of this build, from the lockfile of the build that compiles us:
/// cargo tells build scripts no dependency versions, but `OUT_DIR` lies inside the target folder,
/// which is inside (or beside) the workspace whose `Cargo.lock` picked it.
fn torch_sys_version() -> Option<String> {
    let out = PathBuf::from(env::var_os("OUT_DIR")?);
    for dir in out.ancestors() {
        let lock = dir.join("Cargo.lock");
        // No rerun-if-changed on it: a new torch-sys reruns this script anyway (it links `tch`),
        // and watching the lockfile would rebuild the shim on every unrelated dependency change.
        let Ok(text) = std::fs::read_to_string(&lock) else { continue };
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() == "name = \"torch-sys\"" {
                let version = lines.next()?.trim().strip_prefix("version = \"")?.strip_suffix('"')?;
                return Some(version.to_owned());
            }
        }
        return None;
    }
    None
}

fn main() {
    // PATH and VIRTUAL_ENV pick the Python interpreter, which picks the torch in Python mode.
    for var in [
        "LIBTORCH",
        "LIBTORCH_INCLUDE",
        "LIBTORCH_LIB",
        "LIBTORCH_USE_PYTORCH",
        "LIBTORCH_CXX11_ABI",
        "VIRTUAL_ENV",
        "PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CONDA_PREFIX",
        "LIBTORCH_BYPASS_VERSION_CHECK",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=csrc");
    let with_torch_sys = env::var_os("CARGO_FEATURE_TCH").is_some();
    let (lib, python) = if with_torch_sys {
        let lib = PathBuf::from(
            env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB"),
        );
        (lib, python_torch())
    } else {
        libtorch_without_torch_sys()
    };
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
    // torch-sys honours LIBTORCH_INCLUDE for installs whose headers are not beside lib/.
    let include = env::var_os("LIBTORCH_INCLUDE")
        .map(|dir| PathBuf::from(dir).join("include"))
        .filter(|dir| dir.is_dir())
        .unwrap_or_else(|| lib.join("..").join("include"));
    // The C++ branches on TORCH_VERSION_MAJOR/MINOR itself; Rust gets the same as cfgs (a cfg per
    // release that added something the shim uses) and constants for `capabilities()`.
    let (major, minor, patch) = libtorch_version(&include);
    for (name, (want_major, want_minor)) in [("gmt_libtorch_2_10", (2, 10)), ("gmt_libtorch_2_11", (2, 11))] {
        println!("cargo::rustc-check-cfg=cfg({name})");
        if (major, minor) >= (want_major, want_minor) {
            println!("cargo:rustc-cfg={name}");
        }
    }
    let version = format!("{major}.{minor}.{patch}");
    println!("cargo:rustc-env=GMT_LIBTORCH_VERSION={version}");
    println!("cargo:torch_version={version}");
    let torch_sys = if with_torch_sys { torch_sys_version() } else { None };
    println!("cargo:rustc-env=GMT_TORCH_SYS_VERSION={}", torch_sys.unwrap_or_default());
    println!(
        "cargo:rustc-env=GMT_TORCH_VERSION_CHECK_BYPASSED={}",
        u8::from(env::var_os("LIBTORCH_BYPASS_VERSION_CHECK").is_some())
    );
    let abi = env::var("LIBTORCH_CXX11_ABI")
        .ok()
        .or_else(|| python.map(|py| py.abi))
        .unwrap_or_else(|| "1".to_owned());

    // How the shim's C++ is compiled: libtorch's headers, its C++ standard and ABI, and the
    // warnings libtorch's headers would raise turned off.
    let std = cxx_standard(&include);
    let libtorch_includes = [include.clone(), include.join("torch/csrc/api/include")];
    let mut build = cc::Build::new();
    // The same flags in every profile (-O2, no debug info): the tests, clippy, the docs and the
    // release-built Python wheel then compile the shim with one command, which a compiler cache
    // (scripts/dev's ccache) serves after the first. `CXXFLAGS=-g` brings debug info back.
    build.cpp(true).pic(true).std(std).opt_level(2).debug(false).includes(&libtorch_includes);
    let mut flags = vec![format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"), "-DGLOG_USE_GLOG_EXPORT".to_owned()];
    for warning in ["-Wno-c++20-extensions", "-Wno-unused-parameter"] {
        if build.is_flag_supported(warning).unwrap_or(false) {
            flags.push(warning.to_owned());
        }
    }
    for flag in &flags {
        build.flag(flag);
    }
    // A dependent's C++ that builds on the shim (the estimator's, gpu-mem-track-estimate-sys) is
    // compiled the same way, with the shim's headers first: exported rather than repeated there.
    let shim_include =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("csrc");
    let includes = env::join_paths(std::iter::once(shim_include).chain(libtorch_includes))
        .expect("include folders hold no path separator");
    println!("cargo:cxx_includes={}", includes.to_string_lossy());
    println!("cargo:cxx_std={std}");
    println!("cargo:cxx_flags={}", flags.join(" "));
    // CUDA history hooks the caching allocator, whose header needs the CUDA runtime headers; the
    // rest of the shim does not, so only cuda_history.cpp gets them. What is left out, and why,
    // reaches the library (`capabilities()`, the error of `record_history` on CUDA), not only a
    // cargo warning nobody reads.
    let cuda_dirs = if lib.join("libc10_cuda.so").exists() {
        cuda_include_dirs(&lib)
    } else {
        Err(format!("{} has no libc10_cuda.so: a CPU-only libtorch", lib.display()))
    };
    let mut cuda_build = build.clone();
    match &cuda_dirs {
        Ok(dirs) => {
            cuda_build.define("GMT_HAVE_CUDA_HEADERS", None);
            for d in dirs {
                cuda_build.include(d);
            }
        }
        Err(why) => println!("cargo:warning=CUDA memory history is left out of this build: {why}"),
    }
    // CUDA history is optional: headers that do not compile leave it out, not the whole build.
    let mut missing = cuda_dirs.err();
    if let Err(e) = cuda_build.file("csrc/cuda_history.cpp").try_compile("gpu_mem_track_cuda_history") {
        let why = format!("csrc/cuda_history.cpp failed to compile with the CUDA headers found ({e})");
        println!("cargo:warning=CUDA memory history is left out of this build: {why}");
        build.clone().file("csrc/cuda_history.cpp").compile("gpu_mem_track_cuda_history");
        missing = Some(why);
    }
    if missing.is_none() {
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    // One line: rustc-env values cannot hold newlines.
    println!(
        "cargo:rustc-env=GMT_CUDA_HISTORY_MISSING={}",
        missing.unwrap_or_default().replace(['\n', '\r'], " ")
    );
    // Only torch_cuda_link.cpp reads the define.
    let have_torch_cuda = lib.join("libtorch_cuda.so").exists();
    if have_torch_cuda {
        build.define("GMT_HAVE_TORCH_CUDA", None);
    }
    build
        .files([
            "csrc/registry.cpp",
            "csrc/registry_callback.cpp",
            "csrc/registry_records.cpp",
            "csrc/registry_walk.cpp",
            "csrc/allocator.cpp",
            "csrc/oom.cpp",
            "csrc/cuda.cpp",
            "csrc/recorder.cpp",
            "csrc/module.cpp",
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
