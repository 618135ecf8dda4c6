//! Regressions of `report` (issue 11): quadratic leak check, whole-file reading, wrapping
//! arithmetic, unbounded output, growth worded as if it were a leak.
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use gpu_mem_track_log::log::{parse_log, parse_log_lenient};
use gpu_mem_track_log::report::{
    analyse, analyse_file, analyse_reader, combine, render_text, Dialect, LogReport,
};
use gpu_mem_track_log::Error;

const FIXTURE: &str = include_str!("../../tests/fixtures/pytorch_memory_utils.txt");
const HEADER: &str = "GPU Memory Track | 01-Jan-24-00:00:00 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n\n";

fn at(line: u32, mib: f64) -> String {
    format!(
        "\nAt {:<50} Total Tensor Used Memory:{mib:<7.1}Mb Total Allocated Memory:{mib:<7.1}Mb Peak Allocated Memory:{mib:<7.1}Mb\n\n",
        format!("train.rs line {line}: step")
    )
}

/// Python-tool counts (absolute) of one group at one repeated line.
fn python_counts(shape: &str, counts: &[u64]) -> String {
    let mut s = HEADER.to_owned();
    let mut prev = 0;
    for (i, &n) in counts.iter().enumerate() {
        if n != prev {
            s += &format!(
                "+ | {n} * Size:{shape} | Memory: 0.0039 M | <class 'torch.Tensor'> | torch.float32\n"
            );
            if prev > 0 {
                s += &format!("- | {prev} * Size:{shape} | Memory: 0.0039 M | <class 'torch.Tensor'> | torch.float32 \n");
            }
        }
        s += &format!(
            "\nAt train.py line 20: train                           Total Tensor Used Memory:{:<7.1}Mb Total Allocated Memory:{:<7.1}Mb\n\n",
            i as f64, i as f64
        );
        prev = n;
    }
    s
}

fn report_of(text: &str) -> LogReport {
    let (log, errors) = parse_log_lenient(text);
    let r = analyse(Path::new("x.txt"), &log.unwrap(), errors.iter().map(|e| e.to_string()).collect(), 10);
    let streamed = analyse_reader(Path::new("x.txt"), text.as_bytes(), 10).unwrap();
    assert_eq!(streamed, r, "streaming and whole-log analyses agree");
    r
}

#[test]
fn twenty_thousand_distinct_groups_are_not_quadratic() {
    // Each point adds one new shape. The old check pushed a count for every group ever seen at
    // every point: 20 000 points took 377 s and 4.4 GB (release).
    let mut text = HEADER.to_owned();
    for i in 0..20_000u32 {
        text += &format!(
            "+ | 1 * Size:({}, 3) | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32\n",
            i + 1
        );
        text += &at(20, f64::from(i) / 100.0);
    }
    let start = Instant::now();
    let r = analyse_reader(Path::new("x.txt"), text.as_bytes(), 10).unwrap();
    let took = start.elapsed();
    assert_eq!(r.points, 20_000);
    assert!(r.leak_suspects.is_empty(), "every group rises once only");
    // Well under a second in release, a few in a debug build. The quadratic check took 377 s in
    // release: a bound that far above the linear time fails on it, never on a loaded machine.
    assert!(took < Duration::from_secs(90), "took {took:?}");
}

#[test]
fn analyse_file_streams_and_names_the_file_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("20240101-cuda0-rank2-gpu_mem_track.txt");
    std::fs::write(&log, FIXTURE.replace('\n', "\r\n")).unwrap();
    let r = analyse_file(&log, 10).unwrap();
    let whole = analyse(&log, &parse_log(FIXTURE).unwrap(), vec![], 10);
    assert_eq!(r, whole);
    assert_eq!((r.dialect, r.points, r.rank), (Dialect::PytorchMemoryUtils, 4, Some(2)));

    let missing = dir.path().join("missing.txt");
    let e = analyse_file(&missing, 10).unwrap_err();
    assert!(matches!(&e, Error::LogRead { path, .. } if path == &missing), "{e}");
    assert!(e.to_string().contains("missing.txt"), "{e}");
    let e = analyse_file(dir.path(), 10).unwrap_err();
    assert!(matches!(e, Error::LogRead { .. }), "a directory: {e}");

    for (name, bytes) in
        [("empty.txt", &b""[..]), ("junk.txt", b"hello\nworld\n"), ("bin.txt", b"\x7fELF\0\0\xff")]
    {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = analyse_file(&p, 10).unwrap_err();
        assert!(matches!(e, Error::LogParse(_)), "{name}: {e}");
        assert!(e.to_string().starts_with(&format!("{}:line 1: ", p.display())), "{e}");
    }
}

#[test]
fn huge_counts_and_shapes_say_overflow_instead_of_wrapping() {
    // Old code: 4096 * (u64::MAX - 1) wrapped to a tiny figure in release and panicked in debug.
    let r = report_of(&python_counts("(1024,)", &[1, 2, u64::MAX]));
    assert_eq!(r.leak_suspects.len(), 1);
    let s = &r.leak_suspects[0];
    assert!(s.overflow && s.grown_bytes == Some(u64::MAX), "{s:?}");
    assert_eq!((s.first, s.last, s.visits), (1, u64::MAX, 3));
    let text = render_text(&combine(vec![r]));
    assert!(text.contains("overflow"), "{text}");
    assert!(!text.contains("+0.0000 MiB"), "{text}");

    // A shape whose element count does not fit in 64 bits.
    let r = report_of(&python_counts("(4294967296, 4294967296, 16)", &[1, 2, 3]));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.leak_suspects.len(), 1, "{r:#?}");
    assert!(r.leak_suspects[0].overflow, "{:?}", r.leak_suspects);
    assert!(render_text(&combine(vec![r])).contains("overflow"));

    // Our deltas: 2 then `+ u64::MAX` saturates rather than wrapping to 1 (a fall, which hid the
    // suspect) or panicking.
    let mut text = HEADER.to_owned();
    for n in [1, 1, u64::MAX, 1] {
        text += &format!("+ | {n} * Size:(2,) | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32\n");
        text += &at(7, 1.0);
    }
    let r = report_of(&text);
    assert_eq!(r.dialect, Dialect::GpuMemTrack);
    let s = &r.leak_suspects[0];
    assert!(s.overflow && s.last == u64::MAX, "{s:?}");
}

#[test]
fn skipped_lines_are_summarised() {
    let mut text = FIXTURE.to_owned();
    for i in 0..100_000 {
        text += &format!("junk {i} {}\n", "é".repeat(300));
    }
    let r = report_of(&text);
    assert_eq!((r.errors.len(), r.errors_total), (5, 100_000));
    let out = render_text(&combine(vec![r.clone()]));
    assert!(out.contains("... and 99995 more skipped lines"), "{out}");
    assert!(out.len() < 10_000, "{} bytes", out.len());
    assert!(out.lines().all(|l| l.chars().count() < 400), "{out}");
    assert!(serde_json::to_string(&r).unwrap().len() < 10_000);
}

#[test]
fn leak_suspects_are_a_bounded_summary() {
    // 5000 visits of a line where one group rises every time: the old report printed all 5000
    // counts on one line.
    let mut text = HEADER.to_owned();
    for g in 0..50 {
        text += &format!("+ | 1 * Size:({g},) | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32\n");
    }
    for i in 0..5000 {
        for g in 0..50 {
            text +=
                &format!("+ | 1 * Size:({g},) | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32\n");
        }
        text += &at(9, f64::from(i));
    }
    let r = report_of(&text);
    assert_eq!((r.leak_suspects.len(), r.leak_suspects_total), (10, 50));
    let s = &r.leak_suspects[0];
    assert_eq!(s.counts, vec![2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!((s.visits, s.first, s.min, s.max, s.last, s.rises), (5000, 2, 2, 5001, 5001, 4999));
    let out = render_text(&combine(vec![r]));
    assert!(out.contains("2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 8 -> 9 -> ... -> 5001 (5000 visits"), "{out}");
    assert!(out.contains("... and 40 more leak suspects"), "{out}");
    assert!(out.len() < 10_000, "{} bytes", out.len());
}

#[test]
fn freed_activations_are_not_worded_as_growth() {
    // Per step: forward allocates 26.3 MiB of activations, backward frees them. The old report
    // said "largest growth ... (total 789.0 MiB over 30 visits)".
    let mut text = HEADER.to_owned() + &at(10, 4.0);
    for step in 0..30 {
        text += "+ | 1 * Size:(1024, 6733) | Memory: 26.3 M | <class 'torch.Tensor'> | torch.float32\n";
        text += &at(39, 30.3);
        text += "- | 1 * Size:(1024, 6733) | Memory: 26.3 M | <class 'torch.Tensor'> | torch.float32\n";
        text += &at(44, 4.0 + f64::from(step) * 0.0);
    }
    let r = report_of(&text);
    let out = render_text(&combine(vec![r.clone()]));
    assert!(
        out.contains("allocates up to 26.3 MiB per visit (30 visits, 789.0 MiB allocated in all); freed again later (the level here stays at 30.3 MiB)"),
        "{out}"
    );
    assert!(
        out.contains("net growth of Total Allocated Memory over the run (memory that stays): +0.0 MiB"),
        "{out}"
    );
    assert!(!out.contains("largest growth"), "{out}");
    assert!(r.leak_suspects.is_empty());

    // A real leak: the level at the line climbs.
    let mut text = HEADER.to_owned();
    for step in 0..4 {
        text += "+ | 1 * Size:(1024, 256) | Memory: 1.0 M | <class 'torch.Tensor'> | torch.float32\n";
        text += &at(39, 1.0 + f64::from(step));
    }
    let out = render_text(&combine(vec![report_of(&text)]));
    assert!(
        out.contains("the level here grows +2.0 MiB from the first visit to the last (2.0 -> 4.0 MiB)"),
        "{out}"
    );
    assert!(
        out.contains("net growth of Total Allocated Memory over the run (memory that stays): +3.0 MiB"),
        "{out}"
    );
}

#[test]
fn report_file_of_a_large_repeated_log_keeps_memory_flat() {
    // Not a measurement (see the bench and README), just that a multi-megabyte log streams
    // through analyse_file and its report stays small.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.txt");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    f.write_all(FIXTURE.as_bytes()).unwrap();
    let body = &FIXTURE[FIXTURE.find("\n\n").unwrap() + 2..];
    for _ in 0..5000 {
        f.write_all(body.as_bytes()).unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let r = analyse_file(&path, 10).unwrap();
    assert_eq!(r.points, 4 * 5001);
    let out = render_text(&combine(vec![r]));
    assert!(out.len() < 20_000, "{} bytes", out.len());
}

#[test]
fn python_fixture_report_is_unchanged() {
    // What /work/main/tests/report.rs checks through the main crate, here without libtorch.
    let r = report_of(FIXTURE);
    assert_eq!(r.dialect, Dialect::PytorchMemoryUtils);
    let peak = r.peak.clone().unwrap();
    assert_eq!((peak.mib, peak.at.as_str(), peak.log_line), (316.4, "main.py line 14: <module>", 19));
    let growth: Vec<(&str, f64)> = r.growth.iter().map(|g| (g.at.as_str(), g.max_mib)).collect();
    assert_eq!(growth.len(), 2);
    assert_eq!(growth[0].0, "main.py line 14: <module>");
    assert!((growth[0].1 - 240.0).abs() < 1e-9);
    assert!(r.leak_suspects.is_empty());
    let r = report_of(&python_counts("(1024,)", &[1, 2, 3, 4]));
    let s = &r.leak_suspects[0];
    assert_eq!((s.counts.clone(), s.grown_bytes), (vec![1, 2, 3, 4], Some(3 * 1024 * 4)));
    assert!(render_text(&combine(vec![r])).contains("1 -> 2 -> 3 -> 4 (4 visits"));
}

/// The Python tool's way of printing a growing group (the new count with `+`, the old with `-`)
/// reads as absolute counts: a group that grows every visit is a leak suspect, a steady one not.
#[test]
fn python_log_growing_group_is_a_leak_suspect() {
    let r = report_of(&python_counts("(1024,)", &[1, 2, 3, 4]));
    assert_eq!(r.leak_suspects.len(), 1);
    let s = &r.leak_suspects[0];
    assert_eq!(s.counts, vec![1, 2, 3, 4]);
    assert_eq!(s.at, "train.py line 20: train");
    assert_eq!(s.group, "Size:(1024,) torch.float32 <class 'torch.Tensor'>");
    assert_eq!(s.grown_bytes, Some(3 * 1024 * 4));
    assert!(report_of(&python_counts("(1024,)", &[2, 2, 2, 2])).leak_suspects.is_empty());
}
