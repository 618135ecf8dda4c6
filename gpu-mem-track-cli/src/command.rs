//! The `gpu-mem-track` command line itself (`report`, `plot`, `watch`, `timeline` of a snapshot
//! pickle without libtorch; `estimate`, `fit` and `timeline` of a model run the second binary,
//! `gpu-mem-track-estimate`, installed beside this one, git-style): [`run_from`] is what the binary
//! and the Python package's `python -m gpu_mem_track` run.
//!
//! Exit codes: 0 success, 1 error (one line on stderr naming the file or option), 2 usage.
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use gpu_mem_track_log::nvml::NvmlReader;
use gpu_mem_track_log::plot::plot_log_file;
use gpu_mem_track_log::report::{analyse_files, render_text};
use gpu_mem_track_log::simulated_nvml::SimulatedNvml;
use gpu_mem_track_log::trace::read_snapshot_trace;
use gpu_mem_track_log::watch::{run_watch, NvmlSource, StopReason, WatchConfig, WatchTarget};

/// The binary that runs models (links libtorch).
const ESTIMATE_BINARY: &str = "gpu-mem-track-estimate";

#[derive(Parser)]
#[command(
    name = "gpu-mem-track",
    version,
    about = "Where does the GPU memory of a PyTorch training run go, and will it fit?"
)]
struct Cli {
    #[command(flatten)]
    verbosity: crate::VerbosityArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Summarise logs (ours or Pytorch-Memory-Utils'): peak line, largest growth, leak suspects.
    Report {
        /// Log files (`*-gpu_mem_track.txt`); several give one table each and a combined view.
        #[arg(required = true)]
        logs: Vec<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// How many growth lines to list.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Plot memory over track points to an SVG or PNG.
    Plot {
        /// The log file.
        log: PathBuf,
        /// Output file: `.svg` or `.png`.
        #[arg(short, long)]
        output: PathBuf,
        /// Chart title (default: the log's file name).
        #[arg(long)]
        title: Option<String>,
    },
    /// Estimate the memory of an exported model (`.pt2`, or TorchScript `.pt`) without a GPU (runs it
    /// on the meta device).
    /// `gpu-mem-track estimate --help` lists the options.
    #[command(disable_help_flag = true)]
    Estimate {
        /// MODEL and options, as `gpu-mem-track estimate --help` lists them.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// The largest batch (or sequence, `--vary seq`) of an exported model (`.pt2` or `.pt`) that fits
    /// a GPU.
    /// `gpu-mem-track fit --help` lists the options.
    #[command(disable_help_flag = true)]
    Fit {
        /// MODEL and options, as `gpu-mem-track fit --help` lists them.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Memory over a run by category (parameters, gradients, optimizer state, input, activations,
    /// temporaries) as `.svg`/`.png`/`.json`: of an estimated run of a model, or of a snapshot
    /// `.pickle` (ours or PyTorch's). `gpu-mem-track timeline --help` lists the options.
    #[command(disable_help_flag = true)]
    Timeline {
        /// MODEL or SNAPSHOT.pickle, and options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Log NVML memory of a GPU or of processes on it, at an interval, until Ctrl-C / SIGTERM.
    Watch {
        /// NVML device index.
        #[arg(long, default_value_t = 0)]
        device: u32,
        /// A process id to log (repeatable).
        #[arg(long = "pid", conflicts_with = "all")]
        pids: Vec<u32>,
        /// Log every process on the device.
        #[arg(long)]
        all: bool,
        /// Time between samples, e.g. `500ms`, `2s` (at least 1ms).
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: Duration,
        /// Stop after this long, e.g. `10m`.
        #[arg(long, value_parser = parse_duration)]
        duration: Option<Duration>,
        /// Stop after this many samples.
        #[arg(long)]
        samples: Option<u64>,
        /// Folder for the log files (created if missing).
        #[arg(long, default_value = "logs")]
        log_dir: PathBuf,
        /// File-name prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start a new file when the current one reaches this size (`64MiB`, `1GB`, or bytes).
        #[arg(long, alias = "rotate-bytes", value_parser = gpu_mem_track_log::units::parse_memory_size)]
        rotate_size: Option<u64>,
        /// Watch a simulated GPU with this many processes instead of NVML (for tests and
        /// soak benchmarks of the watch loop on machines without a driver).
        #[arg(long, hide = true)]
        simulate_nvml: Option<u32>,
    },
    /// Print a completion script for a shell: `gpu-mem-track completions bash >
    /// ~/.local/share/bash-completion/completions/gpu-mem-track`.
    Completions {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
}

/// `timeline` of a snapshot pickle: the options that apply to it.
#[derive(Parser)]
#[command(name = "gpu-mem-track timeline")]
struct PickleTimeline {
    #[command(flatten)]
    verbosity: crate::VerbosityArgs,
    /// The snapshot pickle.
    snapshot: PathBuf,
    /// Output: `.svg`, `.png`, `.json`, or `.pickle` (a memory snapshot laid out by the caching
    /// allocator model, for memory_viz).
    #[arg(short, long)]
    output: PathBuf,
    /// Ignored for a pickle (its events carry their own phases).
    #[arg(long)]
    mode: Option<String>,
}

/// A sampling interval: a duration of at least 1 ms (0 would write samples as fast as the disk
/// takes them).
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!("{s:?} is shorter than 1ms"));
    }
    Ok(d)
}

/// `250ms`, `2s`, `1.5s`, `10m`, `1h`; a bare number is seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 500ms, 2s or 10m"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?} (use ms, s, m or h)")),
    };
    // A century is more than any run; beyond it Duration cannot hold the value.
    const MAX_SECS: f64 = 100.0 * 365.0 * 86400.0;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a valid duration"));
    }
    if secs > MAX_SECS {
        return Err(format!("{s:?} is longer than 100 years"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// Runs `gpu-mem-track-estimate <subcommand> <args>`: the one beside this binary, else the one on
/// PATH. Replaces this process, so exit codes and signals are the other binary's.
fn run_estimate_binary(subcommand: &str, args: &[OsString]) -> Result<()> {
    let beside = std::env::current_exe().ok().map(|exe| exe.with_file_name(ESTIMATE_BINARY));
    let program = beside.filter(|p| p.is_file()).map_or_else(|| OsString::from(ESTIMATE_BINARY), Into::into);
    // Answered here, from the definitions that binary parses: also where it is not installed.
    let long = args.iter().any(|a| a == "--help");
    if (long || args.iter().any(|a| a == "-h")) && crate::model_args::print_help(subcommand, long) {
        return Ok(());
    }
    let mut command = Process::new(&program);
    command.arg(subcommand).args(args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = command.exec();
        bail!(
            "cannot run {} ({e}); `estimate`, `fit` and `timeline MODEL` need libtorch: \
             `cargo install gpu-mem-track-cli --features estimate` installs {ESTIMATE_BINARY} (with a libtorch: see its README)",
            Path::new(&program).display()
        )
    }
    #[cfg(not(unix))]
    {
        let status = command.status().with_context(|| format!("cannot run {ESTIMATE_BINARY}"))?;
        std::process::exit(status.code().unwrap_or(1))
    }
}

fn report(logs: &[PathBuf], json: bool, top: usize) -> Result<()> {
    // Streams each file: memory stays bounded for logs of any length.
    let combined = analyse_files(logs, top)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&combined)?);
    } else {
        print!("{}", render_text(&combined));
    }
    Ok(())
}

fn plot(log: &Path, output: &Path, title: Option<String>) -> Result<()> {
    let title = title
        .unwrap_or_else(|| log.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default());
    // Streams the log; the warnings come back summarised (the first few, then a count).
    for w in plot_log_file(log, &title, output)? {
        crate::warn(w);
    }
    crate::note(format_args!("wrote {}", output.display()));
    Ok(())
}

/// Whether `timeline`'s input is a snapshot `.pickle` (read here) rather than a model (the
/// estimate binary's). The output does not count: `-o x.pickle` is written from either.
fn reads_a_snapshot(args: &[OsString]) -> bool {
    let mut after_output = false;
    args.iter().map(|a| a.to_string_lossy()).any(|a| {
        let input = !std::mem::take(&mut after_output) && !a.starts_with('-') && a.ends_with(".pickle");
        after_output = a == "-o" || a == "--output";
        input
    })
}

/// `timeline`: a snapshot pickle is drawn here; a model goes to the estimate binary.
fn timeline(args: &[OsString]) -> Result<()> {
    if !reads_a_snapshot(args) {
        return run_estimate_binary("timeline", args);
    }
    // Not parse_from: a usage error must not end a host process (the Python package's).
    let t = match PickleTimeline::try_parse_from(
        std::iter::once(OsString::from("timeline")).chain(args.iter().cloned()),
    ) {
        Ok(t) => t,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help
            return Ok(());
        }
        Err(e) => {
            // clap's text up to its usage line, on one line.
            let text = e.to_string();
            let said: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.starts_with("Usage:"))
                .filter(|l| !l.is_empty())
                .collect();
            bail!("timeline: {}", said.join(" ").trim_start_matches("error: "))
        }
    };
    let kind = crate::TimelineOutput::of(&t.output)?;
    let trace = read_snapshot_trace(&t.snapshot)?;
    let title = t.snapshot.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    crate::write_timeline(&trace, kind, &title, serde_json::Value::Null, &t.output)
}

fn watch(cfg: WatchConfig, simulate: Option<u32>) -> Result<()> {
    let mut source: Box<dyn NvmlSource> = match simulate {
        Some(n) => Box::new(SimulatedNvml::new(n)),
        None => Box::new(NvmlReader::open().context("watch needs NVML (an NVIDIA driver)")?),
    };
    std::fs::create_dir_all(&cfg.log_dir).with_context(|| format!("--log-dir {}", cfg.log_dir.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("cannot install signal handlers")?;
    }
    crate::note(format_args!(
        "watching GPU {} every {:?} into {} (Ctrl-C to stop)",
        cfg.device,
        cfg.interval,
        cfg.log_dir.display()
    ));
    let summary = run_watch(source.as_mut(), &cfg, &stop)?;
    let why = match summary.stopped_by {
        StopReason::Duration => "duration reached",
        StopReason::Samples => "sample count reached",
        StopReason::Stopped => "stopped",
    };
    crate::note(format_args!("{} samples ({why}); files:", summary.samples));
    for f in &summary.files {
        crate::note(format_args!("  {}", f.display()));
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    cli.verbosity.apply();
    // The binary that runs models gets the same -q/-v.
    let handed = |args: Vec<OsString>| [cli.verbosity.as_args(), args].concat();
    match cli.command {
        Command::Report { logs, json, top } => report(&logs, json, top),
        Command::Plot { log, output, title } => plot(&log, &output, title),
        Command::Estimate { args } => run_estimate_binary("estimate", &handed(args)),
        Command::Fit { args } => run_estimate_binary("fit", &handed(args)),
        Command::Timeline { args } => timeline(&handed(args)),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "gpu-mem-track", &mut std::io::stdout());
            Ok(())
        }
        Command::Watch {
            device,
            pids,
            all,
            interval,
            duration,
            samples,
            log_dir,
            prefix,
            rotate_size,
            simulate_nvml,
        } => {
            let target = if all {
                WatchTarget::AllProcesses
            } else if pids.is_empty() {
                WatchTarget::Device
            } else {
                WatchTarget::Pids(pids)
            };
            let cfg = WatchConfig {
                device,
                target,
                interval,
                duration,
                max_samples: samples,
                log_dir,
                prefix,
                rotate_bytes: rotate_size,
            };
            watch(cfg, simulate_nvml)
        }
    }
}

/// Runs the command line on `args` (the program name first, as `std::env::args_os` gives it) and
/// returns the exit code: 0 success (and `--help`), 1 an error (one line on stderr), 2 usage. Never
/// exits the process, so a host process (the Python package's `python -m gpu_mem_track`) goes on.
pub fn run_from<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => crate::exit_status(run(cli)),
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors go to stderr.
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_reads_a_snapshot_named_as_its_input_not_as_its_output() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(reads_a_snapshot(&args(&["run.pickle", "-o", "t.png"])));
        assert!(reads_a_snapshot(&args(&["-o", "again.pickle", "run.pickle"])));
        assert!(!reads_a_snapshot(&args(&["m.pt", "--input", "1x3x8x8", "-o", "t.pickle"])));
        assert!(!reads_a_snapshot(&args(&["--output", "t.pickle", "m.pt"])));
    }

    #[test]
    fn durations_parse_with_units_and_refuse_the_rest() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "ms", "-1s", "1d", "1e400s", "NaNs", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_interval("0s").unwrap_err().contains("shorter than 1ms"));
        assert_eq!(parse_interval("1ms"), Ok(Duration::from_millis(1)));
    }

    proptest::proptest! {
        #[test]
        fn any_text_gives_a_duration_or_an_error_never_a_panic(s in "\\PC{0,40}") {
            let _ = parse_duration(&s);
            let _ = parse_interval(&s);
        }

        #[test]
        fn whole_milliseconds_round_trip(ms in 0u64..=(100 * 365 * 86_400_000u64)) {
            // Through seconds as f64: exact to well under a microsecond at any length up to a century.
            let d = parse_duration(&format!("{ms}ms")).expect("a valid duration");
            let want = Duration::from_millis(ms);
            proptest::prop_assert!(d.abs_diff(want) < Duration::from_micros(1), "{d:?} vs {want:?}");
        }
    }
}
