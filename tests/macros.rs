//! `track!()` and `#[track_memory]` record file, line and the enclosing function.
mod common;

use std::sync::LazyLock;

use common::cpu_tracker;
use gpu_mem_track::log::{parse_log_file, SourceLocation};
use gpu_mem_track::{track, track_memory, MemTracker};
use tch::{Device, Kind, Tensor};

static TRACKER: LazyLock<MemTracker> = LazyLock::new(|| {
    let dir: &'static tempfile::TempDir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    cpu_tracker(dir.path())
});

fn locations() -> Vec<SourceLocation> {
    parse_log_file(TRACKER.log_path()).unwrap().blocks.into_iter().map(|b| b.at.location).collect()
}

fn loc(line: u32, function: &str) -> SourceLocation {
    SourceLocation { file: "tests/macros.rs".into(), line, function: function.into() }
}

const STEP_ATTR_LINE: u32 = line!() + 1;
#[track_memory(tracker = TRACKER)]
fn step(fail: bool) -> Result<Tensor, String> {
    let x = Tensor::zeros([32, 32], (Kind::Float, Device::Cpu));
    if fail {
        return Err("early exit".into());
    }
    Ok(x)
}
const STEP_END_LINE: u32 = line!() - 1;

struct Net;
impl Net {
    #[track_memory(tracker = TRACKER)]
    fn forward(&self) -> usize {
        7
    }
}

#[test]
fn track_memory_tracks_entry_and_every_exit() {
    let x = step(false).unwrap();
    assert!(step(true).is_err());
    let _ = Net.forward();
    let entry = loc(STEP_ATTR_LINE + 1, "step (enter)");
    let exit = loc(STEP_END_LINE, "step (exit)");
    let got = locations();
    assert_eq!(got[..4], [entry.clone(), exit.clone(), entry, exit]);
    assert_eq!(got[4].function, "Net::forward (enter)");
    assert_eq!(got[5].function, "Net::forward (exit)");
    assert_eq!(got[5].line, got[4].line + 2);

    // Entry of the first call saw nothing; its exit saw the returned tensor.
    let log = parse_log_file(TRACKER.log_path()).unwrap();
    assert!(log.blocks[0].changes.is_empty());
    assert_eq!(log.blocks[1].changes.len(), 1);
    assert_eq!(log.blocks[1].changes[0].shape, vec![32, 32]);
    drop(x);
}

#[test]
fn track_macro_and_method_name_the_enclosing_function() {
    let line = line!() + 1;
    track!(TRACKER).unwrap();
    let closure = || track!(TRACKER).unwrap();
    closure();
    let method_line = line!() + 1;
    TRACKER.track().unwrap();
    let got = locations();
    assert_eq!(got[0], loc(line, "track_macro_and_method_name_the_enclosing_function"));
    assert_eq!(got[1].function, "track_macro_and_method_name_the_enclosing_function::{{closure}}");
    assert_eq!(got[2], loc(method_line, "track_macro_and_method_name_the_enclosing_function"));
}

#[test]
fn default_tracker_is_used_without_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let mine = cpu_tracker(dir.path());
    let path = mine.log_path().to_owned();
    gpu_mem_track::set_default_tracker(mine).unwrap();
    let line = line!() + 1;
    let p = track!().expect("default tracker works");
    assert_eq!(p.site.line, line);
    let log = parse_log_file(&path).unwrap();
    assert_eq!(log.blocks[0].at.location, loc(line, "default_tracker_is_used_without_arguments"));
    // A second default cannot replace the first.
    assert!(gpu_mem_track::set_default_tracker(cpu_tracker(dir.path())).is_err());
}
