//! What this machine offers the tests, as the cfgs they are ignored without: a GPU (`gmt_gpu`),
//! Python with torch (`gmt_python_torch`) and torchvision (`gmt_torchvision`), a browser with
//! PyTorch's memory_viz page (`gmt_memory_viz`). `scripts/dev` passes [`probe`]'s answer to the
//! build scripts as `GMT_TEST_CFGS`; the crates' build scripts only read it, so a user's build
//! runs nothing.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every cfg a test may be ignored without.
pub const CFGS: [&str; 4] = ["gmt_gpu", "gmt_python_torch", "gmt_torchvision", "gmt_memory_viz"];

/// The cfgs this machine satisfies, in [`CFGS`] order.
pub fn probe() -> Vec<&'static str> {
    // An NVIDIA driver with a device: its control node and the per-GPU entries in /proc.
    let gpu = Path::new("/dev/nvidiactl").exists()
        && std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut d| d.next().is_some());
    // The Python the tests will run (the first with torch), and whether that one has torchvision:
    // another interpreter's torchvision is no use to them.
    let python = python_with(&["torch"]);
    let torchvision = python.as_deref().is_some_and(|p| imports(p, &["torchvision"]));
    let python = python.is_some();
    let memory_viz = env::var_os("GMT_MEMORY_VIZ_JS").is_some_and(|p| Path::new(&p).is_file())
        && Path::new("/usr/share/nodejs/d3").exists()
        && env::var_os("PATH").is_some_and(|p| env::split_paths(&p).any(|d| d.join("chromium").is_file()));
    CFGS.into_iter()
        .zip([gpu, python, torchvision, memory_viz])
        .filter_map(|(name, on)| on.then_some(name))
        .collect()
}

/// The first Python the tests use (the virtualenv's, the workspace's `.venv`, or `python3`) that
/// can import these modules.
pub fn python_with(modules: &[&str]) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(venv) = env::var_os("VIRTUAL_ENV") {
        candidates.push(Path::new(&venv).join("bin/python"));
    }
    candidates.push(crate::workspace_root().join(".venv/bin/python"));
    candidates.push("python3".into());
    candidates.into_iter().find(|p| imports(p, modules))
}

/// Whether `python` can import these modules.
fn imports(python: &Path, modules: &[&str]) -> bool {
    let code = format!("import {}", modules.join(", "));
    Command::new(python).args(["-c", &code]).output().is_ok_and(|o| o.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_names_only_known_cfgs_in_order_and_torchvision_only_with_torch() {
        let found = probe();
        let positions: Vec<usize> =
            found.iter().map(|f| CFGS.iter().position(|c| c == f).expect("known")).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{found:?}");
        assert!(!found.contains(&"gmt_torchvision") || found.contains(&"gmt_python_torch"), "{found:?}");
        assert_eq!(found.contains(&"gmt_python_torch"), python_with(&["torch"]).is_some());
        // torchvision counts only in the interpreter the tests use.
        let tests_python = python_with(&["torch"]);
        assert_eq!(
            found.contains(&"gmt_torchvision"),
            tests_python.is_some_and(|p| imports(&p, &["torchvision"]))
        );
    }
}
