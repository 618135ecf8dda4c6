//! Raw FFI to the gpu-mem-track estimator's C++ (`csrc/`, declared in `csrc/estimate.h`):
//! TorchScript runs and the static graph estimate, tch steps and the optimizers, the meta
//! allocator, hand-written meta kernels and "the CPU means meta". The safe API is the
//! `gpu-mem-track-estimate` crate's `ffi` module.
//!
//! This C++ builds on the tracker's shim (`gpu-mem-track-sys`): its errors ([`gmt_error`], freed
//! with `gpu_mem_track_sys::gmt_free_string`), device kinds and allocation recorder. The tracker's
//! C++ never calls into this crate's.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub use gpu_mem_track_sys::gmt_error;

/// The optimizers the estimator runs (`gmt_optimizer`).
pub const GMT_OPT_NONE: i32 = 0;
pub const GMT_OPT_SGD: i32 = 1;
pub const GMT_OPT_SGD_MOMENTUM: i32 = 2;
pub const GMT_OPT_ADAM: i32 = 3;
pub const GMT_OPT_ADAMW: i32 = 4;

/// Options of a TorchScript estimate (mirrors `gmt_estimate_options`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct gmt_estimate_options {
    pub path: *const c_char,
    pub input_shape: *const i64,
    pub input_ndim: i32,
    pub dtype: i32,
    pub input_is_index: i32,
    pub train: i32,
    pub optimizer: i32,
    pub iterations: i32,
    pub device_kind: i32,
    pub eager_lifetimes: i32,
}

/// What kind of failure a run's error is (`gmt_failure`): none named (libtorch's or the shim's own).
pub const GMT_FAILURE_NONE: i32 = 0;
/// The file is not a model the estimator can run, or its forward rejects the input.
pub const GMT_FAILURE_MODEL: i32 = 1;
/// An op reached the meta device with no kernel there (the result's `failed_op`).
pub const GMT_FAILURE_NO_META_KERNEL: i32 = 2;

/// Sizes found by a TorchScript estimate (mirrors `gmt_estimate_result`); on failure, its kind.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct gmt_estimate_result {
    pub param_count: i64,
    pub param_bytes: i64,
    pub buffer_bytes: i64,
    pub input_bytes: i64,
    pub grad_bytes: i64,
    pub optimizer_state_bytes: i64,
    pub output_numel: i64,
    /// `GMT_FAILURE_*`.
    pub failure: i32,
    /// The op of a `GMT_FAILURE_NO_META_KERNEL`, NUL-terminated.
    pub failed_op: [c_char; 124],
}

impl Default for gmt_estimate_result {
    fn default() -> Self {
        Self {
            param_count: 0,
            param_bytes: 0,
            buffer_bytes: 0,
            input_bytes: 0,
            grad_bytes: 0,
            optimizer_state_bytes: 0,
            output_numel: 0,
            failure: GMT_FAILURE_NONE,
            failed_op: [0; 124],
        }
    }
}

/// A placeholder's role in a torch.export program (mirrors `gmt_exported_role`).
pub const GMT_EXPORTED_USER_INPUT: i32 = 0;
/// A parameter.
pub const GMT_EXPORTED_PARAMETER: i32 = 1;
/// A buffer.
pub const GMT_EXPORTED_BUFFER: i32 = 2;
/// A tensor constant.
pub const GMT_EXPORTED_CONSTANT: i32 = 3;

/// What a node argument holds (mirrors `gmt_exported_arg_kind`).
pub const GMT_EXPORTED_ARG_NONE: i32 = 0;
/// A value (`i`).
pub const GMT_EXPORTED_ARG_TENSOR: i32 = 1;
/// Values (`ints`).
pub const GMT_EXPORTED_ARG_TENSORS: i32 = 2;
/// Values or none (`ints`, -1: none).
pub const GMT_EXPORTED_ARG_OPTIONAL_TENSORS: i32 = 3;
/// `i`.
pub const GMT_EXPORTED_ARG_INT: i32 = 4;
/// `ints`.
pub const GMT_EXPORTED_ARG_INTS: i32 = 5;
/// `f`.
pub const GMT_EXPORTED_ARG_FLOAT: i32 = 6;
/// `floats`.
pub const GMT_EXPORTED_ARG_FLOATS: i32 = 7;
/// `i` (0 or 1).
pub const GMT_EXPORTED_ARG_BOOL: i32 = 8;
/// `ints` (0 or 1 each).
pub const GMT_EXPORTED_ARG_BOOLS: i32 = 9;
/// `s`.
pub const GMT_EXPORTED_ARG_STRING: i32 = 10;
/// `i`, a c10::ScalarType.
pub const GMT_EXPORTED_ARG_SCALAR_TYPE: i32 = 11;
/// `i`, a c10::MemoryFormat.
pub const GMT_EXPORTED_ARG_MEMORY_FORMAT: i32 = 12;
/// `i`, a c10::Layout.
pub const GMT_EXPORTED_ARG_LAYOUT: i32 = 13;
/// `s` the device type, `i` its index (-1: none).
pub const GMT_EXPORTED_ARG_DEVICE: i32 = 14;

/// One named argument of a torch.export node (mirrors `gmt_exported_arg`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct gmt_exported_arg {
    pub kind: i32,
    pub name: *const c_char,
    pub i: i64,
    pub f: f64,
    pub ints: *const i64,
    pub floats: *const f64,
    pub n: usize,
    pub s: *const c_char,
}

/// Static estimate result (mirrors `gmt_static_result`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct gmt_static_result {
    pub activation_peak: i64,
    pub param_bytes: i64,
    pub nodes: i64,
    pub tensor_values: i64,
    pub unknown_shapes: i64,
    pub peak_node: i32,
    /// `GMT_FAILURE_*`, when the call fails.
    pub failure: i32,
    pub peak_op: [c_char; 64],
    pub seconds: f64,
}

extern "C" {
    /// `.item()` calls on meta tensors since the process started (each returned 0).
    pub fn gmt_meta_scalar_reads() -> i64;
    /// Whether LSTM and GRU on meta take cuDNN's path (the default) or PyTorch's own (the CPU's).
    pub fn gmt_meta_rnn_follows_cudnn(on: c_int);
    pub fn gmt_meta_target_device(major: c_int, minor: c_int);
    pub fn gmt_meta_attention_kernels(calls: *mut i64);
    pub fn gmt_meta_fallback_ops() -> i64;
    pub fn gmt_meta_kernels_registered(count: *mut usize) -> *const *const c_char;
    pub fn gmt_meta_kernels_check(report: *mut *mut c_char) -> gmt_error;
    pub fn gmt_meta_fallback_counts(
        ops: *mut *const c_char,
        calls: *mut i64,
        bytes: *mut i64,
        cap: usize,
    ) -> usize;
    pub fn gmt_conv_workspaces(ids: *mut i64, bytes: *mut i64, cap: usize) -> usize;
    pub fn gmt_conv_workspaces_clear();
    pub fn gmt_meta_allocator_install() -> gmt_error;
    pub fn gmt_meta_allocator_current() -> i64;
    pub fn gmt_cpu_means_meta_begin(copies_too: i32) -> gmt_error;
    pub fn gmt_cpu_means_meta_end();
    pub fn gmt_cpu_means_meta_counts(made_on_cpu: *mut i64, moved_to_meta: *mut i64);
    pub fn gmt_cpu_means_meta_examples() -> *mut c_char;
    pub fn gmt_script_ops_without_meta(path: *const c_char, report: *mut *mut c_char) -> gmt_error;
    pub fn gmt_estimate_torchscript(
        options: *const gmt_estimate_options,
        out: *mut gmt_estimate_result,
    ) -> gmt_error;
    pub fn gmt_estimate_forward_passes() -> i64;
    pub fn gmt_meta_storage_resize(storage_impl: *mut c_void, nbytes: i64) -> gmt_error;
    pub fn gmt_meta_unrecorded_begin();
    pub fn gmt_meta_unrecorded_end();
    pub fn gmt_meta_storage_recorded(storage_impl: *const c_void) -> i32;
    pub fn gmt_exported_program_json(path: *const c_char, json: *mut *mut c_char) -> gmt_error;
    pub fn gmt_exported_program_new() -> *mut c_void;
    pub fn gmt_exported_program_free(program: *mut c_void);
    pub fn gmt_exported_program_placeholder(
        program: *mut c_void,
        name: *const c_char,
        role: i32,
        sizes: *const i64,
        strides: *const i64,
        ndim: usize,
        dtype: i32,
        requires_grad: i32,
    ) -> gmt_error;
    pub fn gmt_exported_program_node(
        program: *mut c_void,
        op: *const c_char,
        overload: *const c_char,
        args: *const gmt_exported_arg,
        nargs: usize,
        outputs: *const i64,
        noutputs: usize,
        frees: *const i64,
        nfrees: usize,
        values: i64,
    ) -> gmt_error;
    pub fn gmt_exported_program_outputs(program: *mut c_void, values: *const i64, n: usize) -> gmt_error;
    pub fn gmt_estimate_exported(
        program: *const c_void,
        options: *const gmt_estimate_options,
        out: *mut gmt_estimate_result,
    ) -> gmt_error;
    pub fn gmt_estimate_static(
        path: *const c_char,
        shape: *const i64,
        ndim: i32,
        dtype: i32,
        is_index: i32,
        out: *mut gmt_static_result,
    ) -> gmt_error;
    pub fn gmt_tensor_to_device_in_place(tensor: *mut c_void, device_kind: i32, dtype: i32) -> gmt_error;
    pub fn gmt_tag_parameter_tensor(tensor: *const c_void) -> gmt_error;
    pub fn gmt_make_tensor(
        shape: *const i64,
        ndim: i32,
        dtype: i32,
        device_kind: i32,
        out: *mut *mut c_void,
    ) -> gmt_error;
    pub fn gmt_optimizer_new(kind: i32) -> *mut c_void;
    pub fn gmt_optimizer_step(optimizer: *mut c_void, params: *const *const c_void, n: usize) -> gmt_error;
    pub fn gmt_optimizer_state_bytes(optimizer: *mut c_void) -> i64;
    pub fn gmt_optimizer_free(optimizer: *mut c_void);
    pub fn gmt_grads_set_to_none(params: *const *const c_void, n: usize, grad_bytes: *mut i64) -> gmt_error;
}

// The C layouts this crate mirrors (`csrc/estimate.h` asserts the same sizes on its side).
const _: () = assert!(std::mem::size_of::<gmt_estimate_options>() == 48);
const _: () = assert!(std::mem::size_of::<gmt_estimate_result>() == 184);
const _: () = assert!(std::mem::size_of::<gmt_static_result>() == 120);
const _: () = assert!(std::mem::size_of::<gmt_exported_arg>() == 64);
