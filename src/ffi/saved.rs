//! Autograd's saved-for-backward tensors (`csrc/saved.cpp`), captured on one thread: what the
//! public `saved` module reads. The memory history's tagging of saved tensors is the recorder's
//! (`history_tag_saved`).
use std::ffi::{c_void, CStr};

use super::{check, sys, Result};

/// Starts capturing saved-for-backward tensors on this thread, leaving out `excluded` storages.
pub(crate) fn saved_capture_begin(excluded: &[&tch::Tensor]) -> Result<()> {
    let ptrs: Vec<*const c_void> = excluded.iter().map(|t| t.as_ptr() as *const c_void).collect();
    // SAFETY: the pointers are `at::Tensor*` of tensors borrowed for the call; the shim only reads
    // their storages' addresses.
    check("memory_for_backward", unsafe { sys::gmt_saved_capture_begin(ptrs.as_ptr(), ptrs.len()) })
}

/// Ends the capture started on this thread.
pub(crate) fn saved_capture_end() {
    // SAFETY: clears a thread-local flag; no-op without a capture.
    unsafe { sys::gmt_saved_capture_end() }
}

/// (bytes, op) of every saved storage still alive, plus parameter bytes that were left out.
pub(crate) fn saved_entries() -> (Vec<(u64, String)>, u64) {
    // SAFETY: a first call with cap 0 only counts; the second fills buffers of that size. Entries
    // may only shrink in between (hooks being destroyed), never grow, as the capture has ended.
    unsafe {
        let n = sys::gmt_saved_entries(std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let mut bytes = vec![0i64; n];
        let mut ops = vec![std::ptr::null::<std::os::raw::c_char>(); n];
        let got = sys::gmt_saved_entries(bytes.as_mut_ptr(), ops.as_mut_ptr(), n).min(n);
        let entries = (0..got)
            .map(|i| {
                let op = if ops[i].is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(ops[i]).to_string_lossy().into_owned()
                };
                (bytes[i].max(0) as u64, op)
            })
            .collect();
        (entries, sys::gmt_saved_parameter_bytes().max(0) as u64)
    }
}
