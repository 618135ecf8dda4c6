//! Estimates' traces as PyTorch memory snapshots, read back by PyTorch's own `_memory_viz` and
//! rendered in a browser.
use gpu_mem_track_testkit as common;

use common::{exported_model, python_with_torch, MEMORY_VIZ_CHECK as CHECK};
use gpu_mem_track_gpu::snapshot::dump_snapshot;

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn estimate_trace_categories_sum_to_the_peak_and_its_snapshot_loads_in_memory_viz() {
    use gpu_mem_track_estimate::{estimate_torchscript_traced, Category, EstimateOptions, Mode, Optimizer};
    let (dir, model) = exported_model("cnn");
    let options = EstimateOptions {
        input_shape: vec![32, 3, 64, 64],
        mode: Mode::Train(Optimizer::Adam),
        ..EstimateOptions::default()
    };
    let (e, trace) = estimate_torchscript_traced(&model, &options).unwrap();
    let peak = trace.peak().unwrap();
    assert_eq!(peak.total, e.peak.bytes);
    assert_eq!(peak.bytes.iter().map(|b| b.1).sum::<u64>(), peak.total, "categories sum to the peak");
    let at = |c: Category| peak.bytes.iter().find(|b| b.0 == c).unwrap().1;
    assert_eq!(at(Category::Parameter), e.sizes.param_bytes, "parameters are exactly the model's");
    assert_eq!(
        at(Category::OptimizerState),
        2 * e.sizes.param_bytes,
        "Adam's two buffers are alive at the peak"
    );
    assert_eq!(at(Category::Input), e.sizes.input_bytes);
    assert!(at(Category::Activation) > 0);

    let pickle = dir.path().join("estimate.pickle");
    dump_snapshot(&trace, &pickle).unwrap();
    let python = python_with_torch().expect("a Python with torch");
    let script = dir.path().join("check.py");
    std::fs::write(
        &script,
        CHECK.replace(
            "print(json.dumps({",
            "segs = sum(1 for e in data['device_traces'][0] if e['action'] == 'segment_alloc')\n\
             held = sum(b['requested_size'] for s in data['segments'] for b in s['blocks'] if b['state'] == 'active_allocated')\n\
             print(json.dumps({'segment_allocs': segs, 'held_at_end': held, 'live_at_end': live, ",
        ),
    )
    .unwrap();
    let check = |pickle: &std::path::Path| -> serde_json::Value {
        let out = std::process::Command::new(&python).arg(&script).arg(pickle).output().unwrap();
        assert!(out.status.success(), "memory_viz failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = check(&pickle);
    assert_eq!(v["allocs"], e.allocations);
    // The trace holds the bytes asked for, as PyTorch's does; its blocks and segments are the
    // caching allocator model's.
    assert_eq!(v["peak"], e.peak.bytes);
    assert_eq!(
        v["segment_allocs"], e.cuda.segment_allocs,
        "the snapshot replays the caching allocator model"
    );
    // Cut at the peak, the blocks left in `segments` hold what the trace left allocated, in the
    // same bytes (a whole run frees everything by its end).
    let mut cut = trace.clone();
    cut.events.truncate(peak.event + 1);
    let at_peak = dir.path().join("at-peak.pickle");
    dump_snapshot(&cut, &at_peak).unwrap();
    let v = check(&at_peak);
    let want = serde_json::Value::from(peak.total);
    assert_eq!((&v["live_at_end"], &v["held_at_end"]), (&want, &want));
}

/// Renders the snapshot pages in headless Chromium when the machine can (Debian's `chromium` and
/// `node-d3`, and a local MemoryViz.js in `GMT_MEMORY_VIZ_JS`); says why not otherwise.
#[cfg_attr(
    not(all(gmt_python_torch, gmt_memory_viz)),
    ignore = "needs Python with torch, Debian's chromium and node-d3, and a MemoryViz.js in GMT_MEMORY_VIZ_JS"
)]
#[test]
fn snapshots_render_in_headless_chromium_without_script_errors() {
    use gpu_mem_track_estimate::{estimate_torchscript_traced, EstimateOptions, Mode, Optimizer};
    let (dir, model) = exported_model("cnn");
    let options = EstimateOptions {
        input_shape: vec![4, 3, 32, 32],
        mode: Mode::Train(Optimizer::Adam),
        ..EstimateOptions::default()
    };
    let (_, trace) = estimate_torchscript_traced(&model, &options).unwrap();
    let pickle = dir.path().join("estimate.pickle");
    dump_snapshot(&trace, &pickle).unwrap();
    let checker = common::workspace_root().join("scripts/ci/check-memory-viz");
    let out = std::process::Command::new(checker).arg(&pickle).arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => assert!(text.contains("OK"), "{text}"),
        _ => panic!("memory_viz pages failed in Chromium:\n{text}\n{}", String::from_utf8_lossy(&out.stderr)),
    }
}
