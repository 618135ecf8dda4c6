//! `plot` on hostile and long logs: no hang on infinite or absurd values, clear errors for
//! logs with nothing to draw, a bounded list of warnings however many lines are bad.
#![cfg(feature = "plot")]
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use gpu_mem_track_log::log::parse_log;
use gpu_mem_track_log::plot::{plot_log, plot_log_file, PlotError};
use proptest::prelude::*;

type Plotted = Result<Vec<String>, PlotError>;

const HEADER: &str = "GPU Memory Track | t | Total Tensor Used Memory:0.0 Mb\n\n";

fn at(i: usize, mib: &str) -> String {
    format!(
        "At a.rs line {}: f Total Tensor Used Memory:{mib} Mb Total Allocated Memory:{mib} Mb\n\n",
        i % 3 + 1
    )
}

/// Runs `f` on a thread and fails the test if it takes over a minute (the old code looped
/// forever on an infinite axis).
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("plot hung")
}

/// Plots `text` with [`plot_log_file`] and, when it parses strictly, with [`plot_log`].
fn plot_text(text: String, out: &str) -> (Plotted, Option<Plotted>, PathBuf) {
    let out = out.to_owned();
    within_a_minute(move || {
        let dir = tempfile::tempdir().unwrap().keep();
        let log = dir.join("log.txt");
        std::fs::write(&log, &text).unwrap();
        let a = plot_log_file(&log, "t", &dir.join(&out));
        let b =
            parse_log(&text).ok().map(|parsed| plot_log(&parsed, "t", &dir.join(format!("parsed-{out}"))));
        (a, b, dir)
    })
}

#[test]
fn infinite_and_absurd_values_are_refused_not_looped_on() {
    // The reproducer of the issue: 1.7e308 * 1.15 is infinite.
    let text = "GPU Memory Track | t | Total Tensor Used Memory:0.0 Mb\n\nAt a.rs line 1: f Total Tensor Used Memory:1.7e308 Mb\n\n";
    let (a, b, _) = plot_text(text.to_owned(), "x.png");
    for r in std::iter::once(a).chain(b) {
        let e = r.unwrap_err();
        assert!(matches!(e, PlotError::NothingToDraw(_)), "{e}");
        assert!(e.to_string().contains("out of range"), "{e}");
    }
    // With drawable values beside them: drawn, the others named in the warnings.
    let text = format!("{HEADER}{}{}{}{}", at(0, "5.0"), at(1, "inf"), at(2, "1.7e308"), at(3, "-3.0"));
    let (a, b, dir) = plot_text(text, "y.svg");
    for w in std::iter::once(a).chain(b).map(Result::unwrap) {
        // `inf` is not a number of the format: its line is skipped (by the stream reader).
        assert!(w.len() >= 4, "{w:?}");
        assert!(w.iter().all(|w| w.contains("out of range") || w.contains("\"inf\"")), "{w:?}");
        assert!(w.iter().any(|w| w.contains("1.7e308")) && w.iter().any(|w| w.contains("-3e0")), "{w:?}");
    }
    assert!(std::fs::metadata(dir.join("y.svg")).unwrap().len() > 1000);
}

#[test]
fn degenerate_ranges_draw() {
    for (name, text) in [
        ("single", format!("{HEADER}{}", at(0, "3.0"))),
        ("equal", format!("{HEADER}{}{}{}", at(0, "3.0"), at(1, "3.0"), at(2, "3.0"))),
        ("zeros", format!("{HEADER}{}{}", at(0, "0.0"), at(1, "0.0"))),
        ("tiny", format!("{HEADER}{}{}", at(0, "1e-300"), at(1, "2e-300"))),
        ("large", format!("{HEADER}{}{}", at(0, "1e11"), at(1, "9e11"))),
    ] {
        let (a, b, _) = plot_text(text, "d.png");
        assert!(a.is_ok() && b.is_none_or(|b| b.is_ok()), "{name}: {a:?}");
    }
    let (a, b, _) = plot_text(HEADER.to_owned(), "e.png");
    assert!(matches!(a, Err(PlotError::EmptyLog)), "{a:?}");
    assert!(b.is_none_or(|b| matches!(b, Err(PlotError::EmptyLog))));
}

#[test]
fn a_million_junk_lines_give_six_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("junk.txt");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&log).unwrap());
    write!(f, "{HEADER}{}{}", at(0, "1.0"), at(1, "2.0")).unwrap();
    for _ in 0..1_000_000 {
        f.write_all(b"junk\n").unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let w = plot_log_file(&log, "t", &dir.path().join("j.svg")).unwrap();
    assert_eq!(w.len(), 6, "{w:?}");
    assert!(w[0].contains("skipped") && w[0].contains("line"), "{w:?}");
    assert_eq!(w[5], "... and 999995 more");
}

#[test]
fn bad_outputs_and_missing_logs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = plot_log_file(Path::new("/nonexistent/log.txt"), "t", &dir.path().join("a.png")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/log.txt"), "{e}");
    let e = plot_log_file(Path::new("/nonexistent/log.txt"), "t", &dir.path().join("a.jpg")).unwrap_err();
    assert!(matches!(e, PlotError::UnsupportedFormat(_)), "{e}");
}

proptest! {
    // Plotting is slow in debug builds: few cases.
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_values_plot_or_fail_cleanly(
        values in proptest::collection::vec(prop_oneof![
            Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(f64::MAX), Just(1.7e308),
            Just(-0.0), Just(f64::MIN_POSITIVE), -1e3..1e3f64, any::<f64>(),
        ], 0..40),
        png in any::<bool>(),
    ) {
        let text = values.iter().enumerate().fold(HEADER.to_owned(), |s, (i, v)| s + &at(i, &format!("{v:e}")));
        let (a, _, _) = plot_text(text, if png { "p.png" } else { "p.svg" });
        match a {
            Ok(w) => prop_assert!(w.len() <= 6),
            Err(e) => prop_assert!(matches!(e, PlotError::EmptyLog | PlotError::NothingToDraw(_)), "{e}"),
        }
    }
}
