//! What both binaries of the command line share (`#[path]`-included: neither links the other).
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use tracker_log::Trace;

/// Exit 0, or 1 with one line on stderr naming the file or option (usage errors exit 2 in clap).
pub fn exit_code(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::from(1)
        }
    }
}

/// Writes a timeline as JSON: the estimate (or null), the peak, and at most about 2 000 of the
/// points, evenly spaced.
pub fn write_timeline_json(trace: &Trace, estimate: serde_json::Value, output: &Path) -> Result<()> {
    let points = trace.timeline();
    let step = (points.len() / 2000).max(1);
    let sampled: Vec<_> = points.iter().step_by(step).collect();
    let v = serde_json::json!({ "estimate": estimate, "peak": trace.peak(), "points": sampled });
    std::fs::write(output, serde_json::to_string_pretty(&v)?)
        .with_context(|| format!("cannot write {}", output.display()))
}
