// "The CPU means meta" on the estimating thread. While a meta estimate builds a model and runs its
// step, code that names the CPU (tch's LSTM/GRU make their zero state with the device the model
// was built on; users write `Tensor::zeros(.., (kind, self.device))` in forward) must get meta
// tensors, or the first op that meets both fails ("Input and hidden tensors are not at the same
// device"). Without touching the model:
// - factories asked for the CPU (an explicit `device` argument: tch always passes one) make meta
//   tensors; tch names a meta tensor's device `Mps` (it has no variant for meta), so a device
//   taken from a meta tensor and handed back (`xs.device()`) means meta too;
// - a CPU tensor that reaches an op (one captured before the estimate) is replaced by a meta twin
//   of the same sizes, strides and dtype, as the GPU copy a real run would have made;
// - in TorchScript only, copies to the CPU stay on meta (traced graphs bake in
//   `aten::to(x, device="cpu")`); in tch code a copy to the CPU is there to read values, which a
//   meta tensor has none of, so it fails as it did ("Cannot copy out of meta tensor").
// Left on the CPU: factories with no device (tch's from-data path copies the caller's bytes into
// the new tensor's memory, which a meta tensor has none of) and 0-dim CPU tensors (scalars, which
// every backend's ops accept as they are and whose values `.item()` reads).
//
// The mechanism is a dispatch-key mode: a boxed fallback on TESTING_ONLY_GenericMode, which
// libtorch itself never registers, included in this thread's local dispatch key set only while
// an estimate runs. Every op called on that thread passes through it first; other threads, and
// this one before and after, never do. The fallback excludes its key while it redispatches, as
// PyTorch's own modes do, so ops called inside a kernel (the meta-via-CPU fallback's CPU twins,
// composite ops' pieces) are left alone.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"

namespace {
constexpr c10::DispatchKey kModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

struct ThreadMode {
  int depth = 0;
  bool copies_too = false;  // TorchScript: copies to the CPU stay on meta
  bool was_included = false;
  int64_t made_on_cpu = 0;    // tensors ops returned on the CPU (from-data, no device given)
  int64_t moved_to_meta = 0;  // CPU tensors replaced by meta twins where an op met them
  std::vector<std::string> examples;
};
thread_local ThreadMode t_mode;

void note(const char* what, const c10::OperatorHandle& op, const at::Tensor& t) {
  if (t_mode.examples.size() >= 8) return;
  std::ostringstream s;
  s << what << " " << op.schema().name() << " " << t.sizes() << " " << t.scalar_type();
  t_mode.examples.push_back(s.str());
}

bool names_cpu(const c10::Device& d) { return d.is_cpu() || d.type() == c10::DeviceType::MPS; }

// A CPU tensor an op met: its meta twin (0-dim scalars stay as they are).
bool to_meta_twin(c10::IValue& v, const c10::OperatorHandle& op) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !t.is_cpu() || t.dim() == 0) return false;
  note("moved to meta at", op, t);
  at::Tensor twin = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  if (t.requires_grad() && twin.is_floating_point()) twin.requires_grad_(true);
  v = c10::IValue(std::move(twin));
  ++t_mode.moved_to_meta;
  return true;
}

bool replace_cpu_tensors(c10::IValue& v, const c10::OperatorHandle& op) {
  if (v.isTensor()) return to_meta_twin(v, op);
  bool changed = false;
  if (v.isTensorList()) {
    c10::List<at::Tensor> list = v.toTensorList().copy();  // the caller's list stays
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e(list.get(i));
      if (to_meta_twin(e, op)) {
        list.set(i, e.toTensor());
        changed = true;
      }
    }
    if (changed) v = c10::IValue(list);
  } else if (v.isList()) {  // lists of optional tensors
    c10::impl::GenericList list = v.toList().copy();
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e = list.get(i);
      if (to_meta_twin(e, op)) {
        list.set(i, e);
        changed = true;
      }
    }
    if (changed) v = c10::IValue(list);
  }
  return changed;
}

uint64_t backend_bits(const c10::IValue& v) {
  constexpr uint64_t kBackends = static_cast<uint64_t>(c10::full_backend_mask);
  uint64_t bits = 0;
  auto add = [&](const c10::IValue& e) {
    if (e.isTensor() && e.toTensor().defined()) bits |= e.toTensor().key_set().raw_repr() & kBackends;
  };
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (t.defined()) bits |= t.key_set().raw_repr() & kBackends;
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) add(e);
  } else {
    add(v);
  }
  return bits;
}

void cpu_means_meta(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  const size_t base = stack->size() - n;
  bool moved = false;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (args[i].name() == "device" && v.isDevice() && names_cpu(v.toDevice())) {
      // A copy to the CPU (`to`, `_to_copy`) stays a copy outside TorchScript.
      const std::string& name = op.schema().name();
      const bool copy = name == "aten::to" || name == "aten::_to_copy";
      if (!copy || t_mode.copies_too || v.toDevice().type() == c10::DeviceType::MPS) {
        v = c10::IValue(c10::Device(c10::kMeta));
        for (size_t j = 0; j < n; ++j) {  // meta memory cannot be pinned
          if (args[j].name() == "pin_memory" && !(*stack)[base + j].isNone()) (*stack)[base + j] = c10::IValue(false);
        }
      }
    } else if (replace_cpu_tensors(v, op)) {
      moved = true;
    }
  }
  if (moved) {
    // Only the backends changed (CPU to meta): keep the functionality keys the dispatcher
    // computed, take the backends from the arguments as they are now.
    uint64_t bits = 0;
    for (size_t i = 0; i < n; ++i) bits |= backend_bits((*stack)[base + i]);
    const uint64_t functionality = ks.raw_repr() & ~static_cast<uint64_t>(c10::full_backend_mask);
    ks = c10::DispatchKeySet::from_raw_repr(functionality | bits);
  }
  {
    c10::impl::ExcludeDispatchKeyGuard leave(kModeKey);
    op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kModeKey), stack);
  }
  const size_t nret = op.schema().returns().size();
  for (size_t r = stack->size() - nret; r < stack->size(); ++r) {
    const c10::IValue& v = (*stack)[r];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu()) {
      note("made on the CPU by", op, v.toTensor());
      ++t_mode.made_on_cpu;
    }
  }
}

std::once_flag g_install_once;
std::unique_ptr<torch::Library> g_mode_lib;
std::string g_install_error;

void install() {
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kModeKey, __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_means_meta>());
    g_mode_lib = std::move(lib);  // kept for the process: dropping it would deregister the fallback
  } catch (const std::exception& e) {
    g_install_error = std::string("cannot make the CPU mean meta during estimates: ") + e.what();
  }
}
}  // namespace

extern "C" {
gmt_error gmt_cpu_means_meta_begin(int32_t copies_too) {
  GMT_TRY({
    std::call_once(g_install_once, install);
    if (!g_mode_lib) throw std::runtime_error(g_install_error);
    if (t_mode.depth++ == 0) {
      t_mode.copies_too = copies_too != 0;
      t_mode.was_included = c10::impl::tls_is_dispatch_key_included(kModeKey);
      c10::impl::tls_set_dispatch_key_included(kModeKey, true);
    }
  })
}

void gmt_cpu_means_meta_end(void) {
  if (t_mode.depth > 0 && --t_mode.depth == 0) c10::impl::tls_set_dispatch_key_included(kModeKey, t_mode.was_included);
}

void gmt_cpu_means_meta_counts(int64_t* made_on_cpu, int64_t* moved_to_meta) {
  if (made_on_cpu) *made_on_cpu = t_mode.made_on_cpu;
  if (moved_to_meta) *moved_to_meta = t_mode.moved_to_meta;
}

char* gmt_cpu_means_meta_examples(void) {
  std::string s;
  for (const auto& e : t_mode.examples) s += e + "\n";
  t_mode.examples.clear();
  return gmt::dup_string(s);
}
}  // extern "C"
