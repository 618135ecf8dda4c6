//! Recorded allocation events (from the shim's recorder) as categorised traces: the step that
//! both live memory history and estimates take before they replay events through
//! [`gpu_mem_track_log::Replay`] or the caching-allocator model.
use std::collections::{HashMap, HashSet};

use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};

use crate::ffi::{op_name, AllocEvent, EventKind};

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
/// a CPU kernel library took raw from the allocator (see [`AllocEvent::kernel_scratch`]) is left
/// out: no GPU run has it, and the estimates' figures leave it out too.
pub(crate) fn classify(events: &[AllocEvent], names: &[String], parameter_ids: &[i64]) -> Trace {
    let categories = categorize(events, parameter_ids);
    let mut sizes: HashMap<i64, u64> = HashMap::new();
    let mut scratch: HashSet<i64> = HashSet::new();
    let mut out = Vec::with_capacity(events.len());
    for (e, category) in events.iter().zip(categories) {
        let Some(category) = category else { continue };
        let alloc = e.kind == EventKind::Alloc;
        if (alloc && e.kernel_scratch && scratch.insert(e.id)) || (!alloc && scratch.remove(&e.id)) {
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
    Trace { events: out }
}
