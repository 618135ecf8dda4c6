//! Out of memory: when the allocator of a tracked device refuses an allocation (CUDA's caching
//! allocator, or the wrapped CPU allocator past
//! `MemTrackerBuilder::cpu_memory_limit`), every tracker of that device
//! appends an out-of-memory block to its log (see `gpu_mem_track_log::log::oom`) and writes a
//! snapshot pickle beside it, on the failing thread, before the program gets its error.
//!
//! The report never allocates on the failing device (it reads the registry and the allocator's
//! counters, and writes host memory and files), an allocation refused inside it is not reported
//! again (the shim keeps a per-thread flag), and it waits at most [`STATE_WAIT`] for a tracker
//! busy on another thread rather than risk a deadlock.
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;

use parking_lot::Mutex;

use crate::device::DeviceKind;
use crate::device::TrackedDevice;
use crate::ffi::RegistryWalk;
use crate::ffi::{self, OomEvent};
use crate::history;
use crate::site::Site;
use crate::walk::{largest_holders, GroupKey, GroupTotals, Walk};
use gpu_mem_track_log::diff::{diff_groups, ViewLines};
use gpu_mem_track_log::log::oom::{OomReport, MAX_HOLDERS};
use gpu_mem_track_log::log::{GroupLine, LogWriter, SourceLocation};
use gpu_mem_track_log::memviz::{self, Block, MemorySnapshot, Segment, TraceEntry};
use rustc_hash::FxHashMap;

/// How long a report waits for a tracker that another thread is using.
pub(crate) const STATE_WAIT: Duration = Duration::from_secs(2);

/// What an out-of-memory report reads and updates in a tracker's state.
pub(crate) struct OomParts<'a> {
    pub(crate) raw: &'a mut RegistryWalk,
    /// The groups of the previous block (the block's `+`/`-` lines are the change from them).
    pub(crate) previous: &'a mut FxHashMap<GroupKey, GroupTotals>,
    pub(crate) writer: &'a mut LogWriter,
    pub(crate) last_site: Option<&'a Site>,
    /// Out-of-memory blocks written to this log so far.
    pub(crate) ooms: &'a mut u32,
}

/// A tracker's state, as the report sees it.
pub(crate) trait OomSink: Send {
    fn parts(&mut self) -> OomParts<'_>;
}

/// A tracker that wants out-of-memory blocks.
pub(crate) struct OomSubscriber {
    pub(crate) device: TrackedDevice,
    pub(crate) detail: bool,
    pub(crate) views: ViewLines,
    pub(crate) op_names: bool,
    pub(crate) log_path: PathBuf,
    pub(crate) state: Weak<Mutex<dyn OomSink>>,
}

static SUBSCRIBERS: Mutex<Vec<OomSubscriber>> = Mutex::new(Vec::new());

/// Makes a tracker's log receive out-of-memory blocks (until the tracker is dropped).
pub(crate) fn subscribe(w: OomSubscriber) {
    ffi::oom_set_handler(on_oom);
    let mut subscribers = SUBSCRIBERS.lock();
    subscribers.retain(|w| w.state.strong_count() > 0);
    subscribers.push(w);
}

fn matches(device: TrackedDevice, e: &OomEvent) -> bool {
    match (device, e.device) {
        (TrackedDevice::Cpu, DeviceKind::Cpu) => true,
        (TrackedDevice::Cuda(i), DeviceKind::Cuda) => e.device_index == Some(i),
        _ => false,
    }
}

fn on_oom(e: &OomEvent) {
    let targets: Vec<_> = SUBSCRIBERS
        .lock()
        .iter()
        .filter(|w| matches(w.device, e))
        .filter_map(|w| {
            Some((w.device, (w.detail, w.views), w.op_names, w.log_path.clone(), w.state.upgrade()?))
        })
        .collect();
    for (device, detail, op_names, log_path, state) in targets {
        let Some(mut state) = state.try_lock_for(STATE_WAIT) else {
            tracing::warn!(target: "gpu_mem_track", log = %log_path.display(), "out of memory not logged: the tracker stayed busy");
            continue;
        };
        if let Err(err) = write_report(state.parts(), device, detail, op_names, &log_path, e) {
            tracing::warn!(target: "gpu_mem_track", log = %log_path.display(), "out of memory not logged: {err}");
        }
    }
}

fn write_report(
    state: OomParts<'_>,
    device: TrackedDevice,
    (detail, views): (bool, ViewLines),
    op_names: bool,
    log_path: &Path,
    e: &OomEvent,
) -> crate::error::Result<()> {
    let (kind, index) = device.shim_filter();
    let (records, dims) = state.raw.take_categorized(kind, index)?;
    let snap = Walk::from_records(records, dims, detail, op_names);
    let (holders, others) = largest_holders(records, dims, MAX_HOLDERS);
    let (allocated, reserved) = match device {
        TrackedDevice::Cpu => (ffi::cpu_allocator_stats().current, None),
        TrackedDevice::Cuda(i) => {
            let s = ffi::cuda_stats(i, false)?;
            (s.allocated_current, Some(s.reserved_current))
        }
    };
    *state.ooms += 1;
    let snapshot_path = oom_snapshot_path(log_path, *state.ooms);
    let snapshot = write_snapshot(&snapshot_path, device, e)
        .map(|()| snapshot_path.display().to_string())
        .map_err(|err| err.to_string());
    let report = OomReport {
        device: device.to_string(),
        op: e.op.clone(),
        top_op: e.top_op.clone(),
        last_site: state.last_site.map(SourceLocation::from),
        requested: e.requested,
        tensor_used: snap.tensor_bytes,
        allocated,
        reserved,
        limit: (device == TrackedDevice::Cpu).then_some(e.device_total),
        device_total: (device != TrackedDevice::Cpu).then_some(e.device_total),
        device_free: Some(e.device_free),
        alloc_conf: std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok().filter(|v| !v.is_empty()),
        changes: if detail {
            diff_groups(state.previous, &snap.groups, views).iter().map(GroupLine::from_change).collect()
        } else {
            Vec::new()
        },
        holders,
        others,
        snapshot,
        earlier: *state.ooms - 1,
    };
    state.writer.append(&report.block())?;
    *state.previous = snap.groups;
    Ok(())
}

/// `<log stem>-oom-snapshot.pickle` beside the log (`-2`, `-3`, ... for later ones).
fn oom_snapshot_path(log_path: &Path, nth: u32) -> PathBuf {
    let name = log_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = name.strip_suffix("-gpu_mem_track.txt").or_else(|| name.strip_suffix(".txt")).unwrap_or(&name);
    let suffix = if nth > 1 { format!("-{nth}") } else { String::new() };
    log_path.with_file_name(format!("{stem}-oom-snapshot{suffix}.pickle"))
}

/// The snapshot at the failure: with a history recording this device, its trace (which ends with
/// the `oom` entry); without, the allocator's own state (CUDA: its segments and their blocks;
/// CPU: the live allocations, each its own segment) and the `oom` entry alone.
fn write_snapshot(path: &Path, device: TrackedDevice, e: &OomEvent) -> crate::error::Result<()> {
    if history::recording_device() == Some(device.shim_filter().0) {
        return history::read(false).dump_snapshot(path);
    }
    let oom = TraceEntry {
        action: "oom",
        addr: 0,
        size: e.requested,
        stream: 0,
        time_us: 0,
        frames: &[],
        category: None,
        device_free: Some(e.device_free),
    };
    let segments = match device {
        TrackedDevice::Cpu => ffi::cpu_allocator_live()
            .into_iter()
            .map(|(addr, size)| Segment::new(addr, size, size, false, vec![block(addr, size, size, true)]))
            .collect(),
        TrackedDevice::Cuda(i) => cuda_segments(&ffi::cuda_blocks(i)?),
    };
    Ok(memviz::write(path, MemorySnapshot { segments, device_traces: vec![vec![oom]] })?)
}

fn block(address: u64, size: u64, requested_size: u64, allocated: bool) -> Block<'static> {
    Block {
        address,
        size,
        requested_size,
        state: if allocated { "active_allocated" } else { "inactive" },
        frames: &[],
    }
}

/// The caching allocator's blocks (in address order, segment by segment) as snapshot segments.
fn cuda_segments(blocks: &[ffi::CudaBlock]) -> Vec<Segment<'static>> {
    let mut segments: Vec<Segment<'static>> = Vec::new();
    for b in blocks {
        let start_new = segments.last().is_none_or(|s| s.address != b.segment_address);
        if start_new {
            segments.push(Segment::new(b.segment_address, b.segment_size, 0, !b.is_large, Vec::new()));
        }
        let seg = segments.last_mut().expect("a segment was pushed");
        if b.allocated {
            seg.allocated_size += b.size;
            seg.active_size += b.size;
            seg.requested_size += b.requested_size;
        }
        seg.blocks.push(block(b.address, b.size, b.requested_size, b.allocated));
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_blocks_make_segments_with_their_allocated_bytes() {
        let b = |seg: u64, addr: u64, size: u64, allocated: bool| ffi::CudaBlock {
            segment_address: seg,
            segment_size: 20 << 20,
            address: addr,
            size,
            requested_size: size,
            allocated,
            is_large: true,
        };
        let segs = cuda_segments(&[
            b(0x1000_0000, 0x1000_0000, 8 << 20, true),
            b(0x1000_0000, 0x1080_0000, 12 << 20, false),
            b(0x4000_0000, 0x4000_0000, 20 << 20, true),
        ]);
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[0].allocated_size, segs[0].blocks.len()), (8 << 20, 2));
        assert_eq!(segs[0].blocks[1].state, "inactive");
        assert_eq!((segs[1].address, segs[1].allocated_size), (0x4000_0000, 20 << 20));
    }

    #[test]
    fn snapshots_sit_beside_the_log_and_count_up() {
        let log = Path::new("logs/25-Nov-26-10:00:00-cpu-gpu_mem_track.txt");
        assert_eq!(oom_snapshot_path(log, 1), Path::new("logs/25-Nov-26-10:00:00-cpu-oom-snapshot.pickle"));
        assert_eq!(oom_snapshot_path(log, 2), Path::new("logs/25-Nov-26-10:00:00-cpu-oom-snapshot-2.pickle"));
    }
}
