//! What both binaries of the gpu-mem-track command line share: exit codes and one-line errors,
//! how a timeline is written, and the definitions of the subcommands that run models
//! ([`model_args`]). The `gpu-mem-track` binary links no libtorch; `gpu-mem-track-estimate`
//! (feature `estimate`) does.
use std::fmt::Display;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{bail, Context, Result};
use gpu_mem_track_log::plot::plot_timeline;
use gpu_mem_track_log::Trace;

pub mod command;
pub mod model_args;

/// `-q` / `-v`, global to every subcommand of both binaries: how much is said on stderr besides
/// the result (stdout) and errors, which are always printed.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct VerbosityArgs {
    /// Say nothing on stderr but errors: no progress, warnings or notes.
    #[arg(short, long, global = true, conflicts_with = "verbose", display_order = 900)]
    pub quiet: bool,
    /// Also say what is done and where, even when stderr is not a terminal.
    #[arg(short, long, global = true, display_order = 901)]
    pub verbose: bool,
}

impl VerbosityArgs {
    /// What the flags ask for (`--quiet` and `--verbose` conflict).
    pub fn level(self) -> Verbosity {
        if self.quiet {
            Verbosity::Quiet
        } else if self.verbose {
            Verbosity::Verbose
        } else {
            Verbosity::Normal
        }
    }

    /// Makes these flags the process's ([`verbosity`]).
    pub fn apply(self) {
        VERBOSITY.store(self.level() as u8, Ordering::Relaxed);
    }

    /// The flags as arguments again, for the binary a subcommand is handed to.
    pub fn as_args(self) -> Vec<std::ffi::OsString> {
        let flag = match self.level() {
            Verbosity::Quiet => Some("--quiet"),
            Verbosity::Verbose => Some("--verbose"),
            Verbosity::Normal => None,
        };
        flag.into_iter().map(Into::into).collect()
    }
}

/// How much the command line says on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Errors only.
    Quiet = 0,
    /// Warnings always; progress and notes when stderr is a terminal.
    Normal = 1,
    /// Warnings and notes always; progress when stderr is a terminal.
    Verbose = 2,
}

static VERBOSITY: AtomicU8 = AtomicU8::new(Verbosity::Normal as u8);

/// The process's verbosity ([`VerbosityArgs::apply`]).
pub fn verbosity() -> Verbosity {
    match VERBOSITY.load(Ordering::Relaxed) {
        0 => Verbosity::Quiet,
        2 => Verbosity::Verbose,
        _ => Verbosity::Normal,
    }
}

/// `warning: ...` on stderr, unless `--quiet`.
pub fn warn(message: impl Display) {
    if verbosity() > Verbosity::Quiet {
        eprintln!("warning: {message}");
    }
}

/// A note on what was done (`wrote plot.svg`): on a terminal, or anywhere with `--verbose`; never
/// with `--quiet`.
pub fn note(message: impl Display) {
    match verbosity() {
        Verbosity::Verbose => eprintln!("{message}"),
        Verbosity::Normal if std::io::stderr().is_terminal() => eprintln!("{message}"),
        _ => {}
    }
}

/// Whether a progress bar may be drawn: stderr is a terminal and `--quiet` was not given.
pub fn shows_progress() -> bool {
    verbosity() > Verbosity::Quiet && std::io::stderr().is_terminal()
}

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

/// What `timeline -o FILE` writes, by FILE's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineOutput {
    /// A stacked-area chart (`.svg`, `.png`).
    Chart,
    /// The points as JSON (`.json`).
    Json,
    /// The trace as a memory snapshot laid out by the caching allocator model (`.pickle`): given
    /// a recorded snapshot, its own allocations and frees placed as the model places them, to set
    /// beside the segments the GPU made.
    Snapshot,
}

impl TimelineOutput {
    /// The kind `output`'s extension asks for; other extensions are refused before any work.
    ///
    /// # Errors
    /// An extension that is none of `.svg`, `.png`, `.json`, `.pickle`.
    pub fn of(output: &Path) -> Result<Self> {
        match output.extension().and_then(|x| x.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("json") => Ok(TimelineOutput::Json),
            Some("svg" | "png") => Ok(TimelineOutput::Chart),
            Some("pickle") => Ok(TimelineOutput::Snapshot),
            _ => bail!("output {}: the file name must end in .svg, .png, .json or .pickle", output.display()),
        }
    }
}

/// Writes a timeline of `trace` to `output` as `kind` says: a chart titled `title`, JSON with
/// `estimate` (or null), the peak and at most about 2 000 of the points evenly spaced, or a
/// memory snapshot.
///
/// # Errors
/// The file cannot be written.
pub fn write_timeline(
    trace: &Trace,
    kind: TimelineOutput,
    title: &str,
    estimate: serde_json::Value,
    output: &Path,
) -> Result<()> {
    match kind {
        TimelineOutput::Chart => plot_timeline(trace, title, output)?,
        TimelineOutput::Snapshot => gpu_mem_track_gpu::snapshot::dump_snapshot(trace, output)?,
        TimelineOutput::Json => {
            let points = trace.timeline();
            let step = (points.len() / 2000).max(1);
            let sampled: Vec<_> = points.iter().step_by(step).collect();
            let v = serde_json::json!({ "estimate": estimate, "peak": trace.peak(), "points": sampled });
            std::fs::write(output, serde_json::to_string_pretty(&v)?)
                .with_context(|| format!("cannot write {}", output.display()))?;
        }
    }
    note(format_args!("wrote {}", output.display()));
    Ok(())
}
