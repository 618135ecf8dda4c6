//! The GPU model's typed errors.

/// What can go wrong in the GPU model: a device profile that cannot be found or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An unknown device profile name, or a profile `.json` that cannot be read; the text names it.
    #[error("{0}")]
    Profile(String),
}

/// `Result` with the GPU model's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
