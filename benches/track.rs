//! Latency of one `track()` (registry walk + group + diff + one log write) as the number of live
//! tensors grows. Target: under 0.2 ms at 10 000 live tensors and under 2 ms at 100 000.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_mem_track::{MemTracker, Site, TrackedDevice};
use std::time::Duration;
use tch::{Device, Kind, Tensor};

fn live_tensors(n: usize) -> Vec<Tensor> {
    // A training-like mix: 16 shapes, some views sharing storage.
    (0..n)
        .map(|i| {
            let base = Tensor::zeros([(i % 16) as i64 + 1, 4], (Kind::Float, Device::Cpu));
            if i % 4 == 0 {
                base.view([-1])
            } else {
                base
            }
        })
        .collect()
}

fn track_latency(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let tracker = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir.path()).build().unwrap();
    let site = Site::new(file!(), line!(), "bench::track_latency");
    let mut group = c.benchmark_group("track");
    group.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4)).sample_size(30);
    for n in [100usize, 1_000, 10_000, 100_000] {
        let tensors = live_tensors(n);
        tracker.track_at(&site).unwrap(); // the first block lists every group; later ones are steady
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("live_tensors", n), &n, |b, _| {
            b.iter(|| tracker.track_at(&site).unwrap())
        });
        drop(tensors);
        tracker.track_at(&site).unwrap();
    }
    group.finish();
}

criterion_group!(benches, track_latency);
criterion_main!(benches);
