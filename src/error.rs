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
