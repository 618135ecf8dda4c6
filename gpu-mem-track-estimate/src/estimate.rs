//! What an estimate is and how a recorded run becomes one: live and peak bytes, the peak of each
//! phase, the last forward's figures, and the caching allocator model over the same run.
use std::time::Instant;

use serde::Serialize;

use gpu_mem_track::recorder::{self, AllocEvent, EventKind};
use gpu_mem_track_gpu::caching_allocator::CachingStats;
use gpu_mem_track_log::{Category, Phase, Replay, Trace};

use crate::ffi;
use crate::figures::{AttentionKernels, CpuTensors, FallbackOp, ModelSizes};
use gpu_mem_track_gpu::device_replay::{self, cpu_only_op};
use gpu_mem_track_gpu::options::{EstimateDevice, EstimateOptions, Mode};

/// How far a running estimate is: (steps done, total steps, what runs now). Steps are load,
/// input, then forward (, backward and optimizer step) per iteration. Meant to be polled from
/// another thread while `estimate_torchscript` runs.
pub fn estimate_progress(mode: Mode) -> (u64, u64, String) {
    let (phase, iteration) = recorder::progress();
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

/// Stops the allocation recorder when dropped: a run that fails half-way leaves none running.
pub(crate) struct RecorderGuard;

impl Drop for RecorderGuard {
    fn drop(&mut self) {
        let _ = recorder::stop();
    }
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
    /// What the model and its input hold: parameters, buffers, input, gradients, optimizer state.
    #[serde(flatten)]
    pub sizes: ModelSizes,
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
    /// The most host memory the program held at once while its GPU computed (FSDP's CPU offload:
    /// the sharded parameters, their gradients and the optimizer step on the CPU), left out of
    /// every GPU figure above; 0 when it keeps nothing on the host.
    #[serde(skip_serializing_if = "is_zero")]
    pub host_peak: u64,
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
    /// The kernel each `scaled_dot_product_attention` call took on meta: the one the target GPU
    /// picks (`meta_target_compute_capability`).
    pub attention: AttentionKernels,
    /// Seconds the estimate took.
    pub seconds: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Turns a recorded run into the estimate and its categorised trace.
pub(crate) fn finish_estimate(
    options: &EstimateOptions,
    run: &ffi::RunFigures,
    events: &[AllocEvent],
    names: &[String],
    parameter_ids: &[i64],
    start: Instant,
) -> (Estimate, Trace) {
    let timeline = Timeline::replay(events, names, options.device == EstimateDevice::Cpu);
    let mut trace = recorder::classify(events, names, parameter_ids);
    trace.workspace_bounds = ffi::take_conv_workspaces();
    let (gpu, _, cuda) = device_replay::replay_with_stats(&trace, &[], None);
    let estimate = Estimate {
        options: options.clone(),
        sizes: run.sizes,
        live_after_forward: timeline.live_after_forward,
        forward_peak: timeline.forward_peak,
        peak: timeline.peak,
        phases: timeline.phases,
        cuda,
        baseline_allocated: gpu.baseline_allocated,
        cpu_only_temporaries: timeline.cpu_only_peak,
        host_peak: timeline.host_peak,
        allocations: events.iter().filter(|e| e.kind == EventKind::Alloc && e.size > 0).count() as u64,
        meta_scalar_reads: run.meta_scalar_reads,
        cpu_fallback: run.cpu_fallback.clone(),
        cpu_tensors: run.cpu_tensors.clone(),
        attention: run.attention,
        seconds: start.elapsed().as_secs_f64(),
    };
    (estimate, trace)
}

/// What the recorded events say.
struct Timeline {
    live_after_forward: u64,
    forward_peak: u64,
    peak: PeakPlace,
    phases: Vec<PhasePeak>,
    cpu_only_peak: u64,
    host_peak: u64,
}

impl Timeline {
    /// Replays the recorded events: live and peak bytes (one [`Replay`]), the peak of each
    /// phase, the last forward's figures (the CUDA caching allocator model replays the
    /// categorised trace, in [`device_replay`](gpu_mem_track_gpu::device_replay)). On a CPU run, allocations oneDNN makes directly are kept apart (see
    /// [`Estimate::cpu_only_temporaries`]).
    fn replay(events: &[AllocEvent], names: &[String], cpu: bool) -> Timeline {
        let mut run = TimelineRun {
            last_iteration: events.iter().map(|e| e.iteration).max().unwrap_or(0),
            replay: Replay::new(),
            peak: PeakPlace { bytes: 0, phase: Phase::Load, iteration: 0, op: String::new(), event: 0 },
            phases: Vec::new(),
            live_after_forward: None,
            forward_peak: 0,
            cpu_only: Replay::new(),
            host: Replay::new(),
        };
        for (index, e) in events.iter().enumerate() {
            let op = recorder::op_name(names, e.op);
            let off_gpu = run.host(e) || (cpu && run.cpu_only(e, op));
            if !off_gpu {
                run.event(index, e, op);
            }
        }
        Timeline {
            live_after_forward: run.live_after_forward.unwrap_or(run.replay.live()),
            forward_peak: run.forward_peak,
            peak: run.peak,
            phases: run.phases,
            cpu_only_peak: run.cpu_only.peak(),
            host_peak: run.host.peak(),
        }
    }
}

/// The state of [`Timeline::replay`].
struct TimelineRun {
    last_iteration: u32,
    replay: Replay,
    peak: PeakPlace,
    phases: Vec<PhasePeak>,
    live_after_forward: Option<u64>,
    forward_peak: u64,
    cpu_only: Replay,
    host: Replay,
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

    /// Accounts an event of host memory (see [`Estimate::host_peak`]); false for the rest.
    fn host(&mut self, e: &AllocEvent) -> bool {
        match e.kind {
            EventKind::Alloc if e.host => {
                self.host.alloc(e.id, e.size, Category::Temporary);
                true
            }
            EventKind::Free => self.host.free(e.id).is_some(),
            _ => false,
        }
    }

    fn event(&mut self, index: usize, e: &AllocEvent, op: &str) {
        let (phase, iteration) = (e.phase, e.iteration);
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
            }
            EventKind::Free => {
                self.replay.free(e.id);
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

impl Estimate {
    /// Activation bytes at the peak: the peak minus parameters, buffers and the input. Comparable
    /// with `StaticEstimate::activation_peak` for inference.
    pub fn activation_peak(&self) -> u64 {
        self.peak
            .bytes
            .saturating_sub(self.sizes.param_bytes + self.sizes.buffer_bytes + self.sizes.input_bytes)
    }
}
