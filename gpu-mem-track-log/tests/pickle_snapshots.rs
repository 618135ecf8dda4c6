//! Reading memory-snapshot pickles: damaged, hostile and deeply nested files give errors that
//! name the file, never a panic, an abort (stack overflow) or a huge allocation.
use std::path::Path;

use gpu_mem_track_log::memviz::{write, MemorySnapshot, TraceEntry};
use gpu_mem_track_log::trace::read_snapshot_trace;
use proptest::prelude::*;

fn entry(action: &'static str, addr: u64, size: u64, time_us: i64) -> TraceEntry<'static> {
    TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        time_us,
        frames: &[],
        category: Some("activation"),
        device_free: None,
    }
}

/// A real pickle as this crate writes it: `n` allocations, half of them freed.
fn real_pickle(dir: &Path, n: u64, size: u64) -> Vec<u8> {
    let mut trace = Vec::new();
    for i in 0..n {
        trace.push(entry("alloc", 0x1000 * (i + 1), size, i as i64));
        if i % 2 == 1 {
            trace.push(entry("free_completed", 0x1000 * (i + 1), size, i as i64));
        }
    }
    let path = dir.join("real.pickle");
    write(&path, MemorySnapshot { segments: Vec::new(), device_traces: vec![trace] }).unwrap();
    std::fs::read(&path).unwrap()
}

/// Reads `bytes` as a snapshot file; the error text when it fails.
fn read(dir: &Path, bytes: &[u8]) -> Result<gpu_mem_track_log::Trace, String> {
    let path = dir.join("input.pickle");
    std::fs::write(&path, bytes).unwrap();
    // The segment replay reads the same outside input: it may refuse it, never panic.
    let _ = gpu_mem_track_log::memviz::replay_segments(&path);
    read_snapshot_trace(&path).map_err(|e| {
        let text = e.to_string();
        assert!(text.contains("input.pickle"), "the error names the file: {text}");
        text
    })
}

#[test]
fn a_million_nested_lists_is_an_error_not_a_stack_overflow() {
    // The reproducer of the issue: `]` * N + `a` * (N - 1). serde-pickle aborted (SIGABRT).
    let n = 1_000_000;
    let mut p = b"\x80\x02".to_vec();
    p.extend(std::iter::repeat_n(b']', n));
    p.extend(std::iter::repeat_n(b'a', n - 1));
    p.push(b'.');
    let dir = tempfile::tempdir().unwrap();
    // On a thread with a small stack: any recursion over the nesting would overflow it.
    let e = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || read(dir.path(), &p).unwrap_err())
        .unwrap()
        .join()
        .unwrap();
    assert!(e.contains("device_traces"), "{e}");
}

#[test]
fn truncated_garbage_and_huge_lengths_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let real = real_pickle(dir.path(), 20, 512);
    assert_eq!(read(dir.path(), &real).unwrap().events.len(), 30);
    for len in 0..real.len() {
        let e = read(dir.path(), &real[..len]).unwrap_err();
        assert!(
            e.contains("cut short") || e.contains("underflow") || e.contains("device_traces"),
            "{len}: {e}"
        );
    }
    let e = read(dir.path(), b"hello, world").unwrap_err();
    assert!(e.contains("not a memory snapshot pickle"), "{e}");
    // BINUNICODE8 and BINBYTES8 declaring 2^62 and 2^64-1 bytes: refused, nothing allocated.
    for (op, len) in [(0x8d, 1u64 << 62), (0x8e, u64::MAX), (b'X', u32::MAX as u64)] {
        let mut p = vec![0x80, 4, op];
        p.extend(&len.to_le_bytes()[..if op == b'X' { 4 } else { 8 }]);
        p.push(b'.');
        let e = read(dir.path(), &p).unwrap_err();
        assert!(e.contains("cut short") && e.contains("declared"), "{e}");
    }
}

#[test]
fn four_huge_allocations_saturate_instead_of_wrapping_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.pickle");
    let trace = (1..=4).map(|i| entry("alloc", i, 1 << 62, i as i64)).collect();
    write(&path, MemorySnapshot { segments: Vec::new(), device_traces: vec![trace] }).unwrap();
    let trace = read_snapshot_trace(&path).unwrap();
    assert_eq!(trace.peak_bytes(), u64::MAX);
    assert_eq!(trace.timeline().last().unwrap().total, u64::MAX);
}

fn mutate(real: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut p = real.to_vec();
    for &(at, kind, byte) in edits {
        if p.is_empty() {
            break;
        }
        let at = at % p.len();
        match kind % 4 {
            0 => p[at] = byte,
            1 => p.insert(at, byte),
            2 => {
                p.remove(at);
            }
            _ => p[at] ^= 1 << (byte % 8),
        }
    }
    p
}

/// The replay catches what tools that rebuild the allocator's state trip on: blocks outside any
/// segment (a live CPU history before segments were written for it), and accepts the same trace
/// once each block has its segment.
#[test]
fn the_segment_replay_needs_every_block_inside_a_live_segment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("real.pickle");
    std::fs::write(&path, real_pickle(dir.path(), 4, 4096)).unwrap();
    let err = gpu_mem_track_log::memviz::replay_segments(&path).unwrap_err().to_string();
    assert!(err.contains("device_traces[0][0]: block 0x1000 of 4096 bytes lies in no live segment"), "{err}");

    let segmented = || {
        let mut trace = Vec::new();
        for i in 0..4u64 {
            let a = 0x1000 * (i + 1);
            trace.push(entry("segment_alloc", a, 4096, i as i64));
            trace.push(entry("alloc", a, 4096, i as i64));
            if i % 2 == 1 {
                trace.push(entry("free_completed", a, 4096, i as i64));
                trace.push(entry("segment_free", a, 4096, i as i64));
            }
        }
        trace
    };
    let mut trace = segmented();
    trace.push(entry("alloc", 0x1800, 16, 9)); // overlaps the live block at 0x1000
    write(&path, MemorySnapshot { segments: Vec::new(), device_traces: vec![trace] }).unwrap();
    let err = gpu_mem_track_log::memviz::replay_segments(&path).unwrap_err().to_string();
    assert!(err.contains("overlaps a live block"), "{err}");
    write(&path, MemorySnapshot { segments: Vec::new(), device_traces: vec![segmented()] }).unwrap();
    let r = gpu_mem_track_log::memviz::replay_segments(&path).unwrap();
    assert_eq!((r.blocks, r.segments, r.max_live_segments), (4, 4, 3));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(
        proto in any::<bool>(),
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut p = if proto { vec![0x80, 4] } else { Vec::new() };
        p.extend(body);
        let _ = read(dir.path(), &p);
    }

    #[test]
    fn mutated_real_pickles_never_panic(edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)) {
        let dir = tempfile::tempdir().unwrap();
        let real = real_pickle(dir.path(), 6, 1 << 20);
        let p = mutate(&real, &edits);
        if let Ok(trace) = read(dir.path(), &p) {
            // Whatever was read replays in bounded, saturating arithmetic.
            let _ = trace.peak_bytes();
            prop_assert!(trace.events.len() <= p.len());
        }
    }
}
