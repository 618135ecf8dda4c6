//! The estimator's typed errors: each names what was wrong (the model file, the input shape, the
//! option, the op without a meta kernel).

/// Everything that can go wrong while estimating.
// Variant fields are named for what they hold; the variant docs say the rest.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The tracker's layer failed (installing the registry, the recorder, walking the registry).
    #[error(transparent)]
    Tracker(#[from] gpu_mem_track::Error),
    /// The model file or input is unusable (missing, not TorchScript, wrong input).
    #[error("{0}")]
    Input(String),
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
}

impl From<gpu_mem_track::LogError> for Error {
    fn from(e: gpu_mem_track::LogError) -> Self {
        Error::Tracker(e.into())
    }
}

/// A device profile that cannot be found or read: bad input, named in the text.
impl From<gpu_mem_track_gpu::Error> for Error {
    fn from(e: gpu_mem_track_gpu::Error) -> Self {
        Error::Input(e.to_string())
    }
}

/// `Result` with the estimator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn missing_meta_message(op: &str, all: &[String]) -> String {
    let mut m = format!("operator {op} has no meta kernel, so the model cannot run on the meta device");
    if all.is_empty() {
        m.push_str(" (a run on the CPU computes the same run for real)");
    } else {
        // Ops with a CPU kernel run through the meta-via-CPU fallback: these have none.
        m.push_str(&format!(
            "; the model calls {} op(s) with no meta, composite or CPU kernel in this libtorch (GPU-only): {}; \
             a run on the CPU cannot run them either",
            all.len(),
            all.join("; ")
        ));
    }
    m
}
