//! Model size: parameters by dtype, buffers, gradients, optimizer state, and activations with and
//! without backward, for a `VarStore` or a TorchScript model (any module, not only sequences).
use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::Result;
use crate::torchscript::estimate_torchscript;
#[cfg(feature = "tch")]
use gpu_mem_track::walk::dtype_of;
use gpu_mem_track_gpu::options::{EstimateOptions, Mode, Optimizer, Precision};

/// Activation bytes of one forward pass of a given input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Activations {
    /// Highest bytes above parameters, buffers and input during a no-grad forward.
    pub without_backward: u64,
    /// Bytes above parameters, buffers and input kept after a training forward: what is saved for
    /// backward plus the output.
    pub with_backward: u64,
}

/// What a model occupies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSize {
    /// Parameter elements.
    pub param_count: u64,
    /// Parameter bytes by dtype (`torch.float32`, ...).
    pub param_bytes_by_dtype: BTreeMap<String, u64>,
    /// All parameter bytes.
    pub param_bytes: u64,
    /// Buffer bytes (non-trainable tensors: batch-norm statistics, ...).
    pub buffer_bytes: u64,
    /// Gradient bytes: one per trainable parameter.
    pub grad_bytes: u64,
    /// Optimizer state bytes.
    pub optimizer_state_bytes: u64,
    /// Activations, when a forward was run.
    pub activations: Option<Activations>,
}

impl ModelSize {
    /// Parameters, gradients and optimizer state: what a training step holds before activations.
    pub fn training_static_bytes(&self) -> u64 {
        self.param_bytes + self.buffer_bytes + self.grad_bytes + self.optimizer_state_bytes
    }
}

/// Bytes of optimizer state for `trainable` parameter bytes.
pub fn optimizer_state_bytes(optimizer: Optimizer, trainable: u64) -> u64 {
    match optimizer {
        Optimizer::Sgd => 0,
        Optimizer::SgdMomentum => trainable,
        Optimizer::Adam | Optimizer::AdamW => 2 * trainable,
    }
}

#[cfg(feature = "tch")]
/// Sizes of a `VarStore`'s variables (no forward is run, so no activations).
pub fn varstore_size(vs: &tch::nn::VarStore, optimizer: Optimizer) -> ModelSize {
    let mut by_dtype: BTreeMap<String, u64> = BTreeMap::new();
    let (mut count, mut params, mut buffers, mut trainable) = (0u64, 0u64, 0u64, 0u64);
    for t in vs.variables().values() {
        let bytes = (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        if t.requires_grad() {
            count += t.numel() as u64;
            params += bytes;
            trainable += bytes;
            *by_dtype.entry(dtype_of(t.kind()).torch_name()).or_default() += bytes;
        } else {
            buffers += bytes;
        }
    }
    ModelSize {
        param_count: count,
        param_bytes_by_dtype: by_dtype,
        param_bytes: params,
        buffer_bytes: buffers,
        grad_bytes: trainable,
        optimizer_state_bytes: optimizer_state_bytes(optimizer, trainable),
        activations: None,
    }
}

/// Sizes of a TorchScript model, with activations for `options.input_shape` measured by two runs
/// on the meta device (a no-grad forward and a training forward).
///
/// # Errors
/// As [`estimate_torchscript`](crate::torchscript::estimate_torchscript).
pub fn torchscript_size(path: &Path, options: &EstimateOptions, optimizer: Optimizer) -> Result<ModelSize> {
    let inference =
        estimate_torchscript(path, &EstimateOptions { mode: Mode::Inference, ..options.clone() })?;
    let train =
        estimate_torchscript(path, &EstimateOptions { mode: Mode::Train(optimizer), ..options.clone() })?;
    let base = inference.sizes.param_bytes + inference.sizes.buffer_bytes + inference.sizes.input_bytes;
    let dtype = format!(
        "torch.{}",
        match options.precision {
            Precision::F32 => "float32",
            Precision::F16 => "float16",
            Precision::Bf16 => "bfloat16",
        }
    );
    Ok(ModelSize {
        param_count: inference.sizes.param_count,
        param_bytes_by_dtype: BTreeMap::from([(dtype, inference.sizes.param_bytes)]),
        param_bytes: inference.sizes.param_bytes,
        buffer_bytes: inference.sizes.buffer_bytes,
        grad_bytes: train.sizes.grad_bytes,
        optimizer_state_bytes: train.sizes.optimizer_state_bytes,
        activations: Some(Activations {
            without_backward: inference.forward_peak.saturating_sub(base),
            with_backward: train.live_after_forward.saturating_sub(base + train.sizes.optimizer_state_bytes),
        }),
    })
}
