//! The estimator's figures as text: what `gpu-mem-track estimate` and `fit` print, as `Display`s, so
//! a library user prints the same text. Each ends its lines with `\n`; print them with `print!`.
use std::fmt;
use std::path::Path;

use gpu_mem_track_log::log::format::{group_line, MIB};
use gpu_mem_track_log::log::GroupLine;

use gpu_mem_track_log::{DType, Trace};

use crate::estimate::Estimate;
use crate::figures::StaticEstimate;
use crate::fit::{smallest_too_large, FitBinding, FitResult};
use gpu_mem_track_gpu::device_replay::{replay_with_runtime, GpuReplay};
use gpu_mem_track_gpu::options::Mode;
use gpu_mem_track_gpu::profile::{GpuPrediction, Range};
use gpu_mem_track_gpu::sharding::RankPlan;

/// Bytes as `12.3 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A serde name of a unit enum (`zero3`, `bf16-mixed`), as the command line spells it.
fn serde_name<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// An estimate's summary, after the model's name when there is one; `with_cuda`: the caching
/// allocator model's line too (it is the last).
pub struct EstimateSummary<'a> {
    /// The model file (`None`: a program estimated in process).
    pub model: Option<&'a Path>,
    /// The estimate.
    pub estimate: &'a Estimate,
    /// Whether to end with the CUDA caching allocator model's line.
    pub with_cuda: bool,
}

impl fmt::Display for EstimateSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.estimate.to_string();
        let text = if self.with_cuda {
            text.as_str()
        } else {
            text.rsplit_once('\n').map_or(text.as_str(), |(a, _)| a)
        };
        match self.model {
            Some(model) => writeln!(f, "{}: {text}", model.display()),
            None => writeln!(f, "{text}"),
        }
    }
}

/// What the peak is made of: categories of the live tensors, then what a GPU adds. Empty for a
/// trace without events.
pub struct PeakBreakdown<'a> {
    /// The estimate.
    pub estimate: &'a Estimate,
    /// Its categorised trace.
    pub trace: &'a Trace,
}

impl fmt::Display for PeakBreakdown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(peak) = self.trace.peak() else { return Ok(()) };
        let parts: Vec<String> = peak
            .bytes
            .iter()
            .filter(|(_, b)| *b > 0)
            .map(|(c, b)| format!("{} {}", c.name(), mib(*b)))
            .collect();
        writeln!(f, "  at the peak: {}", parts.join(", "))?;
        let e = self.estimate;
        let rounding = e.cuda.peak_allocated.saturating_sub(e.peak.bytes);
        let cached = e.cuda.peak_reserved.saturating_sub(e.cuda.peak_allocated);
        writeln!(
            f,
            "  the caching allocator adds: rounding to blocks {}, cached/fragmented segments {}",
            mib(rounding),
            mib(cached)
        )
    }
}

/// The live tensors at the peak, grouped as in the log (the largest 12), and what no live tensor
/// holds any more.
pub struct PeakTensors<'a> {
    /// The groups, largest first (see [`estimate_torchscript_with_peak_tensors`](crate::torchscript::estimate_torchscript_with_peak_tensors)).
    pub groups: &'a [GroupLine],
    /// The estimate whose peak they are.
    pub estimate: &'a Estimate,
}

impl fmt::Display for PeakTensors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let groups = self.groups;
        writeln!(
            f,
            "  live tensors at the peak, grouped as in the log ({} groups, largest 12):",
            groups.len()
        )?;
        for g in groups.iter().take(12) {
            write!(f, "    {}", group_line(g))?;
        }
        let seen: f64 = groups.iter().map(|g| g.memory_mib).sum();
        let unseen = self.estimate.peak.bytes as f64 / MIB - seen;
        if unseen > 0.05 {
            writeln!(
                f,
                "    (+ {unseen:.1} MiB in storages no op-returned tensor holds any more: outputs autograd saved through its own handles)"
            )?;
        }
        Ok(())
    }
}

/// What `estimate --json` prints: the estimate's figures, with `rank` (one rank of a data-parallel
/// job), `gpu` (the one profile asked for) or `gpus` (all), and `static` added when present. The
/// Python package's `estimate()` returns the same object.
///
/// # Errors
/// A figure serde cannot represent (never for finite figures).
pub fn estimate_json(
    estimate: &Estimate,
    rank: Option<&RankReport>,
    gpus: &[GpuPrediction],
    one_gpu: bool,
    static_estimate: Option<&StaticEstimate>,
) -> serde_json::Result<serde_json::Value> {
    let mut v = serde_json::to_value(estimate)?;
    if let Some(r) = rank {
        v["rank"] = serde_json::to_value(r)?;
        // Named, so that no reader takes the rescaled step for a traced rank.
        v["rank"]["method"] = "formula".into();
    }
    match (one_gpu, gpus.first()) {
        (true, Some(g)) => v["gpu"] = serde_json::to_value(g)?,
        _ if !gpus.is_empty() => v["gpus"] = serde_json::to_value(gpus)?,
        _ => {}
    }
    if let Some(s) = static_estimate {
        v["static"] = serde_json::to_value(s)?;
    }
    Ok(v)
}

/// One rank's model states and the caching allocator model's figures for its trace: the text
/// `estimate` prints for a data-parallel job and, serialized, its JSON's `rank` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RankReport {
    /// What sharding the trace did.
    #[serde(flatten)]
    pub plan: RankPlan,
    /// The caching allocator model's replay of the rank's trace.
    pub cuda: GpuReplay,
}

impl RankReport {
    /// The report of one rank: its `trace` (from [`per_rank_trace`](gpu_mem_track_gpu::sharding::per_rank_trace))
    /// replayed once, for the text and the JSON alike.
    pub fn new(trace: &Trace, plan: RankPlan) -> Self {
        Self { plan, cuda: replay_with_runtime(trace, &[]) }
    }
}

impl fmt::Display for RankReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.plan.parallelism;
        let s = &self.plan.model_states;
        let r = &self.cuda;
        writeln!(
            f,
            "  formula (ZeRO's model-state counts over the one-process step, not a traced rank), per rank of {} \
             ({}, {}): parameters {}, gradients {}, optimizer state (with fp32 master copies) {}, \
             gathered layer {} ({} parameters in the largest); model states {}",
            p.world_size,
            serde_name(p.shard),
            serde_name(p.precision),
            mib(s.parameters),
            mib(s.gradients),
            mib(s.optimizer),
            mib(s.gathered_layer),
            self.plan.largest_layer,
            mib(s.total())
        )?;
        writeln!(
            f,
            "    caching allocator model per rank: peak allocated {}, peak reserved {}",
            mib(r.peak_allocated),
            mib(r.peak_reserved)
        )
    }
}

fn range(r: Range) -> String {
    if r.low == r.high {
        mib(r.low)
    } else {
        format!("{} - {}", mib(r.low), mib(r.high))
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

/// The prediction for one GPU: baseline, peaks, what nvidia-smi shows, and where it would fail.
pub struct GpuReport<'a>(pub &'a GpuPrediction);

impl fmt::Display for GpuReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (g, p) = (self.0, &self.0.profile);
        writeln!(
            f,
            "  on {} ({:.2} GiB, sm {}.{}; cuBLAS workspace {} at the first matmul of each thread; range = \
             without / with a cuDNN workspace at each convolution, up to {}):",
            p.name,
            gib(p.memory_bytes),
            p.compute_capability.0,
            p.compute_capability.1,
            mib(g.cublas_workspace),
            mib(g.cudnn_workspace_max)
        )?;
        writeln!(
            f,
            "    baseline allocated {}  (parameters, buffers, input as allocator blocks)",
            mib(g.baseline_allocated)
        )?;
        writeln!(
            f,
            "    peak allocated   {}  ({} above the baseline)",
            range(g.peak_allocated),
            range(g.peak_delta)
        )?;
        writeln!(f, "    peak reserved    {}", range(g.peak_reserved))?;
        writeln!(
            f,
            "    nvidia-smi       {}  (reserved + {} CUDA context and libraries, a per-GPU constant{}){}",
            range(g.nvidia_smi),
            mib(p.context_bytes),
            if g.communication_bytes > 0 {
                format!(
                    " + {} NCCL buffers of {} communicator{} at {} each, NCCL's defaults, not measured",
                    mib(g.communication_bytes),
                    g.communicators,
                    if g.communicators == 1 { "" } else { "s" },
                    mib(p.nccl_communicator_bytes)
                )
            } else {
                String::new()
            },
            if g.fits {
                format!("  -> fits, {} to spare", mib(p.memory_bytes.saturating_sub(g.nvidia_smi.high)))
            } else {
                "  -> does NOT fit".to_owned()
            }
        )?;
        if !g.fits {
            writeln!(f, "    {}", oom_verdict(g))?;
        }
        Ok(())
    }
}

/// One line per GPU: what it would show and whether the run fits.
pub struct GpuTable<'a>(pub &'a [GpuPrediction]);

impl fmt::Display for GpuTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  on each GPU preset (nvidia-smi high end, with the largest plausible cuDNN workspaces):"
        )?;
        for g in self.0 {
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
            writeln!(
                f,
                "    {:<10} {:>6.2} GiB  needs {:>12}  {verdict}",
                p.name,
                gib(p.memory_bytes),
                mib(g.nvidia_smi.high)
            )?;
        }
        Ok(())
    }
}

/// The static estimate after the model's name: `(static, N graph nodes, ...): activation peak ...`.
impl fmt::Display for StaticEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "(static, {} graph nodes, {:.3} s): activation peak {} at {}; parameters {}{}",
            self.nodes,
            self.seconds,
            mib(self.activation_peak),
            self.peak_op,
            mib(self.param_bytes),
            if self.unknown_shapes > 0 {
                format!("; {} tensors of unknown shape left out", self.unknown_shapes)
            } else {
                String::new()
            }
        )
    }
}

/// A `fit`'s answer: the largest size that fits, every probe, and where the smallest size too
/// large would fail.
pub struct FitReport<'a> {
    /// The model file.
    pub model: &'a Path,
    /// The search's result.
    pub result: &'a FitResult,
}

impl fmt::Display for FitReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (r, model) = (self.result, self.model.display());
        let dim = serde_name(r.dimension);
        let g = &r.prediction;
        let gib = gib(r.memory_bytes);
        match r.largest {
            None => writeln!(
                f,
                "{model}: even {dim} 1 does not fit {} with {gib:.1} GiB: it needs up to {}",
                g.profile.name,
                mib(g.nvidia_smi.high)
            )?,
            Some(v) => writeln!(
                f,
                "{model}: largest {dim} that fits {} with {gib:.1} GiB: {v}{} (nvidia-smi up to {}, peak allocated up to {}; {} meta runs)",
                g.profile.name,
                if r.reached_max { " (the --max given; larger may fit)" } else { "" },
                mib(g.nvidia_smi.high),
                mib(g.peak_allocated.high),
                r.probes.len()
            )?,
        }
        for p in &r.probes {
            writeln!(
                f,
                "    {dim} {:>8}: {:>12} {}",
                p.value,
                mib(p.needed),
                if p.fits { "fits" } else { "too large" }
            )?;
        }
        // Where the smallest size tried that does not fit would fail, and which figure is over.
        if let Some(p) = smallest_too_large(&r.probes) {
            match r.binds {
                Some(FitBinding::Allocated) => writeln!(
                    f,
                    "  allocated memory binds: at {dim} {}, peak allocated with the CUDA context needs up to {}, above \
                     the device's {}",
                    p.value,
                    mib(p.allocated_needed),
                    mib(r.memory_bytes)
                )?,
                Some(FitBinding::Reserved) => writeln!(
                    f,
                    "  reserved memory binds: at {dim} {}, peak allocated with the CUDA context needs up to {}, \
                     which fits; the caching allocator's segments need up to {}",
                    p.value,
                    mib(p.allocated_needed),
                    mib(p.needed)
                )?,
                None => {}
            }
            match &p.first_oom {
                Some(oom) => writeln!(f, "  at {dim} {}: {oom}", p.value)?,
                None => writeln!(
                    f,
                    "  at {dim} {}: no OOM predicted once the allocator releases its cache; only the reserved \
                     peak is above the device",
                    p.value
                )?,
            }
        }
        Ok(())
    }
}

/// The command line's text: what was run, the sizes, the peak and where, each phase's peak, and
/// the CUDA caching allocator model's figures.
///
/// ```no_run
/// # use gpu_mem_track_estimate::*;
/// let e = estimate_torchscript("model.pt".as_ref(), &EstimateOptions::default())?;
/// println!("{e}");
/// # Ok::<(), gpu_mem_track_estimate::Error>(())
/// ```
impl fmt::Display for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let mode = match o.mode {
            Mode::Inference => "inference".to_owned(),
            Mode::Train(opt) => format!("train ({opt})"),
        };
        // What the input holds: int64 token ids, or floats of the working precision.
        let input = if o.input_is_index {
            format!("{} token ids", DType::INT64.torch_name())
        } else {
            o.precision.dtype().torch_name()
        };
        let device = serde_name(o.device);
        writeln!(f, "input {:?} {input}, {mode}, on {device} in {:.2} s", o.input_shape, self.seconds)?;
        writeln!(
            f,
            "  parameters   {} ({} elements); buffers {}; input {}",
            mib(self.sizes.param_bytes),
            self.sizes.param_count,
            mib(self.sizes.buffer_bytes),
            mib(self.sizes.input_bytes)
        )?;
        if matches!(o.mode, Mode::Train(_)) {
            writeln!(
                f,
                "  gradients    {}; optimizer state {}",
                mib(self.sizes.grad_bytes),
                mib(self.sizes.optimizer_state_bytes)
            )?;
        }
        writeln!(
            f,
            "  live after forward {}; forward peak {}",
            mib(self.live_after_forward),
            mib(self.forward_peak)
        )?;
        writeln!(
            f,
            "  peak         {} ({} bytes) in {} (iteration {}) at {}",
            mib(self.peak.bytes),
            self.peak.bytes,
            self.peak.phase,
            self.peak.iteration,
            self.peak.op
        )?;
        if self.host_peak > 0 {
            writeln!(
                f,
                "  host memory  {} at its highest (CPU offload), not on the GPU nor in the figures here",
                mib(self.host_peak)
            )?;
        }
        for p in &self.phases {
            writeln!(
                f,
                "    iteration {} {:<15} peak {}",
                p.iteration,
                p.phase.to_string(),
                mib(p.peak_bytes)
            )?;
        }
        if !self.cpu_fallback.is_empty() {
            let listed: Vec<String> = self
                .cpu_fallback
                .iter()
                .take(8)
                .map(|o| format!("{} x{} ({} copied)", o.op, o.calls, mib(o.bytes)))
                .collect();
            let more = self.cpu_fallback.len().saturating_sub(8);
            writeln!(
                f,
                "  ran on the CPU for want of a meta kernel (one op's inputs at a time): {}{}",
                listed.join(", "),
                if more > 0 { format!(" and {more} more ops") } else { String::new() }
            )?;
        }
        let cpu = &self.cpu_tensors;
        if cpu.made_on_cpu + cpu.moved_to_meta > 0 {
            writeln!(
                f,
                "  CPU tensors on meta: {} made on the CPU (no device given), {} moved to meta where an op used them{}",
                cpu.made_on_cpu,
                cpu.moved_to_meta,
                if cpu.examples.is_empty() { String::new() } else { format!(" ({})", cpu.examples.join("; ")) }
            )?;
        }
        let a = &self.attention;
        if a.flash + a.efficient + a.math > 0 {
            writeln!(
                f,
                "  attention, as the GPU picks its kernel: {} flash, {} memory-efficient, {} math{}",
                a.flash,
                a.efficient,
                a.math,
                if a.math > 0 {
                    " (math keeps each call's attention weights for backward: no fused kernel takes \
                     those calls there, as for float32 with grouped-query heads)"
                } else {
                    ""
                }
            )?;
        }
        if self.meta_scalar_reads > 0 {
            writeln!(
                f,
                "  warning: the model read {} value(s) of meta tensors (.item()), each taken as 0; \
                 a branch on data may differ from a real run: check with --run-on cpu",
                self.meta_scalar_reads
            )?;
        }
        write!(
            f,
            "  CUDA caching allocator model: baseline allocated {} (model and input, in blocks), \
             peak allocated {} ({} above the baseline), peak reserved {} ({} segments)",
            mib(self.baseline_allocated),
            mib(self.cuda.peak_allocated),
            mib(self.cuda.peak_allocated.saturating_sub(self.baseline_allocated)),
            mib(self.cuda.peak_reserved),
            self.cuda.segment_allocs
        )
    }
}
