//! The libtorch half of the command line, `gpu-mem-track-estimate` (what `gpu-mem-track estimate`,
//! `fit` and `timeline MODEL` run): exit codes (0 ok, 1 error, 2 usage), one-line errors naming
//! the file or option, estimates, fits and timelines. The lean half's own tests are in
//! `tests/cli.rs`.
use gpu_mem_track_testkit as common;

use std::path::Path;
use std::process::{Command, Output};

use common::{export_models, exported_model};

use gpu_mem_track_testkit::cli_output::{one_line_error, stderr};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-mem-track-estimate");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

/// The JSON a run with `args` and `--json` prints; the run must succeed.
fn json_of(args: &[&str]) -> serde_json::Value {
    let o = run(&[args, &["--json"]].concat());
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
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
    // A .pt2 that is not a torch.export archive.
    let junk2 = dir.path().join("junk.pt2");
    std::fs::write(&junk2, "no zip").unwrap();
    one_line_error(&run(&["estimate", junk2.to_str().unwrap(), "--input", "1x3x8x8"]), "junk.pt2");
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
fn estimate_runs_an_op_without_meta_kernel_on_the_cpu_and_flags_its_value_read() {
    let (_dir, model) = exported_model("nonzero");
    let m = model.to_str().unwrap();
    // aten::nonzero has no Meta kernel: its CPU kernel runs on a zeroed copy of the input, and
    // since its result depends on the values, the estimate says so.
    let v = json_of(&["estimate", m, "--input", "4x8"]);
    assert_eq!(v["options"]["device"], "meta");
    assert_eq!(v["param_count"], 72);
    assert_eq!(v["cpu_fallback"][0]["op"], "aten::nonzero", "{}", v["cpu_fallback"]);
    assert!(v["meta_scalar_reads"].as_u64().unwrap() >= 1);
    let text = run(&["estimate", m, "--input", "4x8"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("check with --run-on cpu"), "{}", stderr(&text));
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
fn timeline_reads_a_snapshot_and_lays_it_out_again_as_the_caching_allocator_model_does() {
    let (dir, model) = exported_model("cnn");
    let (m, pickle, json) =
        (model.to_str().unwrap(), dir.path().join("cnn.pickle"), dir.path().join("t.json"));
    let estimate = json_of(&[
        "estimate",
        m,
        "--input",
        "8x3x32x32",
        "--mode",
        "train",
        "--snapshot",
        pickle.to_str().unwrap(),
    ]);
    let o = run(&["timeline", pickle.to_str().unwrap(), "-o", json.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The snapshot's trace holds the bytes asked for, as PyTorch's does.
    assert_eq!(t["peak"]["total"], estimate["peak"]["bytes"]);
    let parameters =
        t["peak"]["bytes"].as_array().unwrap().iter().find(|b| b[0] == "parameter").unwrap()[1].clone();
    assert_eq!(parameters, estimate["param_bytes"]);
    // `-o x.pickle` lays a snapshot's allocations out again through the caching allocator model:
    // an estimate's own snapshot comes back with the estimate's segments.
    let relaid = dir.path().join("relaid.pickle");
    let o = run(&["timeline", pickle.to_str().unwrap(), "-o", relaid.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let replay = gpu_mem_track::memviz::replay_segments(&relaid).unwrap();
    assert_eq!(replay.segments as u64, estimate["cuda"]["segment_allocs"].as_u64().unwrap());
    assert_eq!(replay.blocks, gpu_mem_track::memviz::replay_segments(&pickle).unwrap().blocks);
    // A file that is not a snapshot is a one-line error naming it; a model without --input is a usage error.
    let junk = dir.path().join("junk.pickle");
    std::fs::write(&junk, "junk").unwrap();
    one_line_error(&run(&["timeline", junk.to_str().unwrap(), "-o", json.to_str().unwrap()]), "junk.pickle");
    assert_eq!(run(&["timeline", m, "-o", json.to_str().unwrap()]).status.code(), Some(2));
}

/// The lean binary prints `estimate --help` (and `fit`, `timeline`) itself, from the definitions
/// this binary parses: the same text, whether or not this binary is installed beside it.
#[test]
fn the_lean_binary_prints_this_binarys_help() {
    let lean = env!("CARGO_BIN_EXE_gpu-mem-track");
    for sub in ["estimate", "fit", "timeline"] {
        let ours = run(&[sub, "--help"]);
        let theirs = Command::new(lean).args([sub, "--help"]).output().expect("lean binary runs");
        assert!(ours.status.success() && theirs.status.success());
        assert_eq!(
            String::from_utf8_lossy(&theirs.stdout),
            String::from_utf8_lossy(&ours.stdout),
            "{sub} --help"
        );
        assert!(String::from_utf8_lossy(&ours.stdout).contains("--input <INPUT>"), "{sub} --help");
    }
}

/// The estimator links libtorch (the lean `gpu-mem-track` does not: its own tests check that).
#[test]
fn the_estimate_binary_links_libtorch_and_has_help() {
    let out = Command::new("ldd").arg(BIN).output().expect("ldd");
    let ldd = String::from_utf8_lossy(&out.stdout);
    assert!(ldd.contains("libtorch_cpu.so"), "{ldd}");
    let o = run(&["estimate", "--help"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--device-profile"));
}

#[test]
fn model_paths_and_outputs_are_named_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    one_line_error(&run(&["estimate", d, "--input", "1x3x8x8"]), "is a directory");
    let fifo = dir.path().join("model.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    one_line_error(&run(&["estimate", fifo.to_str().unwrap(), "--input", "1x3x8x8"]), "not a regular file");
    // The output's extension is checked before the model is even opened, and the message lists
    // what works.
    let model = dir.path().join("not-yet-exported.pt");
    let txt = dir.path().join("t.txt");
    one_line_error(
        &run(&["timeline", model.to_str().unwrap(), "--input", "1x3x8x8", "-o", txt.to_str().unwrap()]),
        ".svg, .png, .json or .pickle",
    );
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
    let o = run(&[
        "estimate",
        m,
        "--input",
        "1000000000000000x3x32x32",
        "--method",
        "static",
        "--mode",
        "inference",
    ]);
    one_line_error(&o, "2^63 bytes");
    // A branch on data: meta reads 0 and says so.
    let branch = export_models(dir.path(), &["itembranch"]).remove(0);
    let o = run(&["estimate", branch.to_str().unwrap(), "--input", "4x8", "--mode", "inference"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("read 1 value(s) of meta tensors"), "{text}");
    // A training step runs forward twice: two reads.
    let o = run(&["estimate", branch.to_str().unwrap(), "--input", "4x8", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["meta_scalar_reads"], 2);
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
    // An RTX 4090's profile with 840 MiB: 180 MiB once its 660 MiB context is taken.
    let fit = [
        "fit",
        m,
        "--input",
        "1x256",
        "--optimizer",
        "adam",
        "--device-profile",
        "rtx4090",
        "--gpu-mem",
        "840MiB",
    ];
    let v = json_of(&fit);
    let largest = v["largest"].as_i64().expect("a batch fits");
    assert_eq!(v["memory_bytes"], 840u64 << 20);
    assert!(v["prediction"]["nvidia_smi"]["high"].as_u64().unwrap() <= 840 << 20);
    let probes = v["probes"].as_array().unwrap();
    for p in probes {
        assert_eq!(p["fits"].as_bool().unwrap(), p["value"].as_i64().unwrap() <= largest, "{p}");
    }
    let above = probes.iter().find(|p| p["value"] == largest + 1).expect("the size above was tried");
    // What binds: the figure the size above is over the device by, in the JSON and the text.
    let binds =
        if above["allocated_needed"].as_u64().unwrap() > 840 << 20 { "allocated" } else { "reserved" };
    assert_eq!(v["binds"], binds);
    let o = run(&fit);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("{binds} memory binds: at batch {},", largest + 1)), "{text}");
    one_line_error(
        &run(&["fit", m, "--input", "256", "--vary", "seq", "--gpu-mem", "1GiB"]),
        "varying `seq` needs",
    );
    assert_eq!(run(&["fit", m, "--input", "1x256", "--gpu-mem", "lots"]).status.code(), Some(2));

    let v = json_of(&[
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
    ]);
    let full = v["optimizer_state_bytes"].as_u64().unwrap();
    assert_eq!(v["rank"]["model_states"]["optimizer"].as_u64().unwrap(), full.div_ceil(4));
    assert_eq!(v["rank"]["model_states"]["parameters"], v["param_bytes"]);
    assert!(
        v["rank"]["cuda"]["peak_allocated"].as_u64().unwrap() < v["cuda"]["peak_allocated"].as_u64().unwrap()
    );
    assert_eq!(v["rank"]["method"], "formula", "the output says a formula made these figures: {v}");
    // ZeRO-1 keeps the gradients whole; ZeRO-2 divides them too (DeepSpeed's `2P + 18P/N`).
    assert_eq!(v["rank"]["model_states"]["gradients"], v["param_bytes"]);
    let zero2 = [
        &["estimate", m, "--input", "64x256", "--mode", "train", "--optimizer", "adam"][..],
        &["--world-size", "4", "--shard", "zero2"],
    ]
    .concat();
    let z2 = json_of(&zero2);
    let grads = z2["rank"]["model_states"]["gradients"].as_u64().unwrap();
    assert_eq!(grads, v["param_bytes"].as_u64().unwrap().div_ceil(4), "{z2}");
    let text = String::from_utf8(run(&zero2).stdout).unwrap();
    assert!(text.contains("formula (ZeRO's model-state counts"), "{text}");
}

/// One precision flag: `--precision` (fp32, fp16, bf16, amp-*), `--dtype` another name for it, the
/// dtype names `f32`/`f16` accepted as its values; only mixed precision (or ranks) brings per-rank
/// figures.
#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn one_precision_flag_sets_the_dtype_the_model_runs_in() {
    let (_dir, model) = exported_model("mlp");
    let m = model.to_str().unwrap();
    let estimate = |flags: &[&str]| {
        let mut v =
            json_of(&[&["estimate", m, "--input", "4x256", "--device-profile", "none"], flags].concat());
        v["seconds"] = serde_json::Value::Null; // how long it took
        v
    };
    let fp32 = estimate(&[]);
    let bf16 = estimate(&["--precision", "bf16"]);
    assert_eq!(bf16, estimate(&["--dtype", "bf16"]));
    assert_eq!(estimate(&["--precision", "fp16"]), estimate(&["--dtype", "f16"]));
    assert_eq!(fp32, estimate(&["--precision", "f32"]));
    let params = |v: &serde_json::Value| v["param_bytes"].as_u64().unwrap();
    assert_eq!(params(&bf16) * 2, params(&fp32), "bf16 parameters are half of fp32's");
    assert!(bf16.get("rank").is_none_or(serde_json::Value::is_null), "one process, no ranks: {bf16}");
    let amp = estimate(&["--precision", "amp-bf16"]);
    // Adam's two fp32 states and the fp32 master weight and gradient: 16 bytes, 4 fp32 parameters.
    let optimizer = amp["rank"]["model_states"]["optimizer"].as_u64();
    assert_eq!(optimizer, Some(4 * params(&fp32)), "mixed precision keeps fp32 master weights: {amp}");
    let o = run(&["estimate", m, "--input", "4x256", "--precision", "fp8"]);
    assert!(o.status.code() == Some(2) && stderr(&o).contains("fp8"), "{}", stderr(&o));
    let help = String::from_utf8(run(&["estimate", "--help"]).stdout).unwrap();
    assert!(help.contains("--precision <PRECISION>") && !help.contains("--dtype <"), "{help}");
}

/// Attention takes the kernel the profile's GPU picks. In bf16: flash attention from compute
/// capability 8.0 (the H100); on a T4 (7.5), which has neither flash attention nor bf16
/// memory-efficient attention, the math path, which keeps the attention weights (in float) for
/// backward. The text says which kernels ran.
#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn attention_takes_the_kernel_the_profiles_gpu_picks() {
    let (_dir, model) = exported_model("transformer");
    let m = model.to_str().unwrap();
    let args = |profile: &'static str| {
        ["estimate", m, "--input", "4x256", "--ids", "--precision", "bf16", "--device-profile", profile]
    };
    let (h100, t4) = (json_of(&args("h100-80g")), json_of(&args("t4")));
    // One call an iteration, two iterations.
    assert_eq!(h100["attention"], serde_json::json!({"flash": 2, "efficient": 0, "math": 0}), "{h100}");
    assert_eq!(t4["attention"], serde_json::json!({"flash": 0, "efficient": 0, "math": 2}), "{t4}");
    let kept = |v: &serde_json::Value| v["live_after_forward"].as_u64().unwrap();
    let weights = 4 * 4 * 256 * 256 * 4; // (batch, heads, query, key), float
    assert!(kept(&t4) >= kept(&h100) + weights, "t4 {} h100 {}", kept(&t4), kept(&h100));
    let text = String::from_utf8(run(&args("t4")).stdout).unwrap();
    assert!(
        text.contains("attention, as the GPU picks its kernel: 0 flash, 0 memory-efficient, 2 math"),
        "{text}"
    );
}

/// The bytes of `category` at the peak of a JSON timeline of `model` (input 4x256, training),
/// written in `dir` with `extra` options.
fn timeline_peak_bytes(dir: &Path, model: &str, category: &str, extra: &[&str]) -> u64 {
    let out = dir.join("t.json");
    let mut args =
        vec!["timeline", model, "--input", "4x256", "--mode", "train", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let peak = v["peak"]["bytes"].as_array().unwrap();
    peak.iter().find(|c| c[0] == category).unwrap()[1].as_u64().unwrap()
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn timeline_draws_one_rank_when_ranks_share_the_model_states() {
    let (dir, model) = exported_model("mlp");
    let m = model.to_str().unwrap();
    let parameter_bytes_at_peak = |extra: &[&str]| timeline_peak_bytes(dir.path(), m, "parameter", extra);
    let whole = parameter_bytes_at_peak(&[]);
    let rank = parameter_bytes_at_peak(&["--world-size", "4", "--shard", "zero3"]);
    assert!(whole > 0 && rank * 3 < whole, "one of 4 ZeRO-3 ranks holds {rank} of {whole} parameter bytes");
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn a_timeline_on_a_gpu_profile_shows_its_cublas_workspaces() {
    let (dir, model) = exported_model("mlp");
    let m = model.to_str().unwrap();
    let workspace_at_peak = |extra: &[&str]| timeline_peak_bytes(dir.path(), m, "workspace", extra);
    assert_eq!(workspace_at_peak(&["--device-profile", "none"]), 0, "a meta run has no cuBLAS");
    // The default, `auto`, is the first GPU CUDA shows this process, else an RTX 4090 (sm 8.9: 8.1 MiB + 1 MiB).
    let auto = workspace_at_peak(&[]);
    assert!(auto > 0, "{auto}");
    // sm 9.0: 32 MiB cuBLAS + 1 MiB cuBLASLt, for the program's thread and autograd's.
    assert_eq!(workspace_at_peak(&["--device-profile", "h100-80g"]), 66 << 20);
    one_line_error(
        &run(&["timeline", m, "--input", "4x256", "--device-profile", "h9000", "-o", "t.json"]),
        "h9000",
    );
}

#[cfg_attr(
    not(gmt_torchvision),
    ignore = "needs Python with torch and torchvision to export the models (scripts/dev installs them)"
)]
#[test]
fn a_torch_export_program_estimates_as_its_torchscript_file_does_eagerly() {
    let dir = tempfile::tempdir().unwrap();
    export_models(dir.path(), &["resnet50.pt2", "vit_b_16.pt2"]);
    let estimate = |file: &Path, extra: &[&str]| {
        let args = ["estimate", file.to_str().unwrap(), "--input", "16x3x224x224", "--mode", "train"];
        json_of(&[&args[..], &["--optimizer", "adamw", "--device-profile", "h100-80g"], extra].concat())
    };
    for name in ["resnet50", "vit_b_16"] {
        let pt2 = estimate(&dir.path().join(format!("{name}.pt2")), &[]);
        // The program runs op by op as eager PyTorch does: the TorchScript file of the same model
        // run with eager lifetimes.
        let ts = estimate(&dir.path().join(format!("{name}.pt")), &["--lifetimes", "eager"]);
        for key in [
            "param_count",
            "param_bytes",
            "buffer_bytes",
            "input_bytes",
            "grad_bytes",
            "optimizer_state_bytes",
        ] {
            assert_eq!(pt2[key], ts[key], "{name}: {key}");
        }
        let ratio = |a: &serde_json::Value, b: &serde_json::Value| a.as_f64().unwrap() / b.as_f64().unwrap();
        let peak = ratio(&pt2["peak"]["bytes"], &ts["peak"]["bytes"]);
        let gpu = ratio(&pt2["gpu"]["peak_allocated"]["high"], &ts["gpu"]["peak_allocated"]["high"]);
        println!("{name}: .pt2 / TorchScript: peak {peak:.4}, GPU peak allocated {gpu:.4}");
        assert!((peak - 1.0).abs() <= 0.01 && (gpu - 1.0).abs() <= 0.01, "{name}: {pt2} vs {ts}");
        assert_eq!(pt2["peak"]["phase"], ts["peak"]["phase"], "{name}");
    }
    // Its shapes are baked in: another input is refused, naming the one it was exported for.
    let resnet = dir.path().join("resnet50.pt2");
    one_line_error(
        &run(&["estimate", resnet.to_str().unwrap(), "--input", "8x3x224x224"]),
        "--input 16x3x224x224",
    );
    // Inference runs it too, without gradients.
    let v =
        json_of(&["estimate", resnet.to_str().unwrap(), "--input", "16x3x224x224", "--mode", "inference"]);
    assert_eq!(v["grad_bytes"], 0);
    assert!(v["peak"]["bytes"].as_u64().unwrap() < v["param_bytes"].as_u64().unwrap() * 3, "{v}");
}

#[cfg_attr(
    not(gmt_torchvision),
    ignore = "needs Python with torch and torchvision to export ResNet-50 (scripts/dev installs them)"
)]
#[test]
fn estimate_and_fit_name_where_resnet50_training_would_run_out_of_memory_on_a_t4() {
    let (_dir, model) = exported_model("resnet50");
    let m = model.to_str().unwrap();
    let estimate = |batch: u32, extra: &[&str]| {
        let input = format!("{batch}x3x224x224");
        let mut args = vec!["estimate", m, "--input", &input, "--mode", "train", "--optimizer", "momentum"];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let oom_lines = |text: &str| -> Vec<String> {
        text.lines().filter(|l| l.contains("does not fit: ")).map(str::to_owned).collect()
    };
    // Batch 256 needs about twice the 14.74 GiB CUDA gives a process on a T4.
    let v: serde_json::Value =
        serde_json::from_str(&estimate(256, &["--device-profile", "t4", "--json"])).unwrap();
    let g = &v["gpu"];
    assert_eq!(g["fits"], false);
    let usable = (15_095u64 << 20) - (620 << 20);
    assert_eq!(g["usable_bytes"], usable, "the T4's memory less its CUDA context");
    let oom = &g["first_oom"];
    let (op, phase, iteration) =
        (oom["top_op"].as_str().unwrap(), oom["phase"].as_str().unwrap(), oom["iteration"].as_u64().unwrap());
    assert!(["forward", "backward", "optimizer step"].contains(&phase) && iteration >= 1, "{oom}");
    let field = |k: &str| oom[k].as_u64().unwrap_or_else(|| panic!("{k} in {oom}"));
    assert_eq!(field("capacity"), usable);
    assert!(field("short_by") > 0);
    assert_eq!(field("segment") + field("reserved_after_retry") - usable, field("short_by"));
    // The text says the same, in one line under the T4's figures.
    let text = estimate(256, &["--device-profile", "t4"]);
    let lines = oom_lines(&text);
    assert_eq!(lines.len(), 1, "{text}");
    let line = lines[0].trim();
    println!("{line}");
    assert!(line.starts_with("does not fit: "), "{line}");
    assert!(line.contains(op) && line.contains(&format!("({phase}, iteration {iteration})")), "{line}");
    let short = format!("{:.1} MiB short", field("short_by") as f64 / 1048576.0);
    let short_gib = format!("{:.1} GiB short", field("short_by") as f64 / (1u64 << 30) as f64);
    assert!(line.ends_with(&short) || line.ends_with(&short_gib), "{line}");
    let usable_text = format!("{:.1} GiB usable", usable as f64 / (1u64 << 30) as f64);
    assert!(line.contains(&usable_text), "{line}");
    // The table of every preset says where it fails on the T4 and that the A100 80 GB takes it.
    let table = estimate(256, &["--device-profile", "all"]);
    let row = |name: &str| table.lines().find(|l| l.trim_start().starts_with(name)).unwrap().to_owned();
    assert!(row("t4 ").contains(&format!("does NOT fit: OOM at {op} ({phase}, iteration {iteration})")));
    assert!(row("a100-80g").trim_end().ends_with("fits"), "{table}");
    // A batch that fits has no such line; --gpu-mem makes the same batch fail on a smaller card.
    let fits = estimate(32, &["--device-profile", "t4"]);
    assert!(oom_lines(&fits).is_empty() && !fits.contains("does NOT fit"), "{fits}");
    // It says how much of the T4 is left: its memory less nvidia-smi's high end.
    let v: serde_json::Value =
        serde_json::from_str(&estimate(32, &["--device-profile", "t4", "--json"])).unwrap();
    let spare = (15_095u64 << 20) - v["gpu"]["nvidia_smi"]["high"].as_u64().unwrap();
    let spare = format!("-> fits, {:.1} MiB to spare", spare as f64 / 1048576.0);
    assert!(
        fits.lines().any(|l| l.trim_start().starts_with("nvidia-smi") && l.ends_with(&spare)),
        "{spare}\n{fits}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&estimate(32, &["--device-profile", "t4", "--gpu-mem", "2GiB", "--json"]))
            .unwrap();
    assert_eq!(v["gpu"]["usable_bytes"], (2u64 << 30) - (620 << 20));
    assert!(v["gpu"]["first_oom"]["short_by"].as_u64().unwrap() > 0, "{}", v["gpu"]);
    assert_eq!(
        run(&["estimate", m, "--input", "1x3x224x224", "--gpu-mem", "8GiB", "--device-profile", "all"])
            .status
            .code(),
        Some(2),
        "--gpu-mem needs one profile"
    );
    // The default profile is one: `auto`.
    assert_eq!(run(&["estimate", m, "--input", "1x3x224x224", "--gpu-mem", "8GiB"]).status.code(), Some(0));

    // fit names where the smallest size that does not fit would fail, or says none would.
    let v =
        json_of(&["fit", m, "--input", "1x3x224x224", "--optimizer", "momentum", "--device-profile", "t4"]);
    let largest = v["largest"].as_i64().unwrap();
    let above = v["probes"].as_array().unwrap().iter().find(|p| p["value"] == largest + 1).unwrap();
    let o = run(&["fit", m, "--input", "1x3x224x224", "--optimizer", "momentum", "--device-profile", "t4"]);
    let text = String::from_utf8_lossy(&o.stdout);
    let at = format!("at batch {}: ", largest + 1);
    let line = text.lines().find(|l| l.trim_start().starts_with(&at)).unwrap_or_else(|| panic!("{text}"));
    println!("{line}");
    if above["first_oom"].is_null() {
        assert!(line.contains("no OOM predicted"), "{line}");
    } else {
        assert!(
            line.contains("does not fit: ") && line.contains(above["first_oom"]["phase"].as_str().unwrap())
        );
    }
}

/// The torchvision sweep (`scripts/figures/torchvision-sweep`, which runs all 80 classification models of
/// torchvision) on one model of each architecture family (23 of the 80, in a quarter of the time):
/// each estimates on meta in train mode with Adam at batch 2, and a dozen agree with the same run
/// computed on the CPU.
const TORCHVISION_FAMILIES: [&str; 23] = [
    // The dozen the sweep also computes on the CPU (torchvision_sweep.py's COMPARED).
    "alexnet",
    "convnext_tiny",
    "densenet121",
    "efficientnet_b0",
    "googlenet",
    "mnasnet0_5",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "regnet_y_400mf",
    "resnet18",
    "shufflenet_v2_x0_5",
    "squeezenet1_0",
    // One of each family those leave out, or a variant built differently.
    "efficientnet_v2_s",
    "inception_v3",
    "maxvit_t",
    "mobilenet_v3_large",
    "regnet_x_400mf",
    "resnext50_32x4d",
    "swin_t",
    "swin_v2_t",
    "vgg11_bn",
    "vit_b_16",
    "wide_resnet50_2",
];

#[cfg_attr(
    not(gmt_torchvision),
    ignore = "needs Python with torch and torchvision (scripts/dev installs them)"
)]
#[test]
fn a_torchvision_classification_model_of_every_family_estimates_on_meta_in_train_mode() {
    let python = common::python_with_torch().expect("Python with torch");
    let dir = tempfile::tempdir().unwrap();
    let script = common::workspace_root().join("scripts/figures/torchvision_sweep.py");
    let out = Command::new(python)
        .arg(script)
        .arg(BIN)
        .arg(dir.path())
        .args(TORCHVISION_FAMILIES)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let summary = text.lines().last().unwrap_or("");
    assert!(summary.starts_with("sweep: 23 of 23 torchvision classification models"), "{summary}");
    assert!(summary.contains("12 compared with the CPU"), "{summary}");
}
