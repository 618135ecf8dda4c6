//! The lean command line, `gpu-mem-track`: exit codes (0 ok, 1 error, 2 usage), one-line errors
//! naming the file or option, `report`, `plot` (a valid SVG and PNG), `watch` without NVML, that it
//! links no libtorch, and how it hands `estimate`/`fit`/`timeline MODEL` to
//! `gpu-mem-track-estimate` (beside it, else on `PATH`, else a hint on how to install it).
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_mem_track_testkit::cli_output::{one_line_error, stderr};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-mem-track");
/// A Pytorch-Memory-Utils log; the workspace's shared test data.
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/pytorch_memory_utils.txt");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

#[test]
fn report_prints_the_peak_and_json() {
    let o = run(&["report", FIXTURE]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("peak Total Allocated Memory: 316.4 MiB at main.py line 14: <module>"), "{text}");
    let o = run(&["report", "--json", FIXTURE, FIXTURE]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["logs"].as_array().unwrap().len(), 2);
    assert_eq!(v["logs"][0]["peak"]["mib"], 316.4);
    assert_eq!(v["logs"][0]["dialect"], "pytorch_memory_utils");
    assert_eq!(v["sum_of_peaks_mib"], 632.8);
}

#[test]
fn bad_inputs_are_one_line_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.txt");
    one_line_error(&run(&["report", missing.to_str().unwrap()]), "missing.txt");
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, [0u8, 159, 146, 150, 255, 0, 1, 2, 3]).unwrap();
    one_line_error(&run(&["report", garbage.to_str().unwrap()]), "garbage.bin");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    one_line_error(&run(&["report", empty.to_str().unwrap()]), "empty file");
    one_line_error(
        &run(&["plot", FIXTURE, "-o", dir.path().join("x.jpg").to_str().unwrap()]),
        ".svg or .png",
    );
}

#[test]
fn usage_errors_exit_2_and_every_subcommand_has_help() {
    assert_eq!(run(&["report"]).status.code(), Some(2));
    assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(run(&["watch", "--interval", "fast"]).status.code(), Some(2));
    assert_eq!(run(&["watch", "--pid", "1", "--all"]).status.code(), Some(2));
    for sub in ["report", "plot", "watch", "completions"] {
        let o = run(&[sub, "--help"]);
        assert!(o.status.success());
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(help.contains("Usage: gpu-mem-track"), "{help}");
        assert!(help.contains("-q, --quiet") && help.contains("-v, --verbose"), "{sub}: {help}");
        // A subcommand that prints figures can print them as JSON; the others write files.
        assert_eq!(help.contains("--json"), sub == "report", "{sub}: {help}");
    }
}

#[test]
fn plot_writes_a_valid_svg_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("mem.svg");
    let o = run(&["plot", FIXTURE, "-o", svg.to_str().unwrap(), "--title", "fixture"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
        .collect();
    assert!(texts.iter().any(|t| t == "MiB"), "y axis in MiB: {texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t == "highest: 316.4 MiB (Total Tensor Used Memory) at main.py line 14: <module>"),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "Total Tensor Used Memory"), "legend: {texts:?}");
    assert!(texts.iter().any(|t| t == "main.py:12"), "source lines as labels: {texts:?}");

    let png = dir.path().join("mem.png");
    let o = run(&["plot", FIXTURE, "-o", png.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(bytes.len() > 10_000);
    if let Ok(keep) = std::env::var("GMT_KEEP_PLOT") {
        std::fs::copy(&png, Path::new(&keep)).unwrap();
    }
}

/// Without NVML: one line naming it and no file left behind; with it (a GPU machine): one sample
/// in one log.
#[test]
fn watch_fails_cleanly_without_nvml_and_samples_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["watch", "--samples", "1", "--log-dir", dir.path().to_str().unwrap()]);
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    if o.status.success() {
        assert_eq!(files, 1, "one log: {}", stderr(&o));
    } else {
        one_line_error(&o, "NVML");
        assert_eq!(files, 0, "no file left behind");
    }
}

/// `report`, `plot`, `watch` and `--help` start without libtorch: the binary does not link it.
#[test]
fn the_gpu_mem_track_binary_links_no_libtorch() {
    let out = Command::new("ldd").arg(BIN).output().expect("ldd");
    let ldd = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() || ldd.contains("not a dynamic executable"), "ldd failed");
    assert!(!ldd.contains("torch"), "gpu-mem-track links libtorch:\n{ldd}");
}

#[test]
fn durations_and_timeline_outputs_are_named_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // The output's extension is checked before any work, and the message lists what works.
    let pickle = dir.path().join("x.pickle");
    std::fs::write(&pickle, "junk").unwrap();
    let txt = dir.path().join("t.txt");
    one_line_error(
        &run(&["timeline", pickle.to_str().unwrap(), "-o", txt.to_str().unwrap()]),
        ".svg, .png, .json or .pickle",
    );
    // A file that is not a snapshot is read here (no libtorch) and named.
    let json = dir.path().join("t.json");
    one_line_error(&run(&["timeline", pickle.to_str().unwrap(), "-o", json.to_str().unwrap()]), "x.pickle");
    // Absurd durations were a panic (exit 101) in Duration::from_secs_f64.
    for args in [["--duration", "99999999999999999999h"], ["--interval", "20000000000000000000s"]] {
        let o = run(&["watch", args[0], args[1], "--log-dir", d]);
        assert_eq!(o.status.code(), Some(2), "a usage error, not a panic: {}", stderr(&o));
        assert!(stderr(&o).contains(args[0]), "{}", stderr(&o));
    }
    // --rotate-size (also --rotate-bytes) takes a size as --gpu-mem does; a bad one is a usage error naming it.
    let o = run(&["watch", "--rotate-size", "64 parsecs", "--log-dir", d]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a memory size like 24GiB"), "{}", stderr(&o));
    let o = run(&["watch", "--rotate-bytes", "1KiB", "--samples", "1", "--log-dir", d]);
    assert_ne!(o.status.code(), Some(2), "1KiB is a size: {}", stderr(&o));
}

/// A copy of the lean binary in its own folder, as `cargo install` of this package alone leaves it.
fn installed_alone(dir: &Path) -> PathBuf {
    let exe = dir.join("gpu-mem-track");
    std::fs::copy(BIN, &exe).unwrap();
    exe
}

/// A stand-in `gpu-mem-track-estimate` that prints its arguments and exits with 7.
fn stand_in_estimator(dir: &Path) {
    let script = dir.join("gpu-mem-track-estimate");
    std::fs::write(&script, "#!/bin/sh\necho \"estimator: $*\"\nexit 7\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn estimate_fit_and_model_timelines_run_the_estimator_beside_it_or_on_path() {
    let dir = tempfile::tempdir().unwrap();
    let exe = installed_alone(dir.path());
    stand_in_estimator(dir.path());
    let o = Command::new(&exe)
        .args(["estimate", "m.pt", "--input", "1x3"])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "its exit code is the estimator's: {}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "estimator: estimate m.pt --input 1x3\n");
    let o = Command::new(&exe).args(["timeline", "m.pt", "-o", "t.svg"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "estimator: timeline m.pt -o t.svg\n");

    // Not beside it: the one on PATH.
    let alone = tempfile::tempdir().unwrap();
    let exe = installed_alone(alone.path());
    let path = format!("{}:/usr/bin:/bin", dir.path().display());
    let o = Command::new(&exe).args(["fit", "m.pt"]).env("PATH", path.clone()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "estimator: fit m.pt\n");
    // -q / -v given before the subcommand reach it too.
    for (flag, handed) in [("-q", "--quiet"), ("--verbose", "--verbose")] {
        let o = Command::new(&exe).args([flag, "fit", "m.pt"]).env("PATH", path.clone()).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), format!("estimator: fit {handed} m.pt\n"));
    }
}

/// stderr, not a terminal here: warnings by default, nothing with -q, notes too with -v; stdout is
/// the same in all three.
#[test]
fn quiet_and_verbose_set_what_stderr_says() {
    let dir = tempfile::tempdir().unwrap();
    // A log with a line no reader knows: plot warns about it.
    let log = dir.path().join("odd.txt");
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    std::fs::write(&log, format!("{text}this line is not a log line\n")).unwrap();
    let svg = dir.path().join("odd.svg");
    let plot = |flags: &[&str]| {
        let mut args = flags.to_vec();
        args.extend(["plot", log.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        stderr(&o)
    };
    let normal = plot(&[]);
    assert!(normal.contains("warning:") && !normal.contains("wrote"), "{normal}");
    assert_eq!(plot(&["-q"]), "");
    let verbose = plot(&["-v"]);
    assert!(
        verbose.contains("warning:") && verbose.contains(&format!("wrote {}", svg.display())),
        "{verbose}"
    );
    assert_eq!(run(&["-q", "-v", "report", FIXTURE]).status.code(), Some(2), "one or the other");
    let o = run(&["report", "-q", FIXTURE]);
    assert!(o.status.success() && !o.stdout.is_empty(), "the figures still print: {}", stderr(&o));
}

#[test]
fn without_the_estimator_a_one_line_error_says_how_to_install_it() {
    let alone = tempfile::tempdir().unwrap();
    let exe = installed_alone(alone.path());
    let o = Command::new(&exe)
        .args(["estimate", "m.pt", "--input", "1x3"])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    one_line_error(&o, "cargo install gpu-mem-track-cli --features estimate");
    // Their help still answers, as the estimator prints it: defaults and required arguments.
    for (sub, required) in [
        ("estimate", "--input <INPUT> <MODEL>"),
        ("fit", "--input <INPUT> <MODEL>"),
        ("timeline", "--output <OUTPUT> <MODEL>"),
    ] {
        let o = Command::new(&exe).args([sub, "--help"]).env("PATH", "/usr/bin:/bin").output().unwrap();
        assert!(o.status.success(), "{sub}: {}", stderr(&o));
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(help.contains(&format!("Usage: gpu-mem-track {sub} [OPTIONS] {required}")), "{help}");
        assert!(help.contains("[default: train]") && help.contains("[default: auto]"), "{sub}: {help}");
    }
    // Shell completions.
    let o = Command::new(&exe).args(["completions", "bash"]).output().unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("_gpu__mem__track()"),
        "{}",
        stderr(&o)
    );
    assert_eq!(Command::new(&exe).args(["completions", "tcsh"]).output().unwrap().status.code(), Some(2));
    // Reports still work: they need no estimator and no libtorch.
    let o = Command::new(&exe).args(["report", FIXTURE]).env("PATH", "/usr/bin:/bin").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}
