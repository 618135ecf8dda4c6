//! The process-wide live-tensor registry, as a front end without tch drives it: installing it,
//! registering tensors and naming their Python classes, and its switches and counters. A
//! [`MemTracker`](crate::tracker::MemTracker) installs it on its own; these are for the Python package and
//! the benchmarks.
use crate::error::Result;
use crate::ffi;

/// Installs the live-tensor registry and the wrapped CPU allocator now. Tensors created before
/// this (or before the first tracker is built) are only seen if registered explicitly, so call it
/// first thing in `main` when that matters.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) when libtorch refuses the hooks.
pub fn install() -> Result<()> {
    ffi::install()
}

/// Registers a tensor given by its `c10::TensorImpl*` (what Python's `Tensor._cdata` holds) under a
/// name (empty: none): how a front end without tch adds tensors made before [`install`].
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) when registration fails (e.g. a NUL byte in `name`).
#[allow(unsafe_code)]
pub unsafe fn register_tensor_impl(impl_ptr: *mut std::ffi::c_void, name: &str) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::register_tensor_impl(impl_ptr, name) }?;
    ffi::registry_tag_allocations();
    Ok(())
}

/// Adds a buffer a `torch.compile`'d graph's code allocated to the registry, given by its
/// `c10::TensorImpl*`: inductor allocates its buffers past the dispatcher (`empty_strided_cpu`),
/// where no op returns them. The log's line for them says `inductor buffer`
/// ([`TensorRole::InductorBuffer`](gpu_mem_track_log::TensorRole::InductorBuffer)). The Python
/// package registers each buffer so as inductor's code allocates it.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) for a null pointer.
#[allow(unsafe_code)]
pub unsafe fn register_inductor_buffer_impl(impl_ptr: *mut std::ffi::c_void) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::register_inductor_buffer_impl(impl_ptr) }
}

/// Takes a tensor given by its `c10::TensorImpl*` out of the registry (nothing when it is not
/// in it): `torch.utils.swap_tensors` refuses a tensor anything holds weakly, as the registry
/// holds every tensor. The Python package forgets both tensors of a swap, swaps them, and
/// registers them again.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) for a null pointer.
#[allow(unsafe_code)]
pub unsafe fn forget_tensor_impl(impl_ptr: *mut std::ffi::c_void) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::forget_tensor_impl(impl_ptr) }
}

/// Names a Python tensor class for the log, as Python's `repr` of it does without the brackets
/// (`"torch.nn.parameter.Parameter"`, `"mypkg.QuantTensor"`): how the Python package makes a
/// tensor's class column read as Pytorch-Memory-Utils' does. A tensor whose Python class was not
/// named prints the class's bare name. Builds against libtorch before 2.10 do not read Python
/// classes at all (see [`reads_python_classes`]) and print the autograd rule's class: a leaf that
/// requires grad is a Parameter.
///
/// Takes the registry's lock, which a walk holds while it may wait for the Python interpreter
/// to release a tensor: call it without holding the GIL.
///
/// # Safety
/// `type_ptr` must be a `PyTypeObject*` that stays alive for the rest of the process.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) for a null type, an empty name or a NUL byte in it.
#[allow(unsafe_code)]
pub unsafe fn name_python_class(type_ptr: *const std::ffi::c_void, name: &str) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::name_python_class(type_ptr, name) }
}

/// Whether this build reads the Python class of a tensor that has a Python object (built against
/// libtorch 2.10 or later, whose PyObject preservation keeps that object alive while the tracker
/// holds the tensor).
pub fn reads_python_classes() -> bool {
    ffi::reads_python_classes()
}

/// Whether [`install`] (or a tracker) has installed the registry in this process.
pub fn is_installed() -> bool {
    ffi::registry_installed()
}

/// Pauses (`false`) or resumes the registry's per-op callback. Tensors created while paused are
/// invisible to registry walks; meant for measuring the registry's overhead.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) when the registry is not installed.
pub fn set_registry_enabled(enabled: bool) -> Result<()> {
    ffi::set_registry_enabled(enabled)
}

/// Keeps the registry's per-op callback installed but makes it return at once (`true`), or makes
/// it record again (`false`). libtorch still runs the callback and boxes each op's outputs for
/// it, so a step timed hollow and then recording tells the registry's own work apart from what
/// libtorch does for it (`benches/registry_own_work.rs`). Tensors made while hollow are invisible
/// to registry walks, as while paused.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) when the registry is not installed.
pub fn set_registry_hollow(hollow: bool) -> Result<()> {
    ffi::set_registry_hollow(hollow)
}

/// Op callbacks the registry has received since installation (diagnostics, benchmarks): exact
/// while one thread at a time runs ops, as in a training loop; ops running on several threads at
/// once may be undercounted.
pub fn registry_callbacks() -> u64 {
    ffi::registry_callbacks()
}

/// Registry entries, dead ones included until pruned (diagnostics).
pub fn registry_entries() -> usize {
    ffi::registry_entries()
}
