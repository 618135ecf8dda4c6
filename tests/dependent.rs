//! A crate that depends on gpu-mem-track (`tests/fixtures/dependent`, whose build script is the
//! few lines the README asks users for) gets a binary that finds libtorch without
//! LD_LIBRARY_PATH and keeps libtorch_cuda linked, so CUDA is usable on a GPU machine.
//!
//! The fixture is a member of this workspace, so it reuses the compiled dependencies (libtorch's
//! bindings and the C++ shim); its build script and link line are still its own, as a user's
//! crate's are. Run it after the workspace is built (cargo-nextest does): the build waits for
//! the target folder's lock.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LIBTORCH_LIB: &str = env!("GMT_LIBTORCH_LIB");
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dependent");

/// The target folder this test binary was built in: `CARGO_TARGET_DIR`, else the nearest folder
/// above the binary that cargo tagged as its cache, else `<workspace>/target`.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The cargo that runs this test (same toolchain), else the one on PATH.
fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("cargo"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Builds the fixture and returns its executable.
fn build_fixture() -> PathBuf {
    let out = run(Command::new(cargo())
        .args(["build", "--message-format=json-render-diagnostics", "--manifest-path"])
        .arg(Path::new(FIXTURE).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir()));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "dependent")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .expect("cargo reported the fixture's executable")
}

/// The folders of the binary's RUNPATH (or RPATH).
fn runpath(exe: &Path) -> Vec<PathBuf> {
    let out = run(Command::new("readelf").arg("-d").arg(exe));
    let dynamic = String::from_utf8_lossy(&out.stdout).into_owned();
    dynamic
        .lines()
        .filter(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)"))
        .filter_map(|l| Some(l.split_once('[')?.1.trim_end().trim_end_matches(']').to_owned()))
        .flat_map(|paths| paths.split(':').map(PathBuf::from).collect::<Vec<_>>())
        .collect()
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

#[test]
fn dependent_crate_runs_without_ld_library_path_and_keeps_libtorch_cuda() {
    let lib = Path::new(LIBTORCH_LIB);
    let exe = build_fixture();

    let rpath = runpath(&exe);
    assert!(
        rpath.iter().any(|d| same_dir(d, lib)),
        "{} has no RUNPATH/RPATH to {LIBTORCH_LIB} (has {rpath:?}): the fixture's build script no longer gets the folder",
        exe.display()
    );

    let out = run(Command::new(&exe).env_remove("LD_LIBRARY_PATH"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The input (256 x 1024 f32), the weight (64 x 1024) and bias (64), and the activation
    // (relu's output, 256 x 64; autograd keeps no other storage alive).
    let want = (256 * 1024 + 64 * 1024 + 64 + 256 * 64) * 4;
    assert!(stdout.contains(&format!("tensor_bytes={want}\n")), "unexpected output:\n{stdout}");
    assert!(stdout.contains("cuda_available="), "unexpected output:\n{stdout}");
    // Parameters and activations are logged as such.
    let param = "<class 'torch.nn.parameter.Parameter'> | torch.float32";
    for line in [
        format!("+ | 1 * Size:(64, 1024)           | Memory: 0.25 M | {param}"),
        format!("+ | 1 * Size:(64,)                | Memory: 0.0002 M | {param}"),
        "+ | 1 * Size:(256, 1024)          | Memory: 1.0 M | <class 'torch.Tensor'> | torch.float32"
            .to_owned(),
        "+ | 1 * Size:(256, 64)            | Memory: 0.0625 M | <class 'torch.Tensor'> | torch.float32"
            .to_owned(),
    ] {
        assert!(stdout.lines().any(|l| l == line), "no line {line:?} in:\n{stdout}");
    }
    // The libtorch and tch it was built with are the ones this test was built with.
    assert!(
        stdout.contains(&format!("libtorch={}\n", gpu_mem_track::capabilities().libtorch_version)),
        "{stdout}"
    );

    let out = run(Command::new("ldd").arg(&exe).env_remove("LD_LIBRARY_PATH"));
    let ldd = String::from_utf8_lossy(&out.stdout);
    assert!(!ldd.contains("not found"), "unresolved libraries without LD_LIBRARY_PATH:\n{ldd}");
    let resolved = |name: &str| {
        ldd.lines()
            .find_map(|l| l.trim_start().strip_prefix(name)?.trim_start().strip_prefix("=> "))
            .and_then(|rest| rest.split_once(" (").map(|(path, _)| PathBuf::from(path)))
    };
    let torch_cpu =
        resolved("libtorch_cpu.so").unwrap_or_else(|| panic!("libtorch_cpu.so is not linked:\n{ldd}"));
    assert!(
        same_dir(torch_cpu.parent().unwrap(), lib),
        "libtorch_cpu.so resolves outside {LIBTORCH_LIB}:\n{ldd}"
    );
    let cuda_linked = resolved("libtorch_cuda.so").is_some();
    if lib.join("libtorch_cuda.so").exists() {
        assert!(
            cuda_linked,
            "libtorch_cuda.so was dropped by --as-needed (CUDA would be unavailable):\n{ldd}"
        );
    } else {
        assert!(!cuda_linked, "CPU-only libtorch, yet libtorch_cuda.so is linked:\n{ldd}");
    }
}
