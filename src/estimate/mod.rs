//! Estimating memory without a GPU: a whole TorchScript model run on the meta device (exact
//! tensor sizes, no data, no compute) with every allocation recorded, replayed through a model of
//! the CUDA caching allocator to predict `memory_allocated` and `memory_reserved`.
pub use gpu_mem_track_log::caching_allocator;
pub mod fit;
pub mod gpu_runtime;
mod native;
pub mod profile;
mod saved;
pub mod sharding;
mod size;

pub use gpu_mem_track_log::{Category, Phase, TimelinePoint, Trace, TraceEvent};
pub use native::{inference_step, training_step, NativeStepOptions};
pub use saved::{memory_for_backward, memory_for_backward_excluding, SavedByOp, SavedReport};
pub use size::{optimizer_state_bytes, torchscript_size, varstore_size, Activations, ModelSize};

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use gpu_mem_track_log::caching_allocator::{BlockId, CachingAllocatorModel, CachingStats};
use gpu_mem_track_log::{DType, Replay};

use crate::ffi::{self, AllocEvent, DeviceKind, EventKind, OptimizerKind};

/// Element type of parameters and float inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16
    Bf16,
}

impl Precision {
    /// The dtype of parameters and float inputs.
    pub fn dtype(self) -> DType {
        DType::from_scalar_type(match self {
            Precision::F32 => 6,
            Precision::F16 => 5,
            Precision::Bf16 => 15,
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(Precision::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(format!("unknown dtype {other:?} (use f32, f16 or bf16)")),
        }
    }
}

impl std::str::FromStr for Lifetimes {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "torchscript" | "ts" => Ok(Lifetimes::TorchScript),
            "eager" => Ok(Lifetimes::Eager),
            other => Err(format!("unknown lifetimes {other:?} (use torchscript or eager)")),
        }
    }
}

/// Optimizer whose state a training step allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer per parameter.
    #[cfg_attr(feature = "cli", value(name = "momentum", alias = "sgd-momentum"))]
    SgdMomentum,
    /// Adam: two buffers per parameter, plus a parameter-sized temporary per step.
    Adam,
    /// AdamW: as Adam.
    #[cfg_attr(feature = "cli", value(name = "adamw"))]
    AdamW,
}

impl Optimizer {
    pub(crate) fn kind(self) -> OptimizerKind {
        match self {
            Optimizer::Sgd => OptimizerKind::Sgd,
            Optimizer::SgdMomentum => OptimizerKind::SgdMomentum,
            Optimizer::Adam => OptimizerKind::Adam,
            Optimizer::AdamW => OptimizerKind::AdamW,
        }
    }
}

impl std::str::FromStr for Optimizer {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Ok(Optimizer::Sgd),
            "momentum" | "sgd-momentum" | "sgd_momentum" => Ok(Optimizer::SgdMomentum),
            "adam" => Ok(Optimizer::Adam),
            "adamw" => Ok(Optimizer::AdamW),
            other => Err(format!("unknown optimizer {other:?} (use sgd, momentum, adam or adamw)")),
        }
    }
}

/// Inference (forward without grad) or training steps (forward, backward, optimizer step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `torch.no_grad()` forward.
    Inference,
    /// Forward, backward and an optimizer step, twice (the second shows the steady state).
    Train(Optimizer),
}

/// Where the estimate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EstimateDevice {
    /// The meta device: shapes only.
    Meta,
    /// The CPU: real compute, for models with ops that have no meta kernel, and for checking.
    Cpu,
}

/// What to estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateOptions {
    /// Input shape, batch first.
    pub input_shape: Vec<i64>,
    /// Integer token ids (int64) rather than a float input.
    pub input_is_index: bool,
    /// Precision of parameters and float input.
    pub precision: Precision,
    /// Inference or training.
    pub mode: Mode,
    /// Where to run.
    pub device: EstimateDevice,
    /// How long values live: as the TorchScript interpreter frees them, or as eager PyTorch would.
    pub lifetimes: Lifetimes,
}

/// When a run frees the tensors a model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Lifetimes {
    /// The TorchScript interpreter's: each value is freed right after its last use. What a tch
    /// program running the model as a `CModule` gets.
    #[default]
    #[cfg_attr(feature = "cli", value(name = "torchscript", alias = "ts"))]
    TorchScript,
    /// Eager PyTorch's (CPython reference counting), read from the graph's variable names: a local
    /// variable lives until it is rebound or its `forward` returns, and a module call's inputs
    /// until the call returns. What a Python user running the same model eagerly gets; peaks move
    /// by whole activations.
    Eager,
}

impl Default for EstimateOptions {
    fn default() -> Self {
        EstimateOptions {
            input_shape: vec![1, 3, 224, 224],
            input_is_index: false,
            precision: Precision::F32,
            mode: Mode::Inference,
            device: EstimateDevice::Meta,
            lifetimes: Lifetimes::TorchScript,
        }
    }
}

/// How far a running estimate is: (steps done, total steps, what runs now). Steps are load,
/// input, then forward (, backward and optimizer step) per iteration. Meant to be polled from
/// another thread while [`estimate_torchscript`] runs.
pub fn estimate_progress(mode: Mode) -> (u64, u64, String) {
    let (phase, iteration) = ffi::recorder_progress();
    let per_iteration = if matches!(mode, Mode::Inference) { 1 } else { 3 };
    let total = 2 + per_iteration * if matches!(mode, Mode::Inference) { 1 } else { 2 };
    let done = match phase {
        Phase::Load => 0,
        Phase::Input => 1,
        p => 2 + per_iteration * (iteration.max(1) as u64 - 1) + (p as u64 - Phase::Forward as u64),
    };
    let what = if iteration > 0 { format!("{phase} (iteration {iteration})") } else { phase.to_string() };
    (done.min(total), total, what)
}

/// Where the highest live byte count was reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeakPlace {
    /// Live bytes at the peak.
    pub bytes: u64,
    /// Phase.
    pub phase: Phase,
    /// Training iteration (1-based; 0 before the first).
    pub iteration: u32,
    /// The innermost op that made the allocation.
    pub op: String,
    /// Number of the allocation event (in the recorded sequence).
    pub event: u64,
}

/// Peak of one phase of one iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PhasePeak {
    /// Iteration (1-based; 0 for loading).
    pub iteration: u32,
    /// Phase.
    pub phase: Phase,
    /// Highest live bytes in it.
    pub peak_bytes: u64,
}

/// An op with no Meta kernel that ran its CPU kernel on CPU copies of its meta inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FallbackOp {
    /// `aten::native_dropout`.
    pub op: String,
    /// Calls during the run.
    pub calls: u64,
    /// Bytes of the CPU copies made for them (one op's inputs at a time, freed after each call).
    pub bytes: u64,
}

/// Tensors on the CPU that a meta estimate met: made by ops that named no device (tch's
/// `Tensor::from_slice` copies the caller's bytes, so it stays on the CPU), and captured CPU
/// tensors moved to meta where an op used them (the copy a real run makes to the GPU, counted
/// as that op's allocation). Factories asked for the CPU make meta tensors and are not counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CpuTensors {
    /// Tensors ops returned on the CPU during the estimate (their memory is not in the figures
    /// until an op moves them to meta).
    pub made_on_cpu: u64,
    /// CPU tensors replaced by meta twins where an op met them.
    pub moved_to_meta: u64,
    /// Up to 8 of either: `moved to meta at aten::add [4, 8] Float`.
    pub examples: Vec<String>,
}

/// The result of an estimate. Byte counts are exact tensor storage sizes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// What was asked.
    pub options: EstimateOptions,
    /// Parameter elements.
    pub param_count: u64,
    /// Parameter bytes.
    pub param_bytes: u64,
    /// Buffer bytes (batch-norm statistics, ...).
    pub buffer_bytes: u64,
    /// Input bytes.
    pub input_bytes: u64,
    /// Gradient bytes (training).
    pub grad_bytes: u64,
    /// Optimizer state bytes (training).
    pub optimizer_state_bytes: u64,
    /// Live bytes right after the (last) forward: parameters, input and what is kept for backward.
    pub live_after_forward: u64,
    /// Highest live bytes during the (last) forward.
    pub forward_peak: u64,
    /// Highest live bytes of the whole run, and where.
    pub peak: PeakPlace,
    /// Peak of each phase of each iteration.
    pub phases: Vec<PhasePeak>,
    /// The CUDA caching allocator model's view of the same sequence: peak `allocated` (rounded
    /// blocks) and peak `reserved` (segments).
    pub cuda: CachingStats,
    /// `memory_allocated()` of the caching allocator model once parameters, buffers and input are
    /// loaded (before the first forward): what a GPU shows after loading, each tensor rounded
    /// into its block. The run's own figure is `cuda.peak_allocated - baseline_allocated`.
    pub baseline_allocated: u64,
    /// CPU runs only: highest bytes held at once by temporaries that oneDNN kernels allocate
    /// directly (reorders, scratch space: its own ops' allocations, and what it takes raw from
    /// the CPU allocator inside any op, such as a half-precision `mm`); no GPU kernel makes
    /// them, so they are left out of the figures above (and of the trace) and reported here.
    pub cpu_only_temporaries: u64,
    /// Allocations recorded (of more than 0 bytes: a 0-byte request takes no block on a GPU).
    pub allocations: u64,
    /// Values the run read from meta tensors (`.item()`, data-dependent control flow): a meta
    /// tensor holds no data, so each read 0 and a branch on it may not be the one a real run
    /// takes. Non-zero means: check with a CPU run (`EstimateDevice::Cpu`).
    pub meta_scalar_reads: u64,
    /// Ops with no Meta kernel that ran their CPU kernel on CPU copies of their meta inputs (one
    /// op's inputs at a time), with their calls and the bytes those copies took; busiest first.
    /// Their outputs are meta tensors with the shapes, strides and dtypes the CPU kernel gave.
    pub cpu_fallback: Vec<FallbackOp>,
    /// CPU tensors the run made or met on meta (empty for CPU runs).
    pub cpu_tensors: CpuTensors,
    /// Seconds the estimate took.
    pub seconds: f64,
}

/// One case of [`check_meta_kernels`]: an op with a hand-written meta kernel, the inputs it ran
/// on, and the verdict (`ok`, or how the meta results differ from the CPU kernel's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetaKernelCase {
    /// The op as registered (`native_layer_norm_backward`, `where.self_out`).
    pub op: String,
    /// Its inputs.
    pub inputs: String,
    /// `ok`, or what differs.
    pub verdict: String,
}

impl MetaKernelCase {
    /// The meta kernel gave the CPU kernel's result sizes, strides and dtypes.
    pub fn ok(&self) -> bool {
        self.verdict == "ok"
    }
}

/// Runs every meta kernel gpu-mem-track registers (libtorch C++ lacks them) next to the CPU
/// kernel of the same op on inputs of several shapes, and compares the results' sizes, strides
/// and dtypes: a check of the libtorch this build runs on. Returns one case a shape, and the
/// names of the ops with a kernel of their own (each has at least one case).
///
/// # Errors
/// [`Error::Libtorch`] when the check cannot run.
pub fn check_meta_kernels() -> Result<(Vec<MetaKernelCase>, Vec<String>)> {
    ffi::install()?;
    ffi::meta_allocator_install()?;
    let cases = ffi::meta_kernels_check()?
        .into_iter()
        .map(|(op, inputs, verdict)| MetaKernelCase { op, inputs, verdict })
        .collect();
    Ok((cases, ffi::meta_kernels_registered()))
}

/// Estimates a TorchScript model file.
///
/// # Errors
/// [`Error::EstimateInput`] for a missing file, a file that is not TorchScript, or an input the
/// model rejects; [`Error::MissingMetaKernel`] naming an op without a meta kernel (retry with
/// [`EstimateDevice::Cpu`]).
pub fn estimate_torchscript(path: &Path, options: &EstimateOptions) -> Result<Estimate> {
    estimate_torchscript_traced(path, options).map(|(e, _)| e)
}

/// [`estimate_torchscript`], also returning the categorised allocation trace (for snapshots and
/// timelines).
///
/// # Errors
/// As [`estimate_torchscript`].
pub fn estimate_torchscript_traced(path: &Path, options: &EstimateOptions) -> Result<(Estimate, Trace)> {
    check_model_file(path)?;
    if options.input_shape.is_empty() || options.input_shape.iter().any(|&d| d <= 0) {
        return Err(Error::EstimateInput(format!(
            "input shape {:?} must have positive sizes",
            options.input_shape
        )));
    }
    crate::ffi::install()?;
    let start = Instant::now();
    let (train, optimizer) = match options.mode {
        Mode::Inference => (false, OptimizerKind::None),
        Mode::Train(o) => (true, o.kind()),
    };
    let call = ffi::EstimateCall {
        path,
        input_shape: &options.input_shape,
        dtype: options.precision.dtype(),
        input_is_index: options.input_is_index,
        train,
        optimizer,
        iterations: 2,
        device_kind: match options.device {
            EstimateDevice::Meta => DeviceKind::Meta,
            EstimateDevice::Cpu => DeviceKind::Cpu,
        },
        eager_lifetimes: options.lifetimes == Lifetimes::Eager,
    };
    let (sizes, events, names) = ffi::estimate_torchscript(&call).map_err(|e| match e {
        Error::Libtorch { message, .. } => classify_failure(path, message),
        other => other,
    })?;
    Ok(finish_estimate(options, &sizes, &events, &names, &ffi::recorded_parameter_ids(), start))
}

/// A model path must name a regular file; a folder or a fifo is named as what it is.
fn check_model_file(path: &Path) -> Result<()> {
    let problem = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        Err(e) => format!("cannot be read ({e})"),
        Ok(m) if m.is_dir() => "is a directory, not a TorchScript file".to_owned(),
        Ok(m) if !m.is_file() => "is not a regular file (a fifo, socket or device)".to_owned(),
        Ok(_) => return Ok(()),
    };
    Err(Error::EstimateInput(format!("model file {} {problem}", path.display())))
}

/// Turns a recorded run into the estimate and its categorised trace.
pub(crate) fn finish_estimate(
    options: &EstimateOptions,
    sizes: &ffi::EstimateSizes,
    events: &[AllocEvent],
    names: &[String],
    parameter_ids: &[i64],
    start: Instant,
) -> (Estimate, Trace) {
    let timeline = Timeline::replay(events, names, options.device == EstimateDevice::Cpu);
    let trace = crate::trace::classify(events, names, parameter_ids);
    let estimate = Estimate {
        options: options.clone(),
        param_count: sizes.param_count,
        param_bytes: sizes.param_bytes,
        buffer_bytes: sizes.buffer_bytes,
        input_bytes: sizes.input_bytes,
        grad_bytes: sizes.grad_bytes,
        optimizer_state_bytes: sizes.optimizer_state_bytes,
        live_after_forward: timeline.live_after_forward,
        forward_peak: timeline.forward_peak,
        peak: timeline.peak,
        phases: timeline.phases,
        cuda: timeline.cuda,
        baseline_allocated: timeline.baseline_allocated,
        cpu_only_temporaries: timeline.cpu_only_peak,
        allocations: events.iter().filter(|e| e.kind == EventKind::Alloc && e.size > 0).count() as u64,
        meta_scalar_reads: sizes.meta_scalar_reads,
        cpu_fallback: sizes
            .cpu_fallback
            .iter()
            .map(|c| FallbackOp { op: c.op.clone(), calls: c.calls, bytes: c.bytes })
            .collect(),
        cpu_tensors: CpuTensors {
            made_on_cpu: sizes.cpu_tensors.made_on_cpu,
            moved_to_meta: sizes.cpu_tensors.moved_to_meta,
            examples: sizes.cpu_tensors.examples.clone(),
        },
        seconds: start.elapsed().as_secs_f64(),
    };
    (estimate, trace)
}

/// Turns a libtorch failure into the error a user can act on.
fn classify_failure(path: &Path, message: String) -> Error {
    if message.contains("no fake impl or Meta kernel registered") || message.contains("Meta kernel") {
        let op = message
            .split_whitespace()
            .find(|w| w.starts_with("aten::") || w.contains("::"))
            .map(|w| w.trim_end_matches(':').to_owned())
            .unwrap_or_else(|| "an operator".into());
        // All of them at once, read from the graph, not only the one the run stopped at.
        let all = ffi::script_ops_without_meta(path)
            .unwrap_or_default()
            .into_iter()
            .map(|(schema, place)| format!("{schema} at {place}"))
            .collect();
        return Error::MissingMetaKernel { op, all };
    }
    if message.starts_with("cannot load") || message.starts_with("forward failed") {
        return Error::EstimateInput(message.replace('\n', " "));
    }
    Error::EstimateInput(format!("{}: {}", path.display(), message.lines().next().unwrap_or("")))
}

/// What the recorded events say.
struct Timeline {
    live_after_forward: u64,
    forward_peak: u64,
    peak: PeakPlace,
    phases: Vec<PhasePeak>,
    cuda: CachingStats,
    baseline_allocated: u64,
    cpu_only_peak: u64,
}

/// Allocations made directly by a oneDNN kernel (not by an `aten::empty` it calls) exist only on
/// the CPU.
fn cpu_only_op(name: &str) -> bool {
    name.starts_with("aten::mkldnn") || name.starts_with("mkldnn::") || name.starts_with("onednn::")
}

impl Timeline {
    /// Replays the recorded events: live and peak bytes (one [`Replay`]), the peak of each
    /// phase, the last forward's figures, and the CUDA caching allocator model over the same
    /// sequence. On a CPU run, allocations oneDNN makes directly are kept apart (see
    /// [`Estimate::cpu_only_temporaries`]).
    fn replay(events: &[AllocEvent], names: &[String], cpu: bool) -> Timeline {
        let mut run = TimelineRun {
            last_iteration: events.iter().map(|e| e.iteration).max().unwrap_or(0),
            replay: Replay::new(),
            cuda: CachingAllocatorModel::new(),
            blocks: HashMap::new(),
            peak: PeakPlace { bytes: 0, phase: Phase::Load, iteration: 0, op: String::new(), event: 0 },
            phases: Vec::new(),
            live_after_forward: None,
            forward_peak: 0,
            baseline_allocated: None,
            cpu_only: Replay::new(),
        };
        for (index, e) in events.iter().enumerate() {
            let op = ffi::op_name(names, e.op);
            if !(cpu && run.cpu_only(e, op)) {
                run.event(index, e, op);
            }
        }
        Timeline {
            live_after_forward: run.live_after_forward.unwrap_or(run.replay.live()),
            forward_peak: run.forward_peak,
            peak: run.peak,
            phases: run.phases,
            cuda: run.cuda.stats(),
            baseline_allocated: run.baseline_allocated.unwrap_or(run.cuda.stats().allocated),
            cpu_only_peak: run.cpu_only.peak(),
        }
    }
}

/// The state of [`Timeline::replay`].
struct TimelineRun {
    last_iteration: u32,
    replay: Replay,
    cuda: CachingAllocatorModel,
    blocks: HashMap<i64, BlockId>,
    peak: PeakPlace,
    phases: Vec<PhasePeak>,
    live_after_forward: Option<u64>,
    forward_peak: u64,
    baseline_allocated: Option<u64>,
    cpu_only: Replay,
}

impl TimelineRun {
    /// Accounts an event of a oneDNN kernel's own allocation (CPU only: an op of its own, or
    /// scratch it took raw from the allocator inside any op); false for the rest.
    fn cpu_only(&mut self, e: &AllocEvent, op: &str) -> bool {
        match e.kind {
            EventKind::Alloc if e.kernel_scratch || cpu_only_op(op) => {
                self.cpu_only.alloc(e.id, e.size, Category::Temporary);
                true
            }
            EventKind::Free => self.cpu_only.free(e.id).is_some(),
            _ => false,
        }
    }

    fn event(&mut self, index: usize, e: &AllocEvent, op: &str) {
        let (phase, iteration) = (e.phase, e.iteration);
        if self.baseline_allocated.is_none() && phase >= Phase::Forward {
            self.baseline_allocated = Some(self.cuda.stats().allocated);
        }
        if self.live_after_forward.is_none() && iteration == self.last_iteration && phase > Phase::Forward {
            self.live_after_forward = Some(self.replay.live());
        }
        match e.kind {
            EventKind::Alloc => {
                if self.replay.alloc(e.id, e.size, Category::Unknown) {
                    self.peak = PeakPlace {
                        bytes: self.replay.live(),
                        phase,
                        iteration,
                        op: op.to_owned(),
                        event: index as u64,
                    };
                }
                // The CUDA allocator gives no block for 0 bytes (`NativeCachingAllocator::allocate`).
                if e.size > 0 {
                    if let Ok(b) = self.cuda.malloc(e.size) {
                        self.blocks.insert(e.id, b);
                    }
                }
            }
            EventKind::Free => {
                self.replay.free(e.id);
                if let Some(b) = self.blocks.remove(&e.id) {
                    self.cuda.free(b);
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::Oom => {}
        }
        let live = self.replay.live();
        match self.phases.last_mut() {
            Some(p) if p.phase == phase && p.iteration == iteration => p.peak_bytes = p.peak_bytes.max(live),
            _ => self.phases.push(PhasePeak { iteration, phase, peak_bytes: live }),
        }
        if phase == Phase::Forward && iteration == self.last_iteration {
            self.forward_peak = self.forward_peak.max(live);
        }
    }
}

/// The static (TorchScript IR) estimate of an inference pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StaticEstimate {
    /// Highest live activation bytes (parameters and the input left out).
    pub activation_peak: u64,
    /// Parameter and buffer bytes found in the module.
    pub param_bytes: u64,
    /// Nodes of the inlined graph.
    pub nodes: u64,
    /// Tensor values whose shape propagation could not make concrete (their bytes are missing).
    pub unknown_shapes: u64,
    /// The node kind where the peak is reached.
    pub peak_op: String,
    /// Seconds the analysis took.
    pub seconds: f64,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

/// The command line's text: what was run, the sizes, the peak and where, each phase's peak, and
/// the CUDA caching allocator model's figures.
///
/// ```no_run
/// # use gpu_mem_track::estimate::*;
/// let e = estimate_torchscript("model.pt".as_ref(), &EstimateOptions::default())?;
/// println!("{e}");
/// # Ok::<(), gpu_mem_track::Error>(())
/// ```
impl fmt::Display for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let mode = match o.mode {
            Mode::Inference => "inference".to_owned(),
            Mode::Train(opt) => format!("train ({opt:?})"),
        };
        writeln!(
            f,
            "input {:?} {:?}, {mode}, on {:?} in {:.2} s",
            o.input_shape, o.precision, o.device, self.seconds
        )?;
        writeln!(
            f,
            "  parameters   {} ({} elements); buffers {}; input {}",
            mib(self.param_bytes),
            self.param_count,
            mib(self.buffer_bytes),
            mib(self.input_bytes)
        )?;
        if matches!(o.mode, Mode::Train(_)) {
            writeln!(
                f,
                "  gradients    {}; optimizer state {}",
                mib(self.grad_bytes),
                mib(self.optimizer_state_bytes)
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

impl Estimate {
    /// Activation bytes at the peak: the peak minus parameters, buffers and the input. Comparable
    /// with [`StaticEstimate::activation_peak`] for inference.
    pub fn activation_peak(&self) -> u64 {
        self.peak.bytes.saturating_sub(self.param_bytes + self.buffer_bytes + self.input_bytes)
    }
}

/// Estimates an inference pass statically: the forward graph is inlined, parameter shapes are
/// lifted from the module, shapes are propagated from the input, and each tensor is freed after
/// its last use. A fast second opinion to the meta run; it knows nothing of kernels' temporaries.
///
/// # Errors
/// [`Error::EstimateInput`] for a missing or unreadable model, or a forward with more inputs.
pub fn estimate_static(path: &Path, options: &EstimateOptions) -> Result<StaticEstimate> {
    check_model_file(path)?;
    crate::ffi::install()?;
    let r =
        ffi::estimate_static(path, &options.input_shape, options.precision.dtype(), options.input_is_index)
            .map_err(|e| match e {
            Error::Libtorch { message, .. } => classify_failure(path, message),
            other => other,
        })?;
    Ok(StaticEstimate {
        activation_peak: r.activation_peak,
        param_bytes: r.param_bytes,
        nodes: r.nodes,
        unknown_shapes: r.unknown_shapes,
        peak_op: r.peak_op,
        seconds: r.seconds,
    })
}

/// The live tensors at the peak of an estimate, grouped like the tracker's log (shape, dtype,
/// class; bytes once per storage), largest first. Runs the estimate again, snapshotting the
/// registry at the end of the op that reached the peak.
///
/// # Errors
/// As [`estimate_torchscript`].
pub fn peak_tensors(path: &Path, estimate: &Estimate) -> Result<Vec<gpu_mem_track_log::log::GroupLine>> {
    ffi::recorder_snapshot_at(estimate.peak.event as i64);
    estimate_torchscript_traced(path, &estimate.options)?;
    let (records, dims) = ffi::peak_snapshot_records();
    let snap = crate::snapshot::Snapshot::from_records(&records, &dims, true, false);
    let mut groups: Vec<_> = snap.groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(b.1.count.cmp(&a.1.count)).then(a.0.cmp(&b.0)));
    Ok(groups
        .into_iter()
        .map(|(key, totals)| gpu_mem_track_log::log::GroupLine {
            sign: gpu_mem_track_log::Sign::Plus,
            count: totals.count,
            shape: key.shape.to_vec(),
            memory_mib: totals.bytes as f64 / gpu_mem_track_log::log::format::MIB,
            class: key.class,
            dtype: key.dtype.torch_name(),
            op: None,
        })
        .collect())
}
