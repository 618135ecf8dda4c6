//! Safe wrappers over `gpu-mem-track-sys`: the only module of this crate with `unsafe` code.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::ptr::NonNull;

use gpu_mem_track_sys as sys;
/// What the build script of the sys crate found (libtorch version, CUDA headers, tch version).
pub(crate) use sys::{
    CUDA_HISTORY_MISSING, CUDA_MEMORY_INFO, LIBTORCH_VERSION, TORCH_SYS_VERSION, TORCH_VERSION_CHECK_BYPASSED,
};

use gpu_mem_track_log::{Category, DType, Phase};

use crate::error::{Error, Result};

/// The device kinds the shim can list, record and create tensors on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceKind {
    Cpu,
    Cuda,
    Meta,
}

impl DeviceKind {
    fn code(self) -> i32 {
        match self {
            DeviceKind::Cpu => sys::GMT_DEV_CPU,
            DeviceKind::Cuda => sys::GMT_DEV_CUDA,
            DeviceKind::Meta => sys::GMT_DEV_META,
        }
    }
}

fn phase_code(phase: Option<Phase>) -> u8 {
    match phase {
        Some(Phase::Load) => sys::GMT_PHASE_LOAD,
        Some(Phase::Input) => sys::GMT_PHASE_INPUT,
        Some(Phase::Forward) => sys::GMT_PHASE_FORWARD,
        Some(Phase::Backward) => sys::GMT_PHASE_BACKWARD,
        Some(Phase::Optimizer) => sys::GMT_PHASE_OPTIMIZER,
        Some(Phase::Unmarked) | None => sys::GMT_PHASE_NONE,
    }
}

fn phase_from_code(code: u8) -> Phase {
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
fn category_code(category: Category) -> i32 {
    match category {
        Category::Parameter => sys::GMT_CAT_PARAMETER,
        Category::Buffer => sys::GMT_CAT_BUFFER,
        Category::Gradient => sys::GMT_CAT_GRADIENT,
        Category::Activation => sys::GMT_CAT_ACTIVATION,
        Category::Input => sys::GMT_CAT_INPUT,
        Category::OptimizerState | Category::Temporary | Category::Unknown => sys::GMT_CAT_NONE,
    }
}

fn category_from_code(code: i32) -> Option<Category> {
    Some(match code {
        sys::GMT_CAT_PARAMETER => Category::Parameter,
        sys::GMT_CAT_BUFFER => Category::Buffer,
        sys::GMT_CAT_GRADIENT => Category::Gradient,
        sys::GMT_CAT_ACTIVATION => Category::Activation,
        sys::GMT_CAT_INPUT => Category::Input,
        _ => return None,
    })
}

/// The optimizers the shim implements for tch-native estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptimizerKind {
    None,
    Sgd,
    SgdMomentum,
    Adam,
    AdamW,
}

impl OptimizerKind {
    fn code(self) -> i32 {
        match self {
            OptimizerKind::None => sys::GMT_OPT_NONE,
            OptimizerKind::Sgd => sys::GMT_OPT_SGD,
            OptimizerKind::SgdMomentum => sys::GMT_OPT_SGD_MOMENTUM,
            OptimizerKind::Adam => sys::GMT_OPT_ADAM,
            OptimizerKind::AdamW => sys::GMT_OPT_ADAMW,
        }
    }
}

/// What a recorded event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Alloc,
    Free,
    /// The CUDA caching allocator reserved (or mapped) a segment.
    SegmentAlloc,
    /// The CUDA caching allocator released (or unmapped) a segment.
    SegmentFree,
    /// An allocation of `size` bytes was refused; `id` holds the device's free bytes.
    Oom,
}

/// One recorded allocation event, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AllocEvent {
    pub kind: EventKind,
    /// Address (CPU, CUDA) or allocation number (meta).
    pub id: i64,
    /// Bytes (0 on a CPU free).
    pub size: u64,
    pub phase: Phase,
    pub iteration: u32,
    /// Innermost op, an index into [`Recording::op_names`].
    pub op: Option<usize>,
    /// Outermost op, an index into [`Recording::op_names`].
    pub top_op: Option<usize>,
    pub time_ns: i64,
    /// The track site noted before the event (see [`history_set_site`]).
    pub site: Option<usize>,
    /// A category the shim tagged the allocation with.
    pub tag: Option<Category>,
    /// Memory a CPU kernel library took raw from the allocator (oneDNN's scratchpads), tagged
    /// when it came back: it exists only on the CPU.
    pub kernel_scratch: bool,
    nframes: usize,
}

impl From<&sys::gmt_alloc_event> for AllocEvent {
    fn from(e: &sys::gmt_alloc_event) -> Self {
        AllocEvent {
            kind: match e.is_free {
                sys::GMT_EVENT_ALLOC => EventKind::Alloc,
                sys::GMT_EVENT_FREE => EventKind::Free,
                sys::GMT_EVENT_SEGMENT_ALLOC => EventKind::SegmentAlloc,
                sys::GMT_EVENT_OOM => EventKind::Oom,
                _ => EventKind::SegmentFree,
            },
            id: e.id,
            size: e.size.max(0) as u64,
            phase: phase_from_code(e.phase),
            iteration: e.iteration.into(),
            op: usize::try_from(e.op).ok(),
            top_op: usize::try_from(e.top_op).ok(),
            time_ns: e.time_ns,
            site: usize::try_from(e.site).ok(),
            tag: category_from_code(e.category),
            kernel_scratch: e.category == sys::GMT_CAT_KERNEL_SCRATCH,
            nframes: (e.nframes.max(0) as usize).min(sys::GMT_STACK_FRAMES),
        }
    }
}

/// Counters of the wrapped CPU allocator, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AllocStats {
    /// Live now.
    pub current: u64,
    /// Highest since the window opened or was last reset.
    pub peak: u64,
    /// Highest since installation.
    pub total_peak: u64,
    pub allocations: u64,
    pub frees: u64,
}

/// Counters of the CUDA caching allocator on one device, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CudaStats {
    pub allocated_current: u64,
    pub allocated_peak: u64,
    pub reserved_current: u64,
    /// Free and total device memory per the driver (libtorch 2.10 and later).
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    /// cudaMalloc failures the allocator retried after releasing its cache.
    pub num_alloc_retries: u64,
}

fn bytes(v: i64) -> u64 {
    v.max(0) as u64
}

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
    /// A leaf tensor that requires grad: what Python prints as a Parameter.
    pub(crate) fn is_parameter(&self) -> bool {
        self.0.is_leaf != 0 && self.0.requires_grad != 0
    }
    /// The registration name's id, if it has one (see [`registry_name`]).
    pub(crate) fn name_id(&self) -> Option<i32> {
        (self.0.name_id >= 0).then_some(self.0.name_id)
    }
    /// The op that returned it (see [`registry_op_name`]); `None` when registered explicitly.
    pub(crate) fn op_id(&self) -> Option<u32> {
        u32::try_from(self.0.op_id).ok()
    }
    /// What the tracker knows it holds (filled by [`RawSnapshot::take_categorized`] only).
    pub(crate) fn category(&self) -> Option<Category> {
        category_from_code(self.0.category)
    }
    /// Sizes, from the snapshot's shared dims buffer.
    pub(crate) fn shape<'a>(&self, dims: &'a [i64]) -> &'a [i64] {
        let start = usize::try_from(self.0.dims_offset).unwrap_or(0);
        let n = usize::try_from(self.0.ndim).unwrap_or(0);
        dims.get(start..start.saturating_add(n)).unwrap_or(&[])
    }
}

/// Turns a shim error (owned C string or null) into a typed error.
fn check(call: &'static str, err: sys::gmt_error) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: non-null errors are NUL-terminated strings malloc'ed by the shim; we own them.
    let message = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    // SAFETY: `err` came from the shim's allocator and is freed exactly once.
    unsafe { sys::gmt_free_string(err) };
    Err(Error::Libtorch { call, message })
}

fn c_string(call: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Libtorch { call, message: format!("name {s:?} contains a NUL byte") })
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

pub(crate) fn registry_installed() -> bool {
    // SAFETY: reads an atomic flag.
    unsafe { sys::gmt_registry_installed() != 0 }
}

/// Pauses or resumes the registry's per-op callback.
pub(crate) fn set_registry_enabled(enabled: bool) -> Result<()> {
    // SAFETY: toggles a RecordFunction callback; safe while ops run on other threads.
    check("registry enable", unsafe { sys::gmt_registry_set_enabled(enabled as i32) })
}

pub(crate) fn registry_entries() -> usize {
    // SAFETY: reads the map size under the registry lock.
    unsafe { sys::gmt_registry_entries() }
}

pub(crate) fn registry_callbacks() -> u64 {
    // SAFETY: reads an atomic counter.
    unsafe { sys::gmt_registry_callbacks() }
}

/// Adds a tensor (and a display name) to the registry.
pub(crate) fn register_tensor(tensor: &tch::Tensor, name: &str) -> Result<()> {
    let name = c_string("register tensor", name)?;
    // SAFETY: `as_ptr` is the `at::Tensor*` tch owns; it stays valid for the duration of the call
    // because `tensor` is borrowed. The shim only takes a weak reference to its TensorImpl.
    check("register tensor", unsafe {
        sys::gmt_registry_register(tensor.as_ptr() as *const c_void, name.as_ptr())
    })
}

// tch's CModule is a struct holding only the `torch::jit::script::Module*` and exposes no accessor.
const _: () = assert!(std::mem::size_of::<tch::CModule>() == std::mem::size_of::<*mut c_void>());

/// Registers a TorchScript module's named parameters and buffers; returns how many.
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

/// An op name as the log prints it: an autograd node's evaluation
/// (`autograd::engine::evaluate_function: AddmmBackward0`) by its node (`AddmmBackward0`).
fn tidy_op_name(name: &str) -> &str {
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
    /// A leaf tensor that requires grad: what Python prints as a Parameter.
    pub parameter: bool,
    /// The op that made its tensors (see [`registry_op_name`]); `None` when registered explicitly.
    pub op_id: Option<u32>,
}

/// The registry's log group `id`; `None` for an id it never gave.
pub(crate) fn registry_group(id: u32) -> Option<RegistryGroup> {
    let id = i32::try_from(id).ok()?;
    let (mut scalar_type, mut parameter, mut op_id) = (0i32, 0i32, -1i32);
    let mut sizes = vec![0i64; 8];
    loop {
        // SAFETY: copies at most `sizes.len()` dims into our buffer and plain values into locals.
        let ndim = unsafe {
            sys::gmt_registry_group(
                id,
                sizes.as_mut_ptr(),
                sizes.len(),
                &mut scalar_type,
                &mut parameter,
                &mut op_id,
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
        parameter: parameter != 0,
        op_id: u32::try_from(op_id).ok(),
    })
}

/// Totals of one log group in a grouped snapshot: the C record, read through these accessors.
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
}

/// Overall totals of a grouped snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SnapshotTotals {
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

/// Reusable buffer for registry snapshots (capacity is kept between calls).
pub(crate) struct RawSnapshot {
    ptr: NonNull<sys::gmt_snapshot>,
}

// SAFETY: the buffer is plain owned memory; the shim does not tie it to a thread.
unsafe impl Send for RawSnapshot {}

impl RawSnapshot {
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: allocation; null on failure.
        let ptr = unsafe { sys::gmt_snapshot_new() };
        NonNull::new(ptr)
            .map(|ptr| RawSnapshot { ptr })
            .ok_or(Error::Libtorch { call: "snapshot", message: "out of memory".into() })
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
        let take = if categorized { sys::gmt_snapshot_take_categorized } else { sys::gmt_snapshot_take };
        // SAFETY: `self.ptr` is a live snapshot we own exclusively (&mut self).
        check("snapshot", unsafe { take(self.ptr.as_ptr(), device_kind.code(), device_index) })?;
        // SAFETY: the returned arrays stay valid until the next `take` or drop, both of which
        // need `&mut self`, so the borrow checker enforces their lifetime.
        unsafe {
            let n = sys::gmt_snapshot_len(self.ptr.as_ptr());
            // TensorRecord is repr(transparent) over the C record.
            let recs = sys::gmt_snapshot_records(self.ptr.as_ptr()).cast::<TensorRecord>();
            let mut dims_len = 0usize;
            let dims = sys::gmt_snapshot_dims(self.ptr.as_ptr(), &mut dims_len);
            let recs = if n == 0 { &[][..] } else { std::slice::from_raw_parts(recs, n) };
            let dims = if dims_len == 0 { &[][..] } else { std::slice::from_raw_parts(dims, dims_len) };
            Ok((recs, dims))
        }
    }
}

impl RawSnapshot {
    /// What one track needs, without a record per tensor: the totals per log group of the live
    /// tensors on a device kind and index (-1: any), grouped as the snapshot module groups
    /// records (`detail == false`: the overall totals only).
    pub(crate) fn take_grouped(
        &mut self,
        device_kind: DeviceKind,
        device_index: i32,
        detail: bool,
    ) -> Result<(&[GroupTotal], SnapshotTotals)> {
        // SAFETY: `self.ptr` is a live snapshot we own exclusively (&mut self).
        check("snapshot", unsafe {
            sys::gmt_snapshot_take_grouped(
                self.ptr.as_ptr(),
                device_kind.code(),
                device_index,
                i32::from(detail),
            )
        })?;
        let mut totals = sys::gmt_snapshot_totals::default();
        // SAFETY: as in `take_with`: the array lives until the next take or drop (&mut self).
        unsafe {
            sys::gmt_snapshot_totals_of(self.ptr.as_ptr(), &mut totals);
            let mut len = 0usize;
            let groups = sys::gmt_snapshot_groups(self.ptr.as_ptr(), &mut len).cast::<GroupTotal>();
            // GroupTotal is repr(transparent) over the C record.
            let groups =
                if len == 0 || groups.is_null() { &[][..] } else { std::slice::from_raw_parts(groups, len) };
            let totals = SnapshotTotals {
                tensor_bytes: bytes(totals.tensor_bytes),
                tensor_count: usize::try_from(totals.tensor_count).unwrap_or(0),
                storage_count: usize::try_from(totals.storage_count).unwrap_or(0),
            };
            Ok((groups, totals))
        }
    }
}

impl Drop for RawSnapshot {
    fn drop(&mut self) {
        // SAFETY: allocated by gmt_snapshot_new, freed once.
        unsafe { sys::gmt_snapshot_free(self.ptr.as_ptr()) }
    }
}

/// A peak window on the wrapped CPU allocator: its peak is the highest live byte count since the
/// window was opened or last reset.
pub(crate) struct CpuPeakWindow(i32);

impl CpuPeakWindow {
    /// Opens a window, or `None` when all of them are in use.
    pub(crate) fn open() -> Option<Self> {
        // SAFETY: takes the allocator lock; returns -1 when none is free.
        let w = unsafe { sys::gmt_cpu_allocator_open_window() };
        (w >= 0).then_some(CpuPeakWindow(w))
    }

    pub(crate) fn read(&self, reset_peak: bool) -> AllocStats {
        cpu_allocator_stats_window(self.0, reset_peak)
    }
}

impl Drop for CpuPeakWindow {
    fn drop(&mut self) {
        // SAFETY: closes a window we opened.
        unsafe { sys::gmt_cpu_allocator_close_window(self.0) }
    }
}

fn cpu_allocator_stats_window(window: i32, reset_peak: bool) -> AllocStats {
    let mut out = sys::gmt_alloc_stats::default();
    // SAFETY: `out` is a valid out-pointer; the call takes the allocator lock.
    unsafe { sys::gmt_cpu_allocator_stats(window, reset_peak as i32, &mut out) };
    AllocStats {
        current: bytes(out.current),
        peak: bytes(out.peak),
        total_peak: bytes(out.total_peak),
        allocations: bytes(out.allocations),
        frees: bytes(out.frees),
    }
}

/// Global counters of the wrapped CPU allocator (peak = since installation; zeros before install).
pub(crate) fn cpu_allocator_stats() -> AllocStats {
    cpu_allocator_stats_window(-1, false)
}

/// Sets (or, with `None`, removes) the live-byte limit of the wrapped CPU allocator.
pub(crate) fn cpu_allocator_set_limit(bytes: Option<u64>) {
    let v = bytes.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX));
    // SAFETY: stores an atomic.
    unsafe { sys::gmt_cpu_allocator_set_limit(v) }
}

/// Copies a shim table that can grow between the count and the copy: `copy(cap)` fills buffers
/// of `cap` entries and returns the table's length with what it read; it is called again with room
/// to spare until the whole table fits.
fn copy_table<T>(mut copy: impl FnMut(usize) -> (usize, T)) -> T {
    let mut cap = 0usize;
    loop {
        let (n, out) = copy(cap);
        if n <= cap {
            return out;
        }
        cap = n + n / 8 + 16;
    }
}

/// The wrapped CPU allocator's live allocations, `(address, bytes)`, sorted by address.
pub(crate) fn cpu_allocator_live() -> Vec<(u64, u64)> {
    copy_table(|cap| {
        let mut addrs = vec![0i64; cap];
        let mut sizes = vec![0i64; cap];
        // SAFETY: both buffers hold `cap` elements; the shim writes at most `cap` and copies
        // under its lock.
        let n = unsafe { sys::gmt_cpu_allocator_live(addrs.as_mut_ptr(), sizes.as_mut_ptr(), cap) };
        let mut out: Vec<(u64, u64)> =
            addrs.iter().zip(&sizes).take(n).map(|(&a, &s)| (a as u64, bytes(s))).collect();
        out.sort_unstable();
        (n, out)
    })
}

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

/// One block of the CUDA caching allocator's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CudaBlock {
    pub segment_address: u64,
    pub segment_size: u64,
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub allocated: bool,
    pub is_large: bool,
}

/// The blocks of a CUDA device's segments, from the caching allocator's own snapshot.
pub(crate) fn cuda_blocks(device: usize) -> Result<Vec<CudaBlock>> {
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    copy_table(|cap| {
        let mut out = vec![sys::gmt_cuda_block::default(); cap];
        let mut n = 0usize;
        // SAFETY: `out` holds `cap` blocks; the shim writes at most `cap` and sets `n`.
        let err = unsafe { sys::gmt_cuda_blocks(device, out.as_mut_ptr(), cap, &mut n) };
        if let Err(e) = check("CUDA allocator segments", err) {
            return (0, Err(e));
        }
        let blocks = out
            .iter()
            .take(n)
            .map(|b| CudaBlock {
                segment_address: b.segment_address,
                segment_size: b.segment_size,
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                allocated: b.allocated != 0,
                is_large: b.is_large != 0,
            })
            .collect();
        (n, Ok(blocks))
    })
}

/// Reports CUDA out-of-memory errors to the handler (once per process).
pub(crate) fn cuda_oom_observer_attach() -> Result<()> {
    // SAFETY: guarded on the C++ side.
    check("CUDA out-of-memory observer", unsafe { sys::gmt_cuda_oom_observer_attach() })
}

pub(crate) fn cpu_allocator_installed() -> bool {
    // SAFETY: reads a flag.
    unsafe { sys::gmt_cpu_allocator_installed() != 0 }
}

/// Number of visible CUDA devices; 0 without CUDA. Never fails.
pub(crate) fn cuda_device_count() -> usize {
    // SAFETY: guarded on the C++ side; never throws.
    unsafe { sys::gmt_cuda_device_count() }.max(0) as usize
}

/// The file libtorch_cpu was loaded from, as the dynamic loader names it.
pub(crate) fn libtorch_location() -> Option<String> {
    // SAFETY: returns null or a string the loader owns for as long as libtorch stays loaded
    // (for the life of the process: it is linked, not dlopen'ed); copied at once.
    let p = unsafe { sys::gmt_libtorch_location() };
    (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

pub(crate) fn cuda_stats(device: usize, reset_peak: bool) -> Result<CudaStats> {
    let mut out = sys::gmt_cuda_stats::default();
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    // SAFETY: `out` is a valid out-pointer; the shim checks the device index.
    check("CUDA memory stats", unsafe { sys::gmt_cuda_stats_read(device, reset_peak as i32, &mut out) })?;
    Ok(CudaStats {
        allocated_current: bytes(out.allocated_current),
        allocated_peak: bytes(out.allocated_peak),
        reserved_current: bytes(out.reserved_current),
        device_free: u64::try_from(out.free_bytes).ok(),
        device_total: u64::try_from(out.total_bytes).ok(),
        num_alloc_retries: bytes(out.num_alloc_retries),
    })
}

pub(crate) fn cuda_empty_cache() -> Result<()> {
    // SAFETY: guarded on the C++ side.
    check("CUDA empty_cache", unsafe { sys::gmt_cuda_empty_cache() })
}

/// `.item()` calls on meta tensors since the process started (each returned 0).
pub(crate) fn meta_scalar_reads() -> u64 {
    // SAFETY: reads an atomic counter.
    bytes(unsafe { sys::gmt_meta_scalar_reads() })
}

/// Sizes found by a TorchScript (or tch-native) estimate, in bytes and elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EstimateSizes {
    pub param_count: u64,
    pub param_bytes: u64,
    pub buffer_bytes: u64,
    pub input_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// `.item()` calls on meta tensors during the run (each returned 0).
    pub meta_scalar_reads: u64,
    /// Ops that ran their CPU kernel for want of a Meta kernel during the run.
    pub cpu_fallback: Vec<FallbackCount>,
    /// CPU tensors made or met while the CPU meant meta.
    pub cpu_tensors: CpuTensorCounts,
}

/// An op that went through the meta-via-CPU fallback: name, calls, bytes of CPU copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FallbackCount {
    pub op: String,
    pub calls: u64,
    pub bytes: u64,
}

/// Calls and bytes of every op that went through the meta-via-CPU fallback since the process
/// started, by op.
pub(crate) fn meta_fallback_counts() -> Vec<FallbackCount> {
    copy_table(|cap| {
        let mut ops = vec![std::ptr::null(); cap];
        let mut calls = vec![0i64; cap];
        let mut sizes = vec![0i64; cap];
        // SAFETY: the three buffers hold `cap` elements; the shim fills at most `cap` under its lock.
        let n = unsafe {
            sys::gmt_meta_fallback_counts(ops.as_mut_ptr(), calls.as_mut_ptr(), sizes.as_mut_ptr(), cap)
        };
        let counts = (0..n.min(cap))
            .map(|i| FallbackCount {
                // SAFETY: non-null names are map keys that live (unmoved) for the process.
                op: if ops[i].is_null() {
                    String::new()
                } else {
                    unsafe { CStr::from_ptr(ops[i]) }.to_string_lossy().into_owned()
                },
                calls: bytes(calls[i]),
                bytes: bytes(sizes[i]),
            })
            .collect();
        (n, counts)
    })
}

/// The fallback's counts since `before` (a run's own), busiest first.
pub(crate) fn meta_fallback_since(before: &[FallbackCount]) -> Vec<FallbackCount> {
    let mut out: Vec<FallbackCount> = meta_fallback_counts()
        .into_iter()
        .filter_map(|mut now| {
            if let Some(b) = before.iter().find(|b| b.op == now.op) {
                now.calls -= b.calls.min(now.calls);
                now.bytes -= b.bytes.min(now.bytes);
            }
            (now.calls > 0).then_some(now)
        })
        .collect();
    out.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.op.cmp(&b.op)));
    out
}

/// Options of a TorchScript estimate, owned on the Rust side.
pub(crate) struct EstimateCall<'a> {
    pub path: &'a std::path::Path,
    pub input_shape: &'a [i64],
    pub dtype: DType,
    pub input_is_index: bool,
    pub train: bool,
    pub optimizer: OptimizerKind,
    pub iterations: i32,
    pub device_kind: DeviceKind,
    pub eager_lifetimes: bool,
}

/// Runs a TorchScript model with the allocation recorder on; returns its sizes, the recorded
/// events and the op names they refer to.
pub(crate) fn estimate_torchscript(
    call: &EstimateCall<'_>,
) -> Result<(EstimateSizes, Vec<AllocEvent>, Vec<String>)> {
    let path = c_string("estimate", &call.path.to_string_lossy())?;
    let opts = sys::gmt_estimate_options {
        path: path.as_ptr(),
        input_shape: call.input_shape.as_ptr(),
        input_ndim: call.input_shape.len() as i32,
        dtype: call.dtype.scalar_type(),
        input_is_index: call.input_is_index as i32,
        train: call.train as i32,
        optimizer: call.optimizer.code(),
        iterations: call.iterations,
        device_kind: call.device_kind.code(),
        eager_lifetimes: call.eager_lifetimes as i32,
    };
    let reads_before = meta_scalar_reads();
    let fallback_before = meta_fallback_counts();
    let cpu_before = cpu_means_meta_counts();
    let mut raw = sys::gmt_estimate_result::default();
    // SAFETY: `opts` points at live buffers (`path`, `input_shape`) for the call; `raw` is a
    // valid out-pointer.
    check("estimate", unsafe { sys::gmt_estimate_torchscript(&opts, &mut raw) })?;
    let sizes = EstimateSizes {
        param_count: bytes(raw.param_count),
        param_bytes: bytes(raw.param_bytes),
        buffer_bytes: bytes(raw.buffer_bytes),
        input_bytes: bytes(raw.input_bytes),
        grad_bytes: bytes(raw.grad_bytes),
        optimizer_state_bytes: bytes(raw.optimizer_state_bytes),
        meta_scalar_reads: meta_scalar_reads() - reads_before,
        cpu_fallback: meta_fallback_since(&fallback_before),
        cpu_tensors: {
            // The shim's mode ran on this thread inside the call.
            let (made, moved) = cpu_means_meta_counts();
            CpuTensorCounts {
                made_on_cpu: u64::try_from(made - cpu_before.0).unwrap_or(0),
                moved_to_meta: u64::try_from(moved - cpu_before.1).unwrap_or(0),
                examples: take_cpu_means_meta_examples(),
            }
        },
    };
    let (events, names) = recorded_events();
    Ok((sizes, events, names))
}

/// The allocation recorder's events and op-name table (copied out).
pub(crate) fn recorded_events() -> (Vec<AllocEvent>, Vec<String>) {
    let recording = copy_recording(false);
    (recording.events, recording.op_names)
}

/// A copy of the allocation recorder's contents.
pub(crate) struct Recording {
    pub events: Vec<AllocEvent>,
    /// `GMT_STACK_FRAMES` return addresses per event (empty without stacks).
    stacks: Vec<u64>,
    pub op_names: Vec<String>,
    pub dropped: u64,
}

impl Recording {
    /// The native return addresses of event `i`, innermost first (empty without stacks).
    pub(crate) fn stack(&self, i: usize) -> &[u64] {
        let start = i * sys::GMT_STACK_FRAMES;
        let n = self.events.get(i).map_or(0, |e| e.nframes);
        self.stacks.get(start..start + n).unwrap_or(&[])
    }

    /// The name of an op index of an event (`""` when unknown).
    pub(crate) fn op_name(&self, op: Option<usize>) -> &str {
        op_name(&self.op_names, op)
    }
}

/// The name of an op index in an op-name table (`""` when unknown).
pub(crate) fn op_name(names: &[String], op: Option<usize>) -> &str {
    op.and_then(|i| names.get(i)).map_or("", String::as_str)
}

/// Copies the recorder's events (in order), optionally their stacks, and the op names.
pub(crate) fn copy_recording(with_stacks: bool) -> Recording {
    // SAFETY: `gmt_recorder_len` bounds the copy; the buffers have room for `n` events (and
    // `n * GMT_STACK_FRAMES` addresses); the shim copies under its lock.
    let (events, stacks, dropped) = unsafe {
        let n = sys::gmt_recorder_len();
        let mut events = vec![sys::gmt_alloc_event::default(); n];
        let mut stacks = if with_stacks { vec![0u64; n * sys::GMT_STACK_FRAMES] } else { Vec::new() };
        let mut dropped = 0u64;
        let stack_ptr = if with_stacks { stacks.as_mut_ptr() } else { std::ptr::null_mut() };
        let got = sys::gmt_recorder_copy(events.as_mut_ptr(), stack_ptr, n, &mut dropped);
        events.truncate(got);
        stacks.truncate(got * if with_stacks { sys::GMT_STACK_FRAMES } else { 0 });
        (events, stacks, dropped)
    };
    let max_op = events.iter().map(|e| e.op.max(e.top_op)).max().unwrap_or(-1);
    let events: Vec<AllocEvent> = events.iter().map(AllocEvent::from).collect();
    let op_names = (0..=max_op)
        .map(|i| {
            // SAFETY: returns a pointer into the recorder's name table or a static literal.
            let p = unsafe { sys::gmt_recorder_op_name(i) };
            // SAFETY: NUL-terminated; copied immediately.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        })
        .collect();
    Recording { events, stacks, op_names, dropped }
}

/// Allocation ids the estimator tagged as parameters.
pub(crate) fn recorded_parameter_ids() -> Vec<i64> {
    // SAFETY: first call counts; second fills a buffer of that size (the recorder is stopped).
    unsafe {
        let n = sys::gmt_recorder_parameter_ids(std::ptr::null_mut(), 0);
        let mut out = vec![0i64; n];
        let got = sys::gmt_recorder_parameter_ids(out.as_mut_ptr(), n).min(n);
        out.truncate(got);
        out
    }
}

/// Starts recording allocations of a device kind into a ring of `max_events` (0: unbounded).
pub(crate) fn history_start(device_kind: DeviceKind, max_events: usize, with_stacks: bool) -> Result<()> {
    // SAFETY: starts the recorder; fails cleanly if one is running.
    check("record history", unsafe {
        sys::gmt_recorder_start_history(device_kind.code(), max_events, with_stacks as i32)
    })
}

/// Whether this build can hook the CUDA caching allocator (it had the CUDA headers).
pub(crate) fn cuda_history_compiled() -> bool {
    // SAFETY: returns a constant.
    unsafe { sys::gmt_cuda_history_compiled() != 0 }
}

/// Reports the CUDA caching allocator's events of `device` to the recorder from now on.
pub(crate) fn cuda_history_attach(device: usize) -> Result<()> {
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    // SAFETY: validates the device and installs the hook once; errors come back as strings.
    check("record CUDA history", unsafe { sys::gmt_cuda_history_attach(device) })
}

/// Stops reporting CUDA allocator events (the hook stays installed and filters them out).
pub(crate) fn cuda_history_detach() {
    // SAFETY: stores an integer.
    unsafe { sys::gmt_cuda_history_detach() }
}

/// Tags the recorded allocation holding `t`'s storage with a `GMT_CAT_*` category.
pub(crate) fn history_tag_tensor(t: &tch::Tensor, category: Category) {
    // SAFETY: `t` is a live tensor; the shim reads its storage under the recorder lock.
    unsafe { sys::gmt_recorder_tag_tensor(t.as_ptr() as *const c_void, category_code(category)) }
}

/// Tags the storages of the explicitly registered tensors (parameters, their grads, buffers).
pub(crate) fn history_tag_registered() {
    // SAFETY: walks the registry under its lock; no arguments.
    unsafe { sys::gmt_recorder_tag_registered() }
}

/// Tags tensors saved for backward as activations while a history records (or stops doing so).
pub(crate) fn history_tag_saved(enabled: bool) -> Result<()> {
    // SAFETY: installs the saved-variable engine once and flips a flag.
    check("tag saved tensors", unsafe { sys::gmt_saved_history(enabled as i32) })
}

/// Stops the recorder (its contents stay readable).
pub(crate) fn history_stop() -> Result<()> {
    // SAFETY: stops the recorder; a no-op when none runs.
    check("stop history", unsafe { sys::gmt_recorder_stop() })
}

pub(crate) fn history_active() -> bool {
    // SAFETY: reads a flag.
    unsafe { sys::gmt_recorder_active() != 0 }
}

/// The recorder's current (phase, iteration), for progress display.
pub(crate) fn recorder_progress() -> (Phase, u32) {
    let (mut phase, mut iteration) = (0, 0);
    // SAFETY: two valid out-pointers; atomic reads.
    unsafe { sys::gmt_recorder_progress(&mut phase, &mut iteration) };
    (phase_from_code(phase.clamp(0, 255) as u8), iteration.max(0) as u32)
}

/// Tags the next recorded events with a track site.
pub(crate) fn history_set_site(site: i32) {
    // SAFETY: stores an integer.
    unsafe { sys::gmt_recorder_set_site(site) }
}

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

/// Live bytes on the meta device (tracking meta allocator).
pub(crate) fn meta_allocator_current() -> u64 {
    // SAFETY: reads an atomic counter.
    bytes(unsafe { sys::gmt_meta_allocator_current() })
}

/// Static TorchScript estimate (shape propagation + liveness).
pub(crate) fn estimate_static(
    path: &std::path::Path,
    shape: &[i64],
    dtype: DType,
    is_index: bool,
) -> Result<StaticResult> {
    let path = c_string("static estimate", &path.to_string_lossy())?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut out: sys::gmt_static_result = unsafe { std::mem::zeroed() };
    // SAFETY: `path` and `shape` are live for the call; `out` is a valid out-pointer.
    check("static estimate", unsafe {
        sys::gmt_estimate_static(
            path.as_ptr(),
            shape.as_ptr(),
            shape.len() as i32,
            dtype.scalar_type(),
            is_index as i32,
            &mut out,
        )
    })?;
    Ok(StaticResult {
        activation_peak: bytes(out.activation_peak),
        param_bytes: bytes(out.param_bytes),
        nodes: bytes(out.nodes),
        unknown_shapes: bytes(out.unknown_shapes),
        peak_op: fixed_c_str(&out.peak_op),
        seconds: out.seconds,
    })
}

/// What the static (TorchScript IR) analysis found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StaticResult {
    pub activation_peak: u64,
    pub param_bytes: u64,
    pub nodes: u64,
    pub unknown_shapes: u64,
    pub peak_op: String,
    pub seconds: f64,
}

/// A fixed-size C string field as text.
fn fixed_c_str(field: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = field.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Moves a tch variable's data to the meta device or the CPU in place (same variable, new
/// storage), converting floating dtypes to `scalar_type` (-1 keeps them).
pub(crate) fn tensor_to_device_in_place(
    t: &tch::Tensor,
    device_kind: DeviceKind,
    dtype: Option<DType>,
) -> Result<()> {
    let scalar_type = dtype.map_or(-1, DType::scalar_type);
    // SAFETY: `as_ptr` is tch's live at::Tensor*; set_data mutates the TensorImpl behind it, which
    // is what every handle on this variable shares (the intent: the VarStore sees the new data).
    check("move to device", unsafe {
        sys::gmt_tensor_to_device_in_place(t.as_ptr() as *mut c_void, device_kind.code(), scalar_type)
    })
}

/// Tags a tensor's allocation as a parameter in the current recording.
pub(crate) fn tag_parameter_tensor(t: &tch::Tensor) -> Result<()> {
    // SAFETY: a live at::Tensor* borrowed for the call.
    check("tag parameter", unsafe { sys::gmt_tag_parameter_tensor(t.as_ptr() as *const c_void) })
}

/// A new tensor on the meta device or the CPU (random floats, zero integers).
pub(crate) fn make_tensor(shape: &[i64], dtype: DType, device_kind: DeviceKind) -> Result<tch::Tensor> {
    let (scalar_type, device_kind) = (dtype.scalar_type(), device_kind.code());
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `shape` lives for the call; `out` receives a new at::Tensor* we take ownership of.
    check("make tensor", unsafe {
        sys::gmt_make_tensor(shape.as_ptr(), shape.len() as i32, scalar_type, device_kind, &mut out)
    })?;
    // SAFETY: the shim allocated a fresh at::Tensor with `new`; tch frees it with delete.
    Ok(unsafe { tch::Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

/// Optimizer state driven by the shim (the same foreach updates as TorchScript estimates).
pub(crate) struct ShimOptimizer(NonNull<c_void>);

impl ShimOptimizer {
    pub(crate) fn new(kind: OptimizerKind) -> Result<Self> {
        // SAFETY: allocation; null on failure.
        NonNull::new(unsafe { sys::gmt_optimizer_new(kind.code()) })
            .map(ShimOptimizer)
            .ok_or(Error::Libtorch { call: "optimizer", message: "out of memory".into() })
    }

    pub(crate) fn step(&mut self, params: &[tch::Tensor]) -> Result<()> {
        let ptrs: Vec<*const c_void> = params.iter().map(|t| t.as_ptr() as *const c_void).collect();
        // SAFETY: `self.0` is a live optimizer we own; the tensor pointers are borrowed for the call.
        check("optimizer step", unsafe {
            sys::gmt_optimizer_step(self.0.as_ptr(), ptrs.as_ptr(), ptrs.len())
        })
    }

    pub(crate) fn state_bytes(&self) -> u64 {
        // SAFETY: reads the live optimizer's state sizes.
        unsafe { sys::gmt_optimizer_state_bytes(self.0.as_ptr()) }.max(0) as u64
    }
}

impl Drop for ShimOptimizer {
    fn drop(&mut self) {
        // SAFETY: allocated by gmt_optimizer_new, freed once.
        unsafe { sys::gmt_optimizer_free(self.0.as_ptr()) }
    }
}

/// Drops the gradients of `params` (set_to_none), returning the bytes they held.
pub(crate) fn grads_set_to_none(params: &[tch::Tensor]) -> Result<u64> {
    let ptrs: Vec<*const c_void> = params.iter().map(|t| t.as_ptr() as *const c_void).collect();
    let mut bytes = 0i64;
    // SAFETY: tensor pointers borrowed for the call; `bytes` is a valid out-pointer.
    check("zero_grad", unsafe { sys::gmt_grads_set_to_none(ptrs.as_ptr(), ptrs.len(), &mut bytes) })?;
    Ok(bytes.max(0) as u64)
}

/// Starts the estimate recorder on a device kind (phase tags via `set_phase`).
pub(crate) fn recorder_start(device_kind: DeviceKind) -> Result<()> {
    // SAFETY: starts the recorder; fails cleanly if one runs.
    check("record", unsafe { sys::gmt_recorder_start(device_kind.code()) })
}

/// Tags the events recorded from now on with a phase (`None`: outside any) and an iteration.
pub(crate) fn recorder_set_phase(phase: Option<Phase>, iteration: u32) {
    let iteration = i32::try_from(iteration).unwrap_or(i32::MAX);
    // SAFETY: stores two integers.
    unsafe { sys::gmt_recorder_set_phase(phase_code(phase).into(), iteration) }
}

pub(crate) fn meta_allocator_install() -> Result<()> {
    // SAFETY: idempotent installation.
    check("meta allocator", unsafe { sys::gmt_meta_allocator_install() })
}

/// The ops with a hand-written meta kernel in the shim.
pub(crate) fn meta_kernels_registered() -> Vec<String> {
    let mut n = 0usize;
    // SAFETY: returns a static array of `n` static NUL-terminated names.
    let names = unsafe { sys::gmt_meta_kernels_registered(&mut n) };
    (0..n)
        // SAFETY: `i < n`, and every entry is a static C string.
        .map(|i| unsafe { CStr::from_ptr(*names.add(i)) }.to_string_lossy().into_owned())
        .collect()
}

/// Runs every hand-written meta kernel against the CPU kernel of the same op
/// (`csrc/meta_kernel_check.cpp`): one `(op, shapes, verdict)` a case, verdict `ok` or what
/// differs.
pub(crate) fn meta_kernels_check() -> Result<Vec<(String, String, String)>> {
    let mut report: *mut std::os::raw::c_char = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; on success the shim stores a malloc'ed string we own.
    check("meta kernel check", unsafe { sys::gmt_meta_kernels_check(&mut report) })?;
    // SAFETY: set by the shim on success (or left null), owned by us.
    let text = unsafe { take_shim_string(report) };
    Ok(report_fields(&text)
        .map(|mut f| {
            f.resize(3, String::new());
            (std::mem::take(&mut f[0]), std::mem::take(&mut f[1]), std::mem::take(&mut f[2]))
        })
        .collect())
}

/// "The CPU means meta" on this thread while the guard lives: factories asked for the CPU make
/// meta tensors and CPU tensors that reach an op become meta twins (`csrc/cpu_means_meta.cpp`).
/// Thread-local in libtorch, so the guard stays on the thread that made it.
pub(crate) struct CpuMeansMeta {
    made_before: i64,
    moved_before: i64,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// What a [`CpuMeansMeta`] span saw: tensors ops still made on the CPU, CPU tensors moved to
/// meta where an op met them, and up to 8 examples of either.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CpuTensorCounts {
    pub made_on_cpu: u64,
    pub moved_to_meta: u64,
    pub examples: Vec<String>,
}

fn cpu_means_meta_counts() -> (i64, i64) {
    let (mut made, mut moved) = (0i64, 0i64);
    // SAFETY: two valid out-pointers; reads this thread's counters.
    unsafe { sys::gmt_cpu_means_meta_counts(&mut made, &mut moved) };
    (made, moved)
}

impl CpuMeansMeta {
    /// `copies_too`: copies to the CPU (`to`, `_to_copy`) stay on meta as well (TorchScript).
    pub(crate) fn begin(copies_too: bool) -> Result<Self> {
        let (made_before, moved_before) = cpu_means_meta_counts();
        // SAFETY: sets this thread's dispatch-key state; undone by `end` on drop, on this thread.
        check("cpu means meta", unsafe { sys::gmt_cpu_means_meta_begin(i32::from(copies_too)) })?;
        // The examples of an earlier span are not this one's.
        let _ = take_cpu_means_meta_examples();
        Ok(Self { made_before, moved_before, _not_send: std::marker::PhantomData })
    }

    /// What this span saw so far.
    pub(crate) fn counts(&self) -> CpuTensorCounts {
        let (made, moved) = cpu_means_meta_counts();
        CpuTensorCounts {
            made_on_cpu: u64::try_from(made - self.made_before).unwrap_or(0),
            moved_to_meta: u64::try_from(moved - self.moved_before).unwrap_or(0),
            examples: take_cpu_means_meta_examples(),
        }
    }
}

fn take_cpu_means_meta_examples() -> Vec<String> {
    // SAFETY: the shim returns a malloc'ed NUL-terminated string (or null), owned by us.
    let text = unsafe { take_shim_string(sys::gmt_cpu_means_meta_examples()) };
    text.lines().map(str::to_owned).collect()
}

/// Copies out and frees a string the shim malloc'ed; null is the empty string.
///
/// # Safety
/// `raw` is null or a NUL-terminated string from the shim's allocator that no one else frees.
unsafe fn take_shim_string(raw: *mut std::os::raw::c_char) -> String {
    if raw.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (the caller's promise).
    let text = unsafe { CStr::from_ptr(raw) }.to_string_lossy().into_owned();
    // SAFETY: freed exactly once, with the shim's allocator.
    unsafe { sys::gmt_free_string(raw) };
    text
}

/// Tab-separated lines of a shim report, as fields.
fn report_fields(text: &str) -> impl Iterator<Item = Vec<String>> + '_ {
    text.lines().map(|l| l.split('\t').map(str::to_owned).collect())
}

/// Every aten op of a TorchScript model's forward that can run neither on meta nor on the CPU
/// through the fallback: `(schema, where it is called)`.
pub(crate) fn script_ops_without_meta(path: &std::path::Path) -> Result<Vec<(String, String)>> {
    let path = c_string("ops without meta", &path.to_string_lossy())?;
    let mut report: *mut std::os::raw::c_char = std::ptr::null_mut();
    // SAFETY: `path` lives across the call; `report` is a valid out-pointer.
    check("ops without meta", unsafe { sys::gmt_script_ops_without_meta(path.as_ptr(), &mut report) })?;
    // SAFETY: set by the shim on success (or left null), owned by us.
    let text = unsafe { take_shim_string(report) };
    Ok(report_fields(&text)
        .map(|mut f| {
            f.resize(2, String::new());
            (std::mem::take(&mut f[0]), std::mem::take(&mut f[1]))
        })
        .collect())
}

impl Drop for CpuMeansMeta {
    fn drop(&mut self) {
        // SAFETY: the matching end of `begin`, on the same thread (the guard is not Send).
        unsafe { sys::gmt_cpu_means_meta_end() }
    }
}

/// Asks the next recording to snapshot the live tensors after event number `event`.
pub(crate) fn recorder_snapshot_at(event: i64) {
    // SAFETY: stores an integer.
    unsafe { sys::gmt_recorder_snapshot_at(event) }
}

/// The live tensors captured by `recorder_snapshot_at` (copied out).
pub(crate) fn peak_snapshot_records() -> (Vec<TensorRecord>, Vec<i64>) {
    // SAFETY: the peak snapshot is a static buffer written only during a recording (stopped now);
    // we copy it.
    unsafe {
        let s = sys::gmt_peak_snapshot();
        let n = sys::gmt_snapshot_len(s);
        let recs = sys::gmt_snapshot_records(s).cast::<TensorRecord>();
        let mut dims_len = 0usize;
        let dims = sys::gmt_snapshot_dims(s, &mut dims_len);
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
