//! Raw FFI to the gpu-mem-track C++ shim (`csrc/`). This is the only crate that knows libtorch's
//! C++ side; the safe API lives in the `gpu-mem-track` crate (the tracker) and the
//! `gpu-mem-track-estimate` crate (the estimator), each in its `ffi` module, both on the helpers
//! of [`safe`] (errors, device codes, C strings).
//!
//! Conventions: functions returning [`gmt_error`] return null on success or a message allocated
//! with `malloc` that the caller frees with [`gmt_free_string`]. No C++ exception crosses the
//! boundary.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub mod safe;

// Keep torch-sys linked: it provides libtorch's link flags (without it, build.rs links libtorch).
#[cfg(feature = "tch")]
use torch_sys as _;

/// The libtorch this crate was compiled against, from its headers (`TORCH_VERSION_MAJOR`, ...).
pub const LIBTORCH_VERSION: &str = env!("GMT_LIBTORCH_VERSION");
/// `gpu-mem-track built against torch <LIBTORCH_VERSION>`: a front end that must refuse a torch of
/// another minor version before loading its compiled part (the Python package) finds it in the
/// file's bytes.
pub const BUILD_MARKER: &str = concat!("gpu-mem-track built against torch ", env!("GMT_LIBTORCH_VERSION"));
/// The torch-sys (and so tch) version of this build, from the build's `Cargo.lock`; empty when the
/// build script found none (a target folder outside the workspace).
pub const TORCH_SYS_VERSION: &str = env!("GMT_TORCH_SYS_VERSION");
/// Whether `LIBTORCH_BYPASS_VERSION_CHECK` was set at build time (a libtorch newer than the one
/// the tch version was generated for).
pub const TORCH_VERSION_CHECK_BYPASSED: bool = is_one(env!("GMT_TORCH_VERSION_CHECK_BYPASSED"));
/// Why this build cannot record CUDA memory history (the CUDA headers it looked for, and how to
/// get them); empty when it can.
pub const CUDA_HISTORY_MISSING: &str = env!("GMT_CUDA_HISTORY_MISSING");
/// Whether libtorch's device allocator reports the device's free and total memory
/// (`DeviceAllocator::getMemoryInfo`, libtorch 2.10 and later).
pub const CUDA_MEMORY_INFO: bool = cfg!(gmt_libtorch_2_10);

const fn is_one(s: &str) -> bool {
    matches!(s.as_bytes(), [b'1'])
}

/// Null on success, otherwise an owned C string describing the failure.
pub type gmt_error = *mut c_char;

pub const GMT_DEV_ANY: i32 = -1;
pub const GMT_DEV_CPU: i32 = 0;
pub const GMT_DEV_CUDA: i32 = 1;
pub const GMT_DEV_META: i32 = 2;
pub const GMT_DEV_OTHER: i32 = 3;

/// One live tensor as the registry sees it (mirrors `gmt_tensor_record` in `csrc/shim.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct gmt_tensor_record {
    pub impl_id: u64,
    pub storage_id: u64,
    pub storage_nbytes: i64,
    pub nbytes: i64,
    pub seq: u64,
    pub dims_offset: i64,
    pub ndim: i32,
    pub scalar_type: i32,
    pub device_kind: i32,
    pub device_index: i32,
    pub name_id: i32,
    pub requires_grad: u8,
    pub is_leaf: u8,
    pub storage_shared: u8,
    pub pad_: u8,
    pub op_id: i32,
    pub category: i32,
    pub class_id: i32,
    pub role: i32,
}

/// Totals of one log group in a grouped walk (mirrors `gmt_group_total` in `csrc/shim.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct gmt_group_total {
    pub group: i32,
    pub view: u8,
    pub pad_: [u8; 3],
    pub count: i64,
    pub bytes: i64,
    pub views: i64,
}

/// Overall totals of a grouped walk (mirrors `gmt_walk_totals` in `csrc/shim.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct gmt_walk_totals {
    pub tensor_bytes: i64,
    pub tensor_count: i64,
    pub storage_count: i64,
}

/// Opaque registry-walk buffer owned by the shim.
#[repr(C)]
pub struct gmt_walk {
    _private: [u8; 0],
}

/// Allocator counters (mirrors `gmt_alloc_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct gmt_alloc_stats {
    pub current: i64,
    pub peak: i64,
    pub total_peak: i64,
    pub allocations: i64,
    pub frees: i64,
}

/// One recorded allocation or free (mirrors `gmt_alloc_event`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct gmt_alloc_event {
    pub id: i64,
    pub size: i64,
    pub is_free: u8,
    pub phase: u8,
    pub device_kind: u8,
    pub iteration: u8,
    pub op: i32,
    pub time_ns: i64,
    pub site: i32,
    pub nframes: i32,
    pub top_op: i32,
    pub category: i32,
}

/// Native return addresses kept per event when stacks are recorded.
pub const GMT_STACK_FRAMES: usize = 48;

/// `gmt_alloc_event::is_free` values (`gmt_event_kind`).
pub const GMT_CAT_NONE: i32 = 0;
pub const GMT_CAT_PARAMETER: i32 = 1;
pub const GMT_CAT_BUFFER: i32 = 2;
pub const GMT_CAT_GRADIENT: i32 = 3;
pub const GMT_CAT_ACTIVATION: i32 = 4;
pub const GMT_CAT_INPUT: i32 = 5;
pub const GMT_CAT_KERNEL_SCRATCH: i32 = 6;
pub const GMT_CAT_WORKSPACE: i32 = 7;
pub const GMT_CAT_SHARDED_PARAMETER: i32 = 8;
pub const GMT_CAT_UNSHARDED_PARAMETER: i32 = 9;
pub const GMT_CAT_SHARDED_GRADIENT: i32 = 10;
pub const GMT_CAT_UNSHARDED_GRADIENT: i32 = 11;
pub const GMT_CAT_DDP_BUCKET: i32 = 12;
pub const GMT_CAT_ALL_GATHER_BUFFER: i32 = 13;
pub const GMT_CAT_REDUCE_SCATTER_BUFFER: i32 = 14;
pub const GMT_CAT_HOST: i32 = 15;

/// `gmt_tensor_role` values.
pub const GMT_ROLE_NONE: i32 = 0;
pub const GMT_ROLE_GRADIENT: i32 = 1;
pub const GMT_ROLE_OPTIMIZER_STATE: i32 = 2;
pub const GMT_ROLE_INTERNAL: i32 = 3;
pub const GMT_ROLE_INDUCTOR_BUFFER: i32 = 4;
pub const GMT_EVENT_ALLOC: u8 = 0;
pub const GMT_EVENT_FREE: u8 = 1;
pub const GMT_EVENT_SEGMENT_ALLOC: u8 = 2;
pub const GMT_EVENT_SEGMENT_FREE: u8 = 3;
/// An allocation failed: `size` asked for, `id` the device's free bytes.
pub const GMT_EVENT_OOM: u8 = 4;

pub const GMT_PHASE_LOAD: u8 = 0;
pub const GMT_PHASE_INPUT: u8 = 1;
pub const GMT_PHASE_FORWARD: u8 = 2;
pub const GMT_PHASE_BACKWARD: u8 = 3;
pub const GMT_PHASE_OPTIMIZER: u8 = 4;
pub const GMT_PHASE_NONE: u8 = 5;

/// CUDA caching-allocator counters (mirrors `gmt_cuda_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct gmt_cuda_stats {
    pub allocated_current: i64,
    pub allocated_peak: i64,
    pub reserved_current: i64,
    pub reserved_peak: i64,
    pub active_current: i64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

/// An allocation about to be refused (mirrors `gmt_oom_event`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct gmt_oom_event {
    pub device_kind: i32,
    pub device_index: i32,
    pub requested: i64,
    pub device_total: i64,
    pub device_free: i64,
    pub op: *const c_char,
    pub top_op: *const c_char,
}

/// One block of the CUDA caching allocator's segments (mirrors `gmt_cuda_block`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct gmt_cuda_block {
    pub segment_address: u64,
    pub segment_size: u64,
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub allocated: i32,
    pub is_large: i32,
}

/// Out-of-memory callback (see `gmt_oom_set_callback`).
pub type gmt_oom_callback = Option<unsafe extern "C" fn(event: *const gmt_oom_event)>;

extern "C" {
    pub fn gmt_free_string(s: *mut c_char);

    /// 1 when the shim references libtorch_cuda (the libtorch in use ships it), 0 otherwise.
    /// Calling it from code every user of the library runs is what keeps libtorch_cuda linked
    /// into their binaries (`--as-needed` drops libraries nothing references); see
    /// `csrc/torch_cuda_link.cpp`.
    pub fn gmt_torch_cuda_linked() -> c_int;

    pub fn gmt_registry_install() -> gmt_error;
    pub fn gmt_registry_installed() -> c_int;
    pub fn gmt_registry_set_enabled(enabled: c_int) -> gmt_error;
    /// Benchmarks only: non-zero keeps the op callback installed (libtorch still runs it and
    /// boxes each op's outputs) but makes it return at once, recording nothing and keeping no op
    /// stack; zero makes it record again. The difference is the registry's own work per op.
    pub fn gmt_registry_set_hollow(hollow: c_int) -> gmt_error;
    /// `tensor` is an `at::Tensor*` (what `tch::Tensor::as_ptr` returns).
    pub fn gmt_registry_register(tensor: *const c_void, name: *const c_char) -> gmt_error;
    /// `impl_` is a live `c10::TensorImpl*` (Python's `Tensor._cdata`).
    pub fn gmt_registry_register_impl(impl_: *mut c_void, name: *const c_char) -> gmt_error;
    /// As `gmt_registry_register_impl`, for a buffer a `torch.compile`'d graph's code allocated.
    pub fn gmt_registry_register_inductor_buffer(impl_: *mut c_void) -> gmt_error;
    pub fn gmt_registry_forget_impl(impl_: *mut c_void) -> gmt_error;
    pub fn gmt_registry_entries() -> usize;
    pub fn gmt_registry_callbacks() -> u64;
    pub fn gmt_registry_walk_threads() -> usize;
    /// Only a thread that holds Python's GIL for every walk while `held` is non-zero may give it.
    pub fn gmt_registry_walks_hold_gil(held: c_int) -> c_int;
    pub fn gmt_registry_set_walk_threads(threads: usize);
    pub fn gmt_registry_name(id: i32) -> *const c_char;
    pub fn gmt_registry_op_name(id: i32) -> *const c_char;
    pub fn gmt_scalar_type_name(scalar_type: i32) -> *const c_char;
    pub fn gmt_scalar_type_itemsize(scalar_type: i32) -> i64;

    pub fn gmt_walk_new() -> *mut gmt_walk;
    pub fn gmt_walk_free(s: *mut gmt_walk);
    pub fn gmt_walk_run(s: *mut gmt_walk, device_kind: i32, device_index: i32) -> gmt_error;
    pub fn gmt_walk_run_categorized(s: *mut gmt_walk, device_kind: i32, device_index: i32) -> gmt_error;
    pub fn gmt_walk_run_grouped(
        s: *mut gmt_walk,
        device_kind: i32,
        device_index: i32,
        detail: i32,
    ) -> gmt_error;
    pub fn gmt_walk_groups(s: *const gmt_walk, len: *mut usize) -> *const gmt_group_total;
    pub fn gmt_walk_watch_storage_sizes(s: *mut gmt_walk, sizes: *const i64, n: usize);
    pub fn gmt_walk_watched(s: *const gmt_walk, len: *mut usize) -> *const u64;
    pub fn gmt_walk_totals_of(s: *const gmt_walk, out: *mut gmt_walk_totals);
    pub fn gmt_registry_group(
        id: i32,
        sizes: *mut i64,
        cap: usize,
        scalar_type: *mut i32,
        class_id: *mut i32,
        op_id: *mut i32,
        role: *mut i32,
    ) -> i64;
    /// Tensors ops return between `entering` 1 and 0 are optimizer state (`gmt_tensor_role`).
    pub fn gmt_registry_optimizer_step(entering: i32);
    /// While the recorder records: tags the allocations of the registered tensors' storages.
    pub fn gmt_registry_tag_allocations();
    pub fn gmt_registry_class_name(id: i32) -> *const c_char;
    /// `type_` is a `PyTypeObject*` the caller keeps alive. Never call it holding the GIL.
    pub fn gmt_registry_name_class(type_: *const c_void, name: *const c_char) -> gmt_error;
    pub fn gmt_registry_python_classes() -> c_int;
    pub fn gmt_walk_len(s: *const gmt_walk) -> usize;
    pub fn gmt_walk_records(s: *const gmt_walk) -> *const gmt_tensor_record;
    pub fn gmt_walk_dims(s: *const gmt_walk, len: *mut usize) -> *const i64;

    /// `module` is a `torch::jit::script::Module*`.
    pub fn gmt_register_module(module: *mut c_void, prefix: *const c_char, count: *mut usize) -> gmt_error;

    pub fn gmt_cpu_allocator_install() -> gmt_error;
    pub fn gmt_cpu_allocator_installed() -> c_int;
    pub fn gmt_cpu_allocator_open_window() -> i32;
    pub fn gmt_cpu_allocator_close_window(window: i32);
    pub fn gmt_cpu_allocator_stats(window: i32, reset_peak: c_int, out: *mut gmt_alloc_stats);
    pub fn gmt_cpu_allocator_set_limit(bytes: i64);
    pub fn gmt_cpu_allocator_limit() -> i64;
    pub fn gmt_cpu_allocator_live(addrs: *mut i64, sizes: *mut i64, cap: usize) -> usize;
    pub fn gmt_oom_set_callback(callback: gmt_oom_callback);
    pub fn gmt_cuda_oom_observer_attach() -> gmt_error;
    pub fn gmt_cuda_blocks(device: i32, out: *mut gmt_cuda_block, cap: usize, count: *mut usize)
        -> gmt_error;

    pub fn gmt_recorder_start(device_kind: i32) -> gmt_error;
    pub fn gmt_recorder_stop() -> gmt_error;
    pub fn gmt_recorder_set_phase(phase: i32, iteration: i32);
    pub fn gmt_recorder_tag_tensor(tensor: *const c_void, category: i32);
    /// `impl_` is a live `c10::TensorImpl*` (Python's `Tensor._cdata`).
    pub fn gmt_recorder_tag_tensor_impl(impl_: *const c_void, category: i32);
    /// `impl_` is a live `c10::TensorImpl*`; -1 when its storage is not a recorded allocation.
    pub fn gmt_recorder_tensor_impl_category(impl_: *const c_void) -> i32;
    /// `impl_` is a live `c10::TensorImpl*`.
    pub fn gmt_recorder_site_tensor_impl(impl_: *const c_void, site: i32);
    pub fn gmt_recorder_len() -> usize;
    pub fn gmt_recorder_start_history(device_kind: i32, max_events: usize, with_stacks: c_int) -> gmt_error;
    pub fn gmt_recorder_active() -> c_int;
    pub fn gmt_recorder_progress(phase: *mut i32, iteration: *mut i32);
    pub fn gmt_recorder_set_site(site: i32);
    pub fn gmt_recorder_walk_at(event: i64);
    pub fn gmt_recorder_walk_peaks(on: c_int);
    pub fn gmt_peak_walk() -> *mut gmt_walk;
    pub fn gmt_recorder_copy(
        out: *mut gmt_alloc_event,
        stacks: *mut u64,
        cap: usize,
        dropped: *mut u64,
    ) -> usize;
    pub fn gmt_recorder_parameter_ids(out: *mut i64, cap: usize) -> usize;
    pub fn gmt_recorder_op_name(op: i32) -> *const c_char;

    pub fn gmt_saved_capture_begin(excluded: *const *const c_void, n_excluded: usize) -> gmt_error;
    pub fn gmt_saved_history(enabled: c_int) -> gmt_error;
    pub fn gmt_saved_capture_end();
    pub fn gmt_saved_entries(bytes: *mut i64, ops: *mut *const c_char, cap: usize) -> usize;
    pub fn gmt_saved_parameter_bytes() -> i64;
    pub fn gmt_saved_packed() -> i64;

    pub fn gmt_cuda_device_count() -> i32;
    /// The file libtorch_cpu was loaded from (the loader's string), or null.
    pub fn gmt_libtorch_location() -> *const c_char;
    pub fn gmt_cuda_stats_read(device: i32, reset_peak: c_int, out: *mut gmt_cuda_stats) -> gmt_error;
    pub fn gmt_cuda_device_free(device: i32, free_bytes: *mut i64) -> gmt_error;
    pub fn gmt_cuda_empty_cache() -> gmt_error;
    pub fn gmt_cuda_history_compiled() -> c_int;
    pub fn gmt_cuda_history_attach(device: i32) -> gmt_error;
    pub fn gmt_cuda_history_detach();
}

// The C layouts this crate mirrors (`csrc/shim.h` asserts the same sizes on its side).
const _: () = assert!(std::mem::size_of::<gmt_tensor_record>() == 88);
const _: () = assert!(std::mem::size_of::<gmt_group_total>() == 32);
const _: () = assert!(std::mem::size_of::<gmt_walk_totals>() == 24);
const _: () = assert!(std::mem::size_of::<gmt_oom_event>() == 48);
const _: () = assert!(std::mem::size_of::<gmt_cuda_block>() == 48);
const _: () = assert!(std::mem::size_of::<gmt_alloc_stats>() == 40);
const _: () = assert!(std::mem::size_of::<gmt_alloc_event>() == 48);
const _: () = assert!(std::mem::size_of::<gmt_cuda_stats>() == 56);

/// Copies out and frees a string the shim allocated (an error or a report); `None` for null.
///
/// # Safety
/// `raw` is null or a NUL-terminated string the shim allocated with `malloc`, which no one else
/// frees.
pub unsafe fn take_string(raw: *mut c_char) -> Option<String> {
    if raw.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated (the caller's promise).
    let text = unsafe { std::ffi::CStr::from_ptr(raw) }.to_string_lossy().into_owned();
    // SAFETY: freed exactly once, with the shim's allocator.
    unsafe { gmt_free_string(raw) };
    Some(text)
}

/// Copies a shim table that can grow between the count and the copy: `copy(cap)` fills buffers
/// of `cap` entries and returns the table's length with what it read; it is called again with room
/// to spare until the whole table fits.
pub fn copy_table<T>(mut copy: impl FnMut(usize) -> (usize, T)) -> T {
    let mut cap = 0usize;
    loop {
        let (n, out) = copy(cap);
        if n <= cap {
            return out;
        }
        cap = n + n / 8 + 16;
    }
}
