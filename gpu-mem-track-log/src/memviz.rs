//! PyTorch memory-snapshot pickles, the structure of `torch.cuda.memory._snapshot()` that
//! PyTorch's `torch.cuda._memory_viz` tools and the memory_viz page read: writing them, and
//! reading one (ours or PyTorch's) back ([`read_device_traces`]; `trace::read_snapshot_trace` makes
//! a trace of it).
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};

/// One stack frame, as memory_viz shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// Source file (`??` when unknown).
    pub filename: String,
    /// Line (0 when unknown).
    pub line: u32,
    /// Function.
    pub name: String,
}

/// One `device_traces` entry.
#[derive(Debug, Serialize)]
pub struct TraceEntry<'a> {
    /// `alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `snapshot`,
    /// `oom`.
    pub action: &'static str,
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// CUDA stream.
    pub stream: i64,
    /// Microseconds.
    pub time_us: i64,
    /// Call stack, innermost first.
    pub frames: &'a [Frame],
    /// Category name (`Category::name` in the trace module).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<&'static str>,
    /// `oom` entries: the device's free bytes when the allocation failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

/// One block of a segment.
#[derive(Debug, Serialize)]
pub struct Block<'a> {
    /// Address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Bytes asked for.
    pub requested_size: u64,
    /// `active_allocated` or `inactive`.
    pub state: &'static str,
    /// Call stack of its allocation.
    pub frames: &'a [Frame],
}

/// One segment (a `cudaMalloc`).
#[allow(missing_docs)] // PyTorch's field names.
#[derive(Debug, Serialize)]
pub struct Segment<'a> {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: i64,
    pub segment_type: &'static str,
    pub segment_pool_id: (i64, i64),
    pub is_expandable: bool,
    pub frames: Vec<Frame>,
    pub blocks: Vec<Block<'a>>,
}

impl<'a> Segment<'a> {
    /// A segment on device 0, stream 0.
    pub fn new(address: u64, total_size: u64, allocated: u64, small: bool, blocks: Vec<Block<'a>>) -> Self {
        Segment {
            device: 0,
            address,
            total_size,
            allocated_size: allocated,
            active_size: allocated,
            requested_size: allocated,
            stream: 0,
            segment_type: if small { "small" } else { "large" },
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: Vec::new(),
            blocks,
        }
    }
}

/// A whole PyTorch memory snapshot (what `torch.cuda.memory._snapshot()` pickles).
#[derive(Debug, Serialize)]
pub struct MemorySnapshot<'a> {
    /// Segments at the end, with their blocks.
    pub segments: Vec<Segment<'a>>,
    /// One trace per device.
    pub device_traces: Vec<Vec<TraceEntry<'a>>>,
}

/// Writes a snapshot pickle. A trace with categories ends with a `snapshot` entry (PyTorch marks
/// where a snapshot was taken the same way) in category `unknown`: memory_viz's MemoryViz.js
/// crashes on categorised traces without an `unknown` category (it appends one through a
/// misspelt `snapshot.categores`).
///
/// # Errors
/// [`Error::SnapshotWrite`] naming the file.
pub fn write(path: &Path, mut snapshot: MemorySnapshot<'_>) -> Result<()> {
    for trace in &mut snapshot.device_traces {
        if trace.iter().any(|e| e.category.is_some()) && !trace.iter().any(|e| e.category == Some("unknown"))
        {
            let time_us = trace.last().map_or(0, |e| e.time_us);
            trace.push(TraceEntry {
                action: "snapshot",
                addr: 0,
                size: 0,
                stream: 0,
                time_us,
                frames: &[],
                category: Some("unknown"),
                device_free: None,
            });
        }
    }
    let snapshot = &snapshot;
    let io = |source| Error::SnapshotWrite { path: path.to_owned(), source };
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    serde_pickle::to_writer(&mut file, snapshot, serde_pickle::SerOptions::new())
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    file.flush().map_err(io)
}

/// What a `device_traces` entry read back records (other actions are skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryAction {
    /// `alloc`: a block handed out.
    Alloc,
    /// `free_completed`: a block back in the allocator.
    FreeCompleted,
}

/// One `device_traces` entry as read back (other keys ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadTraceEntry {
    /// Allocation or free.
    pub action: EntryAction,
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Microseconds (0 when the entry has none).
    pub time_us: i64,
    /// Category name, when the writer gave one.
    pub category: Option<String>,
}

/// The `device_traces` of a decoded snapshot, walked without recursion (the shape is fixed:
/// dict -> list of devices -> list of entry dicts), so no nesting in the file can overflow
/// the stack.
fn device_traces(p: &crate::pickle::Pickle<'_>) -> std::result::Result<Vec<Vec<ReadTraceEntry>>, String> {
    let traces =
        p.get(p.root, "device_traces").ok_or("it has no `device_traces` (is it a memory snapshot?)")?;
    let devices = p.items(traces).ok_or("`device_traces` is not a list")?;
    let mut out = Vec::with_capacity(devices.len());
    for (d, &device) in devices.iter().enumerate() {
        let entries = p.items(device).ok_or_else(|| format!("device_traces[{d}] is not a list"))?;
        let mut read = Vec::with_capacity(entries.len());
        for (i, &entry) in entries.iter().enumerate() {
            let at = || format!("device_traces[{d}][{i}]");
            let action = p.get(entry, "action").and_then(|a| p.text(a));
            let action = action.ok_or_else(|| format!("{} has no text `action`", at()))?;
            // Only allocations and frees are read; other entries may lack addresses.
            let action = match action {
                "alloc" => EntryAction::Alloc,
                "free_completed" => EntryAction::FreeCompleted,
                _ => continue,
            };
            let unsigned = |key: &str| {
                let v = p.get(entry, key).and_then(|v| p.int(v));
                v.and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| format!("{} has no `{key}` from 0 to 2^64-1", at()))
            };
            let time_us = match p.get(entry, "time_us") {
                Some(t) => p
                    .int(t)
                    .and_then(|t| i64::try_from(t).ok())
                    .ok_or_else(|| format!("{}: bad `time_us`", at()))?,
                None => 0,
            };
            read.push(ReadTraceEntry {
                action,
                addr: unsigned("addr")?,
                size: unsigned("size")?,
                time_us,
                category: p.get(entry, "category").and_then(|c| p.text(c)).map(str::to_owned),
            });
        }
        out.push(read);
    }
    Ok(out)
}

/// Reads the allocations and frees of a memory snapshot pickle (written by this crate, or by
/// PyTorch's `torch.cuda.memory._dump_snapshot`): one list of entries per device, in file order.
///
/// # Errors
/// [`Error::SnapshotRead`] naming the file when it cannot be read or has no `device_traces`.
pub fn read_device_traces(path: &Path) -> Result<Vec<Vec<ReadTraceEntry>>> {
    let fail = |reason: String| Error::SnapshotRead { path: path.to_owned(), reason };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    // Our own iterative reader: serde-pickle recurses on nested values (a stack overflow on a
    // deeply nested file) and copies values on DUP and memo PUT (unbounded memory).
    let pickle =
        crate::pickle::parse(&bytes).map_err(|e| fail(format!("not a memory snapshot pickle: {e}")))?;
    device_traces(&pickle).map_err(|e| fail(format!("not a memory snapshot: {e}")))
}

/// What a replay of a snapshot's segment and block events found (see [`replay_segments`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentReplay {
    /// `alloc` entries replayed.
    pub blocks: usize,
    /// `segment_alloc` entries replayed.
    pub segments: usize,
    /// Most segments live at once (those reserved before the trace included).
    pub max_live_segments: usize,
    /// `oom` entries.
    pub ooms: usize,
}

/// Replays a snapshot's trace as tools that rebuild the allocator's state do: every block
/// allocated must lie inside a segment that exists at that moment and overlap no live block, a
/// segment is released only with no live block inside, and segments overlap nothing. Segments in
/// the snapshot's `segments` that the trace never reserves existed before it started.
///
/// # Errors
/// [`Error::SnapshotRead`] naming the file and the first entry that breaks the layout.
pub fn replay_segments(path: &Path) -> Result<SegmentReplay> {
    use std::collections::BTreeMap;
    let fail = |reason: String| Error::SnapshotRead { path: path.to_owned(), reason };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let p = crate::pickle::parse(&bytes).map_err(|e| fail(format!("not a memory snapshot pickle: {e}")))?;
    let uint = |node, key: &str| p.get(node, key).and_then(|v| p.int(v)).and_then(|v| u64::try_from(v).ok());
    let mut finals: Vec<(u64, u64)> = Vec::new();
    if let Some(segs) = p.get(p.root, "segments").and_then(|s| p.items(s)) {
        for &s in segs {
            if let (Some(a), Some(n)) = (uint(s, "address"), uint(s, "total_size")) {
                finals.push((a, a.saturating_add(n)));
            }
        }
    }
    let traces = p
        .get(p.root, "device_traces")
        .and_then(|t| p.items(t))
        .ok_or_else(|| fail("no `device_traces`".into()))?;
    let mut out = SegmentReplay::default();
    for (d, &trace) in traces.iter().enumerate() {
        let entries = p.items(trace).ok_or_else(|| fail(format!("device_traces[{d}] is not a list")))?;
        let mut read = Vec::with_capacity(entries.len());
        for (i, &e) in entries.iter().enumerate() {
            let action = p.get(e, "action").and_then(|a| p.text(a)).unwrap_or("");
            read.push((i, action, uint(e, "addr").unwrap_or(0), uint(e, "size").unwrap_or(0)));
        }
        let reserved: std::collections::HashSet<u64> =
            read.iter().filter(|r| r.1 == "segment_alloc").map(|r| r.2).collect();
        let mut segments: BTreeMap<u64, u64> =
            finals.iter().filter(|(a, _)| !reserved.contains(a)).map(|&(a, e)| (a, e)).collect();
        let mut blocks: BTreeMap<u64, u64> = BTreeMap::new();
        let holder = |segments: &BTreeMap<u64, u64>, lo: u64, hi: u64| {
            segments.range(..=lo).next_back().filter(|(_, &end)| end >= hi).map(|(&a, &e)| (a, e))
        };
        for (i, action, addr, size) in read {
            let at = |what: String| fail(format!("device_traces[{d}][{i}]: {what}"));
            let end = addr.saturating_add(size);
            match action {
                "alloc" => {
                    if holder(&segments, addr, end).is_none() {
                        return Err(at(format!("block {addr:#x} of {size} bytes lies in no live segment")));
                    }
                    let before = blocks.range(..=addr).next_back().is_some_and(|(_, &e)| e > addr);
                    let after = blocks.range(addr..).next().is_some_and(|(&a, _)| a < end);
                    if before || after {
                        return Err(at(format!("block {addr:#x} of {size} bytes overlaps a live block")));
                    }
                    blocks.insert(addr, end);
                    out.blocks += 1;
                }
                "free_completed"
                    if blocks.remove(&addr).is_none() && holder(&segments, addr, end).is_none() =>
                {
                    return Err(at(format!("freed block {addr:#x} lies in no live segment")));
                }
                "segment_alloc" => {
                    let before = segments.range(..=addr).next_back().is_some_and(|(_, &e)| e > addr);
                    let after = segments.range(addr..).next().is_some_and(|(&a, _)| a < end);
                    if before || after {
                        return Err(at(format!("segment {addr:#x} of {size} bytes overlaps a live segment")));
                    }
                    segments.insert(addr, end);
                    out.segments += 1;
                    out.max_live_segments = out.max_live_segments.max(segments.len());
                }
                "segment_free" => {
                    let Some((a, e)) = holder(&segments, addr, end) else {
                        return Err(at(format!("released segment {addr:#x} of {size} bytes is not live")));
                    };
                    if blocks.range(addr..end).next().is_some() {
                        return Err(at(format!("segment {addr:#x} released with live blocks inside")));
                    }
                    // A partial release (an expandable segment unmapping a range) keeps the rest.
                    segments.remove(&a);
                    if a < addr {
                        segments.insert(a, addr);
                    }
                    if end < e {
                        segments.insert(end, e);
                    }
                }
                "oom" => out.ooms += 1,
                _ => {}
            }
        }
        out.max_live_segments = out.max_live_segments.max(segments.len());
    }
    Ok(out)
}
