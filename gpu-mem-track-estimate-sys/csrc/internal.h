// Internal to the estimator's native code: what its translation units share. The tracker's
// internals it builds on (the recorder, registration) come from gpu-mem-track-sys's headers.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "estimate.h"

namespace c10 {
class OperatorHandle;
}

namespace gmt {
// The failures a caller tells apart (gmt_failure), thrown as types so that no one reads their text.
// The file is not a model this can run (cannot be loaded, a forward of another form), or its
// forward rejects the input.
struct ModelRejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// An op reached the meta device with no kernel there: no Meta or composite kernel of its own, nor
// the meta-via-CPU fallback's.
struct NoMetaKernel : std::runtime_error {
  NoMetaKernel(std::string op_name, const std::string& what) : std::runtime_error(what), op(std::move(op_name)) {}
  std::string op;
};

inline void set_failure(gmt_estimate_result* out, int32_t kind, const std::string& op) {
  if (!out) return;
  out->failure = kind;
  const size_t n = std::min(op.size(), sizeof(out->failed_op) - 1);
  std::memcpy(out->failed_op, op.data(), n);
  out->failed_op[n] = '\0';
}
inline void set_failure(gmt_static_result* out, int32_t kind, const std::string&) {
  if (out) out->failure = kind;
}
}  // namespace gmt

// GMT_TRY for a call with a result struct: a ModelRejected or NoMetaKernel also writes its kind
// (and op) into `*out`, which may be null.
#define GMT_TRY_RUN(out, ...)                                             \
  try {                                                                   \
    __VA_ARGS__;                                                          \
    return nullptr;                                                       \
  } catch (const gmt::NoMetaKernel& e) {                                  \
    gmt::set_failure(out, GMT_FAILURE_NO_META_KERNEL, e.op);              \
    return gmt::dup_string(e.what());                                     \
  } catch (const gmt::ModelRejected& e) {                                 \
    gmt::set_failure(out, GMT_FAILURE_MODEL, std::string());              \
    return gmt::dup_string(e.what());                                     \
  } catch (const c10::Error& e) {                                         \
    return gmt::dup_string(e.what_without_backtrace());                   \
  } catch (const std::exception& e) {                                     \
    return gmt::dup_string(e.what());                                     \
  } catch (...) {                                                         \
    return gmt::dup_string("unknown C++ exception");                      \
  }

namespace gmt {
// Whether the op can run on meta as it is: a Meta kernel (the meta-via-CPU fallback's included,
// once installed) or a composite one.
bool has_meta_kernel(const c10::OperatorHandle& op);
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
  // The first op the forward calls with no kernel on meta (has_meta_kernel), or "": asked when the
  // forward fails with libtorch's NotImplementedError on meta. Unset: the forward throws
  // NoMetaKernel itself.
  std::function<std::string()> op_without_meta_kernel;
};
// Loads the model on `device`, floating parameters and buffers in `dtype`, with the recorder on
// (phase load).
using ModelLoader = std::function<LoadedModel(const c10::Device& device, c10::ScalarType dtype)>;
// The run every model file gets (torchscript.cpp): recorder on, load, "the CPU means meta" on meta,
// the input, then `options->iterations` forward / backward (the sum of every output tensor) /
// optimizer steps, or one forward without grad.
void run_estimate(const gmt_estimate_options* options, const ModelLoader& load, gmt_estimate_result* out);
}  // namespace gmt
