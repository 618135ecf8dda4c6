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
//!   `:4096:2:16:8` (8 MiB + 128 KiB), or 32 MiB on sm 9.0 (`DeviceProfile::cublas_workspace_bytes` of the `profile` module).
//!   The cuBLASLt workspace (`getCUDABlasLtWorkspace`: 1 MiB unless `CUBLASLT_WORKSPACE_SIZE`,
//!   none when `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1` shares the cuBLAS one) is kept per (handle,
//!   stream) the same way; it is placed beside the cuBLAS workspace. On an H200 with PyTorch 2.11
//!   every inference peak of the GPU table sat exactly 1.0 MiB above a replay without it.
//! * **One handle per thread**: cuBLAS handles come from a per-thread pool window
//!   (`DeviceThreadHandlePool`), and autograd runs a CUDA backward on its own device thread
//!   (`torch/csrc/autograd/engine.cpp`, one thread per device), so the first matmul of the
//!   backward pass takes a second handle and a second pair of workspaces, kept to the end. A
//!   training step holds two cuBLAS workspaces (64 MiB on Hopper, as the memory history of a tch
//!   training loop on an H200 showed).
//! * **cuDNN convolution workspace** (`aten/src/ATen/native/cudnn/Conv_v8.cpp`, `run_conv_plan`):
//!   allocated through the caching allocator while each convolution (forward, backward-data,
//!   backward-weight) runs, after its outputs were allocated, and freed when it returns. Its size is
//!   the engine cuDNN's heuristics pick on the GPU, unknowable here: the low end is 0, the high end
//!   places at each convolution call 9/8 of the bytes of its three operands (input, output and
//!   weight; grad_output, input and weight in backward), which the meta kernels record
//!   ([`Trace::workspace_bounds`]). On an H200 every engine the torchvision models took needed at
//!   most those operands again plus 16 bytes (layout copies), a weight gradient up to 10 % more. A
//!   trace without bounds (a CPU run) takes the call's largest allocation instead.
//! * **cuDNN RNNs** (`aten/src/ATen/native/cudnn/RNN.cpp`): an LSTM or GRU that cuDNN takes
//!   keeps a reserve space from forward to backward and takes a workspace in each call (forward,
//!   backward data, backward weights), and its weight gradients are views of one flat buffer.
//!   These are recorded by the meta run itself, which takes cuDNN's path
//!   (`meta_rnns_take_cudnn_path` of the estimator,
//!   `gpu-mem-track-estimate-sys/csrc/cudnn_rnn.cpp`), so nothing is placed here. Their sizes are cuDNN's
//!   (`cudnnGetRNNTempSpaceSizes`), measured on an H200 for 32 geometries
//!   (`scripts/gpu/gpu_rnn_sizes.py`): the reserve is 5 (LSTM) or 6 (GRU) values per layer,
//!   direction, step, batch row and hidden unit, plus each inner layer's output (exact); each
//!   call's workspace is 8 MiB per layer and direction plus 1.5-2.9 times the input projection
//!   of every step (see that file).
//! * Looked at and already in the meta sequence, so nothing is added: max-pool indices (on any
//!   device but the CPU, `max_pool2d` calls `max_pool2d_with_indices`, `MaxPooling.cpp`), dropout
//!   masks (`dropout` takes `native_dropout` on meta as on CUDA, which keeps a bool mask),
//!   attention's logsumexp (the estimator's meta kernel for fused attention returns it as the
//!   flash kernel does). cuDNN
//!   batch-norm's reserve space and workspace (`aten/src/ATen/native/cudnn/BatchNorm.cpp`, sized
//!   by `cudnnGetBatchNormalizationTrainingExReserveSpaceSize`/`...WorkspaceSize` for
//!   `CUDNN_BATCHNORM_OPS_BN`, no fused activation) are cuDNN's choice and small next to the
//!   activation they normalise (a bitmask at most); they are not placed. Its eval-mode extra
//!   outputs are 0-byte tensors the allocator never sees.
//!
//!
//! How the allocator then lays the whole sequence out, against a device's memory or without a
//! limit, is the `device_replay` module.
use serde::Serialize;

use crate::cuda_libraries::{calls_cublas, is_op, MATMUL_BACKWARD_NODES};
use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};

/// An allocation made by the op named in `top_op` itself rather than by an op it calls: on meta
/// a kernel's outputs are recorded under `aten::empty`/`aten::empty_strided`.
pub(crate) fn is_allocation_primitive(op: &str) -> bool {
    is_op(op, "aten::empty") || is_op(op, "aten::empty_strided") || is_op(op, "aten::empty_like")
}

fn is_cublas_call(e: &TraceEvent) -> bool {
    calls_cublas(&e.op)
        || (is_allocation_primitive(&e.op) && calls_cublas(&e.top_op))
        || is_matmul_backward(e)
}

/// An allocation inside a matmul's backward node. Where the meta kernels are Python's (a run in a
/// Python process, after `import torch`), the node's allocations are recorded under the Python
/// kernel's own ops (`aten::new_empty`, ...) rather than `aten::mm`: the node names the call.
fn is_matmul_backward(e: &TraceEvent) -> bool {
    e.phase == Phase::Backward
        && e.top_op
            .strip_prefix("autograd::engine::evaluate_function: ")
            .is_some_and(|node| MATMUL_BACKWARD_NODES.contains(&node))
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
    /// The cuBLASLt workspace of a handle: kept until the process ends.
    CublasLtWorkspace,
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
    /// cuBLAS workspace bytes per handle (0: the model has no matmul, or leave it out).
    pub cublas_workspace: u64,
    /// cuBLASLt workspace bytes per handle (0: unified with the cuBLAS one, or leave it out).
    pub cublaslt_workspace: u64,
    /// Place the high-end cuDNN workspace at each convolution call.
    pub cudnn_workspaces: bool,
}

/// Places the GPU library allocations of `sizes` in `trace`, in the order the events happen.
pub fn place_runtime_allocations(trace: &Trace, sizes: RuntimeSizes) -> Vec<RuntimeAllocation> {
    let mut out = Vec::new();
    // The program's thread, and autograd's device thread for the backward pass: a handle each.
    for on_autograd_thread in [false, true] {
        let first = trace
            .events
            .iter()
            .position(|e| e.alloc && (e.phase == Phase::Backward) == on_autograd_thread && is_cublas_call(e));
        let Some(i) = first else { continue };
        for (kind, bytes) in [
            (RuntimeKind::CublasWorkspace, sizes.cublas_workspace),
            (RuntimeKind::CublasLtWorkspace, sizes.cublaslt_workspace),
        ] {
            if bytes > 0 {
                out.push(RuntimeAllocation { kind, bytes, after_event: i, freed_after: None });
            }
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

/// The trace with the GPU library allocations placed in it, in the
/// [`Workspace`](Category::Workspace) category: what a timeline of the run on that GPU shows. A
/// placed allocation's id is negative (the trace's own are not). Events after the last one the
/// placements refer to are kept as they are.
pub fn with_workspaces(trace: &Trace, runtime: &[RuntimeAllocation]) -> Trace {
    let mut after: Vec<Vec<TraceEvent>> = vec![Vec::new(); trace.events.len()];
    for (n, r) in runtime.iter().enumerate() {
        let Some(at) = trace.events.get(r.after_event) else { continue };
        let id = -1 - n as i64;
        let event = |alloc: bool, at: &TraceEvent| TraceEvent {
            alloc,
            id,
            size: r.bytes,
            phase: at.phase,
            iteration: at.iteration,
            op: at.op.clone(),
            top_op: at.top_op.clone(),
            category: Category::Workspace,
        };
        after[r.after_event].push(event(true, at));
        if let Some(f) = r.freed_after.filter(|&f| f < trace.events.len()) {
            after[f].push(event(false, &trace.events[f]));
        }
    }
    let mut events = Vec::with_capacity(trace.events.len() + 2 * runtime.len());
    for (e, placed) in trace.events.iter().zip(after) {
        events.push(e.clone());
        events.extend(placed);
    }
    Trace { events, workspace_bounds: trace.workspace_bounds.clone(), communicators: trace.communicators }
}

/// Each convolution call as (its first allocation, its last allocation, its workspace's high end:
/// the bound the meta kernels recorded for it, at least its largest allocation): a run of
/// consecutive convolution allocations with the same outer op and phase.
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
        // What the meta kernels saw of the call's operands bounds its workspace (a CPU run's
        // trace has no bounds: the call's largest allocation stands in).
        let size = e.size.max(trace.workspace_bounds.get(&e.id).copied().unwrap_or(0));
        match calls.last_mut() {
            Some(call) if same_call => {
                call.1 = i;
                call.2 = call.2.max(size);
            }
            _ => calls.push((i, i, size)),
        }
        open = true;
    }
    calls
}

/// The largest cuDNN workspace the high end places (0 without convolutions).
pub fn largest_cudnn_workspace(trace: &Trace) -> u64 {
    convolution_calls(trace).iter().map(|c| c.2).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_events::{ev, replay, trace, MIB};

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
        let with = replay(
            &t,
            RuntimeSizes { cublas_workspace: 8 * MIB, cublaslt_workspace: 0, cudnn_workspaces: false },
        );
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
        let with = replay(
            &t,
            RuntimeSizes {
                cublas_workspace: 8 * MIB + 128 * 1024,
                cublaslt_workspace: 0,
                cudnn_workspaces: false,
            },
        );
        assert_eq!(with.peak_allocated, without.peak_allocated);
        assert_eq!(with.peak_allocated, 70 * MIB);
        assert_eq!(with.baseline_allocated, 4 * MIB);
        // It is there: placed after the addmm output, and live at the end.
        let placed = place_runtime_allocations(
            &t,
            RuntimeSizes { cublas_workspace: MIB, cublaslt_workspace: 0, cudnn_workspaces: false },
        );
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
        let high = replay(
            &peak_at_a,
            RuntimeSizes { cublas_workspace: 0, cublaslt_workspace: 0, cudnn_workspaces: true },
        );
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
        let high = replay(
            &peak_elsewhere,
            RuntimeSizes { cublas_workspace: 0, cublaslt_workspace: 0, cudnn_workspaces: true },
        );
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
        let placed = place_runtime_allocations(
            &t,
            RuntimeSizes { cublas_workspace: 0, cublaslt_workspace: 0, cudnn_workspaces: true },
        );
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
        let placed = place_runtime_allocations(
            &t,
            RuntimeSizes { cublas_workspace: 3 * MIB, cublaslt_workspace: 0, cudnn_workspaces: true },
        );
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
    fn a_timeline_on_the_gpu_shows_the_placed_workspaces_as_workspace() {
        let t = trace(vec![
            ev(true, 1, 4, Phase::Forward, "aten::mm"),
            ev(true, 2, 2, Phase::Forward, "aten::convolution"),
            ev(false, 2, 2, Phase::Forward, "aten::convolution"),
            ev(false, 1, 4, Phase::Forward, "aten::relu"),
        ]);
        let runtime = [
            RuntimeAllocation {
                kind: RuntimeKind::CublasWorkspace,
                bytes: 8 * MIB,
                after_event: 0,
                freed_after: None,
            },
            RuntimeAllocation {
                kind: RuntimeKind::CudnnWorkspace,
                bytes: 3 * MIB,
                after_event: 1,
                freed_after: Some(1),
            },
        ];
        let on_gpu = with_workspaces(&t, &runtime);
        let placed: Vec<(bool, i64, u64)> = on_gpu
            .events
            .iter()
            .filter(|e| e.category == Category::Workspace)
            .map(|e| (e.alloc, e.id, e.size / MIB))
            .collect();
        assert_eq!(placed, [(true, -1, 8), (true, -2, 3), (false, -2, 3)]);
        assert_eq!(on_gpu.events[1].id, -1, "right after the event it follows");
        let peak = on_gpu.timeline().into_iter().max_by_key(|p| p.total).unwrap();
        let workspace = peak.bytes.iter().find(|(c, _)| *c == Category::Workspace).map(|b| b.1);
        assert_eq!((peak.total / MIB, workspace.map(|b| b / MIB)), (17, Some(11)));
    }

    #[test]
    fn autograds_thread_takes_its_own_workspaces_at_the_first_backward_matmul() {
        // Forward: an addmm; backward: a sum (the program's thread), then two mm (autograd's
        // device thread); a second step's forward and backward reuse both handles.
        let t = trace(vec![
            ev(true, 1, 4, Phase::Load, "aten::empty"),
            ev(true, 2, 1, Phase::Forward, "aten::addmm"),
            ev(true, 3, 1, Phase::Backward, "aten::sum"),
            ev(true, 4, 1, Phase::Backward, "aten::mm"),
            ev(true, 5, 1, Phase::Backward, "aten::mm"),
            ev(true, 6, 1, Phase::Forward, "aten::addmm"),
            ev(true, 7, 1, Phase::Backward, "aten::mm"),
        ]);
        let sizes =
            RuntimeSizes { cublas_workspace: 32 * MIB, cublaslt_workspace: MIB, cudnn_workspaces: false };
        let got: Vec<_> =
            place_runtime_allocations(&t, sizes).iter().map(|r| (r.kind, r.bytes, r.after_event)).collect();
        assert_eq!(
            got,
            vec![
                (RuntimeKind::CublasWorkspace, 32 * MIB, 1),
                (RuntimeKind::CublasLtWorkspace, MIB, 1),
                (RuntimeKind::CublasWorkspace, 32 * MIB, 3),
                (RuntimeKind::CublasLtWorkspace, MIB, 3),
            ]
        );
        let r = replay(&t, sizes);
        assert_eq!(r.peak_allocated, 4 * MIB + 6 * MIB + 2 * (32 * MIB + MIB), "all kept to the end");
    }

    #[test]
    fn a_matmul_backward_node_is_a_cublas_call_whatever_op_allocates_in_it() {
        let node = |op: &str, phase| TraceEvent {
            top_op: "autograd::engine::evaluate_function: AddmmBackward0".into(),
            ..ev(true, 1, 1, phase, op)
        };
        assert!(is_cublas_call(&node("aten::new_empty", Phase::Backward)));
        assert!(is_cublas_call(&node("aten::mm", Phase::Backward)));
        assert!(!is_cublas_call(&node("aten::new_empty", Phase::Forward)), "only a backward node");
        let other = TraceEvent {
            top_op: "autograd::engine::evaluate_function: ReluBackward0".into(),
            ..ev(true, 1, 1, Phase::Backward, "aten::new_empty")
        };
        assert!(!is_cublas_call(&other));
    }

    #[test]
    fn matmuls_are_matched_by_name_not_prefix() {
        let with = |op: &str| trace(vec![ev(true, 1, 1, Phase::Forward, op)]);
        let sizes = RuntimeSizes { cublas_workspace: MIB, cublaslt_workspace: 0, cudnn_workspaces: false };
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
}
