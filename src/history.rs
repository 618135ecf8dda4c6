//! Memory history: every allocation and free on the tracked device (CPU: the wrapped allocator;
//! CUDA: the caching allocator's trace hooks, with its segments), with a timestamp, the most recent
//! track site, a category (parameter, buffer, gradient, activation, input, optimizer state,
//! temporary, unknown) and optionally the native call stack, kept in a bounded ring; and snapshots
//! in the structure of PyTorch's `torch.cuda.memory._snapshot()`, so PyTorch's
//! `torch.cuda._memory_viz` tools and the memory_viz page read them.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

pub use crate::recorder::EventKind;
use gpu_mem_track_gpu::cuda_libraries::{calls_cublas, workspace_sizes_from_env};
pub use gpu_mem_track_log::memviz::Frame;
use gpu_mem_track_log::memviz::{self, Block, MemorySnapshot, Segment, TraceEntry};
pub use gpu_mem_track_log::trace::read_snapshot_trace;
use gpu_mem_track_log::Replay;
pub use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};

use crate::device::DeviceKind;
use crate::error::Result;
use crate::ffi::{self, AllocEvent};
use crate::recorder::categorize;
use crate::site::Site;

/// What to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Events kept (the oldest are dropped first); 0 keeps all.
    pub max_entries: usize,
    /// Capture the native call stack of each event (resolved once per distinct address).
    pub with_stacks: bool,
}

impl HistoryOptions {
    /// Keep the last `max_entries` events (0: all), without stacks.
    pub fn new(max_entries: usize) -> Self {
        HistoryOptions { max_entries, with_stacks: false }
    }

    /// Also capture each event's native call stack (about 8 µs per event instead of 0.2 µs).
    pub fn with_stacks(self, with_stacks: bool) -> Self {
        HistoryOptions { with_stacks, ..self }
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    /// What happened (the recorder's own [`EventKind`]; for [`EventKind::Oom`], `addr` holds the
    /// device's free bytes then, as PyTorch's `oom` trace entry does).
    pub kind: EventKind,
    /// Address (CPU) or allocation number (meta).
    pub addr: u64,
    /// Bytes (for a free: of the matching allocation, 0 if it was not recorded).
    pub size: u64,
    /// Microseconds since the recording started.
    pub time_us: i64,
    /// The most recent track point before the event.
    pub site: Option<Arc<Site>>,
    /// Innermost op running.
    pub op: String,
    /// The phase the program declared (see `MemTracker::optimizer_step`).
    pub phase: Phase,
    /// What the allocation holds (on a free: the freed allocation's); `None` for segments and
    /// for frees of memory allocated before the recording.
    pub category: Option<Category>,
    /// Call stack, innermost first; the track site comes last.
    pub frames: Vec<Frame>,
}

/// A copy of the recorded history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    /// Events, oldest first.
    pub events: Vec<HistoryEvent>,
    /// Events dropped because the ring was full.
    pub dropped: u64,
    /// Recorded from the CPU allocator: host memory has no caching segments, so each allocation
    /// is a segment of its own in a snapshot.
    pub host_memory: bool,
}

static SITES: Mutex<Vec<Arc<Site>>> = Mutex::new(Vec::new());

/// The device kind of the running (or last) recording.
static RECORDING: Mutex<Option<DeviceKind>> = Mutex::new(None);

/// The device kind a history is recording now, if one is.
pub(crate) fn recording_device() -> Option<DeviceKind> {
    if ffi::recorder_active() {
        *RECORDING.lock()
    } else {
        None
    }
}

/// Whether this build can record CUDA history: the shim was compiled with the CUDA runtime headers
/// and linked to libc10_cuda. A GPU is still needed at run time.
pub fn cuda_hooks_compiled() -> bool {
    ffi::cuda_history_compiled()
}

/// Tags events recorded from now on with `site` (called by each track while history records).
pub(crate) fn note_site(site: &Site) {
    if !ffi::recorder_active() {
        return;
    }
    let mut sites = SITES.lock();
    let id = match sites.iter().position(|s| **s == *site) {
        Some(i) => i,
        None => {
            sites.push(Arc::new(site.clone()));
            sites.len() - 1
        }
    };
    ffi::recorder_set_site(id as i32);
}

/// Starts recording allocations on a device kind, outside any phase, tagging saved tensors.
pub(crate) fn start(device_kind: DeviceKind, options: HistoryOptions) -> Result<()> {
    ffi::install()?;
    ffi::recorder_start_history(device_kind, options.max_entries, options.with_stacks)?;
    *RECORDING.lock() = Some(device_kind);
    ffi::history_tag_saved(true)
}

/// Stops recording; what was recorded stays readable.
pub(crate) fn stop() -> Result<()> {
    if ffi::recorder_active() {
        ffi::registry_tag_allocations();
    }
    ffi::history_tag_saved(false)?;
    ffi::cuda_history_detach();
    ffi::recorder_stop()
}

fn resolve_frame(ip: u64, cache: &mut FxHashMap<u64, Frame>) -> Frame {
    cache
        .entry(ip)
        .or_insert_with(|| {
            let mut frame = Frame { filename: "??".into(), line: 0, name: format!("{ip:#x}") };
            backtrace::resolve(ip as *mut std::ffi::c_void, |sym| {
                if let Some(name) = sym.name() {
                    frame.name = format!("{name:#}");
                }
                if let Some(file) = sym.filename() {
                    frame.filename = file.display().to_string();
                }
                frame.line = sym.lineno().unwrap_or(0);
            });
            frame
        })
        .clone()
}

/// Names cuBLAS's and cuBLASLt's workspaces in a CUDA history: allocations made inside a matmul,
/// of a size those workspaces take in this process (`sizes`), never freed and tagged with nothing
/// else. PyTorch allocates them through the caching allocator when a thread's first matmul
/// fetches its handle, and keeps them to the end (see `gpu_mem_track_gpu::cuda_libraries`).
fn name_cublas_workspaces(
    events: &[AllocEvent],
    op_names: &[String],
    sizes: &[u64],
    categories: &mut [Option<Category>],
) {
    let mut open: HashMap<i64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                open.insert(e.id, i);
            }
            EventKind::Free => {
                open.remove(&e.id);
            }
            EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::Oom => {}
        }
    }
    for i in open.into_values() {
        let e = &events[i];
        if e.tag.is_none() && sizes.contains(&e.size) && calls_cublas(ffi::op_name(op_names, e.op)) {
            categories[i] = Some(Category::Workspace);
        }
    }
}

/// Reads the recorded history (while recording or after).
pub(crate) fn read(with_stacks: bool) -> History {
    // Parameters, buffers and the gradients live now get their tags before the copy.
    ffi::registry_tag_allocations();
    let rec = ffi::copy_recording(with_stacks);
    let mut categories = categorize(&rec.events, &[]);
    if *RECORDING.lock() == Some(DeviceKind::Cuda) {
        name_cublas_workspaces(&rec.events, &rec.op_names, &workspace_sizes_from_env(), &mut categories);
    }
    let sites = SITES.lock().clone();
    let mut sizes: HashMap<i64, u64> = HashMap::new();
    let mut cache = FxHashMap::default();
    let events = rec
        .events
        .iter()
        .zip(categories)
        .enumerate()
        .map(|(i, (e, category))| {
            let size = match e.kind {
                EventKind::Alloc => {
                    sizes.insert(e.id, e.size);
                    e.size
                }
                // CPU frees carry no size; CUDA's do (also for blocks allocated before recording).
                EventKind::Free => sizes.remove(&e.id).unwrap_or(e.size),
                EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::Oom => e.size,
            };
            let site = e.site.and_then(|s| sites.get(s).cloned());
            let mut frames: Vec<Frame> = if with_stacks {
                rec.stack(i).iter().map(|&ip| resolve_frame(ip, &mut cache)).collect()
            } else {
                Vec::new()
            };
            if let Some(s) = &site {
                frames.push(Frame {
                    filename: s.file.to_owned(),
                    line: s.line,
                    name: s.function.to_string(),
                });
            }
            HistoryEvent {
                kind: e.kind,
                addr: e.id as u64,
                size,
                time_us: e.time_ns / 1000,
                site,
                op: rec.op_name(e.op).to_owned(),
                phase: e.phase,
                category,
                frames,
            }
        })
        .collect();
    History { events, dropped: rec.dropped, host_memory: *RECORDING.lock() == Some(DeviceKind::Cpu) }
}

impl History {
    /// Allocations and frees in the history (segment events left out).
    pub fn counts(&self) -> (usize, usize) {
        let count = |a| self.events.iter().filter(|e| e.kind == a).count();
        (count(EventKind::Alloc), count(EventKind::Free))
    }

    /// Highest bytes live at once among the recorded allocations.
    pub fn peak_bytes(&self) -> u64 {
        let mut replay = Replay::new();
        for e in &self.events {
            match e.kind {
                EventKind::Alloc => {
                    replay.alloc(e.addr as i64, e.size, e.category.unwrap_or(Category::Unknown));
                }
                // Only frees of recorded allocations count: CUDA also reports frees of older
                // blocks, which the replay never saw.
                EventKind::Free => {
                    replay.free(e.addr as i64);
                }
                EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::Oom => {}
            }
        }
        replay.peak()
    }

    /// The categorised allocations and frees, as an estimate's [`Trace`]: its
    /// [`timeline`](Trace::timeline) and [`peak`](Trace::peak) give the bytes of each category
    /// over time, and `plot::plot_timeline` (feature `plot`) draws them. Frees of memory
    /// allocated before the recording are left out.
    pub fn trace(&self) -> Trace {
        let events = self
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
            .filter_map(|e| {
                Some(TraceEvent {
                    alloc: e.kind == EventKind::Alloc,
                    id: e.addr as i64,
                    size: e.size,
                    phase: e.phase,
                    iteration: 0,
                    op: e.op.clone(),
                    top_op: e.op.clone(),
                    category: e.category?,
                })
            })
            .collect();
        Trace { events, ..Trace::default() }
    }

    /// Writes the history as a PyTorch memory snapshot pickle: `device_traces` with `alloc`,
    /// `free_requested` and `free_completed` entries (and, on CUDA, `segment_alloc` /
    /// `segment_free`), each with its `category`, and `segments` holding the allocations still live
    /// at the end: inside the CUDA segments reserved during the recording, or each its own segment
    /// (host memory has no caching segments).
    ///
    /// # Errors
    /// [`LogError::SnapshotWrite`](gpu_mem_track_log::Error::SnapshotWrite) naming the file when it cannot be
    /// written.
    pub fn dump_snapshot(&self, path: &Path) -> Result<()> {
        let mut trace = Vec::with_capacity(self.events.len() * if self.host_memory { 4 } else { 2 });
        let mut live: Vec<Option<&HistoryEvent>> = Vec::new();
        let mut live_at: HashMap<u64, usize> = HashMap::new();
        let mut segments_live: Vec<(u64, u64)> = Vec::new();
        for e in &self.events {
            let entry = |action| TraceEntry {
                action,
                addr: e.addr,
                size: e.size,
                stream: 0,
                time_us: e.time_us,
                frames: &e.frames,
                category: e.category.map(Category::name),
                device_free: None,
            };
            match e.kind {
                EventKind::Alloc => {
                    live_at.insert(e.addr, live.len());
                    live.push(Some(e));
                    // Host memory: the allocation is its own segment, reserved just before it, so
                    // a tool replaying segments and blocks finds every block inside one.
                    if self.host_memory {
                        trace.push(entry("segment_alloc"));
                    }
                    trace.push(entry("alloc"));
                }
                EventKind::Free => {
                    let known = live_at.remove(&e.addr).map(|i| live[i].take());
                    if self.host_memory && known.is_none() {
                        continue; // allocated before the recording: no segment holds it
                    }
                    trace.push(entry("free_requested"));
                    trace.push(entry("free_completed"));
                    if self.host_memory {
                        trace.push(entry("segment_free"));
                    }
                }
                EventKind::SegmentAlloc => {
                    segments_live.push((e.addr, e.size));
                    trace.push(entry("segment_alloc"));
                }
                EventKind::SegmentFree => {
                    segments_live = unmap(segments_live, e.addr, e.addr.saturating_add(e.size));
                    trace.push(entry("segment_free"));
                }
                // PyTorch's `oom` entry: the bytes asked for and the device's free bytes, no address.
                EventKind::Oom => {
                    trace.push(TraceEntry { addr: 0, device_free: Some(e.addr), ..entry("oom") })
                }
            }
        }
        let live: Vec<&HistoryEvent> = live.into_iter().flatten().collect();
        let segments = segments_at_end(live, segments_live, self.host_memory);
        Ok(memviz::write(path, MemorySnapshot { segments, device_traces: vec![trace] })?)
    }
}

/// The segments left after unmapping `lo..hi` (also a partial unmap of an expandable segment:
/// only that range goes).
fn unmap(segments: Vec<(u64, u64)>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    segments
        .into_iter()
        .flat_map(|(a, s)| {
            let end = a.saturating_add(s);
            let left = (a < lo).then(|| (a, lo.min(end) - a));
            let right = (end > hi).then(|| (hi.max(a), end - hi.max(a)));
            left.into_iter().chain(right)
        })
        .collect()
}

/// The CUDA caching allocator hands out blocks in multiples of 512 bytes (`kMinBlockSize`); its
/// trace, like ours, gives the bytes asked for (torch 2.11 on an H200: 1000 floats, 4000 B).
const CUDA_BLOCK_GRANULE: u64 = 512;

/// The snapshot's `segments`: the live allocations at the end placed in the segments reserved
/// during the recording, and those in none (host memory, or a segment reserved before the
/// recording) each in a segment of its own. As in PyTorch's snapshots, a segment's blocks tile it
/// (`torch.cuda._memory_viz stats` checks that they add up to it): each live block as large as
/// the allocator made it (asked-for bytes rounded up on CUDA, never past the next block or the
/// segment's end), the gaps between them `inactive`.
fn segments_at_end<'a>(
    mut live: Vec<&'a HistoryEvent>,
    mut reserved: Vec<(u64, u64)>,
    host_memory: bool,
) -> Vec<Segment<'a>> {
    let granule = if host_memory { 1 } else { CUDA_BLOCK_GRANULE };
    let free =
        |address: u64, size: u64| Block { address, size, requested_size: 0, state: "inactive", frames: &[] };
    live.sort_by_key(|e| e.addr);
    let mut placed = vec![false; live.len()];
    reserved.sort_unstable();
    let mut segments: Vec<Segment<'a>> = reserved
        .iter()
        .map(|&(address, size)| {
            // Live blocks sorted by address: the ones inside this segment are one run.
            let first = live.partition_point(|e| e.addr < address);
            let end = address.saturating_add(size);
            let inside = live[first..].iter().take_while(|e| e.addr.saturating_add(e.size) <= end).count();
            let mine: Vec<&'a HistoryEvent> = (first..first + inside)
                .filter(|&i| !std::mem::replace(&mut placed[i], true))
                .map(|i| live[i])
                .collect();
            let (mut blocks, mut cursor, mut allocated, mut requested) = (Vec::new(), address, 0, 0);
            for (k, e) in mine.iter().enumerate() {
                if e.addr < cursor {
                    continue; // overlaps the block before it: not from one allocator
                }
                if e.addr > cursor {
                    blocks.push(free(cursor, e.addr - cursor));
                }
                let limit = mine.get(k + 1).map_or(end, |next| next.addr.max(e.addr.saturating_add(e.size)));
                let rounded = e.size.div_ceil(granule).saturating_mul(granule);
                let block_size = rounded.min(limit - e.addr).max(e.size);
                blocks.push(Block {
                    address: e.addr,
                    size: block_size,
                    requested_size: e.size,
                    state: "active_allocated",
                    frames: &e.frames,
                });
                cursor = e.addr.saturating_add(block_size);
                allocated += block_size;
                requested += e.size;
            }
            if cursor < end {
                blocks.push(free(cursor, end - cursor));
            }
            // The CUDA caching allocator's small pool uses 2 MiB segments.
            let mut segment = Segment::new(address, size, allocated, size <= 2 << 20, blocks);
            segment.requested_size = requested;
            segment
        })
        .collect();
    let block = |e: &'a HistoryEvent| Block {
        address: e.addr,
        size: e.size,
        requested_size: e.size,
        state: "active_allocated",
        frames: &e.frames,
    };
    segments.extend(
        live.iter()
            .zip(&placed)
            .filter(|(_, &p)| !p)
            .map(|(e, _)| Segment::new(e.addr, e.size, e.size, false, vec![block(e)])),
    );
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublas_workspaces_are_named_by_op_size_and_lifetime() {
        const MIB: u64 = 1 << 20;
        let names: Vec<String> = ["aten::mm", "aten::relu", "aten::addmm"].map(String::from).to_vec();
        let made = AllocEvent::made_in;
        let events = [
            made(1, 4 * MIB, false, 0, None),  // mm's output, freed below
            made(2, 32 * MIB, false, 0, None), // the workspace
            made(3, MIB, false, 0, None),      // cuBLASLt's
            made(4, 32 * MIB, false, 1, None), // relu: no matmul
            made(5, 32 * MIB, false, 2, Some(Category::Activation)), // tagged: a tensor
            made(6, 32 * MIB, false, 2, None), // freed: an output
            made(1, 4 * MIB, true, 0, None),
            made(6, 32 * MIB, true, 2, None),
        ];
        let mut categories = vec![None; events.len()];
        name_cublas_workspaces(&events, &names, &[MIB, 32 * MIB], &mut categories);
        let named: Vec<i64> = events
            .iter()
            .zip(&categories)
            .filter(|(_, c)| **c == Some(Category::Workspace))
            .map(|(e, _)| e.id)
            .collect();
        assert_eq!(named, [2, 3]);
    }

    fn event(kind: EventKind, addr: u64, size: u64, category: Option<Category>) -> HistoryEvent {
        HistoryEvent {
            kind,
            addr,
            size,
            time_us: 0,
            site: None,
            op: String::new(),
            phase: Phase::Unmarked,
            category,
            frames: Vec::new(),
        }
    }

    /// Blocks tile their segment as PyTorch's do: live blocks rounded up as the CUDA allocator
    /// rounds them (to the next block at most), the gaps free; host memory is not rounded.
    #[test]
    fn blocks_tile_their_segments() {
        let t = Some(Category::Temporary);
        let live = [
            event(EventKind::Alloc, 0x1000_0000, 4000, t),
            event(EventKind::Alloc, 0x1000_1000, 100, t),
            event(EventKind::Alloc, 0x1000_2000, 600, t),
            event(EventKind::Alloc, 0x1000_2400, 8, t),
        ];
        let segments = segments_at_end(live.iter().collect(), vec![(0x1000_0000, 2 << 20)], false);
        assert_eq!(segments.len(), 1);
        let s = &segments[0];
        let blocks: Vec<_> =
            s.blocks.iter().map(|b| (b.address, b.size, b.requested_size, b.state)).collect();
        assert_eq!(
            blocks,
            [
                (0x1000_0000, 4096, 4000, "active_allocated"),
                (0x1000_1000, 512, 100, "active_allocated"),
                (0x1000_1200, 0xe00, 0, "inactive"),
                (0x1000_2000, 1024, 600, "active_allocated"),
                (0x1000_2400, 512, 8, "active_allocated"),
                (0x1000_2600, (2 << 20) - 0x2600, 0, "inactive"),
            ]
        );
        assert_eq!(s.blocks.iter().map(|b| b.size).sum::<u64>(), s.total_size);
        assert_eq!((s.allocated_size, s.requested_size), (4096 + 512 + 1024 + 512, 4000 + 100 + 600 + 8));
        // Host memory: blocks as asked for.
        let host = segments_at_end(live.iter().collect(), vec![(0x1000_0000, 0x3000)], true);
        let sizes: Vec<_> = host[0].blocks.iter().map(|b| (b.size, b.state)).collect();
        assert_eq!(
            sizes,
            [
                (4000, "active_allocated"),
                (96, "inactive"),
                (100, "active_allocated"),
                (0xf9c, "inactive"),
                (600, "active_allocated"),
                (0x1a8, "inactive"),
                (8, "active_allocated"),
                (0xbf8, "inactive"),
            ]
        );
    }

    /// A CUDA-like history: live blocks land in the segment that holds them, the rest (a block
    /// of a segment reserved before the recording) get their own, and reading the file back
    /// gives the same categories.
    #[test]
    fn cuda_segments_hold_their_live_blocks() {
        let t = Some(Category::Temporary);
        let p = Some(Category::Parameter);
        let history = History {
            events: vec![
                event(EventKind::SegmentAlloc, 0x1000_0000, 2 << 20, None),
                event(EventKind::Alloc, 0x1000_0000, 512, p),
                event(EventKind::Alloc, 0x1000_0200, 1024, t),
                event(EventKind::Free, 0x1000_0200, 1024, t),
                event(EventKind::Alloc, 0x1000_0600, 4096, t),
                event(EventKind::Alloc, 0x9000_0000, 8192, t),
                event(EventKind::SegmentAlloc, 0x2000_0000, 20 << 20, None),
                event(EventKind::SegmentFree, 0x2000_0000, 20 << 20, None),
                // Expandable segments: map 4 MiB, unmap its first half, a block in the second.
                event(EventKind::SegmentAlloc, 0x3000_0000, 4 << 20, None),
                event(EventKind::SegmentFree, 0x3000_0000, 2 << 20, None),
                event(EventKind::Alloc, 0x3020_0000, 1 << 20, t),
            ],
            dropped: 0,
            host_memory: false,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.pickle");
        history.dump_snapshot(&path).unwrap();
        let v: serde_pickle::Value =
            serde_pickle::from_slice(&std::fs::read(&path).unwrap(), serde_pickle::DeOptions::new()).unwrap();
        let text = format!("{v:?}");
        assert!(text.contains("segment_alloc") && text.contains("segment_free"), "{text}");
        let segments = match &v {
            serde_pickle::Value::Dict(d) => d
                .iter()
                .find(|(k, _)| matches!(k, serde_pickle::HashableValue::String(s) if s == "segments"))
                .map(|(_, v)| v.clone())
                .unwrap(),
            other => panic!("{other:?}"),
        };
        let serde_pickle::Value::List(segments) = segments else { panic!() };
        assert_eq!(
            segments.len(),
            3,
            "the 2 MiB segment with 2 live blocks, the mapped half, the stray block"
        );
        assert!(text.contains(&format!("{}", 0x3020_0000u64)), "the remaining half keeps its address");
        let trace = read_snapshot_trace(&path).unwrap();
        let peak = trace.peak().unwrap();
        assert_eq!(peak.total, 512 + 4096 + 8192 + (1 << 20));
        assert_eq!(peak.bytes.iter().find(|b| b.0 == Category::Parameter).unwrap().1, 512);
    }
}
