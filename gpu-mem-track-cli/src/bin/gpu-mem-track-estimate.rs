//! `gpu-mem-track-estimate` (feature `estimate`): the half of the `gpu-mem-track` command line that
//! runs models and so links libtorch: `estimate`, `fit` and `timeline` of a model, as
//! [`model_args`](gpu_mem_track_cli::model_args) defines them. `gpu-mem-track` runs it for those
//! subcommands; it can also be called directly.
//!
//! Exit codes: 0 success, 1 error (one line on stderr naming the file or option), 2 usage.
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{CommandFactory, Parser};
use gpu_mem_track::history::read_snapshot_trace;
use gpu_mem_track::log::GroupLine;
use gpu_mem_track_cli::model_args::{
    EstimateArgs, FitArgs, Method, ModeArg, ModelArgs, ModelCli, ModelCommand, TimelineArgs,
};
use gpu_mem_track_estimate::fit::{budget, fit_torchscript, FitProbe};
use gpu_mem_track_estimate::profile::{DeviceProfile, WorkspaceEnv};
use gpu_mem_track_estimate::runtime::{place_runtime_allocations, with_workspaces};
use gpu_mem_track_estimate::sharding::per_rank_trace;
use gpu_mem_track_estimate::text::{mib, FitReport};
use gpu_mem_track_estimate::Error;
use gpu_mem_track_estimate::{
    estimate_progress, estimate_static, estimate_torchscript_traced, estimate_torchscript_with_peak_tensors,
    Estimate, EstimateDevice, EstimateOptions, EstimateReport, EstimateRequest, GpuTarget, Mode, RecordedRun,
    Trace,
};

/// The [`EstimateOptions`] of a model's arguments, for a run on `device`.
fn estimate_options(args: &ModelArgs, device: EstimateDevice) -> EstimateOptions {
    let Some(input) = &args.input else {
        ModelCli::command()
            .error(clap::error::ErrorKind::MissingRequiredArgument, "running a model needs --input <SHAPE>")
            .exit()
    };
    EstimateOptions {
        input_shape: input.0.clone(),
        input_is_index: args.ids,
        precision: args.precision.working(),
        mode: match args.mode {
            ModeArg::Train => Mode::Train(args.optimizer),
            ModeArg::Inference => Mode::Inference,
        },
        device,
        lifetimes: args.lifetimes,
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
    if args.gpu.gpu_mem.is_some() && matches!(args.gpu.device_profile.as_str(), "cuda" | "none" | "all") {
        ModelCli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--gpu-mem replaces the memory of one GPU profile: add --device-profile NAME (t4, rtx4090, ...)",
            )
            .exit()
    }
    let target = GpuTarget::resolve(&args.gpu.device_profile, args.gpu.gpu_mem)?;
    target.target_meta_kernels();
    let mut options = estimate_options(&args.model, args.run_on);
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
    let (estimate, trace, peak_tensors) = run_model(&args, &mut options, !args.json)?;
    let request = EstimateRequest {
        gpu: target,
        parallelism: args.model.parallelism(),
        caching_allocator_line: args.gpu.device_profile != "none",
    };
    let run = RecordedRun { estimate, trace, peak_tensors, breakdown: None, static_estimate };
    let report = EstimateReport::new(run, &request);
    if let Some(path) = &args.snapshot {
        gpu_mem_track_gpu::snapshot::dump_snapshot(report.gpu_trace(), path)?;
        gpu_mem_track_cli::note(format_args!("wrote {}", path.display()));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.json()?)?);
    } else {
        print!("{}", report.text(Some(&model)));
    }
    Ok(())
}

fn timeline(args: ModelArgs, device_profile: Option<&str>, output: &Path) -> Result<()> {
    let kind = gpu_mem_track_cli::TimelineOutput::of(output)?;
    let model = args.model.clone();
    let name = model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let target = GpuTarget::resolve(device_profile.unwrap_or("none"), None)?;
    if target == GpuTarget::All {
        bail!("a timeline draws one GPU: --device-profile NAME (h100-80g, t4, ...), not all");
    }
    target.target_meta_kernels();
    let (estimate, mut trace, mut title) = if model.extension().is_some_and(|x| x == "pickle") {
        (None, read_snapshot_trace(&model)?, name)
    } else {
        let options = estimate_options(&args, EstimateDevice::Meta);
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
    if let GpuTarget::One(profile) = &target {
        // cuDNN's workspaces are cuDNN's choice on the GPU: a timeline draws what is known.
        let sizes = profile.runtime_sizes(&WorkspaceEnv::read(), false);
        trace = with_workspaces(&trace, &place_runtime_allocations(&trace, sizes));
        title = format!("{title} on {}", profile.name);
    }
    gpu_mem_track_cli::write_timeline(&trace, kind, &title, serde_json::to_value(&estimate)?, output)
}

fn run(cli: ModelCli) -> Result<()> {
    cli.verbosity.apply();
    match cli.command {
        ModelCommand::Estimate(args) => estimate(args),
        ModelCommand::Timeline(TimelineArgs { model, device_profile, output }) => {
            timeline(model, Some(device_profile.as_str()).filter(|p| *p != "none"), &output)
        }
        ModelCommand::Fit(args) => fit(args),
    }
}

fn fit(args: FitArgs) -> Result<()> {
    let options = estimate_options(&args.model, EstimateDevice::Meta);
    let gpu = budget(&DeviceProfile::find(&args.gpu.device_profile)?, args.gpu.gpu_mem);
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
    gpu_mem_track_cli::exit_code(run(ModelCli::parse())) // usage errors exit with 2
}
