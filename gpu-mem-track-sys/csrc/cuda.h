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
}  // namespace gmt
