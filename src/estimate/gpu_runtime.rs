//! Allocations a GPU run makes that a meta run cannot see, placed where PyTorch makes them and
//! replayed through the caching allocator model with every tensor of the run.
//!
//! A meta run records the tensors ops return. On a GPU, libraries called inside ops also take
//! memory from PyTorch's caching allocator; those allocations are events of the same sequence, so
//! they can land in a cached free block (no new segment) and raise the peak only when they
//! coincide with it. What is modelled, and the PyTorch 2.13 source each rule comes from:
//!
//! * **cuBLAS workspace** (`aten/src/ATen/cuda/CublasHandlePool.cpp`): `getCurrentCUDABlasHandle()`
//!   calls `setWorkspaceForHandle`, which allocates `getChosenWorkspaceSize()` bytes through
//!   `CUDACachingAllocator::get()->allocate` once per (handle, stream) and keeps them in
//!   `cublas_handle_stream_to_workspace` until the process ends. The first matmul-family op
//!   (`mm`, `addmm`, `bmm`, `baddbmm`, `matmul`, `linear`, `addmv`, the math path of attention)
//!   fetches the handle inside its kernel, after its output tensor was allocated (structured
//!   kernels allocate `out` in `set_output` before `impl` runs): the workspace is placed right after
//!   the first such op's first allocation and never freed. Size: `CUBLAS_WORKSPACE_CONFIG`, else
//!   `:4096:2:16:8` (8 MiB + 128 KiB), or 32 MiB on sm 9.0 ([`DeviceProfile::cublas_workspace_bytes`](super::profile::DeviceProfile::cublas_workspace_bytes)).
//!   The cuBLASLt workspace (`getCUDABlasLtWorkspace`, 1 MiB unless `CUBLASLT_WORKSPACE_SIZE`) is
//!   only taken by `addmm` with a bias when both matrices have more than one row and column
//!   (`Blas.cpp`, `useLtInterface`); it is not placed (at most 1 MiB, in the small pool).
//! * **cuDNN convolution workspace** (`aten/src/ATen/native/cudnn/Conv_v8.cpp`, `run_conv_plan`):
//!   allocated through the caching allocator while each convolution (forward, backward-data,
//!   backward-weight) runs, after its outputs were allocated, and freed when it returns. Its size is
//!   the engine cuDNN's heuristics pick on the GPU, unknowable here: the low end is 0, the high end
//!   places at each convolution call a workspace as large as the largest tensor that call
//!   allocates (its output, or the largest gradient it returns) - the implicit-GEMM and Winograd
//!   engines the heuristics favour without `cudnn.benchmark` need at most about one operand.
//! * Looked at and already in the meta sequence, so nothing is added: max-pool indices (on any
//!   device but the CPU, `max_pool2d` calls `max_pool2d_with_indices`, `MaxPooling.cpp`), dropout
//!   masks (`native_dropout` returns its bool mask on CUDA as on meta), attention's logsumexp (this
//!   crate's meta kernel for fused attention returns it as the flash kernel does). cuDNN
//!   batch-norm's reserve space and workspace (`aten/src/ATen/native/cudnn/BatchNorm.cpp`, sized
//!   by `cudnnGetBatchNormalizationTrainingExReserveSpaceSize`/`...WorkspaceSize` for
//!   `CUDNN_BATCHNORM_OPS_BN`, no fused activation) are cuDNN's choice and small next to the
//!   activation they normalise (a bitmask at most); they are not placed. Its eval-mode extra
//!   outputs are 0-byte tensors the allocator never sees.
use serde::Serialize;

use gpu_mem_track_log::caching_allocator::{BlockId, CachingAllocatorModel};
use gpu_mem_track_log::{Phase, Trace, TraceEvent};

/// Ops whose kernels call cuBLAS (the innermost op an allocation is recorded under).
const CUBLAS_OPS: [&str; 8] = [
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::addmv",
    "aten::_scaled_dot_product_attention_math",
];

/// Whether an op name is `name` or one of its overloads (`aten::mm.out`).
fn is_op(op: &str, name: &str) -> bool {
    op.strip_prefix(name).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// An allocation made by the op named in `top_op` itself rather than by an op it calls: on meta
/// a kernel's outputs are recorded under `aten::empty`/`aten::empty_strided`.
fn is_allocation_primitive(op: &str) -> bool {
    is_op(op, "aten::empty") || is_op(op, "aten::empty_strided") || is_op(op, "aten::empty_like")
}

fn is_cublas_call(e: &TraceEvent) -> bool {
    let cublas = |op: &str| CUBLAS_OPS.iter().any(|name| is_op(op, name));
    cublas(&e.op) || (is_allocation_primitive(&e.op) && cublas(&e.top_op))
}

/// Allocations of a convolution call: forward outputs are recorded under `aten::conv2d` (or
/// `conv1d`, `conv3d`, `conv_transpose2d`, `_convolution`) with an allocation primitive or a
/// convolution kernel innermost; backward ones under `ConvolutionBackward0`. Other ops under the
/// same outer op (the `aten::add` that accumulates a gradient) run after the call returned.
fn is_convolution(e: &TraceEvent) -> bool {
    // Case-insensitive without allocating: this runs for every event of every replay.
    let conv = |s: &str| s.as_bytes().windows(4).any(|w| w.eq_ignore_ascii_case(b"conv"));
    conv(&e.top_op) && (is_allocation_primitive(&e.op) || conv(&e.op))
}

/// What a GPU library allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// The cuBLAS handle's workspace: kept until the process ends.
    CublasWorkspace,
    /// A cuDNN convolution's workspace: freed when the call returns.
    CudnnWorkspace,
}

/// A GPU library allocation placed in a recorded sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RuntimeAllocation {
    /// What it is.
    pub kind: RuntimeKind,
    /// Bytes requested from the caching allocator.
    pub bytes: u64,
    /// Allocated right after this event of the trace.
    pub after_event: usize,
    /// Freed right after this event (`None`: kept to the end).
    pub freed_after: Option<usize>,
}

/// Which GPU library allocations to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuntimeSizes {
    /// cuBLAS workspace bytes (0: the model has no matmul, or leave it out).
    pub cublas_workspace: u64,
    /// Place the high-end cuDNN workspace at each convolution call.
    pub cudnn_workspaces: bool,
}

/// Places the GPU library allocations of `sizes` in `trace`, in the order the events happen.
pub fn place_runtime_allocations(trace: &Trace, sizes: RuntimeSizes) -> Vec<RuntimeAllocation> {
    let mut out = Vec::new();
    if sizes.cublas_workspace > 0 {
        if let Some(i) = trace.events.iter().position(|e| e.alloc && is_cublas_call(e)) {
            out.push(RuntimeAllocation {
                kind: RuntimeKind::CublasWorkspace,
                bytes: sizes.cublas_workspace,
                after_event: i,
                freed_after: None,
            });
        }
    }
    if sizes.cudnn_workspaces {
        out.extend(convolution_calls(trace).into_iter().map(|(first, last, largest)| RuntimeAllocation {
            kind: RuntimeKind::CudnnWorkspace,
            bytes: largest,
            after_event: first,
            freed_after: Some(last),
        }));
    }
    out.sort_by_key(|r| r.after_event);
    out
}

/// Each convolution call as (its first allocation, its last allocation, its largest allocation):
/// a run of consecutive convolution allocations with the same outer op and phase.
fn convolution_calls(trace: &Trace) -> Vec<(usize, usize, u64)> {
    let mut calls: Vec<(usize, usize, u64)> = Vec::new();
    let mut open = false;
    for (i, e) in trace.events.iter().enumerate() {
        if !(e.alloc && is_convolution(e)) {
            open = false;
            continue;
        }
        let same_call = open && {
            let prev = &trace.events[i - 1];
            prev.top_op == e.top_op && prev.phase == e.phase
        };
        match calls.last_mut() {
            Some(call) if same_call => {
                call.1 = i;
                call.2 = call.2.max(e.size);
            }
            _ => calls.push((i, i, e.size)),
        }
        open = true;
    }
    calls
}

/// The largest cuDNN workspace the high end places (0 without convolutions).
pub fn largest_cudnn_workspace(trace: &Trace) -> u64 {
    convolution_calls(trace).iter().map(|c| c.2).max().unwrap_or(0)
}

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

/// Replays `trace` and the `runtime` allocations (sorted by [`RuntimeAllocation::after_event`])
/// through one caching allocator model. Allocations only a CPU run makes (oneDNN's own, see
/// [`Estimate::cpu_only_temporaries`](super::Estimate::cpu_only_temporaries)) are left out.
pub fn replay_with_runtime(trace: &Trace, runtime: &[RuntimeAllocation]) -> GpuReplay {
    let mut model = CachingAllocatorModel::new();
    let mut blocks: std::collections::HashMap<i64, BlockId> = std::collections::HashMap::new();
    let mut pending_frees: Vec<(usize, BlockId)> = Vec::new();
    let mut next_runtime = runtime.iter().peekable();
    let mut baseline = None;
    let mut out = GpuReplay::default();
    for (i, e) in trace.events.iter().enumerate() {
        if baseline.is_none() && e.phase >= Phase::Forward && e.phase != Phase::Unmarked {
            baseline = Some(model.stats().allocated);
        }
        if e.alloc {
            // oneDNN's own scratch memory of a CPU run (`--allow-cpu`) has no GPU counterpart; its
            // frees then find no block. The CUDA allocator returns no block for 0 bytes
            // (`NativeCachingAllocator::allocate`).
            if e.size > 0 && !super::cpu_only_op(&e.op) {
                if let Ok(b) = model.malloc(e.size) {
                    blocks.insert(e.id, b);
                }
            }
        } else if let Some(b) = blocks.remove(&e.id) {
            model.free(b);
        }
        while let Some(r) = next_runtime.next_if(|r| r.after_event == i) {
            if let Ok(b) = model.malloc(r.bytes) {
                if let Some(at) = r.freed_after {
                    pending_frees.push((at, b));
                }
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
    out.baseline_allocated = baseline.unwrap_or(stats.allocated);
    out.peak_reserved = stats.peak_reserved;
    out.segments = stats.segment_allocs;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mem_track_log::Category;

    const MIB: u64 = 1 << 20;

    fn ev(alloc: bool, id: i64, mib: u64, phase: Phase, op: &str) -> TraceEvent {
        TraceEvent {
            alloc,
            id,
            size: mib * MIB,
            phase,
            iteration: 1,
            op: op.into(),
            top_op: op.into(),
            category: Category::Unknown,
        }
    }

    fn trace(events: Vec<TraceEvent>) -> Trace {
        Trace { events }
    }

    fn replay(t: &Trace, sizes: RuntimeSizes) -> GpuReplay {
        replay_with_runtime(t, &place_runtime_allocations(t, sizes))
    }

    #[test]
    fn a_workspace_that_fits_a_cached_free_block_leaves_peak_reserved_unchanged() {
        // A 30 MiB activation is freed before the first matmul: its 30 MiB segment is cached and
        // the 8 MiB workspace is carved from it.
        let t = trace(vec![
            ev(true, 1, 4, Phase::Load, "aten::empty"),
            ev(true, 2, 30, Phase::Forward, "aten::relu"),
            ev(false, 2, 30, Phase::Forward, "aten::relu"),
            ev(true, 3, 2, Phase::Forward, "aten::addmm"),
        ]);
        let without = replay(&t, RuntimeSizes::default());
        let with = replay(&t, RuntimeSizes { cublas_workspace: 8 * MIB, cudnn_workspaces: false });
        assert_eq!(with.peak_reserved, without.peak_reserved, "no new segment");
        assert_eq!(with.segments, without.segments);
        // Adding on top would have said +20 MiB (a new large segment for the workspace).
        assert_eq!(without.peak_reserved, 20 * MIB + 30 * MIB);
    }

    #[test]
    fn a_workspace_first_needed_after_the_activation_peak_leaves_peak_allocated_unchanged() {
        // Peak: 4 + 64 MiB in the convolutions; the classifier's matmul comes when 4 + 2 are live.
        let t = trace(vec![
            ev(true, 1, 4, Phase::Load, "aten::empty"),
            ev(true, 2, 64, Phase::Forward, "aten::convolution_overrideable"),
            ev(true, 3, 2, Phase::Forward, "aten::mean"),
            ev(false, 2, 64, Phase::Forward, "aten::mean"),
            ev(true, 4, 1, Phase::Forward, "aten::addmm"),
        ]);
        let without = replay(&t, RuntimeSizes::default());
        let with =
            replay(&t, RuntimeSizes { cublas_workspace: 8 * MIB + 128 * 1024, cudnn_workspaces: false });
        assert_eq!(with.peak_allocated, without.peak_allocated);
        assert_eq!(with.peak_allocated, 70 * MIB);
        assert_eq!(with.baseline_allocated, 4 * MIB);
        // It is there: placed after the addmm output, and live at the end.
        let placed =
            place_runtime_allocations(&t, RuntimeSizes { cublas_workspace: MIB, cudnn_workspaces: false });
        assert_eq!(
            placed,
            vec![RuntimeAllocation {
                kind: RuntimeKind::CublasWorkspace,
                bytes: MIB,
                after_event: 4,
                freed_after: None
            }]
        );
    }

    #[test]
    fn a_convolution_workspace_raises_the_peak_only_where_it_coincides_with_it() {
        // Conv A (8 MiB output) runs while 40 MiB are live: the peak. Conv B (16 MiB output) runs
        // later with little else live.
        let peak_at_a = trace(vec![
            ev(true, 1, 40, Phase::Forward, "aten::relu"),
            ev(true, 2, 8, Phase::Forward, "aten::convolution_overrideable"),
            ev(false, 1, 40, Phase::Forward, "aten::relu"),
            ev(true, 3, 16, Phase::Forward, "aten::convolution_overrideable"),
            ev(false, 2, 8, Phase::Forward, "aten::relu"),
        ]);
        let low = replay(&peak_at_a, RuntimeSizes::default());
        let high = replay(&peak_at_a, RuntimeSizes { cublas_workspace: 0, cudnn_workspaces: true });
        assert_eq!(low.peak_allocated, 48 * MIB);
        // A's 8 MiB workspace coincides with the 48 MiB peak; B's 16 MiB lands at 8 + 16 + 16 = 40.
        assert_eq!(high.peak_allocated, 56 * MIB);
        // Move the peak away from both convolutions: the workspaces no longer raise it.
        let peak_elsewhere = trace(vec![
            ev(true, 1, 100, Phase::Forward, "aten::relu"),
            ev(false, 1, 100, Phase::Forward, "aten::relu"),
            ev(true, 2, 8, Phase::Forward, "aten::convolution_overrideable"),
            ev(true, 3, 16, Phase::Forward, "aten::convolution_overrideable"),
        ]);
        let low = replay(&peak_elsewhere, RuntimeSizes::default());
        let high = replay(&peak_elsewhere, RuntimeSizes { cublas_workspace: 0, cudnn_workspaces: true });
        assert_eq!(low.peak_allocated, 100 * MIB);
        assert_eq!(high.peak_allocated, 100 * MIB, "a sum on top would say 116 MiB");
    }

    #[test]
    fn one_convolution_call_gets_one_workspace_sized_by_its_largest_allocation() {
        // A backward convolution allocates grad_input then grad_weight: one call, one workspace.
        let t = trace(vec![
            ev(true, 1, 6, Phase::Backward, "aten::convolution_backward_overrideable"),
            ev(true, 2, 2, Phase::Backward, "aten::convolution_backward_overrideable"),
            ev(true, 3, 1, Phase::Backward, "aten::add"),
            ev(true, 4, 3, Phase::Backward, "aten::convolution_backward_overrideable"),
        ]);
        let placed =
            place_runtime_allocations(&t, RuntimeSizes { cublas_workspace: 0, cudnn_workspaces: true });
        let calls: Vec<(usize, Option<usize>, u64)> =
            placed.iter().map(|r| (r.after_event, r.freed_after, r.bytes / MIB)).collect();
        assert_eq!(calls, vec![(0, Some(1), 6), (3, Some(3), 3)]);
        assert_eq!(largest_cudnn_workspace(&t), 6 * MIB);
    }

    #[test]
    fn calls_are_recognised_by_the_names_a_meta_run_records() {
        let named = |top: &str, op: &str, mib: u64| TraceEvent {
            top_op: top.into(),
            ..ev(true, 0, mib, Phase::Backward, op)
        };
        let t = trace(vec![
            named("aten::conv2d", "aten::empty", 4),
            named("aten::batch_norm", "aten::empty", 4),
            named("autograd::engine::evaluate_function: ConvolutionBackward0", "aten::empty_strided", 2),
            named("autograd::engine::evaluate_function: ConvolutionBackward0", "aten::empty_strided", 1),
            named("autograd::engine::evaluate_function: ConvolutionBackward0", "aten::add", 8),
            named("aten::linear", "aten::addmm", 1),
        ]);
        let placed =
            place_runtime_allocations(&t, RuntimeSizes { cublas_workspace: 3 * MIB, cudnn_workspaces: true });
        let got: Vec<(RuntimeKind, usize, Option<usize>, u64)> =
            placed.iter().map(|r| (r.kind, r.after_event, r.freed_after, r.bytes / MIB)).collect();
        assert_eq!(
            got,
            vec![
                (RuntimeKind::CudnnWorkspace, 0, Some(0), 4),
                (RuntimeKind::CudnnWorkspace, 2, Some(3), 2),
                (RuntimeKind::CublasWorkspace, 5, None, 3),
            ]
        );
    }

    #[test]
    fn matmuls_are_matched_by_name_not_prefix() {
        let with = |op: &str| trace(vec![ev(true, 1, 1, Phase::Forward, op)]);
        let sizes = RuntimeSizes { cublas_workspace: MIB, cudnn_workspaces: false };
        assert_eq!(place_runtime_allocations(&with("aten::mm"), sizes).len(), 1);
        assert_eq!(place_runtime_allocations(&with("aten::addmm.out"), sizes).len(), 1);
        assert!(place_runtime_allocations(&with("aten::mmx"), sizes).is_empty());
    }

    #[test]
    fn onednn_scratch_of_a_cpu_run_is_not_replayed_on_the_gpu() {
        let t = trace(vec![
            ev(true, 1, 4, Phase::Forward, "aten::relu"),
            ev(true, 2, 64, Phase::Forward, "aten::mkldnn_convolution"),
            ev(false, 2, 64, Phase::Forward, "aten::mkldnn_convolution"),
        ]);
        let r = replay(&t, RuntimeSizes::default());
        assert_eq!(r.peak_allocated, 4 * MIB);
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
