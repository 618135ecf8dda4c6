// Internal to the estimator's native code: what its translation units share. The tracker's
// internals it builds on (the recorder, registration) come from gpu-mem-track-sys's headers.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "estimate.h"

namespace gmt {
// Norm and attention statistics are kept in float for reduced-precision inputs, as the real
// kernels do.
inline c10::TensorOptions stats_options(const at::Tensor& x) {
  const auto t = x.scalar_type();
  return x.options().dtype(t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t);
}

// Registers the meta-via-CPU kernel for every op without a Meta kernel (meta_kernels.cpp); once.
void meta_fallback_install();
// Called by whatever runs on meta, so that the linker keeps meta_kernels.cpp's object (and its
// kernel registrations) when the library is linked statically.
int meta_kernels_linked();

// Bytes of the distinct storages among `ts` (tch_steps.cpp).
int64_t unique_storage_bytes(const std::vector<at::Tensor>& ts);

// One optimizer's state, updated with the multi-tensor (foreach) kernels PyTorch uses by default
// on CUDA, so the temporaries (one parameter-sized set for Adam's denominator) are the same
// (tch_steps.cpp). For TorchScript runs and tch steps alike.
struct OptimizerState {
  int32_t kind = GMT_OPT_NONE;
  int64_t step = 0;
  std::vector<at::Tensor> a, b;  // momentum buffers / exp_avg, exp_avg_sq

  // One step over the parameters that have a gradient.
  void update(const std::vector<at::Tensor>& params);
  // Bytes of the state (the moments; not the parameters).
  int64_t bytes() const;
};

// A model loaded for an estimate: its parameters and buffers, and its forward on one input (which
// keeps whatever the model needs alive).
struct LoadedModel {
  std::vector<at::Tensor> params, buffers;
  std::function<c10::IValue(const at::Tensor&)> forward;
};
// Loads the model on `device`, floating parameters and buffers in `dtype`, with the recorder on
// (phase load).
using ModelLoader = std::function<LoadedModel(const c10::Device& device, c10::ScalarType dtype)>;
// The run every model file gets (torchscript.cpp): recorder on, load, "the CPU means meta" on meta,
// the input, then `options->iterations` forward / backward (the sum of every output tensor) /
// optimizer steps, or one forward without grad.
void run_estimate(const gmt_estimate_options* options, const ModelLoader& load, gmt_estimate_result* out);
}  // namespace gmt
