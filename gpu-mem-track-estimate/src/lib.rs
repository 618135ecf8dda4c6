//! # gpu-mem-track-estimate
//!
//! Will it fit? Memory estimates of [`tch`] and TorchScript models without a GPU. A model runs on
//! libtorch's meta device (exact tensor sizes, no data, no compute) while the tracker crate's
//! allocation recorder ([`gpu_mem_track::recorder`]) notes every allocation and free with the phase
//! of the step; the recording is then replayed through a model of PyTorch's CUDA caching allocator
//! ([`caching_allocator`], with cuBLAS and cuDNN workspaces per GPU in [`profile`]) to predict
//! `memory_allocated`, `memory_reserved` and what `nvidia-smi` would show.
//!
//! A training step of a tch model, estimated on the meta device:
//!
//! ```
//! use gpu_mem_track_estimate::{training_step, EstimateDevice, TchStepOptions, Optimizer, Precision};
//! use tch::nn::{self, Module};
//!
//! let options = TchStepOptions {
//!     input_shape: vec![32, 64],
//!     input_is_index: false,
//!     target_shape: vec![],
//!     precision: Precision::F32,
//!     optimizer: Optimizer::Adam,
//!     device: EstimateDevice::Meta,
//! };
//! let build = |p: &nn::Path| nn::linear(p, 64, 10, Default::default());
//! let step = |m: &nn::Linear, x: &tch::Tensor, _target: &tch::Tensor| m.forward(x).sum(tch::Kind::Float);
//! let (estimate, trace) = training_step(build, step, &options)?;
//! let params = (64 * 10 + 10) * 4;
//! assert_eq!(estimate.sizes.param_bytes, params);
//! assert_eq!(estimate.sizes.grad_bytes, params);
//! assert_eq!(estimate.sizes.optimizer_state_bytes, 2 * params); // Adam: exp_avg, exp_avg_sq
//! assert!(estimate.peak.bytes >= 4 * params);
//! print!("{}", gpu_mem_track_estimate::text::PeakBreakdown { estimate: &estimate, trace: &trace });
//! # Ok::<(), gpu_mem_track_estimate::Error>(())
//! ```
//!
//! The rest: [`estimate_torchscript`] (a TorchScript file), [`estimate_static`] (its graph,
//! statically), [`varstore_size`] and [`torchscript_size`], [`memory_for_backward`], [`fit`] (the
//! largest batch or sequence that fits a GPU), [`sharding`] (ZeRO and mixed precision, per rank),
//! and [`text`]: the text the `gpu-mem-track-estimate` binary prints, as `Display`s.
#![deny(unsafe_code)]
#![warn(missing_docs)]

// The GPU model (no libtorch), under the names this crate has always given it.
use gpu_mem_track_gpu::options;
pub use gpu_mem_track_gpu::{caching_allocator, device_replay, profile, runtime, sharding};
mod error;
mod estimate;
mod exported;
mod ffi;
mod figures;
pub mod fit;
mod gpu_target;
pub mod in_process;
#[cfg(feature = "tch")]
mod saved;
pub mod session;
mod size;
#[cfg(feature = "tch")]
mod tch_model;
pub mod text;
mod torchscript;
pub mod vocabulary;

pub use error::{Error, Result};
pub use estimate::{estimate_progress, Estimate, PeakPlace, PhasePeak};
pub use figures::{AttentionKernels, CpuTensors, FallbackOp, ModelSizes, StaticEstimate};
pub use gpu_mem_track_log::{Category, Phase, TimelinePoint, Trace, TraceEvent};
pub use gpu_target::GpuTarget;
pub use options::{EstimateDevice, EstimateOptions, Lifetimes, Mode, Optimizer, Precision};
pub use session::{EstimateReport, EstimateRequest, ModuleBytes, RecordedRun};
#[cfg(feature = "tch")]
pub use tch_model::{inference_step, training_step, TchStepOptions};

/// Whether LSTM and GRU take cuDNN's path in a meta run, as they do on a CUDA device: on by
/// default, since estimates are for GPUs. Off, they take PyTorch's own path, the CPU's: what a
/// meta run is held to when it is checked against a CPU run of the same step. Process-wide.
pub fn meta_rnns_take_cudnn_path(on: bool) {
    ffi::meta_rnn_follows_cudnn(on);
}

/// The compute capability `(major, minor)` of the GPU that meta runs stand for: it decides which
/// kernel `scaled_dot_product_attention` takes, as on that GPU (flash attention from 8.0,
/// memory-efficient attention's dtypes and alignment, else the math path), and so what attention
/// keeps for backward. 9.0 until set; the `fit` functions set it from their device profile,
/// the command line and Python's `Estimator` from the profile asked for
/// ([`GpuTarget::target_meta_kernels`]). Process-wide.
pub fn meta_target_compute_capability(compute_capability: (u32, u32)) {
    ffi::meta_target_device(compute_capability);
}

#[cfg(feature = "tch")]
pub use saved::{memory_for_backward, memory_for_backward_excluding, SavedByOp, SavedReport};
#[cfg(feature = "tch")]
pub use size::varstore_size;
pub use size::{optimizer_state_bytes, torchscript_size, Activations, ModelSize};
pub use torchscript::{
    check_meta_kernels, estimate_static, estimate_torchscript, estimate_torchscript_traced,
    estimate_torchscript_with_peak_tensors, forward_passes, MetaKernelCase,
};
