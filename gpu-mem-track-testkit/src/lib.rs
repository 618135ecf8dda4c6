//! The test harness of the gpu-mem-track workspace, a dev-dependency of its crates and never
//! shipped: where the fixtures are, TorchScript models exported by Python, the checks every
//! command-line test makes ([`cli_output`]), the GPU acceptance, and the probe of what this
//! machine offers the tests ([`environment`]).
//!
//! Tests that need Python with torch, torchvision, a GPU or a browser are
//! `#[cfg_attr(not(gmt_python_torch), ignore = "why")]`: the build scripts read those cfgs from
//! `GMT_TEST_CFGS`, which `scripts/dev` sets from [`environment::probe`] (`cargo run -p
//! gpu-mem-track-testkit --bin gmt-test-env`). A plain `cargo test` reports them as ignored.
use std::path::{Path, PathBuf};

pub mod cli_output;
pub mod environment;

/// The workspace's root (this crate lives in its `gpu-mem-track-testkit/` folder).
pub fn workspace_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here)
}

/// The folder of the test fixtures: `GMT_TEST_FIXTURES` where the test binaries run away from
/// this checkout (the GPU bundle ships them), else `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    std::env::var_os("GMT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("tests/fixtures"))
}

/// A Python interpreter with torch, for tests that export TorchScript models.
pub fn python_with_torch() -> Option<PathBuf> {
    environment::python_with(&["torch"])
}

/// Exports models of `tests/fixtures/export_models.py` to `dir`. The tests calling it are
/// ignored where no Python with torch was found at build time; here a missing one is a failure.
pub fn export_models(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    let python = python_with_torch().expect("exporting models needs Python with torch");
    let script = fixtures().join("export_models.py");
    let out = std::process::Command::new(python).arg(&script).arg(dir).args(names).output().unwrap();
    assert!(out.status.success(), "export failed: {}", String::from_utf8_lossy(&out.stderr));
    names.iter().map(|n| dir.join(format!("{n}.pt"))).collect()
}

/// One exported model in a temporary folder (kept as long as the returned guard lives).
pub fn exported_model(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = export_models(dir.path(), &[name]).remove(0);
    (dir, model)
}

/// A Python check of a memory snapshot pickle with PyTorch's own `torch.cuda._memory_viz`: it
/// renders both pages, sums the segments up (which fails unless each segment's blocks add up to
/// it) and prints the trace's counts and peak as JSON.
pub const MEMORY_VIZ_CHECK: &str = r#"
import json, pickle, sys
import torch.cuda._memory_viz as viz
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
html = viz.trace_plot(data)
segments = viz.segment_plot(data)
summary = viz.segsum(data)
live = peak = 0
allocs = frees = 0
for e in data["device_traces"][0]:
    if e["action"] == "alloc":
        allocs += 1; live += e["size"]; peak = max(peak, live)
    elif e["action"] == "free_completed":
        frees += 1; live -= e["size"]
print(json.dumps({"allocs": allocs, "frees": frees, "peak": peak, "html": len(html), "segments_html": len(segments),
                  "live_segments": len(data["segments"]), "segsum": len(summary)}))
"#;

/// The acceptance a GPU prediction is held to (the estimator's GPU tests), in % of the GPU's
/// figure: peak allocated at most this far above the predicted high end (an estimate under the
/// GPU, the dangerous side) ...
pub const GPU_ALLOCATED_ABOVE_PCT: f64 = 1.0;
/// ... or this far below its low end; peak reserved within this of its range.
pub const GPU_ALLOCATED_BELOW_PCT: f64 = 3.0;
/// Peak reserved: at most this far outside the predicted range, either side.
pub const GPU_RESERVED_PCT: f64 = 5.0;
