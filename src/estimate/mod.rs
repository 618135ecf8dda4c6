//! Estimating memory without a GPU: a whole TorchScript model run on the meta device (exact
//! tensor sizes, no data, no compute) with every allocation recorded, replayed through a model of
//! the CUDA caching allocator to predict `memory_allocated` and `memory_reserved`.
pub mod caching_allocator;
mod native;
pub mod profile;
mod saved;
mod size;
mod trace;
pub(crate) use trace::categorize;

pub use native::{training_step, NativeStepOptions};
pub use saved::{memory_for_backward, memory_for_backward_excluding, SavedByOp, SavedReport};
pub use size::{optimizer_state_bytes, torchscript_size, varstore_size, Activations, ModelSize};
pub use trace::{Category, TimelinePoint, Trace, TraceEvent};

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ffi::{self, AllocEvent};
use caching_allocator::{BlockId, CachingAllocatorModel, CachingStats};

/// Element type of parameters and float inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    fn scalar_type(self) -> i32 {
        match self {
            Precision::F32 => 6,
            Precision::F16 => 5,
            Precision::Bf16 => 15,
        }
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
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer per parameter.
    SgdMomentum,
    /// Adam: two buffers per parameter, plus a parameter-sized temporary per step.
    Adam,
    /// AdamW: as Adam.
    AdamW,
}

impl Optimizer {
    fn code(self) -> i32 {
        match self {
            Optimizer::Sgd => tracker_sys::GMT_OPT_SGD,
            Optimizer::SgdMomentum => tracker_sys::GMT_OPT_SGD_MOMENTUM,
            Optimizer::Adam => tracker_sys::GMT_OPT_ADAM,
            Optimizer::AdamW => tracker_sys::GMT_OPT_ADAMW,
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
#[serde(rename_all = "lowercase")]
pub enum Lifetimes {
    /// The TorchScript interpreter's: each value is freed right after its last use. What a tch
    /// program running the model as a `CModule` gets.
    #[default]
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

/// A phase of the estimated run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Loading the module (parameters, buffers).
    Load,
    /// Creating the input.
    Input,
    /// The forward pass.
    Forward,
    /// Loss and backward pass.
    Backward,
    /// The optimizer step.
    Optimizer,
    /// A live program (memory history) outside any phase it declared.
    Unmarked,
}

impl Phase {
    pub(crate) fn from_code(c: u8) -> Phase {
        match c {
            tracker_sys::GMT_PHASE_LOAD => Phase::Load,
            tracker_sys::GMT_PHASE_INPUT => Phase::Input,
            tracker_sys::GMT_PHASE_FORWARD => Phase::Forward,
            tracker_sys::GMT_PHASE_BACKWARD => Phase::Backward,
            tracker_sys::GMT_PHASE_OPTIMIZER => Phase::Optimizer,
            _ => Phase::Unmarked,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Load => "load",
            Phase::Input => "input",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer step",
            Phase::Unmarked => "run",
        })
    }
}

/// How far a running estimate is: (steps done, total steps, what runs now). Steps are load,
/// input, then forward (, backward and optimizer step) per iteration. Meant to be polled from
/// another thread while [`estimate_torchscript`] runs.
pub fn estimate_progress(mode: Mode) -> (u64, u64, String) {
    let (phase, iteration) = ffi::recorder_progress();
    let phase = Phase::from_code(phase.clamp(0, 255) as u8);
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
    /// CPU runs only: highest bytes held at once by temporaries that oneDNN kernels allocate
    /// directly (reorders, scratch space); no GPU kernel makes them, so they are left out of the
    /// figures above and reported here.
    pub cpu_only_temporaries: u64,
    /// Allocations recorded.
    pub allocations: u64,
    /// Seconds the estimate took.
    pub seconds: f64,
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
    if !path.is_file() {
        return Err(Error::EstimateInput(format!("model file {} does not exist", path.display())));
    }
    if options.input_shape.is_empty() || options.input_shape.iter().any(|&d| d <= 0) {
        return Err(Error::EstimateInput(format!(
            "input shape {:?} must have positive sizes",
            options.input_shape
        )));
    }
    crate::ffi::install()?;
    let start = Instant::now();
    let (train, optimizer) = match options.mode {
        Mode::Inference => (false, tracker_sys::GMT_OPT_NONE),
        Mode::Train(o) => (true, o.code()),
    };
    let call = ffi::EstimateCall {
        path,
        input_shape: &options.input_shape,
        scalar_type: options.precision.scalar_type(),
        input_is_index: options.input_is_index,
        train,
        optimizer,
        iterations: 2,
        device_kind: match options.device {
            EstimateDevice::Meta => ffi::GMT_DEV_META,
            EstimateDevice::Cpu => ffi::GMT_DEV_CPU,
        },
        eager_lifetimes: options.lifetimes == Lifetimes::Eager,
    };
    let (sizes, events, names) = ffi::estimate_torchscript(&call).map_err(|e| match e {
        Error::Libtorch { message, .. } => classify_failure(path, message),
        other => other,
    })?;
    Ok(finish_estimate(options, &sizes, &events, &names, &ffi::recorded_parameter_ids(), start))
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
    let trace = Trace::classify(events, names, parameter_ids);
    let estimate = Estimate {
        options: options.clone(),
        param_count: sizes.param_count.max(0) as u64,
        param_bytes: sizes.param_bytes.max(0) as u64,
        buffer_bytes: sizes.buffer_bytes.max(0) as u64,
        input_bytes: sizes.input_bytes.max(0) as u64,
        grad_bytes: sizes.grad_bytes.max(0) as u64,
        optimizer_state_bytes: sizes.optimizer_state_bytes.max(0) as u64,
        live_after_forward: timeline.live_after_forward,
        forward_peak: timeline.forward_peak,
        peak: timeline.peak,
        phases: timeline.phases,
        cuda: timeline.cuda,
        cpu_only_temporaries: timeline.cpu_only_peak,
        allocations: events.iter().filter(|e| e.is_free == 0).count() as u64,
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
        return Error::MissingMetaKernel { op };
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
    cpu_only_peak: u64,
}

/// Allocations made directly by a oneDNN kernel (not by an `aten::empty` it calls) exist only on
/// the CPU.
fn cpu_only_op(name: &str) -> bool {
    name.starts_with("aten::mkldnn") || name.starts_with("mkldnn::") || name.starts_with("onednn::")
}

impl Timeline {
    fn replay(events: &[AllocEvent], names: &[String], cpu: bool) -> Timeline {
        let last_iter = events.iter().map(|e| e.iteration).max().unwrap_or(0);
        let mut sizes: HashMap<i64, u64> = HashMap::new();
        let mut blocks: HashMap<i64, BlockId> = HashMap::new();
        let mut cuda = CachingAllocatorModel::new();
        let mut live = 0u64;
        let mut peak = PeakPlace { bytes: 0, phase: Phase::Load, iteration: 0, op: String::new(), event: 0 };
        let mut phases: Vec<PhasePeak> = Vec::new();
        let mut live_after_forward = None;
        let mut forward_peak = 0;
        let (mut cpu_only, mut cpu_only_live, mut cpu_only_peak) = (HashMap::new(), 0u64, 0u64);
        for (index, e) in events.iter().enumerate() {
            let phase = Phase::from_code(e.phase);
            let iteration = u32::from(e.iteration);
            if live_after_forward.is_none() && iteration == u32::from(last_iter) && phase > Phase::Forward {
                live_after_forward = Some(live);
            }
            let op_name = || names.get(e.op.max(0) as usize).map(String::as_str).unwrap_or("");
            if e.is_free == 0 && cpu && cpu_only_op(op_name()) {
                cpu_only.insert(e.id, e.size.max(0) as u64);
                cpu_only_live += e.size.max(0) as u64;
                cpu_only_peak = cpu_only_peak.max(cpu_only_live);
                continue;
            }
            if e.is_free != 0 {
                if let Some(size) = cpu_only.remove(&e.id) {
                    cpu_only_live -= size;
                    continue;
                }
            }
            if e.is_free == 0 {
                let size = e.size.max(0) as u64;
                live += size;
                sizes.insert(e.id, size);
                if let Ok(b) = cuda.malloc(size) {
                    blocks.insert(e.id, b);
                }
                if live > peak.bytes {
                    peak = PeakPlace {
                        bytes: live,
                        phase,
                        iteration,
                        op: op_name().to_owned(),
                        event: index as u64,
                    };
                }
            } else {
                live -= sizes.remove(&e.id).unwrap_or(0);
                if let Some(b) = blocks.remove(&e.id) {
                    cuda.free(b);
                }
            }
            match phases.last_mut() {
                Some(p) if p.phase == phase && p.iteration == iteration => {
                    p.peak_bytes = p.peak_bytes.max(live)
                }
                _ => phases.push(PhasePeak { iteration, phase, peak_bytes: live }),
            }
            if phase == Phase::Forward && iteration == u32::from(last_iter) {
                forward_peak = forward_peak.max(live);
            }
        }
        Timeline {
            live_after_forward: live_after_forward.unwrap_or(live),
            forward_peak,
            peak,
            phases,
            cuda: cuda.stats(),
            cpu_only_peak,
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
    if !path.is_file() {
        return Err(Error::EstimateInput(format!("model file {} does not exist", path.display())));
    }
    crate::ffi::install()?;
    let r = ffi::estimate_static(
        path,
        &options.input_shape,
        options.precision.scalar_type(),
        options.input_is_index,
    )
    .map_err(|e| match e {
        Error::Libtorch { message, .. } => classify_failure(path, message),
        other => other,
    })?;
    Ok(StaticEstimate {
        activation_peak: r.activation_peak.max(0) as u64,
        param_bytes: r.param_bytes.max(0) as u64,
        nodes: r.nodes.max(0) as u64,
        unknown_shapes: r.unknown_shapes.max(0) as u64,
        peak_op: ffi::fixed_c_str(&r.peak_op),
        seconds: r.seconds,
    })
}

/// The live tensors at the peak of an estimate, grouped like the tracker's log (shape, dtype,
/// class; bytes once per storage), largest first. Runs the estimate again, snapshotting the
/// registry at the end of the op that reached the peak.
///
/// # Errors
/// As [`estimate_torchscript`].
pub fn peak_tensors(path: &Path, estimate: &Estimate) -> Result<Vec<crate::log::GroupLine>> {
    ffi::recorder_snapshot_at(estimate.peak.event as i64);
    estimate_torchscript_traced(path, &estimate.options)?;
    let (records, dims) = ffi::peak_snapshot_records();
    let snap = crate::snapshot::Snapshot::from_records(&records, &dims, true);
    let mut groups: Vec<_> = snap.groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(b.1.count.cmp(&a.1.count)).then(a.0.cmp(&b.0)));
    Ok(groups
        .into_iter()
        .map(|(key, totals)| crate::log::GroupLine {
            sign: crate::diff::Sign::Plus,
            count: totals.count,
            shape: key.shape.to_vec(),
            memory_mib: totals.bytes as f64 / crate::log::format::MIB,
            class: key.class,
            dtype: key.dtype.torch_name(),
        })
        .collect())
}
