//! `report` on hand-written Python-format logs and on our own logs: peak line, growth ranking and
//! leak suspects (a growing Vec of tensors is flagged, a steady loop is not).
mod common;

use std::path::Path;

use common::cpu_tracker;
use gpu_mem_track::log::{parse_log_file, parse_log_lenient};
use gpu_mem_track::report::{analyse, combine, render_text, Dialect};
use gpu_mem_track::{track, MemTracker, TrackedDevice};
use tch::{Device, Kind, Tensor};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pytorch_memory_utils.txt");

#[test]
fn python_log_peak_and_growth() {
    let log = parse_log_file(FIXTURE).unwrap();
    let r = analyse(Path::new(FIXTURE), &log, vec![], 10);
    assert_eq!(r.dialect, Dialect::PytorchMemoryUtils);
    assert_eq!(r.main_field.as_deref(), Some("Total Allocated Memory"));
    let peak = r.peak.unwrap();
    assert_eq!((peak.mib, peak.at.as_str(), peak.log_line), (316.4, "main.py line 14: <module>", 19));
    let growth: Vec<(&str, f64)> = r.growth.iter().map(|g| (g.at.as_str(), g.max_mib)).collect();
    assert_eq!(growth.len(), 2);
    assert_eq!(growth[0].0, "main.py line 14: <module>");
    assert!((growth[0].1 - 240.0).abs() < 1e-9);
    assert_eq!(growth[1].0, "main.py line 12: <module>");
    assert!(r.leak_suspects.is_empty());
}

fn loop_log(leak: bool) -> (MemTracker, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    let mut kept = Vec::new();
    for step in 0..6 {
        let activation = Tensor::ones([512], (Kind::Float, Device::Cpu)) * step as f64;
        let loss = activation.sum(Kind::Float);
        if leak {
            kept.push(loss); // the classic: keeping the loss tensor (and its graph) every step
        }
        track!(t);
    }
    (t, dir)
}

#[test]
fn our_log_flags_a_vec_that_grows_every_step() {
    let (t, _dir) = loop_log(true);
    let log = parse_log_file(t.log_path()).unwrap();
    let r = analyse(t.log_path(), &log, vec![], 10);
    assert_eq!(r.dialect, Dialect::GpuMemTrack);
    let sums: Vec<_> =
        r.leak_suspects.iter().filter(|s| s.group.starts_with("Size:() torch.float32")).collect();
    assert_eq!(sums.len(), 1, "{:#?}", r.leak_suspects);
    assert_eq!(sums[0].counts, vec![1, 2, 3, 4, 5, 6]);
    assert!(sums[0].at.starts_with("tests/report.rs line "));
    assert!(render_text(&combine(vec![r])).contains("1 -> 2 -> 3 -> 4 -> 5 -> 6"));
}

#[test]
fn our_log_of_a_steady_loop_has_no_suspects() {
    let (t, _dir) = loop_log(false);
    let log = parse_log_file(t.log_path()).unwrap();
    let r = analyse(t.log_path(), &log, vec![], 10);
    assert!(r.leak_suspects.is_empty(), "{:#?}", r.leak_suspects);
    assert_eq!(r.points, 6);
}

#[test]
fn ranks_and_devices_come_from_file_names_and_logs_combine() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("RANK", "3");
    let ranked = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir.path()).build().unwrap();
    std::env::remove_var("RANK");
    let plain = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir.path()).build().unwrap();
    let name = ranked.log_path().file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-cpu-rank3-gpu_mem_track.txt"), "{name}");
    let x = Tensor::zeros([1024, 1024], (Kind::Float, Device::Cpu));
    track!(ranked);
    drop(x);
    track!(plain);
    let reports: Vec<_> = [ranked.log_path(), plain.log_path()]
        .iter()
        .map(|p| analyse(p, &parse_log_file(p).unwrap(), vec![], 5))
        .collect();
    assert_eq!((reports[0].rank, reports[0].device.as_deref()), (Some(3), Some("cpu")));
    assert_eq!((reports[1].rank, reports[1].device.as_deref()), (None, Some("cpu")));
    let c = combine(reports);
    assert_eq!(c.highest.as_deref(), Some(&*ranked.log_path().display().to_string()));
    assert!(c.sum_of_peaks_mib >= 4.0);
    assert!(render_text(&c).contains("combined (2 logs)"));
}

#[test]
fn truncated_log_gives_a_partial_report_naming_the_bad_line() {
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    let cut = &text[..text.find("- | 2 * Size").unwrap() + 30];
    let (log, errors) = parse_log_lenient(cut);
    let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let r = analyse(Path::new("cut.txt"), &log.unwrap(), errors, 10);
    assert_eq!(r.points, 3);
    assert_eq!(r.errors.len(), 1);
    assert!(r.errors[0].starts_with("line 21:"), "{:?}", r.errors);
    assert!(render_text(&combine(vec![r])).contains("skipped: line 21"));
}
