//! The background sampler: a named thread that polls the allocator and NVML at an interval and
//! keeps the maximum since the last track point, so an `At` line can report a peak that happened
//! between two `track!()` calls. Hand-off is lock-free (atomic maxima), so the training thread
//! never waits on the sampler, and the sampler never does I/O.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::device::TrackedDevice;
use crate::ffi;
use gpu_mem_track_log::nvml::NvmlReader;

/// One reading of the sampled counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Allocator bytes live (CPU: wrapped allocator; CUDA: `memory_allocated`).
    pub allocated: Option<u64>,
    /// This process's usage according to NVML.
    pub nvml_process_used: Option<u64>,
    /// Whole-device usage according to NVML.
    pub nvml_device_used: Option<u64>,
}

/// Maxima of the samples taken since the previous track point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampledPeak {
    /// Samples taken in the window.
    pub samples: u64,
    /// Highest allocator reading.
    pub allocated: Option<u64>,
    /// Highest NVML process reading.
    pub nvml_process_used: Option<u64>,
    /// Highest NVML device reading.
    pub nvml_device_used: Option<u64>,
}

/// Where samples come from.
pub trait SampleSource: Send + 'static {
    /// Reads the counters now.
    fn sample(&mut self) -> Sample;
}

/// The allocator of a device, plus NVML for CUDA devices.
pub(crate) struct DeviceSource {
    device: TrackedDevice,
    nvml: Option<NvmlReader>,
    pid: u32,
}

impl DeviceSource {
    pub(crate) fn new(device: TrackedDevice, nvml: Option<NvmlReader>) -> Self {
        DeviceSource { device, nvml, pid: std::process::id() }
    }
}

impl SampleSource for DeviceSource {
    fn sample(&mut self) -> Sample {
        match self.device {
            TrackedDevice::Cpu => {
                Sample { allocated: Some(ffi::cpu_allocator_stats().current), ..Sample::default() }
            }
            TrackedDevice::Cuda(i) => {
                let allocated = ffi::cuda_stats(i, false).ok().map(|s| s.allocated_current);
                let reading = self.nvml.as_ref().and_then(|n| n.read(i, self.pid).ok());
                Sample {
                    allocated,
                    nvml_process_used: reading.and_then(|r| r.process_used),
                    nvml_device_used: reading.map(|r| r.device_used),
                }
            }
        }
    }
}

/// Atomic maxima; `u64::MAX` never occurs as a byte count, so 0 with `samples == 0` is "none"
/// and each field keeps a separate presence bit.
#[derive(Default)]
struct Peaks {
    samples: AtomicU64,
    present: AtomicU64,
    allocated: AtomicU64,
    nvml_process: AtomicU64,
    nvml_device: AtomicU64,
}

impl Peaks {
    fn record(&self, s: Sample) {
        let mut bits = 0;
        for (i, (value, slot)) in [
            (s.allocated, &self.allocated),
            (s.nvml_process_used, &self.nvml_process),
            (s.nvml_device_used, &self.nvml_device),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(v) = value {
                slot.fetch_max(v, Ordering::Relaxed);
                bits |= 1 << i;
            }
        }
        self.present.fetch_or(bits, Ordering::Relaxed);
        self.samples.fetch_add(1, Ordering::Release);
    }

    fn take(&self) -> SampledPeak {
        let samples = self.samples.swap(0, Ordering::Acquire);
        let present = self.present.swap(0, Ordering::Relaxed);
        let get = |bit: u64, slot: &AtomicU64| {
            let v = slot.swap(0, Ordering::Relaxed);
            (present & bit != 0).then_some(v)
        };
        SampledPeak {
            samples,
            allocated: get(1, &self.allocated),
            nvml_process_used: get(2, &self.nvml_process),
            nvml_device_used: get(4, &self.nvml_device),
        }
    }
}

/// A running sampler thread; stops and joins on drop.
pub struct Sampler {
    peaks: Arc<Peaks>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
    interval: Duration,
}

/// Name of the sampler thread (`/proc/<pid>/task/*/comm` shows its first 15 bytes).
pub const THREAD_NAME: &str = "gpu-mem-track-sampler";

impl Sampler {
    /// Starts sampling `source` every `interval`.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub fn start(mut source: impl SampleSource, interval: Duration) -> std::io::Result<Self> {
        let peaks = Arc::new(Peaks::default());
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (p, s) = (Arc::clone(&peaks), Arc::clone(&stop));
        let handle = std::thread::Builder::new().name(THREAD_NAME.into()).spawn(move || {
            let (lock, cv) = &*s;
            loop {
                p.record(source.sample());
                let mut stopped = lock.lock();
                if !*stopped {
                    cv.wait_for(&mut stopped, interval);
                }
                if *stopped {
                    break;
                }
            }
        })?;
        Ok(Sampler { peaks, stop, handle: Some(handle), interval })
    }

    /// The maxima since the previous call (or the start), and restarts the window.
    pub fn take_peak(&self) -> SampledPeak {
        self.peaks.take()
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock() = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Replay {
        values: Vec<u64>,
        next: Arc<AtomicUsize>,
    }

    impl SampleSource for Replay {
        fn sample(&mut self) -> Sample {
            let i = self.next.fetch_add(1, Ordering::SeqCst);
            Sample { allocated: self.values.get(i).copied(), ..Sample::default() }
        }
    }

    #[test]
    fn peak_is_the_maximum_of_the_window_and_the_window_restarts() {
        let next = Arc::new(AtomicUsize::new(0));
        let source = Replay { values: vec![5, 90, 20], next: Arc::clone(&next) };
        let sampler = Sampler::start(source, Duration::from_millis(1)).unwrap();
        while next.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(5));
        let peak = sampler.take_peak();
        assert_eq!(peak.allocated, Some(90));
        assert!(peak.samples >= 3);
        assert_eq!(peak.nvml_process_used, None);
        drop(sampler);
        let stopped_at = next.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(next.load(Ordering::SeqCst), stopped_at, "no samples after drop");
    }
}
