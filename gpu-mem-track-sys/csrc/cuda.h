// Internal to the shim: CUDA's presence, shared by cuda.cpp (counters) and cuda_history.cpp (hooks).
#pragma once
#include <cstdint>

namespace gmt {
// Throws "CUDA is not available" without CUDA, and names the device when `device` is not one of
// CUDA's. Then runs CUDA's lazy init, which a program's first CUDA op runs: the caching allocator
// creates its per-device state there, and before it refuses every counter ("Invalid device
// argument") and a hook reaches no device. Host-side state, no CUDA context.
void require_cuda(int32_t device);
// The same for what concerns every device (empty_cache, the out-of-memory observer).
void require_cuda_any();

// Before torch 2.9 there is no device-generic allocator (c10::DeviceAllocator): cuda.cpp reads the
// CUDA caching allocator through these, which cuda_history.cpp defines with the c10/cuda headers
// (and, built without them, as errors that say so). `reset_peak`: after the read.
struct CudaCounters {
  int64_t allocated_current, allocated_peak, reserved_current, reserved_peak, active_current;
  int64_t num_alloc_retries, num_ooms;
};
CudaCounters cuda_caching_allocator_counters(int32_t device, bool reset_peak);
void cuda_caching_allocator_empty_cache();
}  // namespace gmt
