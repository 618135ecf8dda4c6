//! Eight threads calling `track!()` on one tracker leave only whole, well-formed blocks.
mod common;

use std::sync::Arc;

use common::{cpu_tracker, raw_blocks};
use gpu_mem_track::log::parse_log_file;
use gpu_mem_track::track;
use tch::{Device, Kind, Tensor};

#[test]
fn eight_threads_write_whole_blocks() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(cpu_tracker(dir.path()));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let mut keep = Vec::new();
                for r in 0..ROUNDS {
                    keep.push(Tensor::zeros([i as i64 + 1, r as i64 + 1], (Kind::Float, Device::Cpu)));
                    if r % 3 == 0 {
                        keep.clear();
                    }
                    track!(t).expect("track");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let text = std::fs::read_to_string(t.log_path()).unwrap();
    assert!(text.ends_with("\n\n"), "the file ends after a whole block");
    let log = parse_log_file(t.log_path()).expect("every line is well-formed");
    assert_eq!(log.blocks.len(), THREADS * ROUNDS);
    assert!(log.trailing_changes.is_empty());
    // Blocks are separated exactly as written: group lines, blank, At, blank.
    for (lines, at) in raw_blocks(t.log_path()) {
        assert!(at.starts_with("At tests/concurrency.rs line "), "{at}");
        assert!(lines.iter().all(|l| l.contains(" | Memory: ")));
    }
    // Net deltas add up: after everything is dropped, the sum of + minus - per group is zero.
    let mut net = std::collections::HashMap::<(Vec<i64>, String), i64>::new();
    for b in &log.blocks {
        for c in &b.changes {
            let n = if c.sign == gpu_mem_track::Sign::Plus { c.count as i64 } else { -(c.count as i64) };
            *net.entry((c.shape.clone(), c.dtype.clone())).or_default() += n;
        }
    }
    track!(t).unwrap();
    let last = parse_log_file(t.log_path()).unwrap().blocks.pop().unwrap();
    for c in &last.changes {
        let n = if c.sign == gpu_mem_track::Sign::Plus { c.count as i64 } else { -(c.count as i64) };
        *net.entry((c.shape.clone(), c.dtype.clone())).or_default() += n;
    }
    assert!(net.values().all(|&n| n == 0), "{net:?}");
}
