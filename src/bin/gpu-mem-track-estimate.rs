//! `gpu-mem-track-estimate`: the half of the `gpu-mem-track` command line that runs models and
//! so links libtorch: `estimate` and `timeline` of a model. `gpu-mem-track` runs it for those
//! subcommands; it can also be called directly.
//!
//! Exit codes: 0 success, 1 error (one line on stderr naming the file or option), 2 usage.
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand, ValueEnum};
use gpu_mem_track::estimate::fit::{
    budget, fit_torchscript, parse_memory_size, FitDimension, FitProbe, FitResult,
};
use gpu_mem_track::estimate::gpu_runtime::replay_with_runtime;
use gpu_mem_track::estimate::profile::{predict, DeviceProfile, GpuPrediction};
use gpu_mem_track::estimate::sharding::{per_rank_trace, Parallelism, RankPlan, Shard, TrainingPrecision};
use gpu_mem_track::estimate::{
    estimate_progress, estimate_static, estimate_torchscript_traced, peak_tensors, Estimate, EstimateDevice,
    EstimateOptions, Lifetimes, Mode, Optimizer, Precision, StaticEstimate, Trace,
};
use gpu_mem_track::history::read_snapshot_trace;
use gpu_mem_track::plot::plot_timeline;
use gpu_mem_track::Error;

#[derive(Parser)]
#[command(
    name = "gpu-mem-track",
    bin_name = "gpu-mem-track",
    version,
    about = "Where does the GPU memory of a tch program go? (the commands that run models)"
)]
struct Cli {
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
    /// Estimate the memory of a TorchScript model without a GPU (runs it on the meta device).
    Estimate {
        #[command(flatten)]
        model: ModelArgs,
        /// inference (no grad) or train (forward, backward, optimizer step; twice).
        #[arg(long, value_enum, default_value_t = ModeArg::Inference)]
        mode: ModeArg,
        /// Show the CUDA caching-allocator prediction (`cuda`), a GPU's figures (a preset such as
        /// `a100-80g`, `h100-80g`, `rtx4090`, `l4`, `t4`, or a profile `.json`), which presets
        /// the run fits (`all`), or only tensor bytes (`none`). A run that does not fit a GPU is
        /// told the first allocation that would raise a CUDA out-of-memory error there.
        #[arg(long, default_value = "cuda")]
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
    },
    /// The largest batch (or sequence length, `--vary seq`) of a TorchScript model that fits a GPU,
    /// for inference or a training step: a search over meta runs, each judged on the high end of
    /// its GPU prediction (nvidia-smi with the largest plausible cuDNN workspaces).
    Fit(FitArgs),
    /// Memory over an estimated run by category (parameters, gradients, optimizer state, input,
    /// activations, temporaries): a stacked-area `.svg`/`.png`, or `.json`. Given a snapshot
    /// `.pickle` (`MemTracker::dump_snapshot`, `estimate --snapshot`, or PyTorch's own) instead
    /// of a model, draws its recorded allocations.
    Timeline {
        #[command(flatten)]
        model: ModelArgs,
        /// inference or train.
        #[arg(long, value_enum, default_value_t = ModeArg::Train)]
        mode: ModeArg,
        /// Output: `.svg`, `.png` or `.json`.
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
    /// The GPU: a preset (`a100-80g`, `h100-80g`, `rtx4090`, `l4`, `t4`, ...) or a profile `.json`.
    #[arg(long, default_value = "rtx4090")]
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
    /// TorchScript model file (`torch.jit.script(model).save(...)`).
    model: PathBuf,
    /// Input shape, batch first: `16x3x224x224` (required to run a model).
    #[arg(long, value_parser = parse_shape)]
    input: Option<Shape>,
    /// The input is integer token ids (int64), e.g. for language models.
    #[arg(long)]
    ids: bool,
    /// Precision of parameters and input: f32, f16 or bf16.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    dtype: Precision,
    /// Optimizer for --mode train: sgd, momentum, adam or adamw.
    #[arg(long, value_enum, default_value_t = Optimizer::Adam)]
    optimizer: Optimizer,
    /// When values are freed: torchscript (after their last use, as a tch `CModule` runs the
    /// model) or eager (as eager Python PyTorch: locals until rebound or `forward` returns, call
    /// inputs until the call returns).
    #[arg(long, value_enum, default_value_t = Lifetimes::TorchScript)]
    lifetimes: Lifetimes,
    /// Training precision: fp32, bf16 (everything bf16), amp-bf16 or amp-fp16 (low-precision
    /// weights and activations, fp32 master weights and optimizer state). Sets the dtype the
    /// model runs in; figures are then given per rank.
    #[arg(long, value_enum, conflicts_with = "dtype")]
    precision: Option<TrainingPrecision>,
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
            precision: self.precision.map_or(self.dtype, TrainingPrecision::working),
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
        let asked = self.precision.is_some() || self.world_size > 1 || self.shard != Shard::None;
        asked.then(|| Parallelism {
            world_size: self.world_size,
            shard: self.shard,
            precision: self.precision.unwrap_or(match self.dtype {
                Precision::F32 => TrainingPrecision::Fp32,
                _ => TrainingPrecision::Bf16,
            }),
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

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

fn print_estimate(e: &Estimate, model: &Path, cuda: bool) {
    let text = e.to_string();
    // The CUDA model's line is the last; `--device-profile none` asks for tensor bytes only.
    let text = if cuda { text.as_str() } else { text.rsplit_once('\n').map_or(text.as_str(), |(a, _)| a) };
    println!("{}: {text}", model.display());
}

/// What the peak is made of: categories of the live tensors, then what a GPU adds.
fn print_peak_breakdown(e: &Estimate, trace: &Trace) {
    let Some(peak) = trace.peak() else { return };
    let parts: Vec<String> =
        peak.bytes.iter().filter(|(_, b)| *b > 0).map(|(c, b)| format!("{} {}", c.name(), mib(*b))).collect();
    println!("  at the peak: {}", parts.join(", "));
    let rounding = e.cuda.peak_allocated.saturating_sub(e.peak.bytes);
    let cached = e.cuda.peak_reserved.saturating_sub(e.cuda.peak_allocated);
    println!(
        "  the caching allocator adds: rounding to blocks {}, cached/fragmented segments {}",
        mib(rounding),
        mib(cached)
    );
}

/// One rank's model states and the caching allocator model's figures for its trace.
fn rank_json(trace: &Trace, plan: &RankPlan) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(plan)?;
    v["cuda"] = serde_json::to_value(replay_with_runtime(trace, &[]))?;
    Ok(v)
}

fn print_rank(trace: &Trace, plan: &RankPlan) {
    let p = &plan.parallelism;
    let s = &plan.model_states;
    let r = replay_with_runtime(trace, &[]);
    println!(
        "  per rank of {} ({}, {}): parameters {}, gradients {}, optimizer state (with fp32 master copies) {}, \
         gathered layer {} ({} parameters in the largest); model states {}",
        p.world_size,
        serde_json::to_value(p.shard).unwrap_or_default().as_str().unwrap_or(""),
        serde_json::to_value(p.precision).unwrap_or_default().as_str().unwrap_or(""),
        mib(s.parameters),
        mib(s.gradients),
        mib(s.optimizer),
        mib(s.gathered_layer),
        plan.largest_layer,
        mib(s.total())
    );
    println!(
        "    caching allocator model per rank: peak allocated {}, peak reserved {}",
        mib(r.peak_allocated),
        mib(r.peak_reserved)
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
        "  on {} ({:.0} GiB, sm {}.{}; cuBLAS workspace {} at the first matmul; range = without / with \
         a cuDNN workspace at each convolution, up to {}):",
        p.name,
        p.memory_bytes as f64 / (1u64 << 30) as f64,
        p.compute_capability.0,
        p.compute_capability.1,
        mib(g.cublas_workspace),
        mib(g.cudnn_workspace_max)
    );
    println!(
        "    baseline allocated {}  (parameters, buffers, input as allocator blocks)",
        mib(g.baseline_allocated)
    );
    println!(
        "    peak allocated   {}  ({} above the baseline)",
        range(g.peak_allocated),
        range(g.peak_delta)
    );
    println!("    peak reserved    {}", range(g.peak_reserved));
    println!(
        "    nvidia-smi       {}  (reserved + {} CUDA context and libraries, a per-GPU constant){}",
        range(g.nvidia_smi),
        mib(p.context_bytes),
        if g.fits { "" } else { "  -> does NOT fit" }
    );
    if !g.fits {
        println!("    {}", oom_verdict(g));
    }
}

/// Where a run that does not fit would fail: the first allocation the caching allocator cannot
/// place once its cache is released, or why none fails.
fn oom_verdict(g: &GpuPrediction) -> String {
    match &g.first_oom {
        Some(oom) => oom.to_string(),
        None => format!(
            "no OOM predicted: the reserved peak keeps freed segments cached, but released under \
             pressure (as PyTorch does before it fails) every allocation is placed within {} usable",
            mib(g.usable_bytes)
        ),
    }
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

/// The `estimate` subcommand's options.
struct EstimateArgs {
    model: ModelArgs,
    mode: ModeArg,
    device_profile: String,
    gpu_mem: Option<u64>,
    allow_cpu: bool,
    method: Method,
    run_on: RunOn,
    snapshot: Option<PathBuf>,
    json: bool,
}

/// Runs the meta (or CPU) estimate with a progress bar, retrying on the CPU when asked to.
fn run_model(args: &EstimateArgs, options: &mut EstimateOptions) -> Result<(Estimate, Trace)> {
    let model = &args.model.model;
    let label = format!("estimating {} on {:?}", model.display(), args.run_on).to_lowercase();
    let mut result = with_progress(label, options.mode, || estimate_torchscript_traced(model, options));
    // Ops with no CPU kernel either (`all` names them) cannot run on the CPU: no retry then.
    if let (Err(Error::MissingMetaKernel { op, all }), true) = (&result, args.allow_cpu) {
        if !all.is_empty() {
            return Ok(result?);
        }
        eprintln!("warning: {op} has no meta kernel; estimating on the CPU instead");
        options.device = EstimateDevice::Cpu;
        result = with_progress(format!("estimating {} on the CPU", model.display()), options.mode, || {
            estimate_torchscript_traced(model, options)
        });
    }
    Ok(result?)
}

/// The figures of the GPU profiles asked for: none for `cuda` (the plain model) or `none`, every
/// preset for `all`; `gpu_mem` replaces the memory of the one profile named.
fn gpu_predictions(device_profile: &str, gpu_mem: Option<u64>, trace: &Trace) -> Result<Vec<GpuPrediction>> {
    let config = std::env::var("CUBLAS_WORKSPACE_CONFIG").ok();
    let profiles = match device_profile {
        "cuda" | "none" => Vec::new(),
        "all" => DeviceProfile::presets(),
        name => vec![budget(&DeviceProfile::find(name)?, gpu_mem)],
    };
    Ok(profiles.iter().map(|p| predict(p, trace, config.as_deref())).collect())
}

/// One line per GPU: what it would show and whether the run fits.
fn print_gpu_table(gpus: &[GpuPrediction]) {
    println!("  on each GPU preset (nvidia-smi high end, with the largest plausible cuDNN workspaces):");
    for g in gpus {
        let p = &g.profile;
        let verdict = match &g.first_oom {
            _ if g.fits => "fits".to_owned(),
            Some(oom) => format!(
                "does NOT fit: OOM at {} ({}, iteration {}), {} short",
                oom.op_name(),
                oom.phase,
                oom.iteration,
                mib(oom.short_by)
            ),
            None => "does NOT fit the reserved peak; no OOM once the cache is released".to_owned(),
        };
        println!(
            "    {:<10} {:>4.0} GiB  needs {:>12}  {verdict}",
            p.name,
            p.memory_bytes as f64 / (1u64 << 30) as f64,
            mib(g.nvidia_smi.high),
        );
    }
}

/// The live tensors at the peak, grouped as in the log (meta runs only).
fn print_peak_tensors(model: &Path, e: &Estimate) -> Result<()> {
    let groups = peak_tensors(model, e)?;
    println!("  live tensors at the peak, grouped as in the log ({} groups, largest 12):", groups.len());
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
    Ok(())
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
            print_static(s, &model);
        }
        return Ok(());
    }
    let (e, trace) = run_model(&args, &mut options)?;
    // A data-parallel job: the GPU figures are one rank's.
    let rank = args.model.parallelism().map(|p| per_rank_trace(&trace, args.model.optimizer, &p));
    let gpu_trace = rank.as_ref().map_or(&trace, |(t, _)| t);
    let gpus = gpu_predictions(&args.device_profile, args.gpu_mem, gpu_trace)?;
    let gpu = (args.device_profile != "all").then(|| gpus.first()).flatten();
    if let Some(path) = &args.snapshot {
        gpu_trace.dump_snapshot(path)?;
    }
    if args.json {
        let mut v = serde_json::to_value(&e)?;
        if let Some((t, plan)) = &rank {
            v["rank"] = rank_json(t, plan)?;
        }
        if let Some(g) = gpu {
            v["gpu"] = serde_json::to_value(g)?;
        } else if !gpus.is_empty() {
            v["gpus"] = serde_json::to_value(&gpus)?;
        }
        if let Some(s) = &static_estimate {
            v["static"] = serde_json::to_value(s)?;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_estimate(&e, &model, args.device_profile != "none");
    print_peak_breakdown(&e, &trace);
    if e.options.device == EstimateDevice::Meta {
        print_peak_tensors(&model, &e)?;
    }
    if let Some((t, plan)) = &rank {
        print_rank(t, plan);
    }
    match gpu {
        Some(g) => print_gpu(g),
        None if !gpus.is_empty() => print_gpu_table(&gpus),
        None => {}
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
    Ok(())
}

fn timeline(args: ModelArgs, mode: ModeArg, output: &Path) -> Result<()> {
    let is_json = gpu_mem_track_cli::timeline_is_json(output)?;
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
    if is_json {
        gpu_mem_track_cli::write_timeline_json(&trace, serde_json::to_value(&estimate)?, output)?;
    } else {
        plot_timeline(&trace, &title, output)?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Estimate {
            model,
            mode,
            device_profile,
            gpu_mem,
            allow_cpu,
            method,
            run_on,
            snapshot,
            json,
        } => estimate(EstimateArgs {
            model,
            mode,
            device_profile,
            gpu_mem,
            allow_cpu,
            method,
            run_on,
            snapshot,
            json,
        }),
        Command::Timeline { model, mode, output } => timeline(model, mode, &output),
        Command::Fit(args) => fit(args),
    }
}

fn fit(args: FitArgs) -> Result<()> {
    let options = args.model.options(args.mode, EstimateDevice::Meta);
    let gpu = budget(&DeviceProfile::find(&args.device_profile)?, args.gpu_mem);
    let parallelism = args.model.parallelism();
    let model = &args.model.model;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_prefix(format!("fitting {} on {}", model.display(), gpu.name));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {prefix}: {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    });
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
    print_fit(&r, &dim, model);
    Ok(())
}

fn print_fit(r: &FitResult, dim: &str, model: &Path) {
    let g = &r.prediction;
    let gib = r.memory_bytes as f64 / (1u64 << 30) as f64;
    match r.largest {
        None => println!(
            "{}: even {dim} 1 does not fit {} with {gib:.1} GiB: it needs up to {}",
            model.display(),
            g.profile.name,
            mib(g.nvidia_smi.high)
        ),
        Some(v) => println!(
            "{}: largest {dim} that fits {} with {gib:.1} GiB: {v}{} (nvidia-smi up to {}, peak allocated up to {}; {} meta runs)",
            model.display(),
            g.profile.name,
            if r.reached_max { " (the --max given; larger may fit)" } else { "" },
            mib(g.nvidia_smi.high),
            mib(g.peak_allocated.high),
            r.probes.len()
        ),
    }
    for p in &r.probes {
        println!(
            "    {dim} {:>8}: {:>12} {}",
            p.value,
            mib(p.needed),
            if p.fits { "fits" } else { "too large" }
        );
    }
    // Where the smallest size tried that does not fit would fail.
    if let Some(p) = r.probes.iter().filter(|p| !p.fits).min_by_key(|p| p.value) {
        match &p.first_oom {
            Some(oom) => println!("  at {dim} {}: {oom}", p.value),
            None => println!(
                "  at {dim} {}: no OOM predicted once the allocator releases its cache; only the reserved \
                 peak is above the device",
                p.value
            ),
        }
    }
}

fn main() -> ExitCode {
    gpu_mem_track_cli::exit_code(run(Cli::parse())) // usage errors exit with 2
}
