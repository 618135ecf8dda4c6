//! Helpers of the tracker's integration tests; what every package's tests share is
//! `gpu-mem-track-testkit`'s, re-exported here.
#![allow(dead_code)]
use std::path::Path;

#[allow(unused_imports)] // each test file uses some of them
pub use gpu_mem_track_testkit::*;

use gpu_mem_track::{MemTracker, TrackedDevice};

/// A CPU tracker logging into `dir`.
pub fn cpu_tracker(dir: &Path) -> MemTracker {
    MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir).build().expect("CPU tracker")
}

/// The raw text of each block of a log: (group lines, `At` line).
pub fn raw_blocks(path: &Path) -> Vec<(Vec<String>, String)> {
    let text = std::fs::read_to_string(path).expect("log readable");
    let mut out = Vec::new();
    let mut pending = Vec::new();
    for line in text.lines().skip(1) {
        if line.starts_with("+ |") || line.starts_with("- |") {
            pending.push(line.to_owned());
        } else if line.starts_with("At ") {
            out.push((std::mem::take(&mut pending), line.to_owned()));
        } else {
            assert!(line.is_empty(), "unexpected line {line:?}");
        }
    }
    assert!(pending.is_empty(), "group lines after the last At line");
    out
}

/// The group lines of the last block.
pub fn last_group_lines(tracker: &MemTracker) -> Vec<String> {
    raw_blocks(tracker.log_path()).pop().expect("a block").0
}

/// A group line as the log must print it.
pub fn line(sign: char, n: u64, shape: &str, mem: &str, class: &str, dtype: &str) -> String {
    format!("{sign} | {n} * Size:{shape:<20} | Memory: {mem} M | {class:<20} | {dtype}")
}

pub const TENSOR: &str = "<class 'torch.Tensor'>";
pub const PARAM: &str = "<class 'torch.nn.parameter.Parameter'>";
