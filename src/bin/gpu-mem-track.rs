//! The `gpu-mem-track` command line: `report`, `plot`, `watch`, `estimate` and `timeline`.
//!
//! Exit codes: 0 success, 1 error (one line on stderr naming the file or option), 2 usage.
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use gpu_mem_track::estimate::profile::{predict, DeviceProfile, GpuPrediction};
use gpu_mem_track::estimate::{
    estimate_progress, estimate_static, estimate_torchscript_traced, peak_tensors, Estimate, EstimateDevice,
    EstimateOptions, Lifetimes, Mode, Optimizer, Precision, StaticEstimate, Trace,
};
use gpu_mem_track::history::read_snapshot_trace;
use gpu_mem_track::log::{parse_log_lenient, ParsedLog};
use gpu_mem_track::nvml::NvmlReader;
use gpu_mem_track::plot::{plot_log, plot_timeline};
use gpu_mem_track::report::{analyse, combine, render_text};
use gpu_mem_track::watch::{run_watch, StopReason, WatchConfig, WatchTarget};
use gpu_mem_track::Error;

#[derive(Parser)]
#[command(name = "gpu-mem-track", version, about = "Where does the GPU memory of a tch program go?")]
struct Cli {
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
    /// Estimate the memory of a TorchScript model without a GPU (runs it on the meta device).
    Estimate {
        #[command(flatten)]
        model: ModelArgs,
        /// inference (no grad) or train (forward, backward, optimizer step; twice).
        #[arg(long, default_value = "inference", value_parser = ["inference", "train"])]
        mode: String,
        /// Show the CUDA caching-allocator prediction (`cuda`), a GPU's figures (a preset such as
        /// `a100-80g`, `h100-80g`, `rtx4090`, `l4`, `t4`, or a profile `.json`), or only tensor
        /// bytes (`none`).
        #[arg(long, default_value = "cuda")]
        device_profile: String,
        /// Run on the CPU when an op has no meta kernel (slow: real compute).
        #[arg(long)]
        allow_cpu: bool,
        /// meta: run the model on the meta device; static: analyse the TorchScript graph (inference
        /// only); both: run both and compare.
        #[arg(long, default_value = "meta", value_parser = ["meta", "static", "both"])]
        method: String,
        /// Where to run: meta (shapes only, fast) or cpu (real compute, to check an estimate).
        #[arg(long, default_value = "meta", value_parser = ["meta", "cpu"])]
        run_on: String,
        /// Also write the simulated trace as a PyTorch memory snapshot (open it in memory_viz).
        #[arg(long)]
        snapshot: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Memory over an estimated run by category (parameters, gradients, optimizer state, input,
    /// activations, temporaries): a stacked-area `.svg`/`.png`, or `.json`. Given a snapshot
    /// `.pickle` (`MemTracker::dump_snapshot`, `estimate --snapshot`, or PyTorch's own) instead
    /// of a model, draws its recorded allocations.
    Timeline {
        #[command(flatten)]
        model: ModelArgs,
        /// inference or train.
        #[arg(long, default_value = "train", value_parser = ["inference", "train"])]
        mode: String,
        /// Output: `.svg`, `.png` or `.json`.
        #[arg(short, long)]
        output: PathBuf,
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
        /// Time between samples, e.g. `500ms`, `2s`.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
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
        /// Start a new file when the current one reaches this many bytes.
        #[arg(long)]
        rotate_bytes: Option<u64>,
    },
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
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The model and run shared by `estimate` and `timeline`.
#[derive(clap::Args)]
struct ModelArgs {
    /// TorchScript model file (`torch.jit.script(model).save(...)`).
    model: PathBuf,
    /// Input shape, batch first: `16x3x224x224` (required to run a model).
    #[arg(long, value_parser = parse_shape)]
    input: Option<Shape>,
    /// The input is integer token ids (int64), e.g. for language models.
    #[arg(long)]
    ids: bool,
    /// Precision of parameters and input: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: Precision,
    /// Optimizer for --mode train: sgd, momentum, adam or adamw.
    #[arg(long, default_value = "adam")]
    optimizer: Optimizer,
    /// When values are freed: torchscript (after their last use, as a tch `CModule` runs the
    /// model) or eager (as eager Python PyTorch: locals until rebound or `forward` returns, call
    /// inputs until the call returns).
    #[arg(long, default_value = "torchscript")]
    lifetimes: Lifetimes,
}

impl ModelArgs {
    fn options(&self, mode: &str, device: EstimateDevice) -> EstimateOptions {
        let Some(input) = &self.input else {
            use clap::CommandFactory;
            Cli::command()
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "running a model needs --input <SHAPE>",
                )
                .exit()
        };
        EstimateOptions {
            input_shape: input.0.clone(),
            input_is_index: self.ids,
            precision: self.dtype,
            mode: if mode == "train" { Mode::Train(self.optimizer) } else { Mode::Inference },
            device,
            lifetimes: self.lifetimes,
        }
    }
}

/// An input shape from the command line.
#[derive(Debug, Clone)]
struct Shape(Vec<i64>);

/// `16x3x224x224` (also `16,3,224,224`).
fn parse_shape(s: &str) -> Result<Shape, String> {
    let dims: Result<Vec<i64>, _> = s.split(['x', 'X', ',']).map(|d| d.trim().parse::<i64>()).collect();
    match dims {
        Ok(d) if !d.is_empty() && d.iter().all(|&x| x > 0) => Ok(Shape(d)),
        _ => Err(format!("{s:?} is not a shape like 16x3x224x224")),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

fn print_estimate(e: &Estimate, model: &Path, cuda: bool) {
    let o = &e.options;
    let mode = match o.mode {
        Mode::Inference => "inference".to_owned(),
        Mode::Train(opt) => format!("train ({opt:?})"),
    };
    println!(
        "{}: input {:?} {:?}, {mode}, on {:?} in {:.2} s",
        model.display(),
        o.input_shape,
        o.precision,
        o.device,
        e.seconds
    );
    println!(
        "  parameters   {} ({} elements); buffers {}; input {}",
        mib(e.param_bytes),
        e.param_count,
        mib(e.buffer_bytes),
        mib(e.input_bytes)
    );
    if matches!(o.mode, Mode::Train(_)) {
        println!("  gradients    {}; optimizer state {}", mib(e.grad_bytes), mib(e.optimizer_state_bytes));
    }
    println!("  live after forward {}; forward peak {}", mib(e.live_after_forward), mib(e.forward_peak));
    println!(
        "  peak         {} ({} bytes) in {} (iteration {}) at {}",
        mib(e.peak.bytes),
        e.peak.bytes,
        e.peak.phase,
        e.peak.iteration,
        e.peak.op
    );
    for p in &e.phases {
        println!("    iteration {} {:<15} peak {}", p.iteration, p.phase.to_string(), mib(p.peak_bytes));
    }
    if cuda {
        println!(
            "  CUDA caching allocator model: peak allocated {}, peak reserved {} ({} segments)",
            mib(e.cuda.peak_allocated),
            mib(e.cuda.peak_reserved),
            e.cuda.segment_allocs
        );
    }
}

/// What the peak is made of: categories of the live tensors, then what a GPU adds.
fn print_peak_breakdown(e: &Estimate, trace: &Trace, gpu: Option<&GpuPrediction>) {
    let Some(peak) = trace.peak() else { return };
    let parts: Vec<String> =
        peak.bytes.iter().filter(|(_, b)| *b > 0).map(|(c, b)| format!("{} {}", c.name(), mib(*b))).collect();
    println!("  at the peak: {}", parts.join(", "));
    let rounding = e.cuda.peak_allocated.saturating_sub(e.peak.bytes);
    let cached = e.cuda.peak_reserved.saturating_sub(e.cuda.peak_allocated);
    let workspace = gpu.map_or(String::new(), |g| format!("cuBLAS workspace {}, ", mib(g.cublas_workspace)));
    println!(
        "  on a GPU add: {workspace}allocator rounding {}, cached/fragmented segments {}",
        mib(rounding),
        mib(cached)
    );
}

fn print_gpu(g: &GpuPrediction) {
    let range = |r: gpu_mem_track::estimate::profile::Range| {
        if r.low == r.high {
            mib(r.low)
        } else {
            format!("{} - {}", mib(r.low), mib(r.high))
        }
    };
    let p = &g.profile;
    println!(
        "  on {} ({:.0} GiB, sm {}.{}; cuBLAS workspace {}; range = without / with the largest plausible cuDNN workspace):",
        p.name,
        p.memory_bytes as f64 / (1u64 << 30) as f64,
        p.compute_capability.0,
        p.compute_capability.1,
        mib(g.cublas_workspace)
    );
    println!("    peak allocated   {}", range(g.peak_allocated));
    println!("    peak reserved    {}", range(g.peak_reserved));
    println!(
        "    nvidia-smi       {}  (reserved + {} CUDA context and libraries, a per-GPU constant){}",
        range(g.nvidia_smi),
        mib(p.context_bytes),
        if g.fits { "" } else { "  -> does NOT fit" }
    );
}

fn print_static(s: &StaticEstimate, model: &Path) {
    println!(
        "{} (static, {} graph nodes, {:.3} s): activation peak {} at {}; parameters {}{}",
        model.display(),
        s.nodes,
        s.seconds,
        mib(s.activation_peak),
        s.peak_op,
        mib(s.param_bytes),
        if s.unknown_shapes > 0 {
            format!("; {} tensors of unknown shape left out", s.unknown_shapes)
        } else {
            String::new()
        }
    );
}

/// Runs an estimate with a progress bar of its phases on stderr when it is a terminal.
fn with_progress<T: Send>(message: String, mode: Mode, f: impl FnOnce() -> T + Send) -> T {
    if !std::io::stderr().is_terminal() {
        return f();
    }
    let (_, total, _) = estimate_progress(mode);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(message);
    bar.enable_steady_tick(Duration::from_millis(100));
    let done = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (pos, _, what) = estimate_progress(mode);
                bar.set_position(pos);
                bar.set_message(what);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = f();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    bar.finish_and_clear();
    out
}

/// Reads a log leniently: bad lines become report entries; a file that is not a log is an error.
fn read_log(path: &Path) -> Result<(ParsedLog, Vec<String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let (log, errors) = parse_log_lenient(&text);
    let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    match log {
        Some(log) => Ok((log, errors)),
        None => bail!("{}: {}", path.display(), errors.first().map(String::as_str).unwrap_or("not a log")),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Report { logs, json, top } => {
            let mut reports = Vec::new();
            for path in &logs {
                let (log, errors) = read_log(path)?;
                reports.push(analyse(path, &log, errors, top));
            }
            let combined = combine(reports);
            if json {
                println!("{}", serde_json::to_string_pretty(&combined)?);
            } else {
                print!("{}", render_text(&combined));
            }
        }
        Command::Plot { log, output, title } => {
            let (parsed, errors) = read_log(&log)?;
            for e in &errors {
                eprintln!("warning: skipped {e}");
            }
            let title = title.unwrap_or_else(|| {
                log.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
            });
            plot_log(&parsed, &title, &output)?;
            if std::io::stderr().is_terminal() {
                eprintln!("wrote {}", output.display());
            }
        }
        Command::Estimate {
            model: args,
            mode,
            device_profile,
            allow_cpu,
            method,
            run_on,
            snapshot,
            json,
        } => {
            let mut options =
                args.options(&mode, if run_on == "cpu" { EstimateDevice::Cpu } else { EstimateDevice::Meta });
            let model = args.model;
            if method != "meta" && matches!(options.mode, Mode::Train(_)) {
                bail!("--method {method} estimates inference only; use --mode inference or --method meta");
            }
            let static_estimate =
                if method == "meta" { None } else { Some(estimate_static(&model, &options)?) };
            if method == "static" {
                let s = static_estimate.expect("computed above");
                if json {
                    println!("{}", serde_json::to_string_pretty(&s)?);
                } else {
                    print_static(&s, &model);
                }
                return Ok(());
            }
            let label = format!("estimating {} on {run_on}", model.display());
            let mut result =
                with_progress(label, options.mode, || estimate_torchscript_traced(&model, &options));
            if let (Err(Error::MissingMetaKernel { op }), true) = (&result, allow_cpu) {
                eprintln!("warning: {op} has no meta kernel; estimating on the CPU instead");
                options.device = EstimateDevice::Cpu;
                result =
                    with_progress(format!("estimating {} on the CPU", model.display()), options.mode, || {
                        estimate_torchscript_traced(&model, &options)
                    });
            }
            let (e, trace) = result?;
            let gpu = match device_profile.as_str() {
                "cuda" | "none" => None,
                name => {
                    let profile = DeviceProfile::find(name)?;
                    let config = std::env::var("CUBLAS_WORKSPACE_CONFIG").ok();
                    Some(predict(
                        &profile,
                        e.cuda.peak_allocated,
                        e.cuda.peak_reserved,
                        trace.uses_cublas(),
                        trace.largest_convolution_allocation(),
                        config.as_deref(),
                    ))
                }
            };
            if let Some(path) = &snapshot {
                trace.dump_snapshot(path)?;
            }
            if json {
                let mut v = serde_json::to_value(&e)?;
                if let Some(g) = &gpu {
                    v["gpu"] = serde_json::to_value(g)?;
                }
                if let Some(s) = &static_estimate {
                    v["static"] = serde_json::to_value(s)?;
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_estimate(&e, &model, device_profile != "none");
                print_peak_breakdown(&e, &trace, gpu.as_ref());
                if e.options.device == EstimateDevice::Meta {
                    let groups = peak_tensors(&model, &e)?;
                    println!(
                        "  live tensors at the peak, grouped as in the log ({} groups, largest 12):",
                        groups.len()
                    );
                    for g in groups.iter().take(12) {
                        print!("    {}", gpu_mem_track::log::format::group_line(g));
                    }
                    let seen: f64 = groups.iter().map(|g| g.memory_mib).sum();
                    let unseen = e.peak.bytes as f64 / 1048576.0 - seen;
                    if unseen > 0.05 {
                        println!(
                            "    (+ {unseen:.1} MiB in storages no op-returned tensor holds any more: outputs autograd saved through its own handles)"
                        );
                    }
                }
                if let Some(g) = &gpu {
                    print_gpu(g);
                }
                if let Some(s) = &static_estimate {
                    print_static(s, &model);
                    let (a, b) = (e.activation_peak() as f64, s.activation_peak as f64);
                    println!(
                        "  comparison: activation peak meta {} vs static {} ({:+.1} %)",
                        mib(e.activation_peak()),
                        mib(s.activation_peak),
                        if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 }
                    );
                }
            }
        }
        Command::Timeline { model: args, mode, output } => {
            let model = args.model.clone();
            let name = model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let (estimate, trace, title) = if model.extension().is_some_and(|x| x == "pickle") {
                (None, read_snapshot_trace(&model)?, name)
            } else {
                let options = args.options(&mode, EstimateDevice::Meta);
                let (e, trace) =
                    with_progress(format!("estimating {}", model.display()), options.mode, || {
                        estimate_torchscript_traced(&model, &options)
                    })?;
                let title = format!("{name} {:?}", e.options.input_shape);
                (Some(e), trace, title)
            };
            let is_json = output.extension().is_some_and(|x| x.eq_ignore_ascii_case("json"));
            if is_json {
                let points = trace.timeline();
                let step = (points.len() / 2000).max(1);
                let sampled: Vec<_> = points.iter().step_by(step).collect();
                let v = serde_json::json!({ "estimate": estimate, "peak": trace.peak(), "points": sampled });
                std::fs::write(&output, serde_json::to_string_pretty(&v)?)
                    .with_context(|| format!("cannot write {}", output.display()))?;
            } else {
                plot_timeline(&trace, &title, &output)?;
            }
        }
        Command::Watch { device, pids, all, interval, duration, samples, log_dir, prefix, rotate_bytes } => {
            let target = if all {
                WatchTarget::AllProcesses
            } else if pids.is_empty() {
                WatchTarget::Device
            } else {
                WatchTarget::Pids(pids)
            };
            let mut nvml = NvmlReader::open().context("watch needs NVML (an NVIDIA driver)")?;
            std::fs::create_dir_all(&log_dir).with_context(|| format!("--log-dir {}", log_dir.display()))?;
            let stop = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(signal, Arc::clone(&stop))
                    .context("cannot install signal handlers")?;
            }
            let cfg = WatchConfig {
                device,
                target,
                interval,
                duration,
                max_samples: samples,
                log_dir,
                prefix,
                rotate_bytes,
            };
            if std::io::stderr().is_terminal() {
                eprintln!(
                    "watching GPU {device} every {interval:?} into {} (Ctrl-C to stop)",
                    cfg.log_dir.display()
                );
            }
            let summary = run_watch(&mut nvml, &cfg, &stop)?;
            if std::io::stderr().is_terminal() {
                let why = match summary.stopped_by {
                    StopReason::Duration => "duration reached",
                    StopReason::Samples => "sample count reached",
                    StopReason::Stopped => "stopped",
                };
                eprintln!("{} samples ({why}); files:", summary.samples);
                for f in &summary.files {
                    eprintln!("  {}", f.display());
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse(); // usage errors exit with 2
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::from(1)
        }
    }
}
