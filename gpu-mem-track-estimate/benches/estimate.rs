//! Time (and memory) of whole-model estimates on the meta device:
//! * ResNet-50, batch 16, 224x224, training step with SGD momentum. Target: under 2 s.
//! * A 1.016-billion-parameter decoder-only transformer (GPT-style, 16 layers, d=2048), batch 4 x
//!   1024 tokens, training step with AdamW. Target: under 60 s and under 2 GB of RAM.
//!
//! * Llama-2-7B-shaped decoder (32 layers, d 4096), batch 1 x 2048 tokens, bf16 (the working
//!   precision of amp-bf16), training step with AdamW. Target: under 10 s and under 1 GB of RAM.
//! * Llama-2-70B-shaped (80 layers, d 8192, 8 KV heads), same step. Target: under 60 s, 2 GB.
//! * `fit` of ResNet-50 training (SGD momentum) on an RTX 4090 profile. Target: under 10 s.
//!
//! The models are exported with the project's Python (torchvision for ResNet-50); without it the
//! benchmark says so and measures nothing.
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use gpu_mem_track_estimate::fit::{budget, fit_torchscript, FitDimension};
use gpu_mem_track_estimate::profile::DeviceProfile;
use gpu_mem_track_estimate::{
    estimate_torchscript, EstimateDevice, EstimateOptions, Mode, Optimizer, Precision,
};

fn python() -> Option<PathBuf> {
    // The project's .venv and fixtures are the workspace's, beside this crate.
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let candidates = [std::env::var_os("VIRTUAL_ENV").map(|v| Path::new(&v).join("bin/python")), Some(venv)];
    candidates.into_iter().flatten().find(|p| p.exists())
}

fn export(dir: &Path, name: &str) -> Option<PathBuf> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/export_models.py");
    let ok = std::process::Command::new(python()?).arg(script).arg(dir).arg(name).status().ok()?.success();
    ok.then(|| dir.join(format!("{name}.pt")))
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn estimates(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("estimate_training_step");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(8));
    let cases = [
        ("resnet50", vec![16, 3, 224, 224], false, Optimizer::SgdMomentum, Precision::F32),
        ("gpt1b", vec![4, 1024], true, Optimizer::AdamW, Precision::F32),
        ("llama7b", vec![1, 2048], true, Optimizer::AdamW, Precision::Bf16),
        ("llama70b", vec![1, 2048], true, Optimizer::AdamW, Precision::Bf16),
    ];
    for (name, shape, ids, optimizer, precision) in cases {
        let Some(model) = export(dir.path(), name) else {
            eprintln!("skipped {name}: no Python with torch/torchvision to export it");
            continue;
        };
        let options = EstimateOptions {
            input_shape: shape,
            input_is_index: ids,
            precision,
            mode: Mode::Train(optimizer),
            device: EstimateDevice::Meta,
            ..EstimateOptions::default()
        };
        let e = estimate_torchscript(&model, &options).unwrap();
        eprintln!(
            "{name}: {} parameters, peak {:.1} MiB ({}), CUDA model: allocated {:.1} MiB, reserved {:.1} MiB",
            e.sizes.param_count,
            e.peak.bytes as f64 / 1048576.0,
            e.peak.phase,
            e.cuda.peak_allocated as f64 / 1048576.0,
            e.cuda.peak_reserved as f64 / 1048576.0
        );
        group.bench_function(name, |b| b.iter(|| estimate_torchscript(&model, &options).unwrap()));
        eprintln!("{name}: peak resident memory of this process so far: {:.0} MiB", peak_rss_mib());
    }
    group.finish();
    let Some(model) = export(dir.path(), "resnet50") else { return };
    let options = EstimateOptions {
        input_shape: vec![1, 3, 224, 224],
        mode: Mode::Train(Optimizer::SgdMomentum),
        ..EstimateOptions::default()
    };
    let gpu = budget(&DeviceProfile::find("rtx4090").unwrap(), None);
    let fit = || fit_torchscript(&model, &options, FitDimension::Batch, &gpu, None, 1 << 16, |_| {}).unwrap();
    let r = fit();
    eprintln!("fit resnet50 on rtx4090: batch {:?} in {} meta runs", r.largest, r.probes.len());
    let mut group = c.benchmark_group("fit");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(8));
    group.bench_function("resnet50_train_rtx4090", |b| b.iter(fit));
    group.finish();
}

criterion_group!(benches, estimates);
criterion_main!(benches);
