//! Estimates for models built with `tch::nn` on a `VarStore`: the model is built and its step
//! runs on the meta device - no real memory, no compute.
//!
//! On meta, for the build and the step and on the estimating thread only, the CPU means meta
//! (`ffi::CpuMeansMeta`): tch's LSTM and GRU make their zero state with the device the model was
//! built on, users write `Tensor::zeros(.., (kind, self.device))` or `xs.device()` (which tch
//! names `Device::Mps` for a meta tensor) in `forward`, and all of that is made on meta. The
//! VarStore is a CPU one, so its variables are made on meta as they are created; what is left on
//! the CPU (a tensor made before the estimate, tch's from-data tensors) is moved to meta where an
//! op uses it, and counted in [`Estimate::cpu_tensors`].
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use tch::nn;
use tch::{Device, Kind, Tensor};

use gpu_mem_track_log::{Phase, Trace};

use crate::error::{Error, Result};
use crate::estimate::{finish_estimate, Estimate, RecorderGuard};
use crate::ffi;
use crate::figures::ModelSizes;
use gpu_mem_track::recorder;
use gpu_mem_track::walk::dtype_of;
use gpu_mem_track::DeviceKind;
use gpu_mem_track_gpu::options::{EstimateDevice, EstimateOptions, Lifetimes, Mode, Optimizer, Precision};
use gpu_mem_track_log::DType;

/// What a tch training step is estimated with.
#[derive(Debug, Clone, PartialEq)]
pub struct TchStepOptions {
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

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = panic_message(p);
        Error::Input(format!("{what} failed: {}", msg.lines().next().unwrap_or("")))
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

/// What the build leaves for the run: the model, its VarStore and their sizes.
struct Loaded<M> {
    vs: nn::VarStore,
    model: M,
    params: Vec<Tensor>,
    sizes: ModelSizes,
}

/// Everything an estimate of a tch model sets up and takes down around the run: the meta
/// allocator, the recording, "the CPU means meta", the build, the input and the target.
struct NativeRun<M> {
    loaded: Loaded<M>,
    input: Tensor,
    target: Tensor,
    start: Instant,
    meta_counters: ffi::MetaCounters,
    // Dropped in this order: the CPU stops meaning meta, then the recording stops.
    cpu_means_meta: Option<ffi::CpuMeansMeta>,
    _recording: RecorderGuard,
}

impl<M> NativeRun<M> {
    fn begin(build: impl FnOnce(&nn::Path) -> M, options: &TchStepOptions) -> Result<Self> {
        gpu_mem_track::install()?;
        let meta = options.device == EstimateDevice::Meta;
        if meta {
            ffi::meta_allocator_install()?;
        }
        let kind = if meta { DeviceKind::Meta } else { DeviceKind::Cpu };
        let dtype = options.precision.dtype();
        let start = Instant::now();
        let meta_counters = ffi::MetaCounters::begin();
        recorder::start(kind)?;
        let recording = RecorderGuard;
        // On meta, what the build and the step make "on the CPU" is made on meta, on this thread.
        let cpu_means_meta = if meta { Some(ffi::CpuMeansMeta::begin(false)?) } else { None };
        recorder::set_phase(Some(Phase::Load), 0);
        let convert = meta || options.precision != Precision::F32;
        let (vs, model) = load(build, kind, convert.then_some(dtype))?;
        let variables = vs.variables();
        let params = vs.trainable_variables();
        let sizes = ModelSizes {
            param_count: params.iter().map(|t| t.numel() as u64).sum(),
            param_bytes: params.iter().map(tensor_bytes).sum(),
            buffer_bytes: variables.values().filter(|t| !t.requires_grad()).map(tensor_bytes).sum(),
            ..Default::default()
        };

        recorder::set_phase(Some(Phase::Input), 0);
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
        let mut loaded = Loaded { vs, model, params, sizes };
        loaded.sizes.input_bytes = tensor_bytes(&input);
        Ok(Self { loaded, input, target, start, meta_counters, cpu_means_meta, _recording: recording })
    }

    /// Ends the run and turns its recording into the estimate.
    fn finish(self, options: EstimateOptions) -> (Estimate, Trace) {
        let NativeRun { loaded, input, target, start, meta_counters, cpu_means_meta, _recording } = self;
        let cpu_tensors = cpu_means_meta.as_ref().map(ffi::CpuMeansMeta::counts).unwrap_or_default();
        drop(cpu_means_meta);
        drop(_recording);
        let (events, names) = recorder::events();
        let (meta_scalar_reads, cpu_fallback, attention) = meta_counters.since();
        let run =
            ffi::RunFigures { sizes: loaded.sizes, meta_scalar_reads, cpu_fallback, cpu_tensors, attention };
        let parameter_ids = recorder::parameter_ids();
        drop((loaded.model, loaded.vs, loaded.params, input, target));
        finish_estimate(&options, &run, &events, &names, &parameter_ids, start)
    }
}

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as u64
}

fn estimate_options(options: &TchStepOptions, mode: Mode) -> EstimateOptions {
    EstimateOptions {
        input_shape: options.input_shape.clone(),
        input_is_index: options.input_is_index,
        precision: options.precision,
        mode,
        device: options.device,
        // The program's own tensors, freed when it drops them: eager by construction.
        lifetimes: Lifetimes::Eager,
    }
}

/// Estimates two training iterations of a `tch::nn` model: `build` creates it on a `VarStore`
/// path; `step` returns the loss for an input and a target. Backward and the optimizer step are
/// done here (the same foreach updates as for TorchScript models).
///
/// # Errors
/// [`Error::Input`] when building or the step fails (its message); [`Libtorch`](gpu_mem_track::Error::Libtorch)
/// from the shim.
pub fn training_step<M>(
    build: impl FnOnce(&nn::Path) -> M,
    step: impl Fn(&M, &Tensor, &Tensor) -> Tensor,
    options: &TchStepOptions,
) -> Result<(Estimate, Trace)> {
    let mut run = NativeRun::begin(build, options)?;
    let mut optimizer = ffi::ShimOptimizer::new(options.optimizer.into())?;
    for it in 1..=2 {
        recorder::set_phase(Some(Phase::Forward), it);
        let loss = guarded("the step", || step(&run.loaded.model, &run.input, &run.target))?;
        recorder::set_phase(Some(Phase::Backward), it);
        loss.f_backward().map_err(|e| Error::Input(format!("backward failed: {e}")))?;
        drop(loss);
        recorder::set_phase(Some(Phase::Optimizer), it);
        optimizer.step(&run.loaded.params)?;
        if it < 2 {
            run.loaded.sizes.grad_bytes = ffi::grads_set_to_none(&run.loaded.params)?;
        }
    }
    run.loaded.sizes.optimizer_state_bytes = optimizer.state_bytes();
    let estimate = run.finish(estimate_options(options, Mode::Train(options.optimizer)));
    drop(optimizer);
    Ok(estimate)
}

/// Estimates inference of a `tch::nn` model: `forward` runs twice on the input without
/// gradients (`tch::no_grad`), as a serving loop would. `options.optimizer` and
/// `options.target_shape` are not used.
///
/// # Errors
/// As [`training_step`].
pub fn inference_step<M>(
    build: impl FnOnce(&nn::Path) -> M,
    forward: impl Fn(&M, &Tensor) -> Tensor,
    options: &TchStepOptions,
) -> Result<(Estimate, Trace)> {
    let options = TchStepOptions { target_shape: Vec::new(), ..options.clone() };
    let run = NativeRun::begin(build, &options)?;
    for it in 1..=2 {
        recorder::set_phase(Some(Phase::Forward), it);
        let output = guarded("the forward pass", || tch::no_grad(|| forward(&run.loaded.model, &run.input)))?;
        drop(output);
    }
    Ok(run.finish(estimate_options(&options, Mode::Inference)))
}
