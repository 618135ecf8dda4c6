//! Typed errors of the libtorch-free layer. Every failure names what was wrong: the file, the
//! option, the device.
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong reading and writing logs, snapshots and NVML figures.
// Variant fields are named for what they hold; the variant docs say the rest.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The log folder does not exist.
    #[error("log folder {} does not exist (create it first; only the default `logs/` is created automatically)", path.display())]
    LogDirMissing { path: PathBuf },
    /// The log folder is a file or something else that is not a folder.
    #[error("log folder {} is not a directory", path.display())]
    LogDirNotADirectory { path: PathBuf },
    /// A log file could not be created in the log folder.
    #[error("cannot create a log file in {}: {source}", path.display())]
    LogDirUnwritable { path: PathBuf, source: io::Error },
    /// Appending a block to the log file failed.
    #[error("cannot append to log file {}: {source}", path.display())]
    LogWrite { path: PathBuf, source: io::Error },
    /// A file-name prefix cannot be part of a file name.
    #[error("invalid log file prefix {prefix:?}: {reason}")]
    InvalidPrefix { prefix: String, reason: &'static str },
    /// NVML (the NVIDIA driver's management library) could not be used.
    #[error("NVML is not available: {0}")]
    NvmlUnavailable(String),
    /// A memory snapshot pickle could not be read or is not one.
    #[error("cannot read memory snapshot {}: {reason}", path.display())]
    SnapshotRead { path: PathBuf, reason: String },
    /// A memory snapshot pickle could not be written.
    #[error("cannot write memory snapshot {}: {source}", path.display())]
    SnapshotWrite { path: PathBuf, source: io::Error },
    /// A log file could not be read.
    #[error("cannot read log file {}: {source}", path.display())]
    LogRead { path: PathBuf, source: io::Error },
    /// A log file's text is not in the gpu_mem_track format.
    #[error(transparent)]
    LogParse(#[from] LogParseError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A line that is not in the log format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogParseError {
    /// File the text came from, when known.
    pub path: Option<PathBuf>,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
    /// The start of the offending line.
    pub text: String,
}

impl fmt::Display for LogParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.path {
            write!(f, "{}:", p.display())?;
        }
        write!(f, "line {}: {}: {:?}", self.line, self.reason, self.text)
    }
}

impl std::error::Error for LogParseError {}
