//! The allocation trace of an estimate: each allocation tagged with a category (parameter,
//! gradient, optimizer state, input, activation, temporary), a stacked timeline, and the trace as a
//! PyTorch memory snapshot laid out by the CUDA caching allocator model, so memory_viz shows a
//! GPU-like timeline of a run that never touched a GPU.
use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

use super::caching_allocator::{BlockId, CachingAllocatorModel};
use super::Phase;
use crate::error::Result;
use crate::ffi::AllocEvent;

/// What an allocation holds, judged from the phase that made it and how long it lived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// A model parameter.
    Parameter,
    /// A module buffer (batch-norm statistics, ...).
    Buffer,
    /// The input batch.
    Input,
    /// Made by the forward pass and alive at its end: saved for backward, or the output.
    Activation,
    /// Made by backward and alive at its end: a gradient.
    Gradient,
    /// Made by the optimizer step and kept: its state.
    OptimizerState,
    /// Freed within the phase that made it.
    Temporary,
    /// Made outside any declared phase, untagged, and still live at the end.
    Unknown,
}

impl Category {
    /// Every category, in stacking order.
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::Buffer,
        Category::OptimizerState,
        Category::Gradient,
        Category::Input,
        Category::Activation,
        Category::Temporary,
        Category::Unknown,
    ];

    /// The category a snapshot or JSON names (the inverse of [`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The name used in snapshots and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Buffer => "buffer",
            Category::Input => "input",
            Category::Activation => "activation",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Temporary => "temporary",
            Category::Unknown => "unknown",
        }
    }
}

/// One allocation or free of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// Allocation (true) or free.
    pub alloc: bool,
    /// Allocation identity.
    pub id: i64,
    /// Bytes (of the allocation, also on its free).
    pub size: u64,
    /// Phase.
    pub phase: Phase,
    /// Iteration.
    pub iteration: u32,
    /// Innermost op.
    pub op: String,
    /// Outermost op (the call the program made, e.g. `aten::conv2d`).
    pub top_op: String,
    /// Category of the allocation.
    pub category: Category,
}

/// An estimate's trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Trace {
    /// Events in order.
    pub events: Vec<TraceEvent>,
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
        match e.is_free {
            tracker_sys::GMT_EVENT_ALLOC => {
                open.insert(e.id, i);
            }
            tracker_sys::GMT_EVENT_FREE => {
                if let Some(a) = open.remove(&e.id) {
                    freed_at.insert(a, i);
                }
            }
            _ => {}
        }
    }
    let mut of_alloc: HashMap<i64, Category> = HashMap::new();
    events
        .iter()
        .enumerate()
        .map(|(i, e)| match e.is_free {
            tracker_sys::GMT_EVENT_ALLOC => {
                let freed = freed_at.get(&i);
                let outlives_phase = freed.is_none_or(|&f| f > block_end[block_of[i]]);
                let category = match (tag_category(e.category), Phase::from_code(e.phase)) {
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
            tracker_sys::GMT_EVENT_FREE => of_alloc.remove(&e.id),
            _ => None,
        })
        .collect()
}

/// The category a `GMT_CAT_*` tag names.
fn tag_category(tag: i32) -> Option<Category> {
    Some(match tag {
        tracker_sys::GMT_CAT_PARAMETER => Category::Parameter,
        tracker_sys::GMT_CAT_BUFFER => Category::Buffer,
        tracker_sys::GMT_CAT_GRADIENT => Category::Gradient,
        tracker_sys::GMT_CAT_ACTIVATION => Category::Activation,
        tracker_sys::GMT_CAT_INPUT => Category::Input,
        _ => return None,
    })
}

/// Live bytes per category after one event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelinePoint {
    /// Event index.
    pub event: usize,
    /// Phase.
    pub phase: Phase,
    /// Iteration.
    pub iteration: u32,
    /// Bytes by category name.
    pub bytes: Vec<(Category, u64)>,
    /// Sum.
    pub total: u64,
}

impl Trace {
    /// Builds the trace from recorded events, op names and the parameter allocation ids.
    pub(crate) fn classify(events: &[AllocEvent], names: &[String], parameter_ids: &[i64]) -> Trace {
        let categories = categorize(events, parameter_ids);
        let name = |i: i32| names.get(i.max(0) as usize).cloned().unwrap_or_default();
        let mut sizes: HashMap<i64, u64> = HashMap::new();
        let mut out = Vec::with_capacity(events.len());
        for (e, category) in events.iter().zip(categories) {
            let Some(category) = category else { continue };
            let alloc = e.is_free == tracker_sys::GMT_EVENT_ALLOC;
            let size = if alloc {
                let size = e.size.max(0) as u64;
                sizes.insert(e.id, size);
                size
            } else {
                sizes.remove(&e.id).unwrap_or(e.size.max(0) as u64)
            };
            out.push(TraceEvent {
                alloc,
                id: e.id,
                size,
                phase: Phase::from_code(e.phase),
                iteration: e.iteration.into(),
                op: name(e.op),
                top_op: name(e.top_op),
                category,
            });
        }
        Trace { events: out }
    }
    /// Whether the run called a cuBLAS-backed op (matrix products).
    pub fn uses_cublas(&self) -> bool {
        const CUBLAS_OPS: [&str; 7] = [
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::matmul",
            "aten::linear",
            "aten::addmv",
        ];
        self.events
            .iter()
            .any(|e| CUBLAS_OPS.iter().any(|op| e.op == *op || e.op.starts_with(&format!("{op}."))))
    }

    /// The largest allocation made inside a convolution (forward or backward): the bound this
    /// crate uses for a cuDNN workspace, which only the GPU's heuristics decide.
    pub fn largest_convolution_allocation(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| e.alloc && (e.top_op.contains("conv") || e.op.contains("convolution")))
            .map(|e| e.size)
            .max()
            .unwrap_or(0)
    }

    /// Live bytes by category after every event.
    pub fn timeline(&self) -> Vec<TimelinePoint> {
        let mut live: HashMap<Category, u64> = HashMap::new();
        self.events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let slot = live.entry(e.category).or_default();
                if e.alloc {
                    *slot += e.size;
                } else {
                    *slot = slot.saturating_sub(e.size);
                }
                let bytes: Vec<(Category, u64)> =
                    Category::ALL.iter().map(|c| (*c, live.get(c).copied().unwrap_or(0))).collect();
                let total = bytes.iter().map(|b| b.1).sum();
                TimelinePoint { event: i, phase: e.phase, iteration: e.iteration, bytes, total }
            })
            .collect()
    }

    /// The timeline point with the most live bytes (the first, if several).
    pub fn peak(&self) -> Option<TimelinePoint> {
        self.timeline().into_iter().fold(None, |best: Option<TimelinePoint>, p| match best {
            Some(b) if b.total >= p.total => Some(b),
            _ => Some(p),
        })
    }

    /// Writes the trace as a PyTorch memory snapshot, laid out by the CUDA caching allocator
    /// model: `segment_alloc` when the model reserves a segment, `alloc` / `free_requested` /
    /// `free_completed` with block addresses, and the segments left at the end with their blocks.
    /// Each entry carries its `category`.
    ///
    /// # Errors
    /// [`Error::LogWrite`](crate::Error::LogWrite) naming the file.
    pub fn dump_snapshot(&self, path: &Path) -> Result<()> {
        use crate::history::pickle::{self, Block, Segment, Snapshot, TraceEntry};
        use crate::history::Frame;
        let mut model = CachingAllocatorModel::new();
        let mut blocks: HashMap<i64, BlockId> = HashMap::new();
        let mut trace = Vec::new();
        // One frame per event: the op, labelled with the phase.
        let frames: Vec<Vec<Frame>> = self
            .events
            .iter()
            .map(|e| {
                vec![Frame {
                    filename: format!("{} (iteration {})", e.phase, e.iteration),
                    line: 0,
                    name: e.op.clone(),
                }]
            })
            .collect();
        for (t, e) in self.events.iter().enumerate() {
            let entry = |action, addr, size| TraceEntry {
                action,
                addr,
                size,
                stream: 0,
                time_us: t as i64,
                frames: &frames[t],
                category: Some(e.category.name()),
            };
            if e.alloc {
                let before = model.segments();
                let Ok(b) = model.malloc(e.size) else { continue };
                for (addr, size, _) in model.segments().into_iter().filter(|s| !before.contains(s)) {
                    trace.push(entry("segment_alloc", addr, size));
                }
                let (addr, size) = model.block(b).expect("just allocated");
                blocks.insert(e.id, b);
                trace.push(entry("alloc", addr, size));
            } else if let Some(b) = blocks.remove(&e.id) {
                let (addr, size) = model.block(b).expect("live block");
                model.free(b);
                trace.push(entry("free_requested", addr, size));
                trace.push(entry("free_completed", addr, size));
            }
        }
        let segments = model
            .segment_blocks()
            .into_iter()
            .map(|s| {
                let allocated: u64 = s.blocks.iter().filter(|b| b.2).map(|b| b.1).sum();
                let blocks = s
                    .blocks
                    .iter()
                    .map(|&(address, size, allocated)| Block {
                        address,
                        size,
                        requested_size: if allocated { size } else { 0 },
                        state: if allocated { "active_allocated" } else { "inactive" },
                        frames: &[],
                    })
                    .collect();
                Segment::new(s.address, s.size, allocated, s.small, blocks)
            })
            .collect();
        pickle::write(path, Snapshot { segments, device_traces: vec![trace] })
    }
}
