//! A trace with its GPU library allocations ([`runtime`](crate::runtime)) laid out by the caching
//! allocator model: the peaks `torch.cuda` reports, the segments, and the baseline before the first
//! forward.
//!
//! **Against a device's memory** ([`replay_on_device`]) the model has a capacity and does what
//! `CUDACachingAllocator.cpp`'s `malloc` does when `cudaMalloc` fails: it releases every cached
//! segment that holds no live block (`release_cached_blocks`, as `empty_cache`) and tries again;
//! the first allocation that still cannot be placed is the predicted `torch.OutOfMemoryError`
//! ([`FirstOom`]). A cuDNN workspace that cannot be placed is not one: PyTorch catches that
//! error and runs an engine needing less (`Conv_v8.cpp`, `generate_and_filter_plans` halves the
//! workspace and drops the plans that need more; `Conv_v7.cpp`, `try_all`), so it is left out and
//! the replay goes on. The cuBLAS workspace has no such fallback: its failure is the op's.
use std::fmt;

use serde::Serialize;

use crate::caching_allocator::{BlockId, CachingAllocatorModel, CachingStats, OutOfMemory};
use crate::runtime::{is_allocation_primitive, RuntimeAllocation, RuntimeKind};
use gpu_mem_track_log::log::oom::human_bytes;
use gpu_mem_track_log::{Phase, Trace, TraceEvent};

/// What the caching allocator model shows for a trace with its GPU library allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct GpuReplay {
    /// `memory_allocated()` once the model and the input are loaded (before the first forward):
    /// parameters, buffers and input as the allocator rounds them into blocks.
    pub baseline_allocated: u64,
    /// `max_memory_allocated()`.
    pub peak_allocated: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved: u64,
    /// Segments `cudaMalloc`ed.
    pub segments: u64,
    /// The trace event after which `peak_allocated` was first reached.
    pub peak_event: usize,
}

/// The first allocation a device cannot serve, after the caching allocator released its cache
/// and tried again: where a GPU run would stop with `torch.OutOfMemoryError`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// The innermost op of the allocation (`aten::empty` for a kernel's output on meta).
    pub op: String,
    /// The outermost op: the call the program made (`aten::conv2d`, or the autograd node in
    /// backward).
    pub top_op: String,
    /// Phase of the run.
    pub phase: Phase,
    /// Training iteration (1-based; 0 while loading).
    pub iteration: u32,
    /// The trace event of the allocation (for a GPU library's workspace: the event it follows).
    pub event: usize,
    /// `None` for a tensor; the GPU library allocation it is otherwise.
    pub runtime: Option<RuntimeKind>,
    /// Bytes asked for.
    pub requested: u64,
    /// Rounded to the allocator's 512-byte granularity.
    pub rounded: u64,
    /// The segment `cudaMalloc` would have had to give: the rounded size for 10 MiB and more
    /// (rounded up to 2 MiB), a 2 MiB or 20 MiB segment for smaller requests.
    pub segment: u64,
    /// `memory_reserved()` after the cache was released: segments with live blocks.
    pub reserved_after_retry: u64,
    /// `memory_allocated()` then.
    pub allocated: u64,
    /// Memory the allocator can have: the device's, less the CUDA context.
    pub capacity: u64,
    /// `segment + reserved_after_retry - capacity`: bytes missing for this allocation to
    /// succeed (free space inside reserved segments counts as taken: it is fragmentation the
    /// request cannot use).
    pub short_by: u64,
}

impl FirstOom {
    fn new(e: &TraceEvent, event: usize, runtime: Option<RuntimeKind>, oom: &OutOfMemory) -> FirstOom {
        FirstOom {
            op: e.op.clone(),
            top_op: e.top_op.clone(),
            phase: e.phase,
            iteration: e.iteration,
            event,
            runtime,
            requested: oom.requested,
            rounded: oom.rounded,
            segment: oom.segment,
            reserved_after_retry: oom.reserved,
            allocated: oom.allocated,
            capacity: oom.capacity,
            short_by: oom.short_by(),
        }
    }

    /// The op to name: the program's call when the innermost op only allocates for it
    /// (`aten::empty` under `aten::conv2d`), else the innermost op and the call it is in; an
    /// autograd node by its name (`ConvolutionBackward0`, not
    /// `autograd::engine::evaluate_function: ConvolutionBackward0`).
    pub fn op_name(&self) -> String {
        let top = self.top_op.strip_prefix("autograd::engine::evaluate_function: ").unwrap_or(&self.top_op);
        if self.op == self.top_op || top.is_empty() {
            self.op.clone()
        } else if is_allocation_primitive(&self.op) || self.op.is_empty() {
            top.to_owned()
        } else {
            format!("{} in {top}", self.op)
        }
    }
}

/// `does not fit: aten::conv2d (forward, iteration 1) asks for 196.0 MiB; 58.0 MiB left of 15.6 GiB
/// usable once the cache is released (15.6 GiB reserved, 15.5 GiB allocated): 138.0 MiB short`
impl fmt::Display for FirstOom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.runtime {
            None => "",
            Some(RuntimeKind::CublasWorkspace) => "the cuBLAS workspace of ",
            Some(RuntimeKind::CublasLtWorkspace) => "the cuBLASLt workspace of ",
            Some(RuntimeKind::CudnnWorkspace) => "the cuDNN workspace of ",
        };
        let when = if self.iteration > 0 {
            format!("{}, iteration {}", self.phase, self.iteration)
        } else {
            self.phase.to_string()
        };
        let segment = if self.segment > self.rounded {
            format!(" (a new {} segment)", human_bytes(self.segment))
        } else {
            String::new()
        };
        write!(
            f,
            "does not fit: {what}{} ({when}) asks for {}{segment}; {} left of {} usable once the cache is \
             released ({} reserved, {} allocated): {} short",
            self.op_name(),
            human_bytes(self.rounded),
            human_bytes(self.capacity.saturating_sub(self.reserved_after_retry)),
            human_bytes(self.capacity),
            human_bytes(self.reserved_after_retry),
            human_bytes(self.allocated),
            human_bytes(self.short_by)
        )
    }
}

/// Allocations made directly by a oneDNN kernel (not by an `aten::empty` it calls) exist only on
/// the CPU.
pub fn cpu_only_op(name: &str) -> bool {
    name.starts_with("aten::mkldnn") || name.starts_with("mkldnn::") || name.starts_with("onednn::")
}

/// Replays `trace` and the `runtime` allocations (sorted by [`RuntimeAllocation::after_event`])
/// through one caching allocator model. Allocations only a CPU run makes (oneDNN's own, see
/// `Estimate::cpu_only_temporaries`) are left out.
pub fn replay_with_runtime(trace: &Trace, runtime: &[RuntimeAllocation]) -> GpuReplay {
    replay_on_device(trace, runtime, None).0
}

/// [`replay_with_runtime`] on a device whose allocator can reserve at most `capacity` bytes
/// (`None`: unlimited): the replay stops at the first allocation that cannot be placed once the
/// cache was released, and returns it. A cuDNN workspace that cannot be placed is left out (the
/// convolution falls back to an engine needing less, see the [module docs](self)). The figures
/// returned are those up to the failure.
pub fn replay_on_device(
    trace: &Trace,
    runtime: &[RuntimeAllocation],
    capacity: Option<u64>,
) -> (GpuReplay, Option<FirstOom>) {
    let (replay, first_oom, _) = replay_with_stats(trace, runtime, capacity);
    (replay, first_oom)
}

/// [`replay_on_device`], with the caching allocator model's own counters at the end (what
/// `Estimate::cuda` reports). The one loop that feeds a trace through
/// the model: estimates, GPU predictions and per-rank figures all come from it.
pub fn replay_with_stats(
    trace: &Trace,
    runtime: &[RuntimeAllocation],
    capacity: Option<u64>,
) -> (GpuReplay, Option<FirstOom>, CachingStats) {
    let mut model = capacity.map_or_else(CachingAllocatorModel::new, CachingAllocatorModel::with_capacity);
    let mut blocks: std::collections::HashMap<i64, BlockId> = std::collections::HashMap::new();
    let mut pending_frees: Vec<(usize, BlockId)> = Vec::new();
    let mut next_runtime = runtime.iter().peekable();
    let mut baseline = None;
    let mut out = GpuReplay::default();
    let mut first_oom = None;
    'events: for (i, e) in trace.events.iter().enumerate() {
        if baseline.is_none() && e.phase >= Phase::Forward && e.phase != Phase::Unmarked {
            baseline = Some(model.stats().allocated);
        }
        if e.alloc {
            // oneDNN's own scratch memory of a CPU run (`--allow-cpu`) has no GPU counterpart; its
            // frees then find no block. The CUDA allocator returns no block for 0 bytes
            // (`NativeCachingAllocator::allocate`).
            if e.size > 0 && !cpu_only_op(&e.op) {
                match model.malloc(e.size) {
                    Ok(b) => {
                        blocks.insert(e.id, b);
                    }
                    Err(oom) => {
                        first_oom = Some(FirstOom::new(e, i, None, &oom));
                        break 'events;
                    }
                }
            }
        } else if let Some(b) = blocks.remove(&e.id) {
            model.free(b);
        }
        while let Some(r) = next_runtime.next_if(|r| r.after_event == i) {
            match model.malloc(r.bytes) {
                Ok(b) => {
                    if let Some(at) = r.freed_after {
                        pending_frees.push((at, b));
                    }
                }
                Err(oom) if r.kind == RuntimeKind::CublasWorkspace => {
                    first_oom = Some(FirstOom::new(e, i, Some(r.kind), &oom));
                    break 'events;
                }
                Err(_) => {} // a cuDNN engine with a smaller workspace runs instead
            }
        }
        if model.stats().peak_allocated > out.peak_allocated {
            out.peak_allocated = model.stats().peak_allocated;
            out.peak_event = i;
        }
        pending_frees.retain(|&(at, b)| {
            if at == i {
                model.free(b);
            }
            at != i
        });
    }
    let stats = model.stats();
    if let (Some(oom), true) = (&first_oom, stats.peak_allocated > out.peak_allocated) {
        // The failing event's own tensor was placed before its workspace failed.
        out.peak_allocated = stats.peak_allocated;
        out.peak_event = oom.event;
    }
    out.baseline_allocated = baseline.unwrap_or(stats.allocated);
    out.peak_reserved = stats.peak_reserved;
    out.segments = stats.segment_allocs;
    (out, first_oom, stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{place_runtime_allocations, RuntimeSizes};
    use crate::test_events::{ev, replay, trace, MIB};

    fn with_iteration(mut e: TraceEvent, iteration: u32) -> TraceEvent {
        e.iteration = iteration;
        e
    }

    #[test]
    fn the_first_allocation_that_cannot_be_placed_is_named_with_its_shortfall() {
        let t = trace(vec![
            with_iteration(ev(true, 1, 12, Phase::Load, "aten::empty"), 0),
            ev(true, 2, 30, Phase::Forward, "aten::relu"),
            with_iteration(
                TraceEvent {
                    size: 40 * MIB + 100,
                    top_op: "autograd::engine::evaluate_function: ConvolutionBackward0".into(),
                    ..ev(true, 3, 0, Phase::Backward, "aten::empty_strided")
                },
                2,
            ),
            ev(true, 4, 1, Phase::Backward, "aten::add"),
        ]);
        let (_, oom) = replay_on_device(&t, &[], Some(80 * MIB));
        let oom = oom.expect("12 + 30 + 42 MiB > 80 MiB");
        assert_eq!(
            oom,
            FirstOom {
                op: "aten::empty_strided".into(),
                top_op: "autograd::engine::evaluate_function: ConvolutionBackward0".into(),
                phase: Phase::Backward,
                iteration: 2,
                event: 2,
                runtime: None,
                requested: 40 * MIB + 100,
                rounded: 40 * MIB + 512,
                segment: 42 * MIB,
                reserved_after_retry: 42 * MIB,
                allocated: 42 * MIB,
                capacity: 80 * MIB,
                short_by: 4 * MIB,
            }
        );
        assert_eq!(
            oom.to_string(),
            "does not fit: ConvolutionBackward0 (backward, iteration 2) asks for 40.0 MiB (a new 42.0 MiB \
             segment); 38.0 MiB left of 80.0 MiB usable once the cache is released (42.0 MiB \
             reserved, 42.0 MiB allocated): 4.0 MiB short"
        );
        // With room for it, the next allocation is the first that fails; with more, none.
        assert_eq!(replay_on_device(&t, &[], Some(84 * MIB)).1.map(|o| o.event), Some(3));
        assert_eq!(replay_on_device(&t, &[], Some(86 * MIB)).1, None);
        assert_eq!(replay_on_device(&t, &[], None).1, None, "unlimited: never");
    }

    #[test]
    fn an_allocation_that_fits_once_the_cache_is_released_is_no_oom() {
        // The 30 MiB activation is freed: its segment is cached and too small for the 40 MiB.
        let t = trace(vec![
            ev(true, 1, 12, Phase::Load, "aten::empty"),
            ev(true, 2, 30, Phase::Forward, "aten::relu"),
            ev(false, 2, 30, Phase::Forward, "aten::relu"),
            ev(true, 3, 40, Phase::Forward, "aten::relu"),
        ]);
        // Without a limit the cache is kept: 82 MiB reserved, more than the 60 MiB device.
        assert_eq!(replay_with_runtime(&t, &[]).peak_reserved, 82 * MIB);
        // PyTorch releases the cached 30 MiB segment and retries: 12 + 40 fits.
        let (r, oom) = replay_on_device(&t, &[], Some(60 * MIB));
        assert_eq!(oom, None);
        assert_eq!((r.peak_allocated, r.peak_reserved), (52 * MIB, 52 * MIB));
        // One byte less than 12 + 40 and it does not.
        let oom = replay_on_device(&t, &[], Some(52 * MIB - 1)).1.unwrap();
        assert_eq!((oom.event, oom.reserved_after_retry, oom.short_by), (3, 12 * MIB, 1));
    }

    #[test]
    fn a_cudnn_workspace_that_cannot_be_placed_falls_back_but_the_cublas_one_fails() {
        let t = trace(vec![
            ev(true, 1, 20, Phase::Forward, "aten::relu"),
            ev(true, 2, 30, Phase::Forward, "aten::convolution_overrideable"),
            ev(true, 3, 2, Phase::Forward, "aten::addmm"),
        ]);
        let sizes = RuntimeSizes { cublas_workspace: 8 * MIB, cublaslt_workspace: 0, cudnn_workspaces: true };
        let placed = place_runtime_allocations(&t, sizes);
        assert_eq!(replay_on_device(&t, &placed, None).0.peak_allocated, 80 * MIB, "with the 30 MiB one");
        // 50 MiB of tensors, the 30 MiB cuDNN workspace left out, the 2 MiB output and the 8 MiB
        // cuBLAS workspace in one 20 MiB segment: 70 MiB.
        let (r, oom) = replay_on_device(&t, &placed, Some(70 * MIB));
        assert_eq!(oom, None, "the convolution runs without its workspace");
        assert_eq!((r.peak_allocated, r.peak_reserved), (60 * MIB, 70 * MIB));
        let oom = replay_on_device(&t, &placed, Some(69 * MIB)).1.expect("the matmul output's segment");
        assert_eq!((oom.event, oom.runtime, oom.op.as_str()), (2, None, "aten::addmm"));
        // The output in a 2 MiB small-pool segment; the workspace then needs 20 MiB more.
        let t = trace(vec![
            ev(true, 1, 20, Phase::Forward, "aten::relu"),
            TraceEvent { size: 4096, ..ev(true, 2, 0, Phase::Forward, "aten::addmm") },
        ]);
        let placed = place_runtime_allocations(&t, sizes);
        let oom = replay_on_device(&t, &placed, Some(30 * MIB)).1.expect("the workspace's segment");
        assert_eq!((oom.event, oom.runtime), (1, Some(RuntimeKind::CublasWorkspace)));
        assert_eq!((oom.requested, oom.segment, oom.short_by), (8 * MIB, 20 * MIB, 12 * MIB));
        assert!(oom.to_string().starts_with("does not fit: the cuBLAS workspace of aten::addmm (forward"));
    }

    #[test]
    fn the_baseline_is_what_the_allocator_holds_before_the_first_forward() {
        // 1000 small parameters of 100 bytes: 512-byte blocks each.
        let mut events: Vec<TraceEvent> = (0..1000)
            .map(|i| TraceEvent { size: 100, ..ev(true, i, 0, Phase::Load, "aten::empty") })
            .collect();
        events.push(ev(true, 5000, 3, Phase::Input, "aten::empty"));
        events.push(ev(true, 5001, 1, Phase::Forward, "aten::relu"));
        let r = replay(&trace(events), RuntimeSizes::default());
        assert_eq!(r.baseline_allocated, 1000 * 512 + 3 * MIB);
    }
}
