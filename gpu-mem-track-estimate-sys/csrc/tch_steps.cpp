// tch models: parameters moved to the meta device in place, inputs made on it, gradients
// dropped, and the optimizers (driven from Rust here, from torchscript.cpp for TorchScript runs).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <new>
#include <stdexcept>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common.h"
#include "internal.h"
#include "recorder.h"

namespace gmt {
int64_t unique_storage_bytes(const std::vector<at::Tensor>& ts) {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& t : ts)
    if (t.defined() && t.has_storage() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
      total += static_cast<int64_t>(t.storage().nbytes());
  return total;
}

void OptimizerState::update(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  // What the step makes is optimizer state to the registry, as in MemTracker::optimizer_step:
  // the estimate's live tensors at a peak then say so.
  struct StepMark {
    StepMark() { gmt_registry_optimizer_step(1); }
    ~StepMark() { gmt_registry_optimizer_step(0); }
  } mark;
  std::vector<at::Tensor> ps, gs;
  for (const auto& p : params)
    if (p.grad().defined()) {
      ps.push_back(p);
      gs.push_back(p.grad());
    }
  if (ps.empty()) return;
  const double lr = 1e-3;
  ++step;
  switch (kind) {
    case GMT_OPT_SGD:
      at::_foreach_add_(ps, gs, -lr);
      break;
    case GMT_OPT_SGD_MOMENTUM:
      if (a.empty()) {
        for (const auto& g : gs) a.push_back(g.clone());
      } else {
        at::_foreach_mul_(a, 0.9);
        at::_foreach_add_(a, gs);
      }
      at::_foreach_add_(ps, a, -lr);
      break;
    case GMT_OPT_ADAM:
    case GMT_OPT_ADAMW: {
      if (a.empty()) {
        for (const auto& p : ps) {
          a.push_back(at::zeros_like(p));
          b.push_back(at::zeros_like(p));
        }
      }
      const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
      if (kind == GMT_OPT_ADAMW) at::_foreach_mul_(ps, 1.0 - lr * 0.01);
      at::_foreach_lerp_(a, gs, 1.0 - b1);
      at::_foreach_mul_(b, b2);
      at::_foreach_addcmul_(b, gs, gs, 1.0 - b2);
      const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
      auto denom = at::_foreach_sqrt(b);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, eps);
      at::_foreach_addcdiv_(ps, a, denom, -lr / bc1);
      break;
    }
    default:
      break;
  }
}

int64_t OptimizerState::bytes() const {
  std::vector<at::Tensor> all(a);
  all.insert(all.end(), b.begin(), b.end());
  return unique_storage_bytes(all);
}
}  // namespace gmt

namespace {
at::Tensor& tensor_ref(void* t) {
  if (!t) throw std::invalid_argument("null tensor pointer");
  return *static_cast<at::Tensor*>(t);
}
}  // namespace

extern "C" {

gmt_error gmt_tensor_to_device_in_place(void* tensor, int32_t device_kind, int32_t dtype) {
  GMT_TRY({
    at::Tensor& t = tensor_ref(tensor);
    const bool meta = device_kind == GMT_DEV_META;
    if (meta) (void)gmt::meta_kernels_linked();
    const c10::Device device(meta ? c10::DeviceType::Meta : c10::DeviceType::CPU);
    at::NoGradGuard no_grad;
    const auto target = dtype >= 0 && t.is_floating_point() ? static_cast<c10::ScalarType>(dtype) : t.scalar_type();
    // set_data keeps the variable (and every handle tch holds on it) and swaps its storage; the
    // meta kernel of _has_compatible_shallow_copy_type lets a CPU variable take meta data.
    t.set_data(t.to(device, target));
  })
}

gmt_error gmt_tag_parameter_tensor(const void* tensor) {
  GMT_TRY({
    const auto& t = *static_cast<const at::Tensor*>(tensor);
    if (t.defined() && t.has_storage()) gmt::tag_parameter(gmt::allocation_id(t.storage().unsafeGetStorageImpl()));
  })
}

gmt_error gmt_make_tensor(const int64_t* shape, int32_t ndim, int32_t dtype, int32_t device_kind, void** out) {
  GMT_TRY({
    const c10::Device device(device_kind == GMT_DEV_META ? c10::DeviceType::Meta : c10::DeviceType::CPU);
    const auto type = static_cast<c10::ScalarType>(dtype);
    const std::vector<int64_t> sizes(shape, shape + ndim);
    auto opts = at::TensorOptions().device(device).dtype(type);
    at::Tensor t = c10::isFloatingType(type) ? at::rand(sizes, opts) : at::zeros(sizes, opts);
    *out = new at::Tensor(std::move(t));  // owned by tch::Tensor::from_ptr on the Rust side
  })
}

void* gmt_optimizer_new(int32_t kind) {
  auto* o = new (std::nothrow) gmt::OptimizerState();
  if (o) o->kind = kind;
  return o;
}

gmt_error gmt_optimizer_step(void* optimizer, const void* const* params, size_t n) {
  GMT_TRY({
    if (!optimizer) throw std::invalid_argument("null optimizer");
    std::vector<at::Tensor> ps;
    for (size_t i = 0; i < n; ++i) ps.push_back(*static_cast<const at::Tensor*>(params[i]));
    static_cast<gmt::OptimizerState*>(optimizer)->update(ps);
  })
}

int64_t gmt_optimizer_state_bytes(void* optimizer) {
  return optimizer ? static_cast<gmt::OptimizerState*>(optimizer)->bytes() : 0;
}

void gmt_optimizer_free(void* optimizer) { delete static_cast<gmt::OptimizerState*>(optimizer); }

gmt_error gmt_grads_set_to_none(const void* const* params, size_t n, int64_t* grad_bytes) {
  GMT_TRY({
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < n; ++i) {
      at::Tensor p = *static_cast<const at::Tensor*>(params[i]);
      grads.push_back(p.grad());
    }
    if (grad_bytes) *grad_bytes = gmt::unique_storage_bytes(grads);
    for (size_t i = 0; i < n; ++i) {
      at::Tensor p = *static_cast<const at::Tensor*>(params[i]);
      p.mutable_grad() = at::Tensor();
    }
  })
}

}  // extern "C"
