//! Cost of recording memory history: allocating and freeing a small tensor with recording off,
//! on (ring of 100 000 events), and on with native stacks.
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use gpu_mem_track::history::HistoryOptions;
use gpu_mem_track::{MemTracker, TrackedDevice};
use tch::{Device, Kind, Tensor};

fn history(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let tracker = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir.path()).build().unwrap();
    let mut group = c.benchmark_group("alloc_free_1k_floats");
    group.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4)).sample_size(30);
    let step = || drop(Tensor::zeros([1024], (Kind::Float, Device::Cpu)));
    group.bench_function("history_off", |b| b.iter(step));
    tracker.record_history(100_000).unwrap();
    group.bench_function("history_on", |b| b.iter(step));
    tracker.stop_history().unwrap();
    tracker.record_history_with(HistoryOptions::new(100_000).with_stacks(true)).unwrap();
    group.bench_function("history_with_stacks", |b| b.iter(step));
    tracker.stop_history().unwrap();
    group.finish();
}

criterion_group!(benches, history);
criterion_main!(benches);
