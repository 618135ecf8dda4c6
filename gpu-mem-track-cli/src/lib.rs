//! What both binaries of the gpu-mem-track command line share: exit codes and one-line errors,
//! and how a timeline is written. The `gpu-mem-track` binary of this package links no libtorch;
//! `gpu-mem-track-estimate` (package `gpu-mem-track-estimate`, feature `cli`) does, and uses this too.
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use gpu_mem_track_log::Trace;

pub mod command;

/// Exit 0, or 1 with one line on stderr naming the file or option (usage errors exit 2 in clap).
pub fn exit_code(result: Result<()>) -> ExitCode {
    ExitCode::from(exit_status(result))
}

/// [`exit_code`] as a number, for a host that goes on running (`command::run_from`).
pub(crate) fn exit_status(result: Result<()>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            1
        }
    }
}

/// The error and its causes on one line, each cause once: library errors already name their
/// OS error in their text and also return it as their source.
fn one_line(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if !text.contains(&m) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&m);
        }
    }
    text.replace('\n', " ")
}

/// Whether a timeline goes to JSON (else a chart); refuses other extensions before any work.
pub fn timeline_is_json(output: &Path) -> Result<bool> {
    match output.extension().and_then(|x| x.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("json") => Ok(true),
        Some("svg" | "png") => Ok(false),
        _ => bail!("output {}: the file name must end in .svg, .png or .json", output.display()),
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
