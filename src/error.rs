//! The library's typed errors. Every failure names what was wrong: the file, the option, the device.
use std::io;

/// Everything that can go wrong in gpu-mem-track's library API.
// Variant fields are named for what they hold; the variant docs say the rest.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Writing or reading a log, a snapshot or NVML figures failed (the libtorch-free layer's
    /// error: log folder, prefix, file and NVML problems, each naming what was wrong).
    #[error(transparent)]
    Log(#[from] gpu_mem_track_log::Error),
    /// CUDA was asked for but this process cannot use it.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable { reason: String },
    /// A CUDA device index beyond the visible devices.
    #[error("CUDA device {index} does not exist ({count} visible)")]
    NoSuchCudaDevice { index: usize, count: usize },
    /// A device kind the tracker cannot observe.
    #[error("device {0} cannot be tracked (supported: cpu, cuda:N, meta)")]
    UnsupportedDevice(String),
    /// The background sampler thread could not be started.
    #[error("cannot start the sampler thread: {source}")]
    SamplerStart { source: io::Error },
    /// An estimate's model file or input is unusable (missing, not TorchScript, wrong input).
    #[error("{0}")]
    EstimateInput(String),
    /// An op of the model has no meta-device kernel (nor a CPU one the meta-via-CPU fallback
    /// could run); the estimate can run on the CPU instead.
    #[error("{}", missing_meta_message(op, all))]
    MissingMetaKernel {
        /// The op the run stopped at.
        op: String,
        /// Every op of the model's forward without one, with its schema and where it is called
        /// (`aten::batch_norm_stats(Tensor input, float eps) -> (Tensor, Tensor)` at
        /// `model.py line 12`); empty when the graph could not be read.
        all: Vec<String>,
    },
    /// This build left a capability out (`gpu_mem_track::capabilities()` lists them): the reason
    /// says what was missing when it was compiled and how to get it.
    #[error("this build of gpu-mem-track has no {capability}: {reason}")]
    NotInThisBuild { capability: &'static str, reason: String },
    /// A builder option that cannot apply (the option and why).
    #[error("option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    /// A call into libtorch failed; the message is libtorch's.
    #[error("libtorch call {call} failed: {message}")]
    Libtorch { call: &'static str, message: String },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn missing_meta_message(op: &str, all: &[String]) -> String {
    let mut m = format!("operator {op} has no meta kernel, so the model cannot run on the meta device");
    if all.is_empty() {
        m.push_str(" (--run-on cpu, or --allow-cpu, computes the same run for real on the CPU)");
    } else {
        // Ops with a CPU kernel run through the meta-via-CPU fallback: these have none.
        m.push_str(&format!(
            "; the model calls {} op(s) with no meta, composite or CPU kernel in this libtorch (GPU-only): {}; \
             a CPU run (--run-on cpu) cannot run them either",
            all.len(),
            all.join("; ")
        ));
    }
    m
}
