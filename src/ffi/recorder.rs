//! The allocation recorder (`csrc/recorder.cpp`, `csrc/saved.cpp`): every allocation and free of
//! a device kind with its phase, op and site, beneath the memory history and the estimates.
use std::ffi::{c_void, CStr};

use gpu_mem_track_log::{Category, Phase};
use gpu_mem_track_sys as sys;

use super::DeviceKind;
use super::{category_code, category_from_code, check, phase_code, phase_from_code};
use crate::error::Result;

/// What a recorded event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// An allocation (a block handed out).
    Alloc,
    /// A free of an earlier allocation (same `id`).
    Free,
    /// The CUDA caching allocator reserved (or mapped) a segment.
    SegmentAlloc,
    /// The CUDA caching allocator released (or unmapped) a segment.
    SegmentFree,
    /// An allocation of `size` bytes was refused; `id` holds the device's free bytes.
    Oom,
}

/// One recorded allocation event, typed: what the recorder noted, as it crosses the FFI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocEvent {
    /// What happened.
    pub kind: EventKind,
    /// Address (CPU, CUDA) or allocation number (meta).
    pub id: i64,
    /// Bytes (0 on a CPU free).
    pub size: u64,
    /// The phase of the step it happened in.
    pub phase: Phase,
    /// The iteration (step) it happened in, from 1; 0 while loading.
    pub iteration: u32,
    /// Innermost op, an index into the op-name table that comes with the events
    /// (the `recorder` module's `events`).
    pub op: Option<usize>,
    /// Outermost op (the call the program made), an index into the same table.
    pub top_op: Option<usize>,
    /// When, in nanoseconds of the recorder's clock.
    pub time_ns: i64,
    /// The track site noted before the event (the memory history's `track!` points).
    pub site: Option<usize>,
    /// A category the shim tagged the allocation with.
    pub tag: Option<Category>,
    /// Memory a CPU kernel library took raw from the allocator (oneDNN's scratchpads), tagged
    /// when it came back: it exists only on the CPU.
    pub kernel_scratch: bool,
    /// Memory the program keeps on the host while its GPU computes (FSDP's CPU offload), tagged by
    /// the Python estimator: it is never on the GPU.
    pub host: bool,
    nframes: usize,
}

#[cfg(test)]
impl AllocEvent {
    /// An allocation (or its free) made in op `op` of a name table, tagged with `tag`.
    pub(crate) fn made_in(id: i64, size: u64, free: bool, op: usize, tag: Option<Category>) -> Self {
        AllocEvent {
            kind: if free { EventKind::Free } else { EventKind::Alloc },
            id,
            size,
            phase: Phase::Unmarked,
            iteration: 0,
            op: Some(op),
            top_op: Some(op),
            time_ns: 0,
            site: None,
            tag,
            kernel_scratch: false,
            host: false,
            nframes: 0,
        }
    }
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
            host: e.category == sys::GMT_CAT_HOST,
            nframes: (e.nframes.max(0) as usize).min(sys::GMT_STACK_FRAMES),
        }
    }
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
pub fn op_name(names: &[String], op: Option<usize>) -> &str {
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
pub(crate) fn recorder_start_history(
    device_kind: DeviceKind,
    max_events: usize,
    with_stacks: bool,
) -> Result<()> {
    // SAFETY: starts the recorder; fails cleanly if one is running.
    check("record history", unsafe {
        sys::gmt_recorder_start_history(device_kind.code(), max_events, with_stacks as i32)
    })
}

/// Tags the recorded allocation holding the storage of the tensor whose `c10::TensorImpl*` this is.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn recorder_tag_tensor_impl(impl_ptr: *const c_void, category: Category) {
    // SAFETY: the caller keeps the TensorImpl alive; the shim reads its storage under the lock.
    unsafe { sys::gmt_recorder_tag_tensor_impl(impl_ptr, category_code(category)) }
}

/// Tags the recorded allocation holding the storage of the tensor whose `c10::TensorImpl*` this is
/// as host memory (it outranks every other tag).
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn recorder_tag_tensor_impl_host(impl_ptr: *const c_void) {
    // SAFETY: as in `recorder_tag_tensor_impl`.
    unsafe { sys::gmt_recorder_tag_tensor_impl(impl_ptr, sys::GMT_CAT_HOST) }
}

/// Whether the recorded allocation holding the storage of the tensor whose `c10::TensorImpl*`
/// this is was tagged as host memory.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn recorder_tensor_impl_is_host(impl_ptr: *const c_void) -> bool {
    // SAFETY: the caller keeps the TensorImpl alive; the shim reads its storage under the lock.
    unsafe { sys::gmt_recorder_tensor_impl_category(impl_ptr) == sys::GMT_CAT_HOST }
}

/// Sets the site of the recorded allocation holding a tensor's storage.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
pub(crate) unsafe fn recorder_site_tensor_impl(impl_ptr: *const c_void, site: Option<usize>) {
    let site = site.and_then(|s| i32::try_from(s).ok()).unwrap_or(-1);
    // SAFETY: the caller keeps the TensorImpl alive; the shim reads its storage under the lock.
    unsafe { sys::gmt_recorder_site_tensor_impl(impl_ptr, site) }
}

/// Tags the recorded allocation holding `t`'s storage with a `GMT_CAT_*` category.
#[cfg(feature = "tch")]
pub(crate) fn recorder_tag_tensor(t: &tch::Tensor, category: Category) {
    // SAFETY: `t` is a live tensor; the shim reads its storage under the recorder lock.
    unsafe { sys::gmt_recorder_tag_tensor(t.as_ptr() as *const c_void, category_code(category)) }
}

/// Tags tensors saved for backward as activations while a history records (or stops doing so).
pub(crate) fn history_tag_saved(enabled: bool) -> Result<()> {
    // SAFETY: installs the saved-variable engine once and flips a flag.
    check("tag saved tensors", unsafe { sys::gmt_saved_history(enabled as i32) })
}

/// Stops the recorder (its contents stay readable).
pub(crate) fn recorder_stop() -> Result<()> {
    // SAFETY: stops the recorder; a no-op when none runs.
    check("stop the recorder", unsafe { sys::gmt_recorder_stop() })
}

pub(crate) fn recorder_active() -> bool {
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
pub(crate) fn recorder_set_site(site: i32) {
    // SAFETY: stores an integer.
    unsafe { sys::gmt_recorder_set_site(site) }
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

/// Asks the next recording to walk the live tensors after event number `event`.
pub(crate) fn recorder_walk_at(event: i64) {
    // SAFETY: stores an integer.
    unsafe { sys::gmt_recorder_walk_at(event) }
}

pub(crate) fn recorder_walk_peaks(on: bool) {
    // SAFETY: stores a flag.
    unsafe { sys::gmt_recorder_walk_peaks(i32::from(on)) }
}
