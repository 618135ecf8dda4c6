//! Safe wrappers over `gpu-mem-track-sys`, one file per subsystem of the shim (mirroring
//! `gpu-mem-track-sys/csrc/`): the only module of this crate with `unsafe` code. The estimator's
//! wrappers (estimates, meta kernels, the shim's optimizers) are the `gpu-mem-track-estimate`
//! crate's own `ffi` module.
#![allow(unsafe_code)]

mod allocator;
mod cuda;
mod oom;
mod recorder;
mod registry;
#[cfg(feature = "tch")]
mod saved;

pub(crate) use allocator::*;
pub(crate) use cuda::*;
pub(crate) use oom::*;
pub(crate) use recorder::*;
// The recorder's events are public API (the `recorder` module), for the estimator crate.
pub use recorder::{op_name, AllocEvent, EventKind};
use registry::tidy_op_name;
pub use registry::with_gil_held;
pub(crate) use registry::*;
#[cfg(feature = "tch")]
pub(crate) use saved::*;

use std::ffi::CString;

use gpu_mem_track_sys as sys;
/// What the build script of the sys crate found (libtorch version, CUDA headers, tch version).
pub(crate) use sys::{
    BUILD_MARKER, CUDA_HISTORY_MISSING, CUDA_MEMORY_INFO, LIBTORCH_VERSION, TORCH_SYS_VERSION,
    TORCH_VERSION_CHECK_BYPASSED,
};

use gpu_mem_track_log::{Category, Phase};

use crate::error::{Error, Result};

pub(crate) use sys::safe::bytes;
pub use sys::safe::DeviceKind;

pub(crate) fn phase_code(phase: Option<Phase>) -> u8 {
    match phase {
        Some(Phase::Load) => sys::GMT_PHASE_LOAD,
        Some(Phase::Input) => sys::GMT_PHASE_INPUT,
        Some(Phase::Forward) => sys::GMT_PHASE_FORWARD,
        Some(Phase::Backward) => sys::GMT_PHASE_BACKWARD,
        Some(Phase::Optimizer) => sys::GMT_PHASE_OPTIMIZER,
        Some(Phase::Unmarked) | None => sys::GMT_PHASE_NONE,
    }
}

pub(crate) fn phase_from_code(code: u8) -> Phase {
    match code {
        sys::GMT_PHASE_LOAD => Phase::Load,
        sys::GMT_PHASE_INPUT => Phase::Input,
        sys::GMT_PHASE_FORWARD => Phase::Forward,
        sys::GMT_PHASE_BACKWARD => Phase::Backward,
        sys::GMT_PHASE_OPTIMIZER => Phase::Optimizer,
        _ => Phase::Unmarked,
    }
}

/// The categories the shim can tag an allocation with (the rest are inferred in Rust).
pub(crate) fn category_code(category: Category) -> i32 {
    match category {
        Category::Parameter => sys::GMT_CAT_PARAMETER,
        Category::Buffer => sys::GMT_CAT_BUFFER,
        Category::Gradient => sys::GMT_CAT_GRADIENT,
        Category::Activation => sys::GMT_CAT_ACTIVATION,
        Category::Input => sys::GMT_CAT_INPUT,
        Category::Workspace => sys::GMT_CAT_WORKSPACE,
        Category::ShardedParameter => sys::GMT_CAT_SHARDED_PARAMETER,
        Category::UnshardedParameter => sys::GMT_CAT_UNSHARDED_PARAMETER,
        Category::ShardedGradient => sys::GMT_CAT_SHARDED_GRADIENT,
        Category::UnshardedGradient => sys::GMT_CAT_UNSHARDED_GRADIENT,
        Category::DdpBucket => sys::GMT_CAT_DDP_BUCKET,
        Category::AllGatherBuffer => sys::GMT_CAT_ALL_GATHER_BUFFER,
        Category::ReduceScatterBuffer => sys::GMT_CAT_REDUCE_SCATTER_BUFFER,
        Category::OptimizerState | Category::Temporary | Category::Unknown => sys::GMT_CAT_NONE,
    }
}

pub(crate) fn category_from_code(code: i32) -> Option<Category> {
    Some(match code {
        sys::GMT_CAT_PARAMETER => Category::Parameter,
        sys::GMT_CAT_BUFFER => Category::Buffer,
        sys::GMT_CAT_GRADIENT => Category::Gradient,
        sys::GMT_CAT_ACTIVATION => Category::Activation,
        sys::GMT_CAT_INPUT => Category::Input,
        sys::GMT_CAT_WORKSPACE => Category::Workspace,
        sys::GMT_CAT_SHARDED_PARAMETER => Category::ShardedParameter,
        sys::GMT_CAT_UNSHARDED_PARAMETER => Category::UnshardedParameter,
        sys::GMT_CAT_SHARDED_GRADIENT => Category::ShardedGradient,
        sys::GMT_CAT_UNSHARDED_GRADIENT => Category::UnshardedGradient,
        sys::GMT_CAT_DDP_BUCKET => Category::DdpBucket,
        sys::GMT_CAT_ALL_GATHER_BUFFER => Category::AllGatherBuffer,
        sys::GMT_CAT_REDUCE_SCATTER_BUFFER => Category::ReduceScatterBuffer,
        _ => return None,
    })
}

impl From<sys::safe::ShimError> for Error {
    fn from(e: sys::safe::ShimError) -> Self {
        Error::Libtorch { call: e.call, message: e.message }
    }
}

/// Turns a shim error (owned C string or null) into a typed error.
pub(crate) fn check(call: &'static str, err: sys::gmt_error) -> Result<()> {
    // SAFETY: `err` is what a shim call returned (every caller passes a call's result).
    Ok(unsafe { sys::safe::check(call, err) }?)
}

pub(crate) fn c_string(call: &'static str, s: &str) -> Result<CString> {
    Ok(sys::safe::c_string(call, s)?)
}

/// Installs the live-tensor registry and the wrapped CPU allocator (idempotent).
pub(crate) fn install() -> Result<()> {
    // SAFETY: returns a constant; the call keeps libtorch_cuda linked into users' binaries.
    unsafe { sys::gmt_torch_cuda_linked() };
    // SAFETY: both installs are idempotent and thread-safe on the C++ side.
    check("registry install", unsafe { sys::gmt_registry_install() })?;
    check("CPU allocator install", unsafe { sys::gmt_cpu_allocator_install() })
}

/// Whether the shim references libtorch_cuda (the libtorch in use ships it).
pub(crate) fn libtorch_has_cuda() -> bool {
    // SAFETY: returns a constant.
    unsafe { sys::gmt_torch_cuda_linked() != 0 }
}

/// The file libtorch_cpu was loaded from, as the dynamic loader names it.
pub(crate) fn libtorch_location() -> Option<String> {
    // SAFETY: returns null or a string the loader owns for as long as libtorch stays loaded
    // (for the life of the process: it is linked, not dlopen'ed); copied at once.
    let p = unsafe { sys::gmt_libtorch_location() };
    (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
