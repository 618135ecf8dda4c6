//! TorchScript models: a run on the meta device (or the CPU) with the recorder on, the static
//! (graph) estimate, the live tensors at the peak, and the check of the hand-written meta kernels.
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use gpu_mem_track::recorder::{self, AllocEvent};
use gpu_mem_track::DeviceKind;
use gpu_mem_track_log::Trace;

use crate::error::{Error, Result};
use crate::estimate::{finish_estimate, Estimate};
use crate::ffi::{self, OptimizerKind};
use crate::figures::StaticEstimate;
use gpu_mem_track_gpu::options::{EstimateDevice, EstimateOptions, Lifetimes, Mode};

/// One case of [`check_meta_kernels`]: an op with a hand-written meta kernel, the inputs it ran
/// on, and the verdict (`ok`, or how the meta results differ from the CPU kernel's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetaKernelCase {
    /// The op as registered (`native_layer_norm_backward`, `where.self_out`).
    pub op: String,
    /// Its inputs.
    pub inputs: String,
    /// `ok`, or what differs.
    pub verdict: String,
}

impl MetaKernelCase {
    /// The meta kernel gave the CPU kernel's result sizes, strides and dtypes.
    pub fn ok(&self) -> bool {
        self.verdict == "ok"
    }
}

/// Runs every meta kernel gpu-mem-track registers (libtorch C++ lacks them) next to the CPU
/// kernel of the same op on inputs of several shapes, and compares the results' sizes, strides
/// and dtypes: a check of the libtorch this build runs on. Returns one case a shape, and the
/// names of the ops with a kernel of their own (each has at least one case).
///
/// # Errors
/// [`Libtorch`](gpu_mem_track::Error::Libtorch) when the check cannot run.
pub fn check_meta_kernels() -> Result<(Vec<MetaKernelCase>, Vec<String>)> {
    gpu_mem_track::install()?;
    ffi::meta_allocator_install()?;
    let cases = ffi::meta_kernels_check()?
        .into_iter()
        .map(|(op, inputs, verdict)| MetaKernelCase { op, inputs, verdict })
        .collect();
    Ok((cases, ffi::meta_kernels_registered()))
}

/// Estimates a TorchScript model file.
///
/// # Errors
/// [`Error::Input`] for a missing file, a file that is not TorchScript, or an input the
/// model rejects; [`Error::MissingMetaKernel`] naming an op without a meta kernel (retry with
/// [`EstimateDevice::Cpu`]).
pub fn estimate_torchscript(path: &Path, options: &EstimateOptions) -> Result<Estimate> {
    estimate_torchscript_traced(path, options).map(|(e, _)| e)
}

/// [`estimate_torchscript`], also returning the categorised allocation trace (for snapshots and
/// timelines).
///
/// # Errors
/// As [`estimate_torchscript`].
pub fn estimate_torchscript_traced(path: &Path, options: &EstimateOptions) -> Result<(Estimate, Trace)> {
    let start = Instant::now();
    let (run, events, names) = run_torchscript(path, options)?;
    Ok(finish_estimate(options, &run, &events, &names, &recorder::parameter_ids(), start))
}

/// The categorised trace of a TorchScript run alone, without the estimate's figures: what `fit`
/// judges each probe by.
pub(crate) fn torchscript_trace(path: &Path, options: &EstimateOptions) -> Result<Trace> {
    let (_, events, names) = run_torchscript(path, options)?;
    Ok(recorder::classify(&events, &names, &recorder::parameter_ids()))
}

/// How many forward passes of TorchScript models this process has run, counted where the
/// estimator's native code calls a model's forward: a training estimate makes one per iteration
/// (two), an inference estimate one. What a test counts to hold an estimate to one run.
pub fn forward_passes() -> u64 {
    ffi::forward_passes()
}

/// Runs a TorchScript model with the recorder on: its sizes, the recorded events and op names.
fn run_torchscript(
    path: &Path,
    options: &EstimateOptions,
) -> Result<(ffi::RunFigures, Vec<AllocEvent>, Vec<String>)> {
    check_model_file(path)?;
    if options.input_shape.is_empty() || options.input_shape.iter().any(|&d| d <= 0) {
        return Err(Error::Input(format!("input shape {:?} must have positive sizes", options.input_shape)));
    }
    gpu_mem_track::install()?;
    let (train, optimizer) = match options.mode {
        Mode::Inference => (false, OptimizerKind::None),
        Mode::Train(o) => (true, o.into()),
    };
    let call = ffi::EstimateCall {
        path,
        input_shape: &options.input_shape,
        dtype: options.precision.dtype(),
        input_is_index: options.input_is_index,
        train,
        optimizer,
        iterations: 2,
        device_kind: match options.device {
            EstimateDevice::Meta => DeviceKind::Meta,
            EstimateDevice::Cpu => DeviceKind::Cpu,
        },
        eager_lifetimes: options.lifetimes == Lifetimes::Eager,
    };
    ffi::estimate_torchscript(&call).map_err(|e| with_graph(path, e))
}

/// A model path must name a regular file; a folder or a fifo is named as what it is.
fn check_model_file(path: &Path) -> Result<()> {
    let problem = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        Err(e) => format!("cannot be read ({e})"),
        Ok(m) if m.is_dir() => "is a directory, not a TorchScript file".to_owned(),
        Ok(m) if !m.is_file() => "is not a regular file (a fifo, socket or device)".to_owned(),
        Ok(_) => return Ok(()),
    };
    Err(Error::Input(format!("model file {} {problem}", path.display())))
}

/// A failed run, as the error a user can act on: an op without a meta kernel is named with every
/// op of the graph that has no CPU kernel either, all at once (not only the one the run stopped
/// at); any other libtorch failure is the model's, named by its file.
fn with_graph(path: &Path, e: Error) -> Error {
    match e {
        Error::MissingMetaKernel { op, all } if all.is_empty() => {
            let all = ffi::script_ops_without_meta(path)
                .unwrap_or_default()
                .into_iter()
                .map(|(schema, place)| format!("{schema} at {place}"))
                .collect();
            Error::MissingMetaKernel { op, all }
        }
        Error::Tracker(gpu_mem_track::Error::Libtorch { message, .. }) => {
            Error::Input(format!("{}: {}", path.display(), message.lines().next().unwrap_or("")))
        }
        other => other,
    }
}

/// Estimates an inference pass statically: the forward graph is inlined, parameter shapes are
/// lifted from the module, shapes are propagated from the input, and each tensor is freed after
/// its last use. A fast second opinion to the meta run; it knows nothing of kernels' temporaries.
///
/// # Errors
/// [`Error::Input`] for a missing or unreadable model, or a forward with more inputs.
pub fn estimate_static(path: &Path, options: &EstimateOptions) -> Result<StaticEstimate> {
    check_model_file(path)?;
    gpu_mem_track::install()?;
    ffi::estimate_static(path, &options.input_shape, options.precision.dtype(), options.input_is_index)
        .map_err(|e| with_graph(path, e))
}

/// [`estimate_torchscript_traced`], also returning the live tensors at its peak, grouped like the
/// tracker's log (shape, dtype, class; bytes once per storage; views counted on their owner's
/// line), largest first. From the same run: the registry is walked at the end of each op
/// that raises the peak, so the last walk is the peak's.
///
/// # Errors
/// As [`estimate_torchscript`].
pub fn estimate_torchscript_with_peak_tensors(
    path: &Path,
    options: &EstimateOptions,
) -> Result<(Estimate, Trace, Vec<gpu_mem_track_log::log::GroupLine>)> {
    recorder::walk_peaks(true);
    let run = estimate_torchscript_traced(path, options);
    recorder::walk_peaks(false); // a run that failed before recording leaves it asked for
    let (estimate, trace) = run?;
    let groups = peak_tensor_groups();
    Ok((estimate, trace, groups))
}

/// The live tensors the recording's peak walk captured ([`recorder::walk_peaks`]), grouped as the
/// log groups them, largest first; views are counted on their storage owner's line, as in the log.
pub(crate) fn peak_tensor_groups() -> Vec<gpu_mem_track_log::log::GroupLine> {
    let snap = recorder::peak_walk();
    let mut groups: Vec<_> = snap.groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(b.1.count.cmp(&a.1.count)).then(a.0.cmp(&b.0)));
    // Views hold no memory of their own: counted on their storage owner's line, as the log does.
    // A compiler's fake tensors (torch.compile in an Estimator block) are meta tensors too, but
    // unrecorded: not the program's.
    groups
        .into_iter()
        .filter(|(key, _)| !key.view && !key.class.is_compiler_tracing())
        .map(|(key, totals)| gpu_mem_track_log::log::GroupLine {
            sign: gpu_mem_track_log::Sign::Plus,
            count: totals.count,
            shape: key.shape.to_vec(),
            memory_mib: totals.bytes as f64 / gpu_mem_track_log::log::format::MIB,
            class: key.class,
            dtype: key.dtype.torch_name(),
            role: key.role.clone(),
            op: None,
            views: i64::try_from(totals.views).unwrap_or(i64::MAX),
        })
        .collect()
}
