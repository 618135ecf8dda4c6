//! What autograd saves for backward, captured on the calling thread while (and only while) a
//! closure runs: autograd's saved-variable hooks, installed by the shim (`csrc/saved.cpp`). The
//! estimator's `memory_for_backward` is built on [`capture`].
use crate::error::Result;
use crate::ffi;

/// The storages autograd saved during a [`capture`] and still alive after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTensors {
    /// Each saved storage once, parameters and the excluded tensors' storages left out: its bytes
    /// and the op that saved it first (`aten::convolution`, ...; empty when none was running).
    pub storages: Vec<(u64, String)>,
    /// Bytes of parameters autograd saved too (left out of `storages`: they live anyway).
    pub parameter_bytes: u64,
}

/// Ends the capture even when the closure panics.
struct CaptureGuard;

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        ffi::saved_capture_end();
    }
}

/// Runs `f` with autograd's saved-variable hooks on for this thread, leaving out the storages of
/// `excluded` (the batch, say), and returns its output with what was saved. Outside the closure,
/// and on other threads, autograd is untouched.
///
/// # Errors
/// [`Libtorch`](crate::error::Error::Libtorch) when the hooks cannot be installed, or when called inside
/// another capture.
pub fn capture<T>(excluded: &[&tch::Tensor], f: impl FnOnce() -> T) -> Result<(T, SavedTensors)> {
    ffi::saved_capture_begin(excluded)?;
    let output = {
        let _guard = CaptureGuard;
        f()
    };
    let (storages, parameter_bytes) = ffi::saved_entries();
    Ok((output, SavedTensors { storages, parameter_bytes }))
}
