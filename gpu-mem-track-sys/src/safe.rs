//! What every safe wrapper of the shim needs, in one place: the tracker's `ffi` module and the
//! estimator's use these, so a shim error, a device code or a C string is converted one way.
use std::ffi::CString;
use std::fmt;

use crate::{gmt_error, take_string, GMT_DEV_CPU, GMT_DEV_CUDA, GMT_DEV_META};

/// A kind of device, without an index: what the shim lists tensors of, records allocations on and
/// makes tensors on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// Any CUDA device.
    Cuda,
    /// The meta device: shapes and dtypes, no data (what estimates run on).
    Meta,
}

impl DeviceKind {
    /// The shim's code of this device kind (`GMT_DEV_*`).
    pub fn code(self) -> i32 {
        match self {
            DeviceKind::Cpu => GMT_DEV_CPU,
            DeviceKind::Cuda => GMT_DEV_CUDA,
            DeviceKind::Meta => GMT_DEV_META,
        }
    }
}

/// A shim call that failed: which call, and libtorch's message (or why the call could not be
/// made). The safe crates turn it into their `Error::Libtorch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShimError {
    /// The call, as the wrapper names it (`registry install`).
    pub call: &'static str,
    /// libtorch's message.
    pub message: String,
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "libtorch call {} failed: {}", self.call, self.message)
    }
}

impl std::error::Error for ShimError {}

/// Turns what a shim call returned (null, or an error string the caller now owns) into a result.
///
/// # Errors
/// [`ShimError`] with the shim's message when `err` is not null.
///
/// # Safety
/// `err` is what a shim call returned: null, or a malloc'd NUL-terminated string that no one else
/// frees ([`take_string`]'s contract).
pub unsafe fn check(call: &'static str, err: gmt_error) -> Result<(), ShimError> {
    // SAFETY: the caller's promise.
    match unsafe { take_string(err) } {
        None => Ok(()),
        Some(message) => Err(ShimError { call, message }),
    }
}

/// `s` as a C string for a shim call.
///
/// # Errors
/// [`ShimError`] naming `s` when it holds a NUL byte.
pub fn c_string(call: &'static str, s: &str) -> Result<CString, ShimError> {
    CString::new(s).map_err(|_| ShimError { call, message: format!("name {s:?} contains a NUL byte") })
}

/// A byte count the shim reports as `int64_t`: a negative one (never expected) reads as 0.
pub fn bytes(v: i64) -> u64 {
    v.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_success_and_a_nul_byte_is_named() {
        // SAFETY: null is what a shim call returns on success.
        assert_eq!(unsafe { check("x", std::ptr::null_mut()) }, Ok(()));
        let e = c_string("register", "a\0b").unwrap_err();
        assert_eq!(e.to_string(), "libtorch call register failed: name \"a\\0b\" contains a NUL byte");
        assert_eq!(bytes(-5), 0);
        assert_eq!(DeviceKind::Meta.code(), GMT_DEV_META);
    }
}
