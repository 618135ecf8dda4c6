//! `plot` of a 300 000-point log (a month-long run has 10^5 to 10^6) to PNG and SVG, read from
//! the file as the CLI does.
use std::io::Write;

use criterion::{criterion_group, criterion_main, Criterion};
use gpu_mem_track_log::plot::plot_log_file;

/// A noisy training loop with a slow leak, three track points per step.
fn write_log(path: &std::path::Path, points: usize) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(
        w,
        "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n"
    )
    .unwrap();
    for i in 0..points {
        let used = [400.0, 250.0, 120.0][i % 3] + (i * 7919 % 1000) as f64 / 100.0 + i as f64 / 1500.0;
        writeln!(
            w,
            "At {:<50} Total Tensor Used Memory:{used:<7.1}Mb Total Allocated Memory:{:<7.1}Mb\n",
            format!("examples/train.rs line {}: step", 39 + i % 3),
            used + 64.0
        )
        .unwrap();
    }
}

fn plot(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.txt");
    write_log(&log, 300_000);
    let mut group = c.benchmark_group("plot_300k_points");
    group.sample_size(10);
    for ext in ["png", "svg"] {
        let out = dir.path().join(format!("out.{ext}"));
        group.bench_function(ext, |b| b.iter(|| plot_log_file(&log, "bench", &out).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, plot);
criterion_main!(benches);
