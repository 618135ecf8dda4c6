//! A [`Trace`] as a PyTorch memory snapshot, laid out by the caching allocator model: what
//! `MemTracker::dump_snapshot`, `estimate --snapshot` and `timeline -o X.pickle` write, for
//! `torch.cuda._memory_viz` and other snapshot readers.
use std::collections::HashMap;
use std::path::Path;

use gpu_mem_track_log::memviz::{self, Block, Frame, MemorySnapshot, Segment, TraceEntry};
use gpu_mem_track_log::{Result, Trace};

use crate::caching_allocator::{BlockId, CachingAllocatorModel};

/// Writes `trace` as a PyTorch memory snapshot, laid out by the CUDA caching allocator
/// model: `segment_alloc` when the model reserves a segment, `alloc` / `free_requested` /
/// `free_completed` with block addresses and the bytes asked for (as PyTorch records them), and
/// the segments left at the end with their blocks.
/// Each entry carries its `category`.
///
/// # Errors
/// [`Error::SnapshotWrite`](gpu_mem_track_log::Error::SnapshotWrite) naming the file.
pub fn dump_snapshot(trace: &Trace, path: &Path) -> Result<()> {
    let mut model = CachingAllocatorModel::new();
    let mut blocks: HashMap<i64, BlockId> = HashMap::new();
    let mut entries = Vec::new();
    // The op, then the call the program made when that is another (an `aten::empty_strided`
    // inside `aten::conv2d`), innermost first as memory_viz reads stacks; labelled with the
    // phase.
    let frames: Vec<Vec<Frame>> = trace
        .events
        .iter()
        .map(|e| {
            let filename = format!("{} (iteration {})", e.phase, e.iteration);
            let mut stack = vec![Frame { filename: filename.clone(), line: 0, name: e.op.clone() }];
            if !e.top_op.is_empty() && e.top_op != e.op {
                stack.push(Frame { filename, line: 0, name: e.top_op.clone() });
            }
            stack
        })
        .collect();
    for (t, e) in trace.events.iter().enumerate() {
        let entry = |action, addr, size| TraceEntry {
            action,
            addr,
            size,
            stream: 0,
            time_us: t as i64,
            frames: &frames[t],
            category: Some(e.category.name()),
            device_free: None,
        };
        if e.alloc {
            let before = model.segments();
            let Ok(b) = model.malloc(e.size) else { continue };
            for (addr, size, _) in model.segments().into_iter().filter(|s| !before.contains(s)) {
                entries.push(entry("segment_alloc", addr, size));
            }
            // A 0-byte allocation takes no block, as on a GPU: nothing to draw.
            let Some((addr, _)) = model.block(b) else { continue };
            blocks.insert(e.id, b);
            // The bytes asked for, as PyTorch's trace records them (the block's size is in
            // `segments`): a history re-read and laid out again gets the same blocks.
            entries.push(entry("alloc", addr, e.size));
        } else if let Some(b) = blocks.remove(&e.id) {
            let (addr, _) = model.block(b).expect("live block");
            model.free(b);
            entries.push(entry("free_requested", addr, e.size));
            entries.push(entry("free_completed", addr, e.size));
        }
    }
    let segments = model
        .segment_blocks()
        .into_iter()
        .map(|s| {
            let allocated: u64 = s.blocks.iter().filter(|b| b.allocated).map(|b| b.size).sum();
            let blocks = s
                .blocks
                .iter()
                .map(|b| Block {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.allocated { "active_allocated" } else { "inactive" },
                    frames: &[],
                })
                .collect();
            Segment::new(s.address, s.size, allocated, s.small, blocks)
        })
        .collect();
    memviz::write(path, MemorySnapshot { segments, device_traces: vec![entries] })
}
