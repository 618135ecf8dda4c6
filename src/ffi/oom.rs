//! Out-of-memory reports (`csrc/oom.cpp`): the allocation an allocator is about to refuse.
use std::ffi::CStr;

use gpu_mem_track_sys as sys;

use super::{bytes, tidy_op_name};

use super::DeviceKind;

/// An allocation the allocator is about to refuse, as the shim reports it.
#[derive(Debug, Clone)]
pub(crate) struct OomEvent {
    pub device: DeviceKind,
    /// CUDA device index (`None` on the CPU).
    pub device_index: Option<usize>,
    pub requested: u64,
    /// CUDA: the device's memory (or what the memory fraction allows); CPU: the limit.
    pub device_total: u64,
    /// CUDA: free per the driver; CPU: the limit minus the live bytes.
    pub device_free: u64,
    /// Innermost and outermost op running on the failing thread.
    pub op: String,
    pub top_op: String,
}

static OOM_HANDLER: std::sync::OnceLock<fn(&OomEvent)> = std::sync::OnceLock::new();

unsafe extern "C" fn on_oom(event: *const sys::gmt_oom_event) {
    // A panic must not unwind into C++ (nor replace the program's own out-of-memory error).
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the shim passes a valid event for the duration of the call.
        let Some(e) = (unsafe { event.as_ref() }) else { return };
        let text = |p: *const std::ffi::c_char| {
            // SAFETY: null or NUL-terminated op names that outlive the call.
            if p.is_null() {
                String::new()
            } else {
                tidy_op_name(&unsafe { CStr::from_ptr(p) }.to_string_lossy()).to_owned()
            }
        };
        let event = OomEvent {
            device: if e.device_kind == sys::GMT_DEV_CUDA { DeviceKind::Cuda } else { DeviceKind::Cpu },
            device_index: usize::try_from(e.device_index).ok(),
            requested: bytes(e.requested),
            device_total: bytes(e.device_total),
            device_free: bytes(e.device_free),
            op: text(e.op),
            top_op: text(e.top_op),
        };
        if let Some(handler) = OOM_HANDLER.get() {
            handler(&event);
        }
    });
}

/// Makes `handler` receive every out-of-memory the shim reports (the first handler set wins).
pub(crate) fn oom_set_handler(handler: fn(&OomEvent)) {
    if OOM_HANDLER.set(handler).is_ok() {
        // SAFETY: `on_oom` matches the callback type and never unwinds.
        unsafe { sys::gmt_oom_set_callback(Some(on_oom)) }
    }
}
