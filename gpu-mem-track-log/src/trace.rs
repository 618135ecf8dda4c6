//! Allocation traces: each allocation tagged with a category (parameter, gradient, optimizer
//! state, input, activation, temporary) and the phase of the run that made it; the one replay of
//! live and peak bytes ([`Replay`]) that live history, estimates and snapshot readers share; and a
//! memory snapshot read back as a trace (writing one laid out by the CUDA caching allocator model
//! is `gpu-mem-track-gpu`'s `snapshot`).
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::memviz::{self, EntryAction};

/// What an allocation holds, judged from the phase that made it and how long it lived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// A model parameter.
    Parameter,
    /// A distributed program's parameter shard on this rank (FSDP's sharded parameter).
    ShardedParameter,
    /// A parameter gathered whole on this rank for its forward or backward (FSDP's unsharded
    /// parameter, the all-gather's result).
    UnshardedParameter,
    /// A module buffer (batch-norm statistics, ...).
    Buffer,
    /// The input batch.
    Input,
    /// Made by the forward pass and alive at its end: saved for backward, or the output.
    Activation,
    /// Made by backward and alive at its end: a gradient.
    Gradient,
    /// A distributed program's gradient shard on this rank (FSDP's reduce-scatter output).
    ShardedGradient,
    /// A whole gradient on this rank before it is reduced to its shard (FSDP).
    UnshardedGradient,
    /// A DDP bucket: gradients flattened for one allreduce (the Reducer's).
    DdpBucket,
    /// The flat buffer an FSDP all-gather of parameters writes into.
    AllGatherBuffer,
    /// The flat buffer of gradients an FSDP reduce-scatter reads.
    ReduceScatterBuffer,
    /// Made by the optimizer step and kept: its state.
    OptimizerState,
    /// Memory a GPU library takes for itself (cuBLAS, cuBLASLt and cuDNN workspaces).
    Workspace,
    /// Freed within the phase that made it.
    Temporary,
    /// Made outside any declared phase, untagged, and still live at the end.
    Unknown,
}

impl Category {
    /// Every category, in stacking order.
    pub const ALL: [Category; 16] = [
        Category::Parameter,
        Category::ShardedParameter,
        Category::UnshardedParameter,
        Category::Buffer,
        Category::OptimizerState,
        Category::Gradient,
        Category::ShardedGradient,
        Category::UnshardedGradient,
        Category::DdpBucket,
        Category::AllGatherBuffer,
        Category::ReduceScatterBuffer,
        Category::Input,
        Category::Activation,
        Category::Workspace,
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
            Category::ShardedParameter => "sharded_parameter",
            Category::UnshardedParameter => "unsharded_parameter",
            Category::ShardedGradient => "sharded_gradient",
            Category::UnshardedGradient => "unsharded_gradient",
            Category::DdpBucket => "ddp_bucket",
            Category::AllGatherBuffer => "all_gather_buffer",
            Category::ReduceScatterBuffer => "reduce_scatter_buffer",
            Category::Buffer => "buffer",
            Category::Input => "input",
            Category::Activation => "activation",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Workspace => "workspace",
            Category::Temporary => "temporary",
            Category::Unknown => "unknown",
        }
    }

    /// Position in [`ALL`](Self::ALL).
    fn slot(self) -> usize {
        Category::ALL.iter().position(|c| *c == self).expect("ALL lists every category")
    }
}

/// A phase of a run: an estimate's, or what a live program declared. Text and JSON spell it by
/// its `Display` name (`optimizer step`); `FromStr` also takes the short names a program declares
/// (`optimizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Loading the module (parameters, buffers).
    Load,
    /// Creating the input.
    Input,
    /// The forward pass.
    Forward,
    /// Loss and backward pass.
    Backward,
    /// The optimizer step.
    Optimizer,
    /// A live program (memory history) outside any phase it declared.
    Unmarked,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Load => "load",
            Phase::Input => "input",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer step",
            Phase::Unmarked => "run",
        })
    }
}

impl Phase {
    /// Every phase, in the order of a step.
    pub const ALL: [Phase; 6] =
        [Phase::Load, Phase::Input, Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Unmarked];
}

impl std::str::FromStr for Phase {
    type Err = String;
    /// A phase's name (`optimizer step`), or the short name a program declares (`optimizer`).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "optimizer" => Ok(Phase::Optimizer),
            _ => Phase::ALL.into_iter().find(|p| p.to_string() == s).ok_or_else(|| {
                let names: Vec<String> = Phase::ALL.iter().map(|p| format!("{:?}", p.to_string())).collect();
                format!("unknown phase {s:?} (use {})", names.join(", "))
            }),
        }
    }
}

impl Serialize for Phase {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One allocation or free of a trace.
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

/// A categorised allocation trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Trace {
    /// Events in order.
    pub events: Vec<TraceEvent>,
    /// The most a cuDNN convolution engine may take as its workspace in each convolution call, by
    /// the allocation id of the call's first output: what an estimate's meta kernels saw of the
    /// call's operands (empty for a recorded history, or a CPU run).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub workspace_bounds: std::collections::BTreeMap<i64, u64>,
    /// The NCCL communicators this rank of a distributed program holds (one per process group of
    /// more than one rank it made; 0 for a single process): their buffers are GPU memory outside
    /// the caching allocator, which nvidia-smi shows.
    #[serde(skip_serializing_if = "is_zero")]
    pub communicators: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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

/// Live and peak bytes over a sequence of allocations and frees, by category. Frees of
/// allocations it did not see (made before a recording began) change nothing; sums saturate
/// rather than wrap, so absurd sizes from a damaged file cannot turn a peak into 0.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    open: HashMap<i64, (u64, Category)>,
    live: u64,
    peak: u64,
    by_category: [u64; Category::ALL.len()],
}

impl Replay {
    /// An empty replay.
    pub fn new() -> Self {
        Replay::default()
    }

    /// Allocation `id` of `size` bytes; returns whether live bytes reached a new peak.
    pub fn alloc(&mut self, id: i64, size: u64, category: Category) -> bool {
        if let Some((old, c)) = self.open.insert(id, (size, category)) {
            // An id allocated twice without a free (a dropped event): forget the old one.
            self.release(old, c);
        }
        self.live = self.live.saturating_add(size);
        let slot = &mut self.by_category[category.slot()];
        *slot = slot.saturating_add(size);
        let new_peak = self.live > self.peak;
        self.peak = self.peak.max(self.live);
        new_peak
    }

    /// Frees allocation `id`; returns its size, `None` if the replay never saw it.
    pub fn free(&mut self, id: i64) -> Option<u64> {
        let (size, category) = self.open.remove(&id)?;
        self.release(size, category);
        Some(size)
    }

    fn release(&mut self, size: u64, category: Category) {
        self.live = self.live.saturating_sub(size);
        let slot = &mut self.by_category[category.slot()];
        *slot = slot.saturating_sub(size);
    }

    /// Applies one trace event.
    pub fn apply(&mut self, e: &TraceEvent) -> bool {
        if e.alloc {
            self.alloc(e.id, e.size, e.category)
        } else {
            self.free(e.id);
            false
        }
    }

    /// Bytes live now.
    pub fn live(&self) -> u64 {
        self.live
    }

    /// Highest live bytes so far.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Bytes live now in each category, in [`Category::ALL`] order.
    pub fn by_category(&self) -> Vec<(Category, u64)> {
        Category::ALL.iter().copied().zip(self.by_category).collect()
    }
}

impl Trace {
    /// Live bytes by category after every event.
    pub fn timeline(&self) -> Vec<TimelinePoint> {
        self.timeline_points().collect()
    }

    /// [`Trace::timeline`] one point at a time, for readers that keep only some of them (a plot
    /// keeps the highest of each pixel column).
    pub fn timeline_points(&self) -> impl Iterator<Item = TimelinePoint> + '_ {
        let mut replay = Replay::new();
        self.events.iter().enumerate().map(move |(i, e)| {
            replay.apply(e);
            TimelinePoint {
                event: i,
                phase: e.phase,
                iteration: e.iteration,
                bytes: replay.by_category(),
                total: replay.live(),
            }
        })
    }

    /// Highest bytes live at once.
    pub fn peak_bytes(&self) -> u64 {
        let mut replay = Replay::new();
        self.events.iter().for_each(|e| {
            replay.apply(e);
        });
        replay.peak()
    }

    /// The timeline point with the most live bytes (the first, if several).
    pub fn peak(&self) -> Option<TimelinePoint> {
        let mut replay = Replay::new();
        let mut best: Option<TimelinePoint> = None;
        for (i, e) in self.events.iter().enumerate() {
            if replay.apply(e) || best.is_none() {
                best = Some(TimelinePoint {
                    event: i,
                    phase: e.phase,
                    iteration: e.iteration,
                    bytes: replay.by_category(),
                    total: replay.live(),
                });
            }
        }
        best
    }
}

/// Reads the allocations and frees of a memory snapshot pickle (written by this crate, or by
/// PyTorch's `torch.cuda.memory._dump_snapshot`) as a [`Trace`]; several devices' events are
/// merged by time, so the peak is of memory live at once on all of them. Entries without a
/// `category` (PyTorch's own) are temporaries when freed within the trace, else unknown.
///
/// # Errors
/// [`Error::SnapshotRead`] naming the file when it cannot be read, has no `device_traces`, or
/// records no allocation.
pub fn read_snapshot_trace(path: &Path) -> Result<Trace> {
    let device_traces = memviz::read_device_traces(path)?;
    let mut events = Vec::new();
    for entries in &device_traces {
        let mut open: HashMap<u64, usize> = HashMap::new();
        let mut freed = vec![false; entries.len()];
        for (i, e) in entries.iter().enumerate() {
            match e.action {
                EntryAction::Alloc => {
                    open.insert(e.addr, i);
                }
                EntryAction::FreeCompleted => {
                    if let Some(a) = open.remove(&e.addr) {
                        freed[a] = true;
                    }
                }
            }
        }
        let mut category_of: HashMap<u64, Category> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let alloc = e.action == EntryAction::Alloc;
            let category = if alloc {
                let c = e.category.as_deref().and_then(Category::from_name).unwrap_or(if freed[i] {
                    Category::Temporary
                } else {
                    Category::Unknown
                });
                category_of.insert(e.addr, c);
                c
            } else {
                // A free of memory allocated before the trace began: nothing to subtract.
                let Some(c) = category_of.remove(&e.addr) else { continue };
                c
            };
            events.push((
                e.time_us,
                TraceEvent {
                    alloc,
                    id: e.addr as i64,
                    size: e.size,
                    phase: Phase::Unmarked,
                    iteration: 0,
                    op: String::new(),
                    top_op: String::new(),
                    category,
                },
            ));
        }
    }
    if events.is_empty() {
        return Err(Error::SnapshotRead { path: path.to_owned(), reason: "it records no allocation".into() });
    }
    // A stable sort keeps each device's order among events of the same microsecond.
    events.sort_by_key(|(time, _)| *time);
    Ok(Trace { events: events.into_iter().map(|(_, e)| e).collect(), ..Trace::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(alloc: bool, id: i64, size: u64, category: Category) -> TraceEvent {
        TraceEvent {
            alloc,
            id,
            size,
            phase: Phase::Unmarked,
            iteration: 0,
            op: String::new(),
            top_op: String::new(),
            category,
        }
    }

    #[test]
    fn replay_ignores_unseen_frees_and_saturates() {
        let mut r = Replay::new();
        assert!(r.alloc(1, 100, Category::Parameter));
        assert_eq!(r.free(7), None, "a free of memory allocated before the recording");
        assert!(r.alloc(2, 50, Category::Temporary));
        assert_eq!(r.free(2), Some(50));
        assert!(!r.alloc(3, 20, Category::Temporary), "below the peak of 150");
        assert_eq!((r.live(), r.peak()), (120, 150));
        for id in 10..14 {
            r.alloc(id, 1 << 62, Category::Activation);
        }
        assert_eq!(r.peak(), u64::MAX, "four 2^62-byte allocations saturate instead of wrapping to 0");
    }

    #[test]
    fn timeline_and_peak_agree() {
        let t = Trace {
            events: vec![
                ev(true, 1, 10, Category::Parameter),
                ev(true, 2, 30, Category::Activation),
                ev(false, 2, 30, Category::Activation),
                ev(true, 3, 25, Category::Temporary),
            ],
            ..Trace::default()
        };
        let peak = t.peak().unwrap();
        assert_eq!((peak.event, peak.total), (1, 40));
        assert_eq!(t.peak_bytes(), 40);
        assert_eq!(t.timeline().last().unwrap().total, 35);
        assert_eq!(t.timeline()[3].bytes[0], (Category::Parameter, 10));
    }
}
