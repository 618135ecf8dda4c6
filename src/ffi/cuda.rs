//! The CUDA caching allocator (`csrc/cuda.cpp`, `csrc/cuda_history.cpp`): counters, blocks,
//! emptying the cache, and its events for the memory history.
use gpu_mem_track_sys as sys;
use sys::copy_table;

use super::{bytes, check};
use crate::error::Result;

/// Counters of the CUDA caching allocator on one device, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CudaStats {
    pub allocated_current: u64,
    pub allocated_peak: u64,
    pub reserved_current: u64,
    /// cudaMalloc failures the allocator retried after releasing its cache.
    pub num_alloc_retries: u64,
}

/// One block of the CUDA caching allocator's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CudaBlock {
    pub segment_address: u64,
    pub segment_size: u64,
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub allocated: bool,
    pub is_large: bool,
}

/// The blocks of a CUDA device's segments, from the caching allocator's own snapshot.
pub(crate) fn cuda_blocks(device: usize) -> Result<Vec<CudaBlock>> {
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    copy_table(|cap| {
        let mut out = vec![sys::gmt_cuda_block::default(); cap];
        let mut n = 0usize;
        // SAFETY: `out` holds `cap` blocks; the shim writes at most `cap` and sets `n`.
        let err = unsafe { sys::gmt_cuda_blocks(device, out.as_mut_ptr(), cap, &mut n) };
        if let Err(e) = check("CUDA allocator segments", err) {
            return (0, Err(e));
        }
        let blocks = out
            .iter()
            .take(n)
            .map(|b| CudaBlock {
                segment_address: b.segment_address,
                segment_size: b.segment_size,
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                allocated: b.allocated != 0,
                is_large: b.is_large != 0,
            })
            .collect();
        (n, Ok(blocks))
    })
}

/// Reports CUDA out-of-memory errors to the handler (once per process).
pub(crate) fn cuda_oom_observer_attach() -> Result<()> {
    // SAFETY: guarded on the C++ side.
    check("CUDA out-of-memory observer", unsafe { sys::gmt_cuda_oom_observer_attach() })
}

/// Number of visible CUDA devices; 0 without CUDA. Never fails.
pub(crate) fn cuda_device_count() -> usize {
    // SAFETY: guarded on the C++ side; never throws.
    unsafe { sys::gmt_cuda_device_count() }.max(0) as usize
}

pub(crate) fn cuda_stats(device: usize, reset_peak: bool) -> Result<CudaStats> {
    let mut out = sys::gmt_cuda_stats::default();
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    // SAFETY: `out` is a valid out-pointer; the shim checks the device index.
    check("CUDA memory stats", unsafe { sys::gmt_cuda_stats_read(device, reset_peak as i32, &mut out) })?;
    Ok(CudaStats {
        allocated_current: bytes(out.allocated_current),
        allocated_peak: bytes(out.allocated_peak),
        reserved_current: bytes(out.reserved_current),
        num_alloc_retries: bytes(out.num_alloc_retries),
    })
}

/// The driver's free memory on a device (`cudaMemGetInfo`); `None` where libtorch (before 2.10)
/// cannot read it. A call into the driver.
pub(crate) fn cuda_device_free(device: usize) -> Result<Option<u64>> {
    let mut free = -1i64;
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    // SAFETY: a valid out-pointer; the shim checks the device index.
    check("CUDA free memory", unsafe { sys::gmt_cuda_device_free(device, &mut free) })?;
    Ok(u64::try_from(free).ok())
}

pub(crate) fn cuda_empty_cache() -> Result<()> {
    // SAFETY: guarded on the C++ side.
    check("CUDA empty_cache", unsafe { sys::gmt_cuda_empty_cache() })
}

/// Whether this build can hook the CUDA caching allocator (it had the CUDA headers).
pub(crate) fn cuda_history_compiled() -> bool {
    // SAFETY: returns a constant.
    unsafe { sys::gmt_cuda_history_compiled() != 0 }
}

/// Reports the CUDA caching allocator's events of `device` to the recorder from now on.
pub(crate) fn cuda_history_attach(device: usize) -> Result<()> {
    let device = i32::try_from(device).unwrap_or(i32::MAX);
    // SAFETY: validates the device and installs the hook once; errors come back as strings.
    check("record CUDA history", unsafe { sys::gmt_cuda_history_attach(device) })
}

/// Stops reporting CUDA allocator events (the hook stays installed and filters them out).
pub(crate) fn cuda_history_detach() {
    // SAFETY: stores an integer.
    unsafe { sys::gmt_cuda_history_detach() }
}
