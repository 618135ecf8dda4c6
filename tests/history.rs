//! Memory history and snapshots PyTorch's memory_viz tools read.
mod common;

use common::{cpu_tracker, export_model, python_with_torch};
use gpu_mem_track::history::{Action, HistoryOptions};
use gpu_mem_track::track;
use tch::{Device, Kind, Tensor};

const CHECK: &str = r#"
import json, pickle, sys
import torch.cuda._memory_viz as viz
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
html = viz.trace_plot(data)
segments = viz.segment_plot(data)
live = peak = 0
allocs = frees = 0
for e in data["device_traces"][0]:
    if e["action"] == "alloc":
        allocs += 1; live += e["size"]; peak = max(peak, live)
    elif e["action"] == "free_completed":
        frees += 1; live -= e["size"]
print(json.dumps({"allocs": allocs, "frees": frees, "peak": peak, "html": len(html), "segments_html": len(segments),
                  "live_segments": len(data["segments"])}))
"#;

#[test]
fn snapshot_loads_in_memory_viz_with_the_same_counts_and_peak() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history(0).unwrap();
    let mut kept = Vec::new();
    for step in 0..5i64 {
        let x = Tensor::rand([64, 128], (Kind::Float, Device::Cpu));
        let y = x.matmul(&x.tr()).relu();
        kept.push(y.sum(Kind::Float));
        track!(t);
        drop((x, y, step));
    }
    t.stop_history().unwrap();
    let history = t.history();
    let (allocs, frees) = history.counts();
    assert!(allocs >= 15 && frees >= 10, "{allocs} {frees}");
    assert!(history
        .events
        .iter()
        .any(|e| e.site.as_ref().is_some_and(|s| s.function.contains("snapshot_loads"))));
    let pickle = dir.path().join("snapshot.pickle");
    t.dump_snapshot(&pickle).unwrap();

    let Some(python) = python_with_torch() else {
        println!("skipped the memory_viz half: no Python with torch");
        return;
    };
    let script = dir.path().join("check.py");
    std::fs::write(&script, CHECK).unwrap();
    let out = std::process::Command::new(python).arg(&script).arg(&pickle).output().unwrap();
    assert!(out.status.success(), "memory_viz failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocs"], allocs as u64);
    assert_eq!(v["frees"], frees as u64);
    assert_eq!(v["peak"], history.peak_bytes());
    assert!(v["html"].as_u64().unwrap() > 1000 && v["segments_html"].as_u64().unwrap() > 1000);
    assert_eq!(
        v["live_segments"],
        (allocs - frees) as u64,
        "every allocation of the run still live is a segment"
    );
}

#[test]
fn the_ring_buffer_keeps_the_last_max_entries() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history(1000).unwrap();
    for _ in 0..50_000 {
        drop(Tensor::zeros([4], (Kind::Float, Device::Cpu)));
    }
    t.stop_history().unwrap();
    let h = t.history();
    assert_eq!(h.events.len(), 1000);
    assert_eq!(h.events.len() as u64 + h.dropped, 100_000, "one alloc and one free per tensor");
    // Oldest first, and the last event is the last free.
    assert!(h.events.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    assert_eq!(h.events.last().unwrap().action, Action::Free);
}

#[inline(never)]
fn allocate_here() -> Tensor {
    Tensor::ones([1000], (Kind::Float, Device::Cpu))
}

#[test]
fn stacks_are_resolved_to_rust_functions() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history_with(HistoryOptions { max_entries: 100, with_stacks: true }).unwrap();
    let x = allocate_here();
    t.stop_history().unwrap();
    let h = t.history();
    let alloc = h
        .events
        .iter()
        .find(|e| e.action == Action::Alloc && e.size == 4000)
        .expect("the 4000-byte allocation");
    assert!(alloc.frames.iter().any(|f| f.name.contains("allocate_here")), "{:#?}", alloc.frames);
    drop(x);
}

#[test]
fn estimate_trace_categories_sum_to_the_peak_and_its_snapshot_loads_in_memory_viz() {
    use gpu_mem_track::estimate::{estimate_torchscript_traced, Category, EstimateOptions, Mode, Optimizer};
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = export_model(dir.path(), "cnn") else {
        println!("skipped: no Python with torch to export the model");
        return;
    };
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
    assert_eq!(at(Category::Parameter), e.param_bytes, "parameters are exactly the model's");
    assert_eq!(at(Category::OptimizerState), 2 * e.param_bytes, "Adam's two buffers are alive at the peak");
    assert_eq!(at(Category::Input), e.input_bytes);
    assert!(at(Category::Activation) > 0);

    let pickle = dir.path().join("estimate.pickle");
    trace.dump_snapshot(&pickle).unwrap();
    let Some(python) = python_with_torch() else { return };
    let script = dir.path().join("check.py");
    std::fs::write(
        &script,
        CHECK.replace(
            "print(json.dumps({",
            "segs = sum(1 for e in data['device_traces'][0] if e['action'] == 'segment_alloc')\nprint(json.dumps({'segment_allocs': segs, ",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(python).arg(&script).arg(&pickle).output().unwrap();
    assert!(out.status.success(), "memory_viz failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocs"], e.allocations);
    assert_eq!(v["peak"], e.cuda.peak_allocated, "the snapshot replays the caching allocator model");
    assert_eq!(v["segment_allocs"], e.cuda.segment_allocs);
}
