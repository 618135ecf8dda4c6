//! The live-tensor registry (`csrc/registry.cpp`): registration, walks of the live tensors
//! (per tensor or grouped as the log groups them), and the names and groups it interns.
use std::sync::Arc;

use gpu_mem_track_log::{Category, DType, TensorClass, TensorRole};
use gpu_mem_track_sys as sys;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use super::DeviceKind;
use super::{bytes, c_string, category_from_code, check};
use crate::error::{Error, Result};

/// One live tensor as the registry lists it: the C record, read only through these accessors.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TensorRecord(sys::gmt_tensor_record);

impl TensorRecord {
    /// Identity of the storage while the tensor is alive (0: none).
    pub(crate) fn storage_id(&self) -> u64 {
        self.0.storage_id
    }
    /// Whether other live tensors share the storage.
    pub(crate) fn storage_shared(&self) -> bool {
        self.0.storage_shared != 0
    }
    pub(crate) fn storage_nbytes(&self) -> u64 {
        bytes(self.0.storage_nbytes)
    }
    /// `numel * itemsize` of this tensor (a view's own extent).
    pub(crate) fn nbytes(&self) -> u64 {
        bytes(self.0.nbytes)
    }
    /// Registration order.
    pub(crate) fn seq(&self) -> u64 {
        self.0.seq
    }
    pub(crate) fn dtype(&self) -> DType {
        DType::from_scalar_type(self.0.scalar_type)
    }
    /// Its class's id (see [`registry_class`]).
    pub(crate) fn class_id(&self) -> i32 {
        self.0.class_id
    }
    /// The registration name's id, if it has one (see [`registry_name`]).
    pub(crate) fn name_id(&self) -> Option<i32> {
        (self.0.name_id >= 0).then_some(self.0.name_id)
    }
    /// The op that returned it (see [`registry_op_name`]); `None` when registered explicitly.
    pub(crate) fn op_id(&self) -> Option<u32> {
        u32::try_from(self.0.op_id).ok()
    }
    /// What the registry knows the tensor is (its `gmt_tensor_role`).
    pub(crate) fn role(&self) -> RoleCode {
        RoleCode(self.0.role)
    }
    /// What the tracker knows it holds (filled by [`RegistryWalk::take_categorized`] only).
    pub(crate) fn category(&self) -> Option<Category> {
        category_from_code(self.0.category)
    }
    /// Sizes, from the walk's shared dims buffer.
    pub(crate) fn shape<'a>(&self, dims: &'a [i64]) -> &'a [i64] {
        let start = usize::try_from(self.0.dims_offset).unwrap_or(0);
        let n = usize::try_from(self.0.ndim).unwrap_or(0);
        dims.get(start..start.saturating_add(n)).unwrap_or(&[])
    }
}

pub(crate) fn registry_installed() -> bool {
    // SAFETY: reads an atomic flag.
    unsafe { sys::gmt_registry_installed() != 0 }
}

/// Pauses or resumes the registry's per-op callback.
pub(crate) fn set_registry_enabled(enabled: bool) -> Result<()> {
    // SAFETY: toggles a RecordFunction callback; safe while ops run on other threads.
    check("registry enable", unsafe { sys::gmt_registry_set_enabled(enabled as i32) })
}

/// Makes the registry's callbacks return at once (`true`) or record again (`false`).
pub(crate) fn set_registry_hollow(hollow: bool) -> Result<()> {
    // SAFETY: stores an atomic flag the callbacks read.
    check("registry hollow", unsafe { sys::gmt_registry_set_hollow(hollow as i32) })
}

pub(crate) fn registry_entries() -> usize {
    // SAFETY: reads the map size under the registry lock.
    unsafe { sys::gmt_registry_entries() }
}

/// Tags, in a running recording, the storages of the explicitly registered tensors (parameters,
/// their grads, buffers): the registry knows them, the recorder their allocations.
pub(crate) fn registry_tag_allocations() {
    // SAFETY: walks the registry under its lock, then tags outside it; no arguments.
    unsafe { sys::gmt_registry_tag_allocations() }
}

/// Tells the registry's walks on this thread whether it holds Python's GIL; returns the word it
/// replaces.
///
/// # Safety
/// With `held` true, the calling thread must hold the GIL for every walk it runs until the word
/// is withdrawn: a walk then reads the tensors that have a Python object without pinning them.
pub(crate) unsafe fn set_walks_hold_gil(held: bool) -> bool {
    // SAFETY: sets a thread-local flag; the caller answers for what it claims.
    unsafe { sys::gmt_registry_walks_hold_gil(i32::from(held)) != 0 }
}

/// Runs `f` with this thread's registry walks told that it holds CPython's GIL throughout: a
/// walk then reads the tensors that have a Python object without pinning them. From torch 2.10
/// on, a pin of a tensor whose only owner is its Python object takes the GIL, and on the walk's
/// helper threads a new Python thread state, twice: most of a walk's time when a quarter of a
/// Python program's tensors are views. Under the GIL such a tensor cannot die mid-walk, so the
/// pin is not needed. What the Python package's `track()` runs in; a Rust program has no use
/// for it.
///
/// ```no_run
/// # fn f(tracker: &gpu_mem_track::MemTracker) -> gpu_mem_track::Result<()> {
/// // In a Python extension, with the GIL held (a pyo3 `Python<'_>` token in scope):
/// // SAFETY: the GIL is held for the whole call, and track_at never releases it.
/// let point = unsafe { gpu_mem_track::walk::with_gil_held(|| tracker.track()) }?;
/// # Ok(()) }
/// ```
///
/// # Safety
/// The calling thread must hold the GIL of the interpreter that owns the tensors' Python objects
/// for all of `f`, and `f` must not release it.
pub unsafe fn with_gil_held<R>(f: impl FnOnce() -> R) -> R {
    /// Gives back the word it replaced, however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: restores what the thread said before `with_gil_held`.
            unsafe { set_walks_hold_gil(self.0) };
        }
    }
    // SAFETY: the caller holds the GIL for all of `f` (this function's contract).
    let _restore = Restore(unsafe { set_walks_hold_gil(true) });
    f()
}

/// Threads a grouped walk of a large registry uses, the caller's included (for walk.rs's tests).
#[cfg(all(test, feature = "tch"))]
pub(crate) fn walk_threads() -> usize {
    // SAFETY: reads a count under the helpers' lock.
    unsafe { sys::gmt_registry_walk_threads() }
}

/// Sets the threads a grouped walk of a large registry uses (1: the caller alone; at most 16).
#[cfg(all(test, feature = "tch"))]
pub(crate) fn set_walk_threads(threads: usize) {
    // SAFETY: sets a count under the helpers' lock.
    unsafe { sys::gmt_registry_set_walk_threads(threads) }
}

pub(crate) fn registry_callbacks() -> u64 {
    // SAFETY: reads an atomic counter.
    unsafe { sys::gmt_registry_callbacks() }
}

/// Adds a tensor given by its `c10::TensorImpl*` (and a display name) to the registry.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn register_tensor_impl(impl_ptr: *mut c_void, name: &str) -> Result<()> {
    let name = c_string("register tensor", name)?;
    // SAFETY: the caller keeps the TensorImpl alive; the shim takes its own reference for the call.
    check("register tensor", unsafe { sys::gmt_registry_register_impl(impl_ptr, name.as_ptr()) })
}

/// Adds a buffer a `torch.compile`'d graph's code allocated past the dispatcher (inductor's
/// `empty_strided_cpu`), given by its `c10::TensorImpl*`: its log line says `inductor buffer`.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn register_inductor_buffer_impl(impl_ptr: *mut c_void) -> Result<()> {
    // SAFETY: the caller keeps the TensorImpl alive; the shim takes its own reference for the call.
    check("register inductor buffer", unsafe { sys::gmt_registry_register_inductor_buffer(impl_ptr) })
}

/// Drops the registry's entry of a TensorImpl, if it has one.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn forget_tensor_impl(impl_ptr: *mut c_void) -> Result<()> {
    // SAFETY: the caller keeps the TensorImpl alive; the shim only compares its address.
    check("forget tensor", unsafe { sys::gmt_registry_forget_impl(impl_ptr) })
}

/// Adds a tensor (and a display name) to the registry.
#[cfg(feature = "tch")]
pub(crate) fn register_tensor(tensor: &tch::Tensor, name: &str) -> Result<()> {
    let name = c_string("register tensor", name)?;
    // SAFETY: `as_ptr` is the `at::Tensor*` tch owns; it stays valid for the duration of the call
    // because `tensor` is borrowed. The shim only takes a weak reference to its TensorImpl.
    check("register tensor", unsafe {
        sys::gmt_registry_register(tensor.as_ptr() as *const c_void, name.as_ptr())
    })
}

#[cfg(feature = "tch")]
// tch's CModule is a struct holding only the `torch::jit::script::Module*` and exposes no accessor.
const _: () = assert!(std::mem::size_of::<tch::CModule>() == std::mem::size_of::<*mut c_void>());

/// Registers a TorchScript module's named parameters and buffers; returns how many.
#[cfg(feature = "tch")]
pub(crate) fn register_module(module: &tch::CModule, prefix: &str) -> Result<usize> {
    let prefix = c_string("register module", prefix)?;
    // SAFETY: `CModule` is a single-field struct around the module pointer (size asserted above),
    // so its bytes are that pointer. The module is borrowed for the call; the shim only reads it.
    let ptr: *mut c_void = unsafe { std::mem::transmute_copy(module) };
    let mut count = 0usize;
    // SAFETY: `ptr` is a live module (see above); `count` is a valid out-pointer.
    check("register module", unsafe { sys::gmt_register_module(ptr, prefix.as_ptr(), &mut count) })?;
    Ok(count)
}

/// A registered tensor's name, if it has one.
pub(crate) fn registry_name(id: i32) -> Option<String> {
    // SAFETY: returns null or a pointer into an append-only table that lives for the process.
    let p = unsafe { sys::gmt_registry_name(id) };
    // SAFETY: non-null pointers are NUL-terminated strings that are never freed.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The class the registry gave id `id`: Tensor and Parameter by the autograd rule (a leaf that
/// requires grad) for tensors without a Python object, else the Python class. An unknown id (a
/// shim bug, not data) reads as a plain tensor.
pub(crate) fn registry_class(id: i32) -> TensorClass {
    match id {
        0 => TensorClass::Tensor,
        1 => TensorClass::Parameter,
        _ => {
            // SAFETY: returns null or a pointer into an append-only table that lives for the process.
            let p = unsafe { sys::gmt_registry_class_name(id) };
            if p.is_null() {
                return TensorClass::Tensor;
            }
            // SAFETY: non-null pointers are NUL-terminated strings that are never freed.
            TensorClass::from_python_name(&unsafe { CStr::from_ptr(p) }.to_string_lossy())
        }
    }
}

/// Names a Python type for the log (the public `name_python_class`).
///
/// # Safety
/// `type_ptr` must be a `PyTypeObject*` that stays alive for the rest of the process.
pub(crate) unsafe fn name_python_class(type_ptr: *const c_void, name: &str) -> Result<()> {
    let name = c_string("name a Python class", name)?;
    // SAFETY: the shim only stores the pointer as a key (the caller keeps the type alive) and
    // copies the name.
    check("name a Python class", unsafe { sys::gmt_registry_name_class(type_ptr, name.as_ptr()) })
}

/// Whether this build reads tensors' Python classes (libtorch 2.10 or later).
pub(crate) fn reads_python_classes() -> bool {
    // SAFETY: a constant of the build.
    unsafe { sys::gmt_registry_python_classes() != 0 }
}

/// An op name as the log prints it: an autograd node's evaluation
/// (`autograd::engine::evaluate_function: AddmmBackward0`) by its node (`AddmmBackward0`).
pub(super) fn tidy_op_name(name: &str) -> &str {
    name.strip_prefix("autograd::engine::evaluate_function: ").unwrap_or(name)
}

/// The name of an op the registry saw return tensors (`aten::conv2d`, `AddmmBackward0`).
pub(crate) fn registry_op_name(id: u32) -> Option<String> {
    let id = i32::try_from(id).ok()?;
    // SAFETY: returns null or a pointer into an append-only table that lives for the process.
    let p = unsafe { sys::gmt_registry_op_name(id) };
    // SAFETY: non-null pointers are NUL-terminated strings that are never freed.
    (!p.is_null()).then(|| tidy_op_name(&unsafe { CStr::from_ptr(p) }.to_string_lossy()).to_owned())
}

/// A log group the registry interned (see [`GroupTotal::group`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegistryGroup {
    pub shape: Box<[i64]>,
    pub dtype: DType,
    /// Its tensors' class.
    pub class: TensorClass,
    /// The op that made its tensors (see [`registry_op_name`]); `None` when registered explicitly.
    pub op_id: Option<u32>,
    /// What its tensors are, when the registry knows.
    pub role: RoleCode,
}

/// The registry's log group `id`; `None` for an id it never gave.
pub(crate) fn registry_group(id: u32) -> Option<RegistryGroup> {
    let id = i32::try_from(id).ok()?;
    let (mut scalar_type, mut class_id, mut op_id, mut role) = (0i32, 0i32, -1i32, 0i32);
    let mut sizes = vec![0i64; 8];
    loop {
        // SAFETY: copies at most `sizes.len()` dims into our buffer and plain values into locals.
        let ndim = unsafe {
            sys::gmt_registry_group(
                id,
                sizes.as_mut_ptr(),
                sizes.len(),
                &mut scalar_type,
                &mut class_id,
                &mut op_id,
                &mut role,
            )
        };
        let ndim = usize::try_from(ndim).ok()?;
        if ndim <= sizes.len() {
            sizes.truncate(ndim);
            break;
        }
        sizes.resize(ndim, 0); // more dims than the buffer held: read again
    }
    Some(RegistryGroup {
        shape: sizes.into_boxed_slice(),
        dtype: DType::from_scalar_type(scalar_type),
        class: registry_class(class_id),
        op_id: u32::try_from(op_id).ok(),
        role: RoleCode(role),
    })
}

/// A `gmt_tensor_role` (see [`RoleCode::role`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RoleCode(pub i32);

impl RoleCode {
    /// Made inside a call that did not return it.
    pub(crate) fn is_internal(self) -> bool {
        self.0 == sys::GMT_ROLE_INTERNAL
    }

    /// The role, naming the call an internal tensor was made in with `op` (the op id's name).
    pub(crate) fn role(self, op: Option<Arc<str>>) -> Option<TensorRole> {
        match self.0 {
            sys::GMT_ROLE_GRADIENT => Some(TensorRole::Gradient),
            sys::GMT_ROLE_OPTIMIZER_STATE => Some(TensorRole::OptimizerState),
            sys::GMT_ROLE_INTERNAL => op.map(|op| TensorRole::Internal { op }),
            sys::GMT_ROLE_INDUCTOR_BUFFER => Some(TensorRole::InductorBuffer),
            _ => None,
        }
    }
}

/// Tensors ops return from now until `false` are optimizer state in the log.
pub(crate) fn registry_optimizer_step(entering: bool) {
    // SAFETY: adjusts an atomic counter.
    unsafe { sys::gmt_registry_optimizer_step(i32::from(entering)) }
}

/// Totals of one log group in a grouped walk: the C record, read through these accessors.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GroupTotal(sys::gmt_group_total);

impl GroupTotal {
    /// The registry's group (see [`registry_group`]).
    pub(crate) fn group(&self) -> u32 {
        u32::try_from(self.0.group).unwrap_or(u32::MAX)
    }
    /// Tensors whose storage another tensor owns.
    pub(crate) fn view(&self) -> bool {
        self.0.view != 0
    }
    pub(crate) fn count(&self) -> u64 {
        bytes(self.0.count)
    }
    /// Bytes of the storages the group owns.
    pub(crate) fn bytes(&self) -> u64 {
        bytes(self.0.bytes)
    }
    /// The other tensors holding the storages the group owns (their views).
    pub(crate) fn views(&self) -> u64 {
        bytes(self.0.views)
    }
}

/// Overall totals of a grouped walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WalkTotals {
    /// Bytes of unique storages.
    pub tensor_bytes: u64,
    /// Live tensors on the device.
    pub tensor_count: usize,
    /// Unique storages.
    pub storage_count: usize,
}

/// libtorch's name of a scalar type ("Float", "BFloat16", ...), to check gpu-mem-track-log's table.
#[cfg(test)]
pub(crate) fn scalar_type_name(scalar_type: i32) -> &'static str {
    // SAFETY: returns a pointer to a static string (c10::toString) or a literal.
    let p = unsafe { sys::gmt_scalar_type_name(scalar_type) };
    // SAFETY: static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("Undefined")
}

/// What one walk of the live-tensor registry found (per tensor, or grouped as the log groups
/// them), in a buffer kept from walk to walk (its capacity, and the grouped walk's scratch).
pub(crate) struct RegistryWalk {
    ptr: NonNull<sys::gmt_walk>,
}

// SAFETY: the buffer is plain owned memory; the shim does not tie it to a thread.
unsafe impl Send for RegistryWalk {}

impl RegistryWalk {
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: allocation; null on failure.
        let ptr = unsafe { sys::gmt_walk_new() };
        NonNull::new(ptr)
            .map(|ptr| RegistryWalk { ptr })
            .ok_or(Error::Libtorch { call: "registry walk", message: "out of memory".into() })
    }

    /// Lists live registered tensors on a device kind (`GMT_DEV_*`) and index (-1: any).
    pub(crate) fn take(
        &mut self,
        device_kind: DeviceKind,
        device_index: i32,
    ) -> Result<(&[TensorRecord], &[i64])> {
        self.take_with(device_kind, device_index, false)
    }

    /// As [`take`](Self::take), with each record's [`category`](TensorRecord::category).
    pub(crate) fn take_categorized(
        &mut self,
        device_kind: DeviceKind,
        device_index: i32,
    ) -> Result<(&[TensorRecord], &[i64])> {
        self.take_with(device_kind, device_index, true)
    }

    fn take_with(
        &mut self,
        device_kind: DeviceKind,
        device_index: i32,
        categorized: bool,
    ) -> Result<(&[TensorRecord], &[i64])> {
        let take = if categorized { sys::gmt_walk_run_categorized } else { sys::gmt_walk_run };
        // SAFETY: `self.ptr` is a live walk we own exclusively (&mut self).
        check("registry walk", unsafe { take(self.ptr.as_ptr(), device_kind.code(), device_index) })?;
        // SAFETY: the returned arrays stay valid until the next `take` or drop, both of which
        // need `&mut self`, so the borrow checker enforces their lifetime.
        unsafe {
            let n = sys::gmt_walk_len(self.ptr.as_ptr());
            // TensorRecord is repr(transparent) over the C record.
            let recs = sys::gmt_walk_records(self.ptr.as_ptr()).cast::<TensorRecord>();
            let mut dims_len = 0usize;
            let dims = sys::gmt_walk_dims(self.ptr.as_ptr(), &mut dims_len);
            let recs = if n == 0 { &[][..] } else { std::slice::from_raw_parts(recs, n) };
            let dims = if dims_len == 0 { &[][..] } else { std::slice::from_raw_parts(dims, dims_len) };
            Ok((recs, dims))
        }
    }
}

impl RegistryWalk {
    /// What one track needs, without a record per tensor: the totals per log group of the live
    /// tensors on a device kind and index (-1: any), grouped as the walk module groups
    /// records (`detail == false`: the overall totals only).
    pub(crate) fn take_grouped(
        &mut self,
        device_kind: DeviceKind,
        device_index: i32,
        detail: bool,
    ) -> Result<(&[GroupTotal], WalkTotals)> {
        // SAFETY: `self.ptr` is a live walk we own exclusively (&mut self).
        check("registry walk", unsafe {
            sys::gmt_walk_run_grouped(self.ptr.as_ptr(), device_kind.code(), device_index, i32::from(detail))
        })?;
        let mut totals = sys::gmt_walk_totals::default();
        // SAFETY: as in `take_with`: the array lives until the next take or drop (&mut self).
        unsafe {
            sys::gmt_walk_totals_of(self.ptr.as_ptr(), &mut totals);
            let mut len = 0usize;
            let groups = sys::gmt_walk_groups(self.ptr.as_ptr(), &mut len).cast::<GroupTotal>();
            // GroupTotal is repr(transparent) over the C record.
            let groups =
                if len == 0 || groups.is_null() { &[][..] } else { std::slice::from_raw_parts(groups, len) };
            let totals = WalkTotals {
                tensor_bytes: bytes(totals.tensor_bytes),
                tensor_count: usize::try_from(totals.tensor_count).unwrap_or(0),
                storage_count: usize::try_from(totals.storage_count).unwrap_or(0),
            };
            Ok((groups, totals))
        }
    }
}

impl RegistryWalk {
    /// Makes later grouped walks collect the data addresses of the live storages of these byte
    /// sizes (see [`watched`](Self::watched)); empty: none, the default.
    pub(crate) fn watch_storage_sizes(&mut self, sizes: &[u64]) {
        let sizes: Vec<i64> = sizes.iter().filter_map(|&b| i64::try_from(b).ok()).collect();
        // SAFETY: `self.ptr` is a live walk we own exclusively; the shim copies the sizes.
        unsafe { sys::gmt_walk_watch_storage_sizes(self.ptr.as_ptr(), sizes.as_ptr(), sizes.len()) }
    }

    /// The data addresses of the storages of a watched size that the last grouped walk met (a
    /// storage once per tensor holding it).
    pub(crate) fn watched(&self) -> &[u64] {
        let mut len = 0usize;
        // SAFETY: the array lives until the next walk or drop, which need &mut self.
        unsafe {
            let data = sys::gmt_walk_watched(self.ptr.as_ptr(), &mut len);
            if len == 0 || data.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(data, len)
            }
        }
    }
}

impl Drop for RegistryWalk {
    fn drop(&mut self) {
        // SAFETY: allocated by gmt_walk_new, freed once.
        unsafe { sys::gmt_walk_free(self.ptr.as_ptr()) }
    }
}

/// The live tensors captured by `recorder_walk_at` (copied out).
pub(crate) fn peak_walk_records() -> (Vec<TensorRecord>, Vec<i64>) {
    // SAFETY: the peak walk is a static buffer written only during a recording (stopped now);
    // we copy it.
    unsafe {
        let s = sys::gmt_peak_walk();
        let n = sys::gmt_walk_len(s);
        let recs = sys::gmt_walk_records(s).cast::<TensorRecord>();
        let mut dims_len = 0usize;
        let dims = sys::gmt_walk_dims(s, &mut dims_len);
        let recs =
            if n == 0 || recs.is_null() { Vec::new() } else { std::slice::from_raw_parts(recs, n).to_vec() };
        let dims = if dims_len == 0 || dims.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(dims, dims_len).to_vec()
        };
        (recs, dims)
    }
}

#[cfg(test)]
mod tests {
    use gpu_mem_track_log::DType;

    /// gpu-mem-track-log names dtypes without libtorch: its table must match libtorch's own.
    #[test]
    fn dtype_table_matches_libtorch() {
        for n in 0..46 {
            assert_eq!(DType::from_scalar_type(n).c10_name(), super::scalar_type_name(n), "scalar type {n}");
        }
    }
}
