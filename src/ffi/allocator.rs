//! The wrapped CPU allocator (`csrc/allocator.cpp`): counters, peak windows, a limit, the live
//! allocations.
use gpu_mem_track_sys as sys;
use sys::copy_table;

use super::bytes;

/// Counters of the wrapped CPU allocator, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AllocStats {
    /// Live now.
    pub current: u64,
    /// Highest since the window opened or was last reset.
    pub peak: u64,
    /// Highest since installation.
    pub total_peak: u64,
    pub allocations: u64,
    pub frees: u64,
}

/// A peak window on the wrapped CPU allocator: its peak is the highest live byte count since the
/// window was opened or last reset.
pub(crate) struct CpuPeakWindow(i32);

impl CpuPeakWindow {
    /// Opens a window, or `None` when all of them are in use.
    pub(crate) fn open() -> Option<Self> {
        // SAFETY: takes the allocator lock; returns -1 when none is free.
        let w = unsafe { sys::gmt_cpu_allocator_open_window() };
        (w >= 0).then_some(CpuPeakWindow(w))
    }

    pub(crate) fn read(&self, reset_peak: bool) -> AllocStats {
        cpu_allocator_stats_window(self.0, reset_peak)
    }
}

impl Drop for CpuPeakWindow {
    fn drop(&mut self) {
        // SAFETY: closes a window we opened.
        unsafe { sys::gmt_cpu_allocator_close_window(self.0) }
    }
}

fn cpu_allocator_stats_window(window: i32, reset_peak: bool) -> AllocStats {
    let mut out = sys::gmt_alloc_stats::default();
    // SAFETY: `out` is a valid out-pointer; the call takes the allocator lock.
    unsafe { sys::gmt_cpu_allocator_stats(window, reset_peak as i32, &mut out) };
    AllocStats {
        current: bytes(out.current),
        peak: bytes(out.peak),
        total_peak: bytes(out.total_peak),
        allocations: bytes(out.allocations),
        frees: bytes(out.frees),
    }
}

/// Global counters of the wrapped CPU allocator (peak = since installation; zeros before install).
pub(crate) fn cpu_allocator_stats() -> AllocStats {
    cpu_allocator_stats_window(-1, false)
}

/// Sets (or, with `None`, removes) the live-byte limit of the wrapped CPU allocator.
pub(crate) fn cpu_allocator_set_limit(bytes: Option<u64>) {
    let v = bytes.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX));
    // SAFETY: stores an atomic.
    unsafe { sys::gmt_cpu_allocator_set_limit(v) }
}

/// The wrapped CPU allocator's live allocations, `(address, bytes)`, sorted by address.
pub(crate) fn cpu_allocator_live() -> Vec<(u64, u64)> {
    copy_table(|cap| {
        let mut addrs = vec![0i64; cap];
        let mut sizes = vec![0i64; cap];
        // SAFETY: both buffers hold `cap` elements; the shim writes at most `cap` and copies
        // under its lock.
        let n = unsafe { sys::gmt_cpu_allocator_live(addrs.as_mut_ptr(), sizes.as_mut_ptr(), cap) };
        let mut out: Vec<(u64, u64)> =
            addrs.iter().zip(&sizes).take(n).map(|(&a, &s)| (a as u64, bytes(s))).collect();
        out.sort_unstable();
        (n, out)
    })
}

pub(crate) fn cpu_allocator_installed() -> bool {
    // SAFETY: reads a flag.
    unsafe { sys::gmt_cpu_allocator_installed() != 0 }
}
