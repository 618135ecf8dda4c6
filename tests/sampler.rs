//! The background sampler sees a peak that lives and dies between two track points, and its
//! thread stops within one interval when the tracker is dropped.
use std::time::{Duration, Instant};

use gpu_mem_track::{track, MemTracker, TrackedDevice};
use tch::{Device, Kind, Tensor};

fn sampler_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == &gpu_mem_track::sampler::THREAD_NAME[..15])
        .count()
}

#[test]
fn sampler_catches_the_peak_between_two_lines() {
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(dir.path())
        .sample_every(Duration::from_millis(1))
        .build()
        .unwrap();
    let before = track!(t).unwrap().allocator.allocated;
    // 8 MiB. Hundreds of samples while it lives on an idle machine; on a loaded 2-core one (CI builds
    // and tests side by side) the sampler thread may wait tens of ms for a core, so it lives long
    // enough for a few scheduling rounds.
    let temp = Tensor::zeros([2048, 1024], (Kind::Float, Device::Cpu));
    std::thread::sleep(Duration::from_millis(300));
    drop(temp);
    let p = track!(t).unwrap();
    let sampled = p.sampled.expect("sampling is on");
    assert!(sampled.samples >= 3, "{sampled:?}");
    assert_eq!(sampled.allocated, Some(before + 8 * 1024 * 1024));
    assert_eq!(p.allocator.allocated, before, "the temporary is gone at the line");
    assert_eq!(p.allocator.peak_since_previous, before + 8 * 1024 * 1024, "the allocator's own peak agrees");
    // No GPU here: NVML fields stay out of the sample and the log.
    assert_eq!(sampled.nvml_process_used, None);
    // The next window starts fresh (and gets its samples, however loaded the machine).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(track!(t).unwrap().sampled.unwrap().allocated, Some(before));
}

#[test]
fn sampler_thread_stops_within_one_interval_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let interval = Duration::from_secs(10);
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(dir.path())
        .sample_every(interval)
        .build()
        .unwrap();
    // The thread names itself once it runs.
    let deadline = Instant::now() + Duration::from_secs(5);
    while sampler_threads() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(sampler_threads(), 1);
    let start = Instant::now();
    drop(t);
    assert!(start.elapsed() < interval, "drop waited {:?}", start.elapsed());
    assert_eq!(sampler_threads(), 0, "the thread was joined");
}

#[test]
fn no_sampler_no_thread_no_field() {
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir.path()).build().unwrap();
    assert_eq!(sampler_threads(), 0);
    assert!(track!(t).unwrap().sampled.is_none());
}
