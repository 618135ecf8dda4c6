//! The library's typed errors. Every failure names what was wrong: the file, the option, the device.
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in gpu-mem-track's library API.
// Variant fields are named for what they hold; the variant docs say the rest.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The log folder given to the builder does not exist.
    #[error("log folder {} does not exist (create it first; only the default `logs/` is created automatically)", path.display())]
    LogDirMissing { path: PathBuf },
    /// The log folder given to the builder is a file or something else that is not a folder.
    #[error("log folder {} is not a directory", path.display())]
    LogDirNotADirectory { path: PathBuf },
    /// A log file could not be created in the log folder.
    #[error("cannot create a log file in {}: {source}", path.display())]
    LogDirUnwritable { path: PathBuf, source: io::Error },
    /// Appending a block to the log file failed.
    #[error("cannot append to log file {}: {source}", path.display())]
    LogWrite { path: PathBuf, source: io::Error },
    /// The file-name prefix given to the builder cannot be part of a file name.
    #[error("invalid log file prefix {prefix:?}: {reason}")]
    InvalidPrefix { prefix: String, reason: &'static str },
    /// CUDA was asked for but this process cannot use it.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable { reason: String },
    /// A CUDA device index beyond the visible devices.
    #[error("CUDA device {index} does not exist ({count} visible)")]
    NoSuchCudaDevice { index: usize, count: usize },
    /// A device kind the tracker cannot observe.
    #[error("device {0} cannot be tracked (supported: cpu, cuda:N, meta)")]
    UnsupportedDevice(String),
    /// NVML (the NVIDIA driver's management library) could not be used.
    #[error("NVML is not available: {0}")]
    NvmlUnavailable(String),
    /// The background sampler thread could not be started.
    #[error("cannot start the sampler thread: {source}")]
    SamplerStart { source: io::Error },
    /// An estimate's model file or input is unusable (missing, not TorchScript, wrong input).
    #[error("{0}")]
    EstimateInput(String),
    /// An op of the model has no meta-device kernel; the estimate can run on the CPU instead.
    #[error("operator {op} has no meta kernel, so the model cannot run on the meta device (allow a CPU run to estimate it anyway)")]
    MissingMetaKernel { op: String },
    /// A call into libtorch failed; the message is libtorch's.
    #[error("libtorch call {call} failed: {message}")]
    Libtorch { call: &'static str, message: String },
    /// A memory snapshot pickle could not be read or is not one.
    #[error("cannot read memory snapshot {}: {reason}", path.display())]
    SnapshotRead { path: PathBuf, reason: String },
    /// A log file could not be read.
    #[error("cannot read log file {}: {source}", path.display())]
    LogRead { path: PathBuf, source: io::Error },
    /// A log file's text is not in the gpu_mem_track format.
    #[error(transparent)]
    LogParse(#[from] crate::log::LogParseError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
