//! # gpu-mem-track-gpu
//!
//! What a run's allocations become on a GPU, without libtorch and without a GPU. Given a
//! [`Trace`](gpu_mem_track_log::Trace) (every allocation and free of a step, in order, with its
//! phase, op and category: from the estimator's meta run, the tracker's memory history, or a
//! PyTorch memory snapshot), this crate models what PyTorch's CUDA runtime makes of it:
//!
//! - [`caching_allocator`]: PyTorch's CUDA caching allocator (block rounding, the small and large
//!   pools, splitting, segments), giving `memory_allocated` and `memory_reserved`;
//! - [`cuda_libraries`]: which ops call cuBLAS and how large the workspaces CUDA libraries take
//!   from the allocator are, and how the tracker attributes them;
//! - [`runtime`]: those workspaces placed in the allocation sequence, where PyTorch makes them;
//! - [`device_replay`]: the sequence laid out against a device's memory, and the first allocation
//!   that would raise `torch.OutOfMemoryError`;
//! - [`profile`]: GPUs (memory, compute capability, CUDA context) and the prediction of what each
//!   would show, nvidia-smi included;
//! - [`sharding`]: one rank of a data-parallel job (ZeRO, FSDP, mixed precision);
//! - [`snapshot`]: a trace written as a memory snapshot laid out by the allocator model, for
//!   `torch.cuda._memory_viz`;
//! - [`options`]: the options a user names (optimizer, precision, lifetimes, ...), one parser each.
//!
//! The estimator (`gpu-mem-track-estimate`) makes the trace by running a model on libtorch's meta
//! device; the command line's lean binary uses this crate for `timeline` of a snapshot without
//! loading libtorch.
//!
//! A training step's trace on an H100, in a few lines:
//!
//! ```
//! use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};
//! use gpu_mem_track_gpu::profile::{predict, DeviceProfile};
//!
//! const MIB: u64 = 1 << 20;
//! let event = |alloc, id, mib: u64, phase, op: &str, category| TraceEvent {
//!     alloc, id, size: mib * MIB, phase, iteration: 1, op: op.into(), top_op: op.into(), category,
//! };
//! let trace = Trace {
//!     events: vec![
//!         event(true, 1, 64, Phase::Load, "aten::empty", Category::Parameter),
//!         event(true, 2, 3, Phase::Forward, "aten::addmm", Category::Activation),
//!         event(true, 3, 64, Phase::Backward, "aten::mm", Category::Gradient),
//!         event(false, 2, 3, Phase::Backward, "aten::mm", Category::Activation),
//!     ],
//!     ..Trace::default()
//! };
//! let h100 = DeviceProfile::find("h100-80g")?;
//! let gpu = predict(&h100, &trace, None);
//! // Two cuBLAS workspaces of 32 MiB on Hopper (the program's thread, autograd's), kept.
//! assert_eq!(gpu.cublas_workspace, 32 * MIB);
//! assert!(gpu.peak_allocated.low >= (64 + 3 + 64 + 2 * 32) * MIB);
//! assert!(gpu.fits);
//! # Ok::<(), gpu_mem_track_gpu::Error>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod caching_allocator;
pub mod cuda_libraries;
pub mod device_replay;
mod error;
pub mod options;
pub mod profile;
pub mod runtime;
pub mod sharding;
pub mod snapshot;

pub use error::{Error, Result};
pub use options::Choice;

/// Events of a trace for the tests of this crate's modules.
#[cfg(test)]
pub(crate) mod test_events {
    use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};

    pub const MIB: u64 = 1 << 20;

    pub fn ev(alloc: bool, id: i64, mib: u64, phase: Phase, op: &str) -> TraceEvent {
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

    pub fn trace(events: Vec<TraceEvent>) -> Trace {
        Trace { events, ..Trace::default() }
    }

    /// The trace replayed with the GPU library allocations `sizes` asks for placed in it.
    pub fn replay(t: &Trace, sizes: crate::runtime::RuntimeSizes) -> crate::device_replay::GpuReplay {
        crate::device_replay::replay_with_runtime(t, &crate::runtime::place_runtime_allocations(t, sizes))
    }
}
