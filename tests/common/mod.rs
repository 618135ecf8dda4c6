//! Helpers shared by the integration tests.
#![allow(dead_code)]
use std::path::Path;

use gpu_mem_track::{MemTracker, TrackedDevice};

/// A CPU tracker logging into `dir`.
pub fn cpu_tracker(dir: &Path) -> MemTracker {
    MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir).build().expect("CPU tracker")
}

/// The raw text of each block of a log: (group lines, `At` line).
pub fn raw_blocks(path: &Path) -> Vec<(Vec<String>, String)> {
    let text = std::fs::read_to_string(path).expect("log readable");
    let mut out = Vec::new();
    let mut pending = Vec::new();
    for line in text.lines().skip(1) {
        if line.starts_with("+ |") || line.starts_with("- |") {
            pending.push(line.to_owned());
        } else if line.starts_with("At ") {
            out.push((std::mem::take(&mut pending), line.to_owned()));
        } else {
            assert!(line.is_empty(), "unexpected line {line:?}");
        }
    }
    assert!(pending.is_empty(), "group lines after the last At line");
    out
}

/// The group lines of the last block.
pub fn last_group_lines(tracker: &MemTracker) -> Vec<String> {
    raw_blocks(tracker.log_path()).pop().expect("a block").0
}

/// A group line as the log must print it.
pub fn line(sign: char, n: u64, shape: &str, mem: &str, class: &str, dtype: &str) -> String {
    format!("{sign} | {n} * Size:{shape:<20} | Memory: {mem} M | {class:<20} | {dtype}")
}

pub const TENSOR: &str = "<class 'torch.Tensor'>";
pub const PARAM: &str = "<class 'torch.nn.parameter.Parameter'>";

/// A Python interpreter with torch, for tests that export TorchScript models.
pub fn python_with_torch() -> Option<std::path::PathBuf> {
    let mut candidates = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        candidates.push(Path::new(&venv).join("bin/python"));
    }
    candidates.push(workspace_root().join(".venv/bin/python"));
    candidates.push("python3".into());
    candidates.into_iter().find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import torch"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

/// The folder of the test fixtures: `GMT_TEST_FIXTURES` where the test binaries run away from
/// this checkout (the GPU bundle ships them), else `tests/fixtures`.
pub fn fixtures() -> std::path::PathBuf {
    std::env::var_os("GMT_TEST_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("tests/fixtures"))
}

/// Exports models of `tests/fixtures/export_models.py` to `dir`. The tests calling it are
/// ignored where no Python with torch was found at build time; here a missing one is a failure.
pub fn export_models(dir: &Path, names: &[&str]) -> Vec<std::path::PathBuf> {
    let python = python_with_torch().expect("exporting models needs Python with torch");
    let script = fixtures().join("export_models.py");
    let out = std::process::Command::new(python).arg(&script).arg(dir).args(names).output().unwrap();
    assert!(out.status.success(), "export failed: {}", String::from_utf8_lossy(&out.stderr));
    names.iter().map(|n| dir.join(format!("{n}.pt"))).collect()
}

/// One exported model in a temporary folder (kept as long as the returned guard lives).
pub fn exported_model(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
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

/// The workspace's root: this package's folder, or its parent for the member crates that share
/// these helpers (`#[path]`).
pub fn workspace_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    if here.join("tests/fixtures").is_dir() {
        here
    } else {
        here.parent().unwrap_or(here)
    }
}

/// The acceptance a GPU prediction is held to (the estimator's GPU tests), in % of the GPU's
/// figure: peak allocated at most this far above the predicted high end (an estimate under the
/// GPU, the dangerous side) ...
pub const GPU_ALLOCATED_ABOVE_PCT: f64 = 1.0;
/// ... or this far below its low end; peak reserved within this of its range.
pub const GPU_ALLOCATED_BELOW_PCT: f64 = 3.0;
/// Peak reserved: at most this far outside the predicted range, either side.
pub const GPU_RESERVED_PCT: f64 = 5.0;
