//! Which device a tracker watches, and the allocator counters it reads there: the wrapped CPU
//! allocator's exact byte count, or the CUDA caching allocator's `allocated`/`reserved`.
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use gpu_mem_track_log::reading_cache::ReadingCache;

use crate::error::{Error, Result};
use crate::ffi;

pub use crate::ffi::DeviceKind;

/// A device whose tensors and allocator a `MemTracker` observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TrackedDevice {
    /// Host memory, through the wrapped CPU allocator.
    Cpu,
    /// A CUDA device by index, through the CUDA caching allocator (and NVML).
    Cuda(usize),
}

impl TrackedDevice {
    /// `cuda:0` when libtorch sees a GPU, else `cpu`.
    pub fn default_for_this_machine() -> Self {
        if cuda_device_count() > 0 {
            TrackedDevice::Cuda(0)
        } else {
            TrackedDevice::Cpu
        }
    }

    /// Checks that this process can observe the device.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] when CUDA is asked for without a usable GPU,
    /// [`Error::NoSuchCudaDevice`] for an index beyond the visible devices.
    pub fn check_available(self) -> Result<()> {
        match self {
            TrackedDevice::Cpu => Ok(()),
            TrackedDevice::Cuda(index) => {
                let count = cuda_device_count();
                if count == 0 {
                    Err(Error::CudaUnavailable {
                        reason: "libtorch sees no CUDA device (no GPU, no driver, or a CPU-only libtorch)"
                            .into(),
                    })
                } else if index >= count {
                    Err(Error::NoSuchCudaDevice { index, count })
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The tch device with the same identity.
    #[cfg(feature = "tch")]
    pub fn to_tch(self) -> tch::Device {
        match self {
            TrackedDevice::Cpu => tch::Device::Cpu,
            TrackedDevice::Cuda(i) => tch::Device::Cuda(i),
        }
    }

    /// The device's tag in log file names: `cpu`, `cuda0`.
    pub fn file_tag(self) -> String {
        match self {
            TrackedDevice::Cpu => "cpu".into(),
            TrackedDevice::Cuda(i) => format!("cuda{i}"),
        }
    }

    /// (shim device kind, index) used to filter registry snapshots.
    pub(crate) fn shim_filter(self) -> (DeviceKind, i32) {
        match self {
            TrackedDevice::Cpu => (DeviceKind::Cpu, -1),
            TrackedDevice::Cuda(i) => (DeviceKind::Cuda, i as i32),
        }
    }
}

impl fmt::Display for TrackedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrackedDevice::Cpu => f.write_str("cpu"),
            TrackedDevice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for TrackedDevice {
    type Err = Error;

    /// Parses `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "cpu" => Ok(TrackedDevice::Cpu),
            "cuda" | "gpu" => Ok(TrackedDevice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|i| i.parse().ok())
                .map(TrackedDevice::Cuda)
                .ok_or_else(|| Error::UnsupportedDevice(s.to_owned())),
        }
    }
}

#[cfg(feature = "tch")]
impl TryFrom<tch::Device> for TrackedDevice {
    type Error = Error;

    fn try_from(d: tch::Device) -> Result<Self> {
        match d {
            tch::Device::Cpu => Ok(TrackedDevice::Cpu),
            tch::Device::Cuda(i) => Ok(TrackedDevice::Cuda(i)),
            other => Err(Error::UnsupportedDevice(format!("{other:?}"))),
        }
    }
}

/// Number of CUDA devices libtorch can use; 0 without CUDA (never fails).
pub fn cuda_device_count() -> usize {
    ffi::cuda_device_count()
}

/// Releases the CUDA caching allocator's unused cached blocks (`torch.cuda.empty_cache()`).
///
/// # Errors
/// [`Error::CudaUnavailable`] when this process has no usable GPU.
pub fn empty_cuda_cache() -> Result<()> {
    if cuda_device_count() == 0 {
        return Err(Error::CudaUnavailable {
            reason: "libtorch sees no CUDA device; there is no cache to empty".into(),
        });
    }
    ffi::cuda_empty_cache()
}

/// What an allocator reports at one track point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocatorReading {
    /// Bytes currently allocated to tensors (CPU: the wrapped allocator; CUDA: `memory_allocated`).
    pub allocated: u64,
    /// Highest `allocated` since the previous reading.
    pub peak_since_previous: u64,
    /// CUDA only: bytes held by the caching allocator (`memory_reserved`).
    pub reserved: Option<u64>,
    /// Free device memory per the driver (CUDA, libtorch 2.10 and later): the headroom. Read again
    /// when `reserved` moved or a second passed, as the NVML reading is.
    pub device_free: Option<u64>,
    /// cudaMalloc failures the caching allocator retried after releasing its cache, since the
    /// process started (CUDA).
    pub alloc_retries: Option<u64>,
}

/// How long a `track!()` reuses a reading of NVML or of the driver's free memory while the
/// caching allocator's reserved memory stays put (see [`ReadingCache`]).
pub(crate) const DEVICE_READING_MAX_AGE: Duration = Duration::from_secs(1);

/// Reads a device's allocator counters; each reading restarts the peak window.
pub(crate) enum AllocatorCounters {
    Cpu(Option<ffi::CpuPeakWindow>),
    /// The device, and its free memory read by the rule NVML is read by.
    Cuda(usize, ReadingCache<Option<u64>>),
}

impl AllocatorCounters {
    pub(crate) fn for_device(device: TrackedDevice) -> Self {
        match device {
            TrackedDevice::Cpu => {
                let window = ffi::CpuPeakWindow::open();
                if window.is_none() {
                    tracing::warn!(target: "gpu_mem_track", "all CPU peak windows are in use; this tracker reports the peak since start");
                }
                AllocatorCounters::Cpu(window)
            }
            TrackedDevice::Cuda(i) => AllocatorCounters::Cuda(i, ReadingCache::new(DEVICE_READING_MAX_AGE)),
        }
    }

    /// Reads the counters; `now` dates the reading for the free-memory cache (the caller's one
    /// clock read serves every cache of a track point).
    pub(crate) fn read(&mut self, now: Instant) -> Result<AllocatorReading> {
        match self {
            AllocatorCounters::Cpu(window) => {
                let s = match window {
                    Some(w) => w.read(true),
                    None => ffi::cpu_allocator_stats(),
                };
                Ok(AllocatorReading {
                    allocated: s.current,
                    peak_since_previous: s.peak,
                    reserved: None,
                    device_free: None,
                    alloc_retries: None,
                })
            }
            AllocatorCounters::Cuda(i, free) => {
                let s = ffi::cuda_stats(*i, true)?;
                let device_free = free.get(Some(s.reserved_current), now, || ffi::cuda_device_free(*i))?;
                Ok(AllocatorReading {
                    allocated: s.allocated_current,
                    peak_since_previous: s.allocated_peak,
                    reserved: Some(s.reserved_current),
                    device_free,
                    alloc_retries: Some(s.num_alloc_retries),
                })
            }
        }
    }
}

/// Exact counters of the wrapped CPU allocator since it was installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuAllocatorStats {
    /// Bytes live now.
    pub current: u64,
    /// Highest `current` since installation.
    pub peak: u64,
    /// Allocations seen.
    pub allocations: u64,
    /// Frees seen.
    pub frees: u64,
}

/// Reads the wrapped CPU allocator, or `None` before `install` ran.
pub fn cpu_allocator_stats() -> Option<CpuAllocatorStats> {
    if !ffi::cpu_allocator_installed() {
        return None;
    }
    let s = ffi::cpu_allocator_stats();
    Some(CpuAllocatorStats {
        current: s.current,
        peak: s.total_peak,
        allocations: s.allocations,
        frees: s.frees,
    })
}
