// CUDA caching-allocator counters and empty_cache through c10's device-generic allocator interface
// (the wheel's c10/cuda headers are unusable). Every call is guarded: without a GPU, or with only
// libtorch_cpu linked, these report "not available" instead of reaching an internal assert.
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <dlfcn.h>
#include <torch/version.h>

#include "common.h"
#include "cuda.h"

// c10::DeviceAllocator, the device-generic caching allocator, arrived in torch 2.9; before it the
// counters come through the CUDA caching allocator (gmt::cuda_caching_allocator_counters).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#define GMT_DEVICE_ALLOCATOR 1
#else
#define GMT_DEVICE_ALLOCATOR 0
#endif

namespace {
int32_t device_count() noexcept {
  try {
    if (!at::detail::getCUDAHooks().hasCUDA()) return 0;
    return static_cast<int32_t>(at::detail::getCUDAHooks().deviceCount());
  } catch (...) {
    return 0;
  }
}

#if GMT_DEVICE_ALLOCATOR
// The CUDA caching allocator, after CUDA's lazy init (gmt::require_cuda), for one device's figures.
c10::DeviceAllocator* cuda_allocator(int32_t device) {
  gmt::require_cuda(device);
  return c10::getDeviceAllocator(c10::DeviceType::CUDA);
}
#endif
}  // namespace

namespace gmt {
namespace {
// `any`: no device in particular.
void require(int32_t device, bool any) {
  const int32_t n = device_count();
  if (n == 0) throw std::runtime_error("CUDA is not available (no GPU, driver or libtorch_cuda)");
  if (!any && (device < 0 || device >= n))
    throw std::out_of_range("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                            " visible)");
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
}
}  // namespace

void require_cuda(int32_t device) { require(device, false); }
void require_cuda_any() { require(0, true); }
}  // namespace gmt

extern "C" {

int32_t gmt_cuda_device_count(void) { return device_count(); }

const char* gmt_libtorch_location(void) {
  // Which libtorch this process really runs on (a bundle built against one install runs on another).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) != 0 && info.dli_fname != nullptr)
    return info.dli_fname;
  return nullptr;
}

gmt_error gmt_cuda_stats_read(int32_t device, int reset_peak, gmt_cuda_stats* out) {
#if !GMT_DEVICE_ALLOCATOR
  GMT_TRY({
    const gmt::CudaCounters c = gmt::cuda_caching_allocator_counters(device, reset_peak != 0);
    if (out) {
      *out = gmt_cuda_stats{c.allocated_current, c.allocated_peak, c.reserved_current, c.reserved_peak,
                            c.active_current,    c.num_alloc_retries, c.num_ooms};
    }
  })
#else
  GMT_TRY({
    c10::DeviceAllocator* alloc = cuda_allocator(device);
    const auto stats = alloc->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    gmt_cuda_stats s{};
    s.allocated_current = stats.allocated_bytes[agg].current;
    s.allocated_peak = stats.allocated_bytes[agg].peak;
    s.reserved_current = stats.reserved_bytes[agg].current;
    s.reserved_peak = stats.reserved_bytes[agg].peak;
    s.active_current = stats.active_bytes[agg].current;
    s.num_alloc_retries = static_cast<int64_t>(stats.num_alloc_retries);
    s.num_ooms = static_cast<int64_t>(stats.num_ooms);
    if (reset_peak) alloc->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    if (out) *out = s;
  })
#endif
}

gmt_error gmt_cuda_device_free(int32_t device, int64_t* free_bytes) {
  GMT_TRY({
    int64_t free_out = -1;  // unknown, never a made-up number
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
    // DeviceAllocator::getMemoryInfo arrived in 2.10; it returns (free, total).
    c10::DeviceAllocator* alloc = cuda_allocator(device);
    free_out = static_cast<int64_t>(alloc->getMemoryInfo(static_cast<c10::DeviceIndex>(device)).first);
#else
    gmt::require_cuda(device);
#endif
    if (free_bytes) *free_bytes = free_out;
  })
}

gmt_error gmt_cuda_empty_cache(void) {
  GMT_TRY({
#if GMT_DEVICE_ALLOCATOR
    gmt::require_cuda_any();
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
#else
    gmt::cuda_caching_allocator_empty_cache();
#endif
  })
}

}  // extern "C"
