// Keeps libtorch_cuda a dependency of every binary that links the shim. Nothing calls into it
// directly (it registers the CUDA backend when loaded), so the linker's --as-needed would drop it
// and CUDA would be silently unavailable. A referenced symbol makes the dependency real; unlike
// link arguments, this reaches binaries of crates that depend on gpu-mem-track.
#include "shim.h"

#ifdef GMT_HAVE_TORCH_CUDA
// Declared by hand to keep torch and CUDA headers out of this file: a non-template function's
// mangled name does not include its return type. Defined in libtorch_cuda.so
// (ATen/cuda/CUDAContextLight.h).
namespace at::cuda {
int warp_size();
}
#endif

extern "C" int gmt_torch_cuda_linked(void) {
#ifdef GMT_HAVE_TORCH_CUDA
  // Only the address is taken (never called: there may be no GPU); the volatile keeps the
  // reference from being folded away.
  int (*volatile keep)() = &at::cuda::warp_size;
  return keep != nullptr;
#else
  return 0;
#endif
}
