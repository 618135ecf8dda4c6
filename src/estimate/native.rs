//! Estimates for models built with `tch::nn` on a `VarStore`: the model is built on the CPU, its
//! variables are moved to the meta device in place (tch has no meta device, the shim does it), and
//! the user's step runs on meta inputs - no real memory, no compute.
//!
//! tch reports a meta tensor's device as `Device::Mps` (it has no variant for it); ops do not look
//! at it, but code that creates tensors with `vs.device()` or `xs.device()` inside the step would
//! mix devices. Make everything from the given input and target, as the step below does.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use tch::nn;
use tch::{Device, Kind, Tensor};

use super::{
    finish_estimate, EstimateDevice, EstimateOptions, Lifetimes, Mode, Optimizer, Phase, Precision, Trace,
};
use crate::error::{Error, Result};
use crate::estimate::Estimate;
use crate::ffi::{self, DeviceKind};
use crate::snapshot::dtype_of;
use gpu_mem_track_log::DType;

/// What a tch-native training step is estimated with.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeStepOptions {
    /// Input shape, batch first.
    pub input_shape: Vec<i64>,
    /// Integer token ids (int64) rather than floats.
    pub input_is_index: bool,
    /// Target shape (int64 class indices, all zero); empty for none (an undefined tensor).
    pub target_shape: Vec<i64>,
    /// Precision of parameters and float input.
    pub precision: Precision,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Where to run: `Meta` to estimate, `Cpu` to check an estimate with real compute.
    pub device: EstimateDevice,
}

struct RecorderGuard;

impl Drop for RecorderGuard {
    fn drop(&mut self) {
        let _ = ffi::history_stop();
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = panic_message(p);
        Error::EstimateInput(format!("{what} failed: {}", msg.lines().next().unwrap_or("")))
    })
}

/// Builds the model in a new VarStore, moves its variables to `kind` (converting floating ones
/// to `dtype`, when given) and tags its trainable ones as parameters in the recording.
fn load<M>(
    build: impl FnOnce(&nn::Path) -> M,
    kind: DeviceKind,
    dtype: Option<DType>,
) -> Result<(nn::VarStore, M)> {
    let vs = nn::VarStore::new(Device::Cpu);
    let model = guarded("building the model", || build(&vs.root()))?;
    if dtype.is_some() {
        for t in vs.variables().values() {
            ffi::tensor_to_device_in_place(t, kind, dtype)?;
        }
    }
    for p in &vs.trainable_variables() {
        ffi::tag_parameter_tensor(p)?;
    }
    Ok((vs, model))
}

/// Estimates two training iterations of a `tch::nn` model: `build` creates it on a `VarStore`
/// path; `step` returns the loss for an input and a target. Backward and the optimizer step are
/// done here (the same foreach updates as for TorchScript models).
///
/// # Errors
/// [`Error::EstimateInput`] when building or the step fails (its message); [`Error::Libtorch`]
/// from the shim.
pub fn training_step<M>(
    build: impl FnOnce(&nn::Path) -> M,
    step: impl Fn(&M, &Tensor, &Tensor) -> Tensor,
    options: &NativeStepOptions,
) -> Result<(Estimate, Trace)> {
    ffi::install()?;
    let meta = options.device == EstimateDevice::Meta;
    if meta {
        ffi::meta_allocator_install()?;
    }
    let kind = if meta { DeviceKind::Meta } else { DeviceKind::Cpu };
    let dtype = options.precision.dtype();
    let start = Instant::now();
    let reads_before = ffi::meta_scalar_reads();
    let fallback_before = ffi::meta_fallback_counts();
    ffi::recorder_start(kind)?;
    let guard = RecorderGuard;
    ffi::recorder_set_phase(Some(Phase::Load), 0);
    let convert = meta || options.precision != Precision::F32;
    let (vs, model) = load(build, kind, convert.then_some(dtype))?;
    let variables = vs.variables();
    let params = vs.trainable_variables();
    let bytes = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as u64;
    let param_bytes: u64 = params.iter().map(bytes).sum();
    let buffer_bytes: u64 = variables.values().filter(|t| !t.requires_grad()).map(bytes).sum();
    let param_count: u64 = params.iter().map(|t| t.numel() as u64).sum();

    ffi::recorder_set_phase(Some(Phase::Input), 0);
    let input = ffi::make_tensor(
        &options.input_shape,
        if options.input_is_index { dtype_of(Kind::Int64) } else { dtype },
        kind,
    )?;
    let target = if options.target_shape.is_empty() {
        Tensor::new()
    } else {
        ffi::make_tensor(&options.target_shape, dtype_of(Kind::Int64), kind)?
    };
    let input_bytes = bytes(&input);
    let mut optimizer = ffi::ShimOptimizer::new(options.optimizer.kind())?;
    let mut grad_bytes = 0;
    for it in 1..=2 {
        ffi::recorder_set_phase(Some(Phase::Forward), it);
        let loss = guarded("the step", || step(&model, &input, &target))?;
        ffi::recorder_set_phase(Some(Phase::Backward), it);
        loss.f_backward().map_err(|e| Error::EstimateInput(format!("backward failed: {e}")))?;
        drop(loss);
        ffi::recorder_set_phase(Some(Phase::Optimizer), it);
        optimizer.step(&params)?;
        if it < 2 {
            grad_bytes = ffi::grads_set_to_none(&params)?;
        }
    }
    let optimizer_state_bytes = optimizer.state_bytes();
    drop(guard);
    let (events, names) = ffi::recorded_events();
    let options = EstimateOptions {
        input_shape: options.input_shape.clone(),
        input_is_index: options.input_is_index,
        precision: options.precision,
        mode: Mode::Train(options.optimizer),
        device: options.device,
        // The program's own tensors, freed when it drops them: eager by construction.
        lifetimes: Lifetimes::Eager,
    };
    let sizes = ffi::EstimateSizes {
        param_count,
        param_bytes,
        buffer_bytes,
        input_bytes,
        grad_bytes,
        optimizer_state_bytes,
        meta_scalar_reads: ffi::meta_scalar_reads() - reads_before,
        cpu_fallback: ffi::meta_fallback_since(&fallback_before),
    };
    let parameter_ids = ffi::recorded_parameter_ids();
    drop((model, vs, optimizer, input, target));
    Ok(finish_estimate(&options, &sizes, &events, &names, &parameter_ids, start))
}
