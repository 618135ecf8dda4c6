//! The command line: exit codes (0 ok, 1 error, 2 usage), one-line errors naming the file or
//! option, `report`, `plot` (a valid SVG and PNG) and `watch` without NVML.
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{export_models, exported_model};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-mem-track");
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pytorch_memory_utils.txt");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn one_line_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(o));
    let e = stderr(o);
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.starts_with("error: ") && e.contains(needle), "{e}");
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
    for sub in ["report", "plot", "watch"] {
        let o = run(&[sub, "--help"]);
        assert!(o.status.success());
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: gpu-mem-track"));
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

#[cfg_attr(gmt_gpu, ignore = "tests the path without NVML; this machine has an NVIDIA driver")]
#[test]
fn watch_without_nvml_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["watch", "--samples", "1", "--log-dir", dir.path().to_str().unwrap()]);
    one_line_error(&o, "NVML");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no file left behind");
}

#[test]
fn estimate_errors_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pt");
    one_line_error(&run(&["estimate", missing.to_str().unwrap(), "--input", "1x3x8x8"]), "missing.pt");
    let junk = dir.path().join("junk.pt");
    std::fs::write(&junk, "no zip").unwrap();
    one_line_error(&run(&["estimate", junk.to_str().unwrap(), "--input", "1x3x8x8"]), "cannot load");
    assert_eq!(run(&["estimate", junk.to_str().unwrap(), "--input", "1xbananax8"]).status.code(), Some(2));
    one_line_error(
        &run(&[
            "estimate",
            junk.to_str().unwrap(),
            "--input",
            "1x3",
            "--method",
            "static",
            "--mode",
            "train",
        ]),
        "inference only",
    );
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn estimate_names_an_op_without_meta_kernel_and_falls_back_to_cpu_when_allowed() {
    let (_dir, model) = exported_model("nonzero");
    let m = model.to_str().unwrap();
    one_line_error(&run(&["estimate", m, "--input", "4x8"]), "aten::nonzero has no meta kernel");
    let o = run(&["estimate", m, "--input", "4x8", "--allow-cpu", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("estimating on the CPU instead"));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["options"]["device"], "cpu");
    assert_eq!(v["param_count"], 72);
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn estimate_with_an_input_of_the_wrong_rank_names_the_shape() {
    let (_dir, model) = exported_model("cnn");
    let o = run(&["estimate", model.to_str().unwrap(), "--input", "32x64"]);
    one_line_error(&o, "forward failed for input [32, 64]");
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn timeline_reads_a_snapshot_and_its_peak_is_the_caching_allocator_models() {
    let (dir, model) = exported_model("cnn");
    let (m, pickle, json) =
        (model.to_str().unwrap(), dir.path().join("cnn.pickle"), dir.path().join("t.json"));
    let o = run(&[
        "estimate",
        m,
        "--input",
        "8x3x32x32",
        "--mode",
        "train",
        "--json",
        "--snapshot",
        pickle.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let estimate: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let o = run(&["timeline", pickle.to_str().unwrap(), "-o", json.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        t["peak"]["total"], estimate["cuda"]["peak_allocated"],
        "blocks as the caching model placed them"
    );
    let parameters =
        t["peak"]["bytes"].as_array().unwrap().iter().find(|b| b[0] == "parameter").unwrap()[1].clone();
    assert!(
        parameters.as_u64().unwrap() >= estimate["param_bytes"].as_u64().unwrap(),
        "rounded up to blocks"
    );
    // A file that is not a snapshot is a one-line error naming it; a model without --input is a usage error.
    let junk = dir.path().join("junk.pickle");
    std::fs::write(&junk, "junk").unwrap();
    one_line_error(&run(&["timeline", junk.to_str().unwrap(), "-o", json.to_str().unwrap()]), "junk.pickle");
    assert_eq!(run(&["timeline", m, "-o", json.to_str().unwrap()]).status.code(), Some(2));
}

/// `report`, `plot`, `watch` and `--help` start without libtorch: the binary does not link it;
/// `estimate` goes through the second binary, which does.
#[test]
fn the_gpu_mem_track_binary_links_no_libtorch() {
    let ldd = |exe: &str| {
        let out = std::process::Command::new("ldd").arg(exe).output().expect("ldd");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let lean = ldd(env!("CARGO_BIN_EXE_gpu-mem-track"));
    assert!(!lean.contains("torch"), "gpu-mem-track links libtorch:\n{lean}");
    let estimate = ldd(env!("CARGO_BIN_EXE_gpu-mem-track-estimate"));
    assert!(estimate.contains("libtorch_cpu.so"), "{estimate}");
    let o = run(&["estimate", "--help"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--device-profile"));
}

#[test]
fn model_paths_outputs_and_durations_are_named_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    one_line_error(&run(&["estimate", d, "--input", "1x3x8x8"]), "is a directory");
    let fifo = dir.path().join("model.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    one_line_error(&run(&["estimate", fifo.to_str().unwrap(), "--input", "1x3x8x8"]), "not a regular file");
    // The output's extension is checked before any work, and the message lists what works.
    let pickle = dir.path().join("x.pickle");
    std::fs::write(&pickle, "junk").unwrap();
    let txt = dir.path().join("t.txt");
    one_line_error(
        &run(&["timeline", pickle.to_str().unwrap(), "-o", txt.to_str().unwrap()]),
        ".svg, .png or .json",
    );
    // Absurd durations were a panic (exit 101) in Duration::from_secs_f64.
    for args in [["--duration", "99999999999999999999h"], ["--interval", "20000000000000000000s"]] {
        let o = run(&["watch", args[0], args[1], "--log-dir", d]);
        assert_eq!(o.status.code(), Some(2), "a usage error, not a panic: {}", stderr(&o));
        assert!(stderr(&o).contains(args[0]), "{}", stderr(&o));
    }
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn snapshot_paths_damaged_models_overflows_and_data_branches_are_reported() {
    let (dir, model) = exported_model("cnn");
    let m = model.to_str().unwrap();
    // A snapshot into a missing folder: named as a snapshot, the OS reason once.
    let o = run(&["estimate", m, "--input", "1x3x8x8", "--snapshot", "/nonexistent/dir/x.pickle"]);
    one_line_error(&o, "cannot write memory snapshot /nonexistent/dir/x.pickle");
    let e = stderr(&o);
    assert!(!e.contains("log file"), "{e}");
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
    // A damaged archive: the reason after "as TorchScript:" is never empty.
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes.truncate(mid);
    let damaged = dir.path().join("damaged.pt");
    std::fs::write(&damaged, &bytes).unwrap();
    let o = run(&["estimate", damaged.to_str().unwrap(), "--input", "1x3x8x8"]);
    one_line_error(&o, "damaged.pt");
    let e = stderr(&o);
    let reason = e.split("TorchScript:").nth(1).unwrap_or("").trim();
    assert!(!reason.is_empty(), "{e}");
    // The static method at an absurd batch overflows: an error, not a wrapped figure.
    let o = run(&["estimate", m, "--input", "1000000000000000x3x32x32", "--method", "static"]);
    one_line_error(&o, "2^63 bytes");
    // A branch on data: meta reads 0 and says so.
    let branch = export_models(dir.path(), &["itembranch"]).remove(0);
    let o = run(&["estimate", branch.to_str().unwrap(), "--input", "4x8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("read 1 value(s) of meta tensors"), "{text}");
    let o = run(&["estimate", branch.to_str().unwrap(), "--input", "4x8", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["meta_scalar_reads"], 1);
    let o = run(&["estimate", m, "--input", "1x3x8x8", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["meta_scalar_reads"], 0);
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn fit_finds_the_boundary_and_ranks_divide_the_optimizer_state() {
    let (_dir, model) = exported_model("mlp");
    let m = model.to_str().unwrap();
    let o = run(&["fit", m, "--input", "1x256", "--optimizer", "adam", "--gpu-mem", "600MiB", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let largest = v["largest"].as_i64().expect("a batch fits");
    assert_eq!(v["memory_bytes"], 600u64 << 20);
    assert!(v["prediction"]["nvidia_smi"]["high"].as_u64().unwrap() <= 600 << 20);
    let probes = v["probes"].as_array().unwrap();
    for p in probes {
        assert_eq!(p["fits"].as_bool().unwrap(), p["value"].as_i64().unwrap() <= largest, "{p}");
    }
    assert!(probes.iter().any(|p| p["value"] == largest + 1), "the size above was tried: {probes:?}");
    one_line_error(&run(&["fit", m, "--input", "256", "--vary", "seq", "--gpu-mem", "1GiB"]), "--vary seq");
    assert_eq!(run(&["fit", m, "--input", "1x256", "--gpu-mem", "lots"]).status.code(), Some(2));

    let o = run(&[
        "estimate",
        m,
        "--input",
        "64x256",
        "--mode",
        "train",
        "--optimizer",
        "adam",
        "--world-size",
        "4",
        "--shard",
        "zero1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let full = v["optimizer_state_bytes"].as_u64().unwrap();
    assert_eq!(v["rank"]["model_states"]["optimizer"].as_u64().unwrap(), full.div_ceil(4));
    assert_eq!(v["rank"]["model_states"]["parameters"], v["param_bytes"]);
    assert!(
        v["rank"]["cuda"]["peak_allocated"].as_u64().unwrap() < v["cuda"]["peak_allocated"].as_u64().unwrap()
    );
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn timeline_draws_one_rank_when_ranks_share_the_model_states() {
    let (dir, model) = exported_model("mlp");
    let m = model.to_str().unwrap();
    let parameter_bytes_at_peak = |extra: &[&str]| {
        let out = dir.path().join("t.json");
        let mut args =
            vec!["timeline", m, "--input", "4x256", "--mode", "train", "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let bytes =
            v["peak"]["bytes"].as_array().unwrap().iter().find(|c| c[0] == "parameter").unwrap()[1].clone();
        bytes.as_u64().unwrap()
    };
    let whole = parameter_bytes_at_peak(&[]);
    let rank = parameter_bytes_at_peak(&["--world-size", "4", "--shard", "zero3"]);
    assert!(whole > 0 && rank * 3 < whole, "one of 4 ZeRO-3 ranks holds {rank} of {whole} parameter bytes");
}
