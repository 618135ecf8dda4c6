//! The registry's own work per op: what its callbacks do, apart from what libtorch does to run
//! them (RecordFunction's per-op state, each op's outputs boxed for the callback), which
//! `registry_overhead`'s rows include.
//!
//! The tiny MLP of `registry_overhead` (173 op callbacks a step, the worst case), on one thread
//! and with its backward on a second thread (CUDA's pattern). Rounds alternate the registry
//! hollow (`gpu_mem_track::set_registry_hollow(true)`: the callbacks stay installed but return at
//! once) and recording, in turn first, so that this machine's drift cancels out. The figure is
//! the median step recording less the median step hollow, per op callback.
//!
//! ```sh
//! scripts/dev bench registry_own_work
//! ```
use std::time::Instant;

#[allow(dead_code)] // the CNN: registry_overhead's
mod common;
use common::{BackwardThread, Loop};

const ROUNDS: usize = 201;
const STEPS: u32 = 20;

/// A step's time hollow and recording (ns): the median of each over the rounds.
fn medians(mut step: impl FnMut() -> f64) -> (f64, f64) {
    let mut timed = |hollow: bool| -> f64 {
        gpu_mem_track::set_registry_hollow(hollow).expect("the registry is installed");
        let started = Instant::now();
        for _ in 0..STEPS {
            std::hint::black_box(step());
        }
        started.elapsed().as_secs_f64() * 1e9 / f64::from(STEPS)
    };
    // Warm-up: the registry's tables, the allocator's caches.
    timed(false);
    timed(true);
    let (mut hollow, mut recording) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            hollow.push(timed(true));
            recording.push(timed(false));
        } else {
            recording.push(timed(false));
            hollow.push(timed(true));
        }
    }
    gpu_mem_track::set_registry_hollow(false).expect("the registry is installed");
    (median(hollow), median(recording))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // Under `cargo test --benches` (which passes no --bench), nothing is measured.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    tch::set_num_threads(1);
    gpu_mem_track::install().expect("gpu-mem-track installs");
    let backward = BackwardThread::start();
    let mut mlp = Loop::mlp();
    let before = gpu_mem_track::registry_callbacks();
    mlp.step();
    let ops = gpu_mem_track::registry_callbacks() - before;
    println!(
        "{}: {ops} op callbacks per step; {ROUNDS} rounds of {STEPS} steps hollow and recording",
        mlp.name
    );
    let one = medians(|| mlp.step());
    let two = medians(|| mlp.step_two_threads(&backward));
    for (threads, (hollow, recording)) in [("one thread", one), ("two threads", two)] {
        println!(
            "registry's own work, {threads}: {:.0} ns per op (a step hollow {:.1} µs, recording {:.1} µs)",
            (recording - hollow) / ops as f64,
            hollow / 1e3,
            recording / 1e3
        );
    }
}
