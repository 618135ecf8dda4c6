// CUDA allocation history through the caching allocator's trace hooks (attachAllocatorTraceTracker):
// every block handed out or returned and every segment cudaMalloc'd or released is reported to the
// allocation recorder. Needs the c10/cuda headers, which include the CUDA runtime headers; build.rs
// defines GMT_HAVE_CUDA_HEADERS only when those and libc10_cuda are present. Otherwise the calls
// report that this build cannot record CUDA history.
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common.h"
#include "cuda.h"
#include "oom.h"
#include "recorder.h"

#ifdef GMT_HAVE_CUDA_HEADERS
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/version.h>

namespace {
// TraceEntry moved from the CUDA allocator to the device-generic one in 2.11.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
using TraceEntry = c10::CachingDeviceAllocator::TraceEntry;
#else
using TraceEntry = c10::cuda::CUDACachingAllocator::TraceEntry;
#endif

// Device whose events are recorded; -1 = none. The hook cannot be detached, so it stays installed
// and filters on this.
std::atomic<int32_t> g_device{-1};
std::once_flag g_attach_once;
std::once_flag g_oom_once;

// Called by the caching allocator after it released its lock (CUDACachingAllocator.cpp unlocks
// before running observers), so the report may read the allocator's stats.
void on_oom(int64_t device, size_t requested, size_t device_total, size_t device_free) {
  gmt::report_oom(GMT_DEV_CUDA, static_cast<int32_t>(device), static_cast<int64_t>(requested),
                  static_cast<int64_t>(device_total), static_cast<int64_t>(device_free));
}

void on_trace(const TraceEntry& te) {
  // Called under the allocator's lock: only the recorder (no PyTorch calls) may run here.
  if (te.device_ != g_device.load(std::memory_order_relaxed)) return;
  using A = TraceEntry::Action;
  const auto addr = static_cast<int64_t>(te.addr_);
  const auto size = static_cast<int64_t>(te.size_);
  switch (te.action_) {
    case A::ALLOC:
      gmt::record_alloc(GMT_DEV_CUDA, addr, size);
      break;
    case A::FREE_COMPLETED:  // FREE_REQUESTED precedes it; memory is reusable only now
      gmt::record_free_sized(GMT_DEV_CUDA, addr, size);
      break;
    case A::SEGMENT_ALLOC:
    case A::SEGMENT_MAP:
      gmt::record_segment(GMT_DEV_CUDA, addr, size, true);
      break;
    case A::SEGMENT_FREE:
    case A::SEGMENT_UNMAP:
      gmt::record_segment(GMT_DEV_CUDA, addr, size, false);
      break;
    case A::OOM:  // addr_ holds the device's free bytes, as in PyTorch's own trace
      gmt::record_oom(GMT_DEV_CUDA, size, addr);
      break;
    default:
      break;
  }
}
}  // namespace

extern "C" {
int gmt_cuda_history_compiled(void) { return 1; }

gmt_error gmt_cuda_history_attach(int32_t device) {
  GMT_TRY({
    gmt::require_cuda(device);
    std::call_once(g_attach_once, [] { c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&on_trace); });
    g_device.store(device);
  })
}

void gmt_cuda_history_detach(void) { g_device.store(-1); }

gmt_error gmt_cuda_blocks(int32_t device, gmt_cuda_block* out, size_t cap, size_t* count) {
  GMT_TRY({
    // Not gmt::require_cuda: that initialises CUDA, and blocks exist only once CUDA has run (this
    // is read on the way out of an out-of-memory error), so only whether CUDA is there is asked.
    if (!at::detail::getCUDAHooks().hasCUDA())
      throw std::runtime_error("CUDA is not available (no GPU, driver or libtorch_cuda)");
    // The allocator's own snapshot (what torch.cuda.memory_snapshot() reads); it takes the
    // allocator's lock, which an out-of-memory observer runs without.
    const auto info = c10::cuda::CUDACachingAllocator::snapshot();
    size_t n = 0;
    for (const auto& seg : info.segments) {
      if (seg.device != device) continue;
      uint64_t addr = seg.address;
      for (const auto& b : seg.blocks) {
        if (out && n < cap) {
          out[n] = gmt_cuda_block{seg.address, seg.total_size, addr, b.size, b.requested_size, b.allocated ? 1 : 0,
                                  seg.is_large ? 1 : 0};
        }
        addr += b.size;
        ++n;
      }
    }
    if (count) *count = n;
  })
}

gmt_error gmt_cuda_oom_observer_attach(void) {
  GMT_TRY({
    gmt::require_cuda_any();
    std::call_once(g_oom_once, [] { c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver(&on_oom); });
  })
}
}  // extern "C"

namespace gmt {
CudaCounters cuda_caching_allocator_counters(int32_t device, bool reset_peak) {
  require_cuda(device);
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const auto stats = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const CudaCounters c{stats.allocated_bytes[agg].current,  stats.allocated_bytes[agg].peak,
                       stats.reserved_bytes[agg].current,   stats.reserved_bytes[agg].peak,
                       stats.active_bytes[agg].current,     static_cast<int64_t>(stats.num_alloc_retries),
                       static_cast<int64_t>(stats.num_ooms)};
  if (reset_peak) alloc::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  return c;
}

void cuda_caching_allocator_empty_cache() {
  require_cuda_any();
  c10::cuda::CUDACachingAllocator::emptyCache();
}
}  // namespace gmt

#else  // no CUDA headers at build time

extern "C" {
int gmt_cuda_history_compiled(void) { return 0; }

gmt_error gmt_cuda_history_attach(int32_t) {
  GMT_TRY({
    throw std::runtime_error(
        "this build has no CUDA allocator hooks (the CUDA runtime headers or libc10_cuda were missing when "
        "gpu-mem-track-sys was compiled)");
  })
}

void gmt_cuda_history_detach(void) {}

gmt_error gmt_cuda_blocks(int32_t, gmt_cuda_block*, size_t, size_t* count) {
  if (count) *count = 0;
  GMT_TRY({
    throw std::runtime_error(
        "this build cannot read the CUDA allocator's segments (the CUDA runtime headers or libc10_cuda were missing "
        "when gpu-mem-track-sys was compiled)");
  })
}

gmt_error gmt_cuda_oom_observer_attach(void) {
  GMT_TRY({
    throw std::runtime_error(
        "this build cannot observe CUDA out-of-memory errors (the CUDA runtime headers or libc10_cuda were missing "
        "when gpu-mem-track-sys was compiled)");
  })
}
}  // extern "C"

namespace gmt {
CudaCounters cuda_caching_allocator_counters(int32_t device, bool) {
  require_cuda(device);
  throw std::runtime_error(
      "this build cannot read the CUDA allocator's counters: torch before 2.9 has no device-generic allocator, and "
      "the CUDA runtime headers or libc10_cuda were missing when gpu-mem-track-sys was compiled");
}

void cuda_caching_allocator_empty_cache() {
  require_cuda_any();
  throw std::runtime_error(
      "this build cannot empty the CUDA cache: torch before 2.9 has no device-generic allocator, and the CUDA "
      "runtime headers or libc10_cuda were missing when gpu-mem-track-sys was compiled");
}
}  // namespace gmt
#endif
