//! The figures a run reports besides its timeline, as the shim counts them and an estimate shows
//! them: the model's sizes, the ops that went through the meta-via-CPU fallback, the CPU tensors a
//! meta run met, the static estimate. The lowest module: the FFI builds them.
use serde::Serialize;

/// What a model and its input hold, in bytes (and parameter elements).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ModelSizes {
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

/// The kernel each `scaled_dot_product_attention` call of a meta run took: the one a GPU of the
/// target compute capability picks for it (flash, memory-efficient or math attention). Math
/// attention keeps the (batch, heads, query, key) attention weights for backward; a GPU takes it
/// when no fused kernel accepts the call (a float32 model with grouped-query heads, a head size
/// the fused kernels do not take, an older GPU, or the fused kernels switched off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AttentionKernels {
    /// Calls that took flash attention (or cuDNN's, which keeps the same tensors).
    pub flash: u64,
    /// Calls that took memory-efficient attention.
    pub efficient: u64,
    /// Calls that took the math path.
    pub math: u64,
}

impl AttentionKernels {
    /// The calls made since `before`, a count taken earlier.
    pub(crate) fn since(&self, before: &AttentionKernels) -> AttentionKernels {
        AttentionKernels {
            flash: self.flash.saturating_sub(before.flash),
            efficient: self.efficient.saturating_sub(before.efficient),
            math: self.math.saturating_sub(before.math),
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
