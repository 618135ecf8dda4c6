//! `gpu-mem-track-estimate`: the half of the `gpu-mem-track` command line that runs models and
//! so links libtorch: `estimate` and `timeline` of a model. `gpu-mem-track` runs it for those
//! subcommands; it can also be called directly.
//!
//! Exit codes: 0 success, 1 error (one line on stderr naming the file or option), 2 usage.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand, ValueEnum};
use gpu_mem_track::history::read_snapshot_trace;
use gpu_mem_track::log::GroupLine;
use gpu_mem_track_estimate::fit::{budget, fit_torchscript, parse_memory_size, FitDimension, FitProbe};
use gpu_mem_track_estimate::gpu_runtime::{place_runtime_allocations, with_workspaces, RuntimeSizes};
use gpu_mem_track_estimate::profile::{self, DeviceProfile};
use gpu_mem_track_estimate::report::{
    estimate_json, gpu_predictions, mib, EstimateSummary, FitReport, GpuTable, PeakBreakdown, PeakTensors,
    RankReport,
};
use gpu_mem_track_estimate::sharding::{per_rank_trace, Parallelism, Shard, TrainingPrecision};
use gpu_mem_track_estimate::Error;
use gpu_mem_track_estimate::{
    estimate_progress, estimate_static, estimate_torchscript_traced, estimate_torchscript_with_peak_tensors,
    Estimate, EstimateDevice, EstimateOptions, Lifetimes, Mode, Optimizer, Trace,
};

#[derive(Parser)]
#[command(
    name = "gpu-mem-track",
    bin_name = "gpu-mem-track",
    version,
    about = "Where does the GPU memory of a tch program go? (the commands that run models)"
)]
struct Cli {
    #[command(flatten)]
    verbosity: gpu_mem_track_cli::VerbosityArgs,
    #[command(subcommand)]
    command: Command,
}

/// Inference (no grad) or training steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// A no-grad forward.
    Inference,
    /// Forward, backward, optimizer step; twice.
    Train,
}

/// How the estimate is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Method {
    /// Run the model on the meta device.
    Meta,
    /// Analyse the TorchScript graph (inference only).
    Static,
    /// Run both and compare.
    Both,
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RunOn {
    /// Shapes only, fast.
    Meta,
    /// Real compute, to check an estimate.
    Cpu,
}

impl From<RunOn> for EstimateDevice {
    fn from(r: RunOn) -> Self {
        match r {
            RunOn::Meta => EstimateDevice::Meta,
            RunOn::Cpu => EstimateDevice::Cpu,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Estimate the memory of a model file without a GPU (runs it on the meta device).
    Estimate(EstimateArgs),
    /// The largest batch (or sequence length, `--vary seq`) of a model file that fits a GPU,
    /// for inference or a training step: a search over meta runs, each judged on the high end of
    /// its GPU prediction (nvidia-smi with the largest plausible cuDNN workspaces).
    Fit(FitArgs),
    /// Memory over an estimated run by category (parameters, gradients, optimizer state, input,
    /// activations, temporaries): a stacked-area `.svg`/`.png`, or `.json`. Given a snapshot
    /// `.pickle` (`MemTracker::dump_snapshot`, `estimate --snapshot`, or PyTorch's own) instead
    /// of a model, draws its recorded allocations.
    #[command(mut_arg("input", |a| a.required(false).help(
        "Input shape, batch first: `16x3x224x224` (required for a model, not for a snapshot `.pickle`)"
    )))]
    Timeline {
        #[command(flatten)]
        model: ModelArgs,
        /// inference or train (forward, backward, optimizer step; twice).
        #[arg(long, value_enum, default_value_t = ModeArg::Train)]
        mode: ModeArg,
        /// Draw the run on this GPU, with the cuBLAS and cuBLASLt workspaces its matmuls take (the
        /// `workspace` category): `auto` (the GPU libtorch sees, else `rtx4090`), a preset such as
        /// `h100-80g`, a profile `.json`, or `none` (the meta run alone).
        #[arg(long, default_value = profile::AUTO)]
        device_profile: String,
        /// Output: `.svg`, `.png`, `.json`, or `.pickle` (a memory snapshot laid out by the
        /// caching allocator model, for memory_viz).
        #[arg(short, long)]
        output: PathBuf,
    },
}

/// `fit`: the options of the search.
#[derive(clap::Args)]
struct FitArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// inference or train (forward, backward, optimizer step; twice).
    #[arg(long, value_enum, default_value_t = ModeArg::Train)]
    mode: ModeArg,
    /// The input dimension to vary: batch (the first) or seq (the second, tokens).
    #[arg(long, value_enum, default_value_t = FitDimension::Batch)]
    vary: FitDimension,
    /// The GPU: `auto` (the GPU libtorch sees, else `rtx4090`), a preset (`a100-80g`, `h100-80g`,
    /// `rtx4090`, `l4`, `t4`, ...) or a profile `.json`.
    #[arg(long, default_value = profile::AUTO)]
    device_profile: String,
    /// Device memory to fit in instead of the profile's, e.g. `24GiB`, `16000MiB`, `40GB`.
    #[arg(long, value_parser = parse_memory_size)]
    gpu_mem: Option<u64>,
    /// The largest size to try.
    #[arg(long, default_value_t = 1 << 16, value_parser = clap::value_parser!(i64).range(1..=1 << 40))]
    max: i64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The model and run shared by `estimate`, `fit` and `timeline`.
#[derive(clap::Args)]
struct ModelArgs {
    /// Model file: a `torch.export` program (`.pt2`, `torch.export.save(torch.export.export(model,
    /// (x,)), "model.pt2")`, exported for the --input shape) or TorchScript (`.pt`,
    /// `torch.jit.script(model).save(...)`, the older format).
    model: PathBuf,
    /// Input shape, batch first: `16x3x224x224`.
    #[arg(long, value_parser = parse_shape, required = true)]
    input: Option<Shape>,
    /// The input is integer token ids (int64), e.g. for language models.
    #[arg(long)]
    ids: bool,
    /// Optimizer for --mode train: sgd, momentum, adam or adamw.
    #[arg(long, value_enum, default_value_t = Optimizer::Adam)]
    optimizer: Optimizer,
    /// When values of a TorchScript model are freed: torchscript (after their last use, as a tch
    /// `CModule` runs the model) or eager (as eager Python PyTorch: locals until rebound or
    /// `forward` returns, call inputs until the call returns). A `.pt2` program runs op by op as
    /// eager PyTorch does, each value freed after its last use, whichever is given.
    #[arg(long, value_enum, default_value_t = Lifetimes::TorchScript)]
    lifetimes: Lifetimes,
    /// The dtype the model runs in: fp32, fp16 or bf16 (parameters, gradients, optimizer state,
    /// float inputs and activations), or amp-bf16 / amp-fp16 (mixed precision: low-precision
    /// weights and activations, fp32 master weights and optimizer state; figures per rank).
    /// `--dtype` is another name for it.
    #[arg(long, alias = "dtype", value_enum, default_value_t = TrainingPrecision::Fp32)]
    precision: TrainingPrecision,
    /// Data-parallel ranks (GPUs) sharing the model states; figures are per rank.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    world_size: u64,
    /// How ranks share model states: none (DDP), zero1, zero2, or zero3 (FSDP full shard).
    #[arg(long, value_enum, default_value_t = Shard::None)]
    shard: Shard,
}

impl ModelArgs {
    fn options(&self, mode: ModeArg, device: EstimateDevice) -> EstimateOptions {
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
            precision: self.precision.working(),
            mode: match mode {
                ModeArg::Train => Mode::Train(self.optimizer),
                ModeArg::Inference => Mode::Inference,
            },
            device,
            lifetimes: self.lifetimes,
        }
    }
}

impl ModelArgs {
    /// The data-parallel job, when one was described (else figures are for one process).
    fn parallelism(&self) -> Option<Parallelism> {
        let asked = self.precision.mixed() || self.world_size > 1 || self.shard != Shard::None;
        asked.then_some(Parallelism {
            world_size: self.world_size,
            shard: self.shard,
            precision: self.precision,
        })
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

/// A bar (`len` steps) or a spinner on stderr with `prefix`, ticking on its own; `None` when
/// stderr is not a terminal (a pipe or a log gets no progress lines).
fn progress(prefix: String, len: Option<u64>) -> Option<indicatif::ProgressBar> {
    if !gpu_mem_track_cli::shows_progress() {
        return None;
    }
    let (bar, style) = match len {
        Some(n) => (
            indicatif::ProgressBar::new(n),
            indicatif::ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})",
            )
            .map(|s| s.progress_chars("=> ")),
        ),
        None => (
            indicatif::ProgressBar::new_spinner(),
            indicatif::ProgressStyle::with_template("{spinner} {prefix}: {msg} ({elapsed})"),
        ),
    };
    bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar.set_prefix(prefix);
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

/// Runs an estimate with a progress bar of its phases on stderr when it is a terminal.
fn with_progress<T: Send>(message: String, mode: Mode, f: impl FnOnce() -> T + Send) -> T {
    let Some(bar) = progress(message, Some(estimate_progress(mode).1)) else {
        return f();
    };
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

/// `estimate`: its options.
#[derive(clap::Args)]
struct EstimateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// inference (no grad) or train (forward, backward, optimizer step; twice).
    #[arg(long, value_enum, default_value_t = ModeArg::Train)]
    mode: ModeArg,
    /// The GPU whose figures to show: `auto` (the GPU libtorch sees, else `rtx4090`), a preset
    /// (`a100-80g`, `h100-80g`, `rtx4090`, `l4`, `t4`, ...) or a profile `.json`; `all` (which
    /// presets the run fits), `cuda` (the caching-allocator prediction alone) or `none` (tensor
    /// bytes only). A run that does not fit a GPU is told the first allocation that would raise a
    /// CUDA out-of-memory error there.
    #[arg(long, default_value = profile::AUTO)]
    device_profile: String,
    /// Device memory instead of the profile's, e.g. `24GiB`, `16000MiB`, `40GB` (with a
    /// `--device-profile` naming one GPU).
    #[arg(long, value_parser = parse_memory_size)]
    gpu_mem: Option<u64>,
    /// Run on the CPU when an op has no meta kernel (slow: real compute).
    #[arg(long)]
    allow_cpu: bool,
    /// meta: run the model on the meta device; static: analyse the TorchScript graph (inference
    /// only); both: run both and compare.
    #[arg(long, value_enum, default_value_t = Method::Meta)]
    method: Method,
    /// Where to run: meta (shapes only, fast) or cpu (real compute, to check an estimate).
    #[arg(long, value_enum, default_value_t = RunOn::Meta)]
    run_on: RunOn,
    /// Also write the simulated trace as a PyTorch memory snapshot (open it in memory_viz).
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A run's estimate, its trace, and (when asked for) the live tensors at its peak, from that run.
type Run = (Estimate, Trace, Option<Vec<GroupLine>>);

/// Runs the meta (or CPU) estimate with a progress bar, retrying on the CPU when asked to; with the
/// live tensors at the peak when `peak_tensors`.
fn run_model(args: &EstimateArgs, options: &mut EstimateOptions, peak_tensors: bool) -> Result<Run> {
    let model = &args.model.model;
    let run = |options: &EstimateOptions| -> gpu_mem_track_estimate::Result<Run> {
        if peak_tensors {
            let (e, trace, groups) = estimate_torchscript_with_peak_tensors(model, options)?;
            Ok((e, trace, Some(groups)))
        } else {
            let (e, trace) = estimate_torchscript_traced(model, options)?;
            Ok((e, trace, None))
        }
    };
    let label = format!("estimating {} on {:?}", model.display(), args.run_on).to_lowercase();
    let mut result = with_progress(label, options.mode, || run(options));
    // Ops with no CPU kernel either (`all` names them) cannot run on the CPU: no retry then.
    if let (Err(Error::MissingMetaKernel { op, all }), true) = (&result, args.allow_cpu) {
        if !all.is_empty() {
            return Ok(result?);
        }
        gpu_mem_track_cli::warn(format_args!("{op} has no meta kernel; estimating on the CPU instead"));
        options.device = EstimateDevice::Cpu;
        result = with_progress(format!("estimating {} on the CPU", model.display()), options.mode, || {
            run(options)
        });
    }
    result.map_err(with_flags)
}

/// A library error with the command line's own flags for what it suggests (the library's texts
/// name none: Python and Rust callers have none).
fn with_flags(e: Error) -> anyhow::Error {
    match &e {
        Error::MissingMetaKernel { all, .. } if all.is_empty() => {
            let text = e.to_string();
            anyhow::anyhow!("{}: --run-on cpu, or --allow-cpu)", text.strip_suffix(')').unwrap_or(&text))
        }
        _ => e.into(),
    }
}

fn estimate(args: EstimateArgs) -> Result<()> {
    if args.gpu_mem.is_some() && matches!(args.device_profile.as_str(), "cuda" | "none" | "all") {
        use clap::CommandFactory;
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--gpu-mem replaces the memory of one GPU profile: add --device-profile NAME (t4, rtx4090, ...)",
            )
            .exit()
    }
    let mut options = args.model.options(args.mode, args.run_on.into());
    let model = args.model.model.clone();
    if args.method != Method::Meta && matches!(options.mode, Mode::Train(_)) {
        bail!("--method {:?} estimates inference only; use --mode inference or --method meta", args.method);
    }
    let static_estimate =
        if args.method == Method::Meta { None } else { Some(estimate_static(&model, &options)?) };
    if let (Method::Static, Some(s)) = (args.method, &static_estimate) {
        if args.json {
            println!("{}", serde_json::to_string_pretty(s)?);
        } else {
            print!("{} {s}", model.display());
        }
        return Ok(());
    }
    let (e, trace, peak_groups) = run_model(&args, &mut options, !args.json)?;
    // A data-parallel job: the GPU figures are one rank's.
    let rank = args.model.parallelism().map(|p| per_rank_trace(&trace, args.model.optimizer, &p));
    let gpu_trace = rank.as_ref().map_or(&trace, |(t, _)| t);
    let rank_report = rank.as_ref().map(|(t, plan)| RankReport::new(t, *plan));
    let gpus = gpu_predictions(&args.device_profile, args.gpu_mem, gpu_trace)?;
    let gpu = (args.device_profile != "all").then(|| gpus.first()).flatten();
    if let Some(path) = &args.snapshot {
        gpu_trace.dump_snapshot(path)?;
        gpu_mem_track_cli::note(format_args!("wrote {}", path.display()));
    }
    if args.json {
        let v = estimate_json(&e, rank_report.as_ref(), &gpus, gpu.is_some(), static_estimate.as_ref())?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print!("{}", EstimateSummary { model: &model, estimate: &e, with_cuda: args.device_profile != "none" });
    print!("{}", PeakBreakdown { estimate: &e, trace: &trace });
    // On the CPU, oneDNN's own allocations are in the peak but not in the registry.
    if let (Some(groups), EstimateDevice::Meta) = (&peak_groups, e.options.device) {
        print!("{}", PeakTensors { groups, estimate: &e });
    }
    if let Some(r) = &rank_report {
        print!("{r}");
    }
    match gpu {
        Some(g) => print!("{g}"),
        None if !gpus.is_empty() => print!("{}", GpuTable(&gpus)),
        None => {}
    }
    if let Some(s) = &static_estimate {
        print!("{} {s}", model.display());
        let (a, b) = (e.activation_peak() as f64, s.activation_peak as f64);
        println!(
            "  comparison: activation peak meta {} vs static {} ({:+.1} %)",
            mib(e.activation_peak()),
            mib(s.activation_peak),
            if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 }
        );
    }
    Ok(())
}

fn timeline(args: ModelArgs, mode: ModeArg, device_profile: Option<&str>, output: &Path) -> Result<()> {
    let kind = gpu_mem_track_cli::TimelineOutput::of(output)?;
    let model = args.model.clone();
    let name = model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let (estimate, mut trace, mut title) = if model.extension().is_some_and(|x| x == "pickle") {
        (None, read_snapshot_trace(&model)?, name)
    } else {
        let options = args.options(mode, EstimateDevice::Meta);
        let (e, trace) = with_progress(format!("estimating {}", model.display()), options.mode, || {
            estimate_torchscript_traced(&model, &options)
        })?;
        let title = format!("{name} {:?}", e.options.input_shape);
        (Some(e), trace, title)
    };
    // One rank's memory, as `estimate` gives its figures, when sharding or precision was asked for.
    if let Some(p) = args.parallelism() {
        trace = per_rank_trace(&trace, args.optimizer, &p).0;
        title = format!("{title}, one of {} ranks ({:?}, {:?})", p.world_size, p.shard, p.precision);
    }
    if let Some(name) = device_profile {
        let profile = DeviceProfile::find(name)?;
        let workspace_config = std::env::var("CUBLAS_WORKSPACE_CONFIG").ok();
        let sizes = RuntimeSizes {
            cublas_workspace: profile.cublas_workspace_bytes(workspace_config.as_deref()),
            cublaslt_workspace: gpu_mem_track_estimate::profile::cublaslt_workspace_bytes(
                std::env::var("CUBLASLT_WORKSPACE_SIZE").ok().as_deref(),
                std::env::var("TORCH_CUBLASLT_UNIFIED_WORKSPACE").ok().as_deref(),
            ),
            // Their sizes are cuDNN's choice on the GPU: a timeline draws what is known.
            cudnn_workspaces: false,
        };
        trace = with_workspaces(&trace, &place_runtime_allocations(&trace, sizes));
        title = format!("{title} on {}", profile.name);
    }
    gpu_mem_track_cli::write_timeline(&trace, kind, &title, serde_json::to_value(&estimate)?, output)
}

fn run(cli: Cli) -> Result<()> {
    cli.verbosity.apply();
    match cli.command {
        Command::Estimate(args) => estimate(args),
        Command::Timeline { model, mode, device_profile, output } => {
            timeline(model, mode, Some(device_profile.as_str()).filter(|p| *p != "none"), &output)
        }
        Command::Fit(args) => fit(args),
    }
}

fn fit(args: FitArgs) -> Result<()> {
    let options = args.model.options(args.mode, EstimateDevice::Meta);
    let gpu = budget(&DeviceProfile::find(&args.device_profile)?, args.gpu_mem);
    let parallelism = args.model.parallelism();
    let model = &args.model.model;
    let bar = progress(format!("fitting {} on {}", model.display(), gpu.name), None);
    let dim = serde_json::to_value(args.vary)?.as_str().unwrap_or("").to_owned();
    let mut tried = 0;
    let show = |p: &FitProbe| {
        tried += 1;
        if let Some(bar) = &bar {
            let verdict = if p.fits { "fits" } else { "too large" };
            bar.set_message(format!("probe {tried}: {dim} {} needs {} ({verdict})", p.value, mib(p.needed)));
        }
    };
    let result = fit_torchscript(model, &options, args.vary, &gpu, parallelism.as_ref(), args.max, show);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let r = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print!("{}", FitReport { model, result: &r });
    Ok(())
}

fn main() -> ExitCode {
    gpu_mem_track_cli::exit_code(run(Cli::parse())) // usage errors exit with 2
}
