//! The estimator's GPU predictions against what GPUs measured (`tests/gpu_table.csv`), on the CPU:
//! each torchvision model of the table is scripted here, estimated on meta and replayed on the
//! profile of the GPU its row comes from (`h200`, `h100-80g`), and its prediction is held to the
//! acceptance of issue 28:
//! - peak allocated: the GPU inside the predicted range, at most 1 % above its high end (an
//!   estimate under the GPU, the dangerous side) or at most 3 % below its low end;
//! - peak reserved: within 5 %.
//!
//! A row that misses a criterion today names it in `known_gap` with the figure it is held to.
use gpu_mem_track_testkit as common;

use common::{export_models, GPU_ALLOCATED_ABOVE_PCT, GPU_ALLOCATED_BELOW_PCT, GPU_RESERVED_PCT};
use gpu_mem_track_estimate::estimate_torchscript_traced;
use gpu_mem_track_estimate::profile::{predict, DeviceProfile};
use gpu_mem_track_estimate::{EstimateDevice, EstimateOptions, Mode, Optimizer, Precision};

const MIB: f64 = 1024.0 * 1024.0;

/// One row of the table.
#[derive(Debug)]
struct Row {
    /// The device profile of the GPU that measured the row.
    profile: DeviceProfile,
    model: String,
    train: bool,
    shape: Vec<i64>,
    allocated_mib: f64,
    reserved_mib: f64,
    /// Criterion -> the percentage it is held to instead of the acceptance's.
    gaps: Vec<(String, f64)>,
}

fn table() -> Vec<Row> {
    let text = include_str!("gpu_table.csv");
    let mut lines = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col =
        |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}"));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), header.len(), "gpu_table.csv: {line}");
            let mode = f[col("mode")];
            assert!(mode == "train" || mode == "inference", "gpu_table.csv: mode {mode}");
            let profile = match f[col("gpu")] {
                "NVIDIA H200" => "h200",
                "NVIDIA H100 80GB HBM3" => "h100-80g",
                gpu => panic!("gpu_table.csv: no device profile for {gpu}"),
            };
            Row {
                profile: DeviceProfile::find(profile).unwrap(),
                model: f[col("model")].to_owned(),
                train: mode == "train",
                shape: f[col("shape")].split('x').map(|d| d.parse().expect("shape")).collect(),
                allocated_mib: f[col("peak_allocated_mib")].parse().expect("peak_allocated_mib"),
                reserved_mib: f[col("peak_reserved_mib")].parse().expect("peak_reserved_mib"),
                gaps: f[col("known_gap")]
                    .split(';')
                    .filter(|g| !g.is_empty())
                    .map(|g| {
                        let (what, pct) = g.split_once(':').expect("known_gap is criterion:percent");
                        (what.to_owned(), pct.parse().expect("known_gap percent"))
                    })
                    .collect(),
            }
        })
        .collect()
}

#[test]
fn the_table_parses_and_names_each_criterion_it_relaxes() {
    let rows = table();
    assert!(rows.len() >= 10);
    for r in &rows {
        assert!(r.allocated_mib > 0.0 && r.reserved_mib >= r.allocated_mib, "{r:?}");
        for (what, pct) in &r.gaps {
            assert!(what == "allocated" || what == "reserved", "{r:?}");
            assert!(*pct > 0.0 && *pct < 20.0, "{r:?}");
        }
    }
}

#[cfg_attr(
    not(all(gmt_python_torch, gmt_torchvision)),
    ignore = "needs Python with torch and torchvision to export the models (scripts/dev installs them)"
)]
#[test]
fn predictions_hold_against_the_gpu_table() {
    let rows = table();
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    export_models(dir.path(), &names);
    let mut failures = Vec::new();
    for r in &rows {
        let options = EstimateOptions {
            input_shape: r.shape.clone(),
            precision: Precision::F32,
            mode: if r.train { Mode::Train(Optimizer::AdamW) } else { Mode::Inference },
            device: EstimateDevice::Meta,
            ..EstimateOptions::default()
        };
        let model = dir.path().join(format!("{}.pt", r.model));
        let (_, trace) = estimate_torchscript_traced(&model, &options).unwrap();
        let g = predict(&r.profile, &trace, None);
        let allocated = g.peak_allocated.miss((r.allocated_mib * MIB) as u64);
        let (over, under) = (allocated.above, allocated.below);
        let reserved = g.peak_reserved.miss((r.reserved_mib * MIB) as u64).either();
        let held = |what: &str, default: f64| {
            r.gaps.iter().find(|(w, _)| w == what).map_or(default, |(_, pct)| *pct)
        };
        let row = format!(
            "{} {} {:?}: allocated GPU {:.1} MiB, predicted {:.1}-{:.1} ({over:.2} % above, {under:.2} % below); \
             reserved GPU {:.0} MiB, predicted {:.0}-{:.0} ({reserved:.2} % off)",
            r.model,
            if r.train { "train" } else { "inference" },
            r.shape,
            r.allocated_mib,
            g.peak_allocated.low as f64 / MIB,
            g.peak_allocated.high as f64 / MIB,
            r.reserved_mib,
            g.peak_reserved.low as f64 / MIB,
            g.peak_reserved.high as f64 / MIB,
        );
        println!("{row}");
        if over > held("allocated", GPU_ALLOCATED_ABOVE_PCT)
            || under > GPU_ALLOCATED_BELOW_PCT
            || reserved > held("reserved", GPU_RESERVED_PCT)
        {
            failures.push(row);
        }
    }
    assert!(failures.is_empty(), "outside the acceptance:\n{}", failures.join("\n"));
}
