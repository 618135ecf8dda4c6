//! The allocation recorder: every allocation and free on one device kind, with the phase of the
//! step (forward, backward, optimizer), the op and the track site that made it. It is what
//! memory history (the `history` module) records a training loop with, and what the estimator crate
//! (`gpu-mem-track-estimate`) records a model's run on the meta device with; both turn the events
//! into a categorised [`Trace`] here ([`classify`]) before they replay them.
//!
//! One recording runs at a time in a process; [`start`] fails while one runs.
use std::collections::{HashMap, HashSet};

use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};

use crate::device::DeviceKind;
use crate::error::Result;
use crate::ffi;
pub use crate::ffi::{op_name, AllocEvent, EventKind};
use crate::walk::Walk;

/// Starts recording the allocations of a device kind (phases tagged with [`set_phase`]).
///
/// # Errors
/// [`Libtorch`](crate::error::Error::Libtorch) when a recording already runs.
pub fn start(device: DeviceKind) -> Result<()> {
    ffi::recorder_start(device)
}

/// Stops the recording; what it recorded stays readable ([`events`]). A no-op when none runs.
///
/// # Errors
/// [`Libtorch`](crate::error::Error::Libtorch) when the shim fails to stop it.
pub fn stop() -> Result<()> {
    ffi::recorder_stop()
}

/// Tags the events recorded from now on with a phase (`None`: outside any) and an iteration.
pub fn set_phase(phase: Option<Phase>, iteration: u32) {
    ffi::recorder_set_phase(phase, iteration)
}

/// The recording's current phase and iteration (for a progress display on another thread).
pub fn progress() -> (Phase, u32) {
    ffi::recorder_progress()
}

/// The recorded events, in order, and the op-name table their `op`/`top_op` index.
pub fn events() -> (Vec<AllocEvent>, Vec<String>) {
    ffi::recorded_events()
}

/// The allocation ids tagged as parameters during the recording.
pub fn parameter_ids() -> Vec<i64> {
    ffi::recorded_parameter_ids()
}

/// Tags the events recorded from now on with a site index the caller defines (`None`: none), kept
/// in [`AllocEvent::site`]: memory history's track points, the Python estimator's module paths.
pub fn set_site(site: Option<usize>) {
    ffi::recorder_set_site(site.and_then(|s| i32::try_from(s).ok()).unwrap_or(-1))
}

/// Tags the recorded allocation holding a tensor's storage with `category` (a tag wins over the
/// category its phase and lifetime would give, see [`classify`]). Nothing when no recording runs
/// or the storage was allocated before it.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` (Python: `Tensor._cdata`) for the call.
#[allow(unsafe_code)]
pub unsafe fn tag_tensor_impl(impl_ptr: *const std::ffi::c_void, category: Category) {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::recorder_tag_tensor_impl(impl_ptr, category) }
}

/// Tags the recorded allocation holding a tensor's storage as host memory: what the program keeps
/// on the host while its GPU computes (FSDP's CPU offload), left out of the trace (see
/// [`classify`]). It outranks every other tag. Nothing when no recording runs or the storage was
/// allocated before it.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` (Python: `Tensor._cdata`) for the call.
#[allow(unsafe_code)]
pub unsafe fn tag_tensor_impl_host(impl_ptr: *const std::ffi::c_void) {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::recorder_tag_tensor_impl_host(impl_ptr) }
}

/// Whether the recorded allocation holding a tensor's storage is host memory
/// ([`tag_tensor_impl_host`]); false when no recording runs or the storage was not recorded.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` (Python: `Tensor._cdata`) for the call.
#[allow(unsafe_code)]
pub unsafe fn tensor_impl_is_host(impl_ptr: *const std::ffi::c_void) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::recorder_tensor_impl_is_host(impl_ptr) }
}

/// Sets the site of the recorded allocation holding a tensor's storage (the module that owns a
/// parameter, its gradient or its optimizer state, whatever ran when it was made). Nothing when no
/// recording runs or the storage was allocated before it.
///
/// # Safety
/// `impl_ptr` must point to a live `c10::TensorImpl` (Python: `Tensor._cdata`) for the call.
#[allow(unsafe_code)]
pub unsafe fn site_tensor_impl(impl_ptr: *const std::ffi::c_void, site: Option<usize>) {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::recorder_site_tensor_impl(impl_ptr, site) }
}

/// Asks the next recording to walk the live tensors right after event number `event` (the
/// peak of an earlier run of the same model), for [`peak_walk`].
pub fn walk_at(event: i64) {
    ffi::recorder_walk_at(event)
}

/// Asks the next recording to walk the live tensors at the end of each op that raises its peak
/// of live bytes: once it stops, [`peak_walk`] is the peak's, from that one run (the first
/// event at the highest live bytes, as an estimate names its peak).
pub fn walk_peaks(on: bool) {
    ffi::recorder_walk_peaks(on)
}

/// The live tensors [`walk_at`] or [`walk_peaks`] captured, grouped as the log groups them (parameters apart).
pub fn peak_walk() -> Walk {
    let (records, dims) = ffi::peak_walk_records();
    Walk::from_records(&records, &dims, true, false)
}

/// The category of each recorded allocation, and of its free; `None` for segment events and for
/// frees of allocations made before the recording. A tag set while recording (parameter, buffer,
/// gradient, activation, input) wins; otherwise the phase that made the allocation and its
/// lifetime decide: kept past the end of its phase, a forward allocation is an activation, a
/// backward one a gradient, an optimizer-step one optimizer state; freed within it, a temporary.
/// Outside any declared phase, untagged allocations are temporaries when freed, else unknown.
pub(crate) fn categorize(events: &[AllocEvent], parameter_ids: &[i64]) -> Vec<Option<Category>> {
    let params: HashSet<i64> = parameter_ids.iter().copied().collect();
    // Blocks are runs of events with one (iteration, phase); the last event index of each event's
    // block, and each allocation's free index.
    let mut block_of: Vec<usize> = Vec::with_capacity(events.len());
    let mut block_end: Vec<usize> = Vec::new();
    let mut freed_at: HashMap<usize, usize> = HashMap::new();
    let mut open: HashMap<i64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let same_block = i > 0 && (events[i - 1].iteration, events[i - 1].phase) == (e.iteration, e.phase);
        if !same_block {
            block_end.push(i);
        }
        *block_end.last_mut().expect("a block was opened") = i;
        block_of.push(block_end.len() - 1);
        match e.kind {
            EventKind::Alloc => {
                open.insert(e.id, i);
            }
            EventKind::Free => {
                if let Some(a) = open.remove(&e.id) {
                    freed_at.insert(a, i);
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::Oom => {}
        }
    }
    let mut of_alloc: HashMap<i64, Category> = HashMap::new();
    events
        .iter()
        .enumerate()
        .map(|(i, e)| match e.kind {
            EventKind::Alloc => {
                let freed = freed_at.get(&i);
                let outlives_phase = freed.is_none_or(|&f| f > block_end[block_of[i]]);
                let category = match (e.tag, e.phase) {
                    (Some(tagged), _) => tagged,
                    _ if params.contains(&e.id) => Category::Parameter,
                    (None, Phase::Load) => Category::Buffer,
                    (None, Phase::Input) => Category::Input,
                    (None, Phase::Unmarked) if freed.is_some() => Category::Temporary,
                    (None, Phase::Unmarked) => Category::Unknown,
                    _ if !outlives_phase => Category::Temporary,
                    (None, Phase::Forward) => Category::Activation,
                    (None, Phase::Backward) => Category::Gradient,
                    (None, Phase::Optimizer) => Category::OptimizerState,
                };
                of_alloc.insert(e.id, category);
                Some(category)
            }
            EventKind::Free => of_alloc.remove(&e.id),
            EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::Oom => None,
        })
        .collect()
}

/// Builds a trace from recorded events, op names and the parameter allocation ids. Scratch memory
/// a CPU kernel library took raw from the allocator (see [`AllocEvent::kernel_scratch`]) and host
/// memory ([`AllocEvent::host`]) are left out: no GPU holds them, and the estimates' figures
/// leave them out too.
pub fn classify(events: &[AllocEvent], names: &[String], parameter_ids: &[i64]) -> Trace {
    let categories = categorize(events, parameter_ids);
    let mut sizes: HashMap<i64, u64> = HashMap::new();
    let mut off_gpu: HashSet<i64> = HashSet::new();
    let mut out = Vec::with_capacity(events.len());
    for (e, category) in events.iter().zip(categories) {
        let Some(category) = category else { continue };
        let alloc = e.kind == EventKind::Alloc;
        if (alloc && (e.kernel_scratch || e.host) && off_gpu.insert(e.id))
            || (!alloc && off_gpu.remove(&e.id))
        {
            continue;
        }
        let size = if alloc {
            sizes.insert(e.id, e.size);
            e.size
        } else {
            sizes.remove(&e.id).unwrap_or(e.size)
        };
        out.push(TraceEvent {
            alloc,
            id: e.id,
            size,
            phase: e.phase,
            iteration: e.iteration,
            op: op_name(names, e.op).to_owned(),
            top_op: op_name(names, e.top_op).to_owned(),
            category,
        });
    }
    Trace { events: out, ..Trace::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_and_kernel_scratch_are_left_out_of_the_trace() {
        let names = vec!["aten::empty".to_owned()];
        let mut host = AllocEvent::made_in(1, 100, false, 0, None);
        host.host = true;
        let mut scratch = AllocEvent::made_in(3, 10, false, 0, None);
        scratch.kernel_scratch = true;
        let events = [
            host,
            AllocEvent::made_in(2, 50, false, 0, None),
            scratch,
            AllocEvent::made_in(1, 100, true, 0, None),
            AllocEvent::made_in(3, 10, true, 0, None),
            AllocEvent::made_in(2, 50, true, 0, None),
        ];
        let trace = classify(&events, &names, &[]);
        let kept: Vec<(i64, bool)> = trace.events.iter().map(|e| (e.id, e.alloc)).collect();
        assert_eq!(kept, [(2, true), (2, false)]);
    }
}
