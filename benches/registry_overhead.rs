//! Per-op overhead of the live-tensor registry (and the wrapped CPU allocator) on two training
//! loops (`common/mod.rs`): a tiny 3-layer MLP (64 wide, batch 32: ~1 µs per op, the worst case)
//! and the demo's small CNN (batch 32, 28x28 images). Each step is forward + backward + optimizer
//! step. `registry_own_work` tells the registry's own part of it apart.
//! Target: under 25 % slower than the same loop without gpu-mem-track.
//!
//! The baselines run first, before anything is installed in this process. The number of op
//! callbacks per step is printed so the overhead can be read per op.
//!
//! The `two_threads` rows are CUDA's pattern on the CPU: CUDA autograd runs a device's backward
//! pass on a thread of its own, so the registry is used by the forward's thread and the
//! backward's in turn. Here the backward runs on a second thread, the forward and the optimizer
//! step on the caller's, for the same loops.
use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;

mod common;
use common::{BackwardThread, Loop};

fn overhead(c: &mut Criterion) {
    tch::set_num_threads(1);
    let mut group = c.benchmark_group("training_step");
    group.warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(6)).sample_size(30);
    let backward = BackwardThread::start();
    for make in [Loop::mlp, Loop::cnn] {
        let mut plain = make();
        group.bench_function(format!("{}/without_gpu_mem_track", plain.name), |b| b.iter(|| plain.step()));
        group.bench_function(format!("{}/two_threads/without_gpu_mem_track", plain.name), |b| {
            b.iter(|| plain.step_two_threads(&backward))
        });
    }
    gpu_mem_track::install().unwrap();
    for make in [Loop::mlp, Loop::cnn] {
        let mut tracked = make();
        let before = gpu_mem_track::registry_callbacks();
        tracked.step();
        let per_step = gpu_mem_track::registry_callbacks() - before;
        eprintln!("{}: {per_step} op callbacks per step", tracked.name);
        group.bench_function(format!("{}/with_registry_and_allocator", tracked.name), |b| {
            b.iter(|| tracked.step())
        });
        group.bench_function(format!("{}/two_threads/with_registry_and_allocator", tracked.name), |b| {
            b.iter(|| tracked.step_two_threads(&backward))
        });
        gpu_mem_track::set_registry_enabled(false).unwrap();
        group.bench_function(format!("{}/registry_paused", tracked.name), |b| b.iter(|| tracked.step()));
        gpu_mem_track::set_registry_enabled(true).unwrap();
    }
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
