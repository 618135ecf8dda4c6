// Memory saved for backward: while a capture is active on a thread, autograd's default
// saved-variable hooks (through an Engine subclass installed as the default engine) see every
// tensor an op saves for backward, with the op that saved it. Outside a capture the hooks are
// absent, so autograd behaves exactly as without gpu-mem-track. Inside one, the hooks keep
// PyTorch's check that a saved tensor was not modified in place.
#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common.h"
#include "recorder.h"

namespace {
using torch::autograd::Engine;
using torch::autograd::SavedVariableHooks;

struct SavedStorage {
  int64_t nbytes;
  std::string op;
  int64_t refs;
};

struct Capture {
  std::mutex mu;
  std::unordered_map<const c10::StorageImpl*, SavedStorage> storages;
  std::unordered_set<const c10::StorageImpl*> excluded;
  int64_t parameter_bytes = 0;
  std::unordered_set<const c10::StorageImpl*> parameters;
  int64_t packed = 0;
};

Capture& capture() {
  static Capture* c = new Capture();  // leaked: hooks may be destroyed during exit
  return *c;
}

thread_local bool t_capturing = false;
// A memory history is recording: tag saved tensors' allocations as activations (any thread).
std::atomic<bool> g_history_saved{false};

struct TrackingHooks final : SavedVariableHooks {
  at::Tensor saved;
  uint32_t version = 0;
  const c10::StorageImpl* storage = nullptr;

  void call_pack_hook(const at::Tensor& x) override {
    // What autograd's SavedVariable keeps without hooks (saved_variable.cpp), so that the live
    // tensors, and the log, are the same whether or not a history records: the tensor itself,
    // unless it is an output of the node being built (its grad_fn is the last node this thread
    // made), where that would be a reference cycle; then an alias of the same storage and version
    // counter without autograd metadata, made without dispatching an op (`detach()` would be one,
    // and the registry would log its result as a tensor of the program).
    const auto& fn = x.grad_fn();
    const bool output_of_this_node = fn && fn->sequence_nr() + 1 == at::sequence_number::peek();
    saved = output_of_this_node ? x.tensor_data() : x;
    version = x._version();
    if (!saved.has_storage()) return;
    const c10::StorageImpl* s = saved.storage().unsafeGetStorageImpl();
    // A parameter, or a view of one (linear saves weight.t()): it lives anyway.
    const at::TensorBase root = x.is_view() ? x._base() : static_cast<const at::TensorBase&>(x);
    const bool parameter = root.is_leaf() && root.requires_grad();
    if (!parameter) gmt::tag_allocation(gmt::allocation_id(s), GMT_CAT_ACTIVATION);  // history categories
    if (!t_capturing) return;
    Capture& c = capture();
    std::lock_guard<std::mutex> lock(c.mu);
    ++c.packed;
    if (parameter) {
      if (c.parameters.insert(s).second) c.parameter_bytes += static_cast<int64_t>(saved.storage().nbytes());
      return;
    }
    if (c.excluded.count(s)) return;
    auto it = c.storages.find(s);
    if (it == c.storages.end()) {
      c.storages.emplace(s, SavedStorage{static_cast<int64_t>(saved.storage().nbytes()), gmt::current_op_name(), 1});
    } else {
      ++it->second.refs;
    }
    storage = s;
  }

  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(saved._version() == version,
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                "saved at version ",
                version, ", now at version ", saved._version(),
                " (detected by gpu-mem-track's saved-tensor hooks, as autograd would)");
    return saved;
  }

  ~TrackingHooks() override {
    if (!storage) return;
    Capture& c = capture();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.storages.find(storage);
    if (it != c.storages.end() && --it->second.refs == 0) c.storages.erase(it);
  }
};

struct TrackingEngine final : Engine {
  std::unique_ptr<SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (t_capturing || g_history_saved.load(std::memory_order_relaxed)) return std::make_unique<TrackingHooks>();
    return Engine::get_default_saved_variable_hooks();
  }
};

Engine& tracking_engine() {
  static TrackingEngine* e = new TrackingEngine();
  return *e;
}
std::once_flag g_engine_once;
}  // namespace

extern "C" {

gmt_error gmt_saved_history(int enabled) {
  GMT_TRY({
    std::call_once(g_engine_once, [] { torch::autograd::set_default_engine_stub(&tracking_engine); });
    g_history_saved.store(enabled != 0);
  })
}

gmt_error gmt_saved_capture_begin(const void* const* excluded, size_t n_excluded) {
  GMT_TRY({
    std::call_once(g_engine_once, [] { torch::autograd::set_default_engine_stub(&tracking_engine); });
    Capture& c = capture();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (t_capturing) throw std::runtime_error("memory_for_backward captures cannot be nested");
      c.storages.clear();
      c.excluded.clear();
      c.parameters.clear();
      c.parameter_bytes = 0;
      c.packed = 0;
      for (size_t i = 0; i < n_excluded; ++i) {
        const auto* t = static_cast<const at::Tensor*>(excluded[i]);
        if (t && t->defined() && t->has_storage()) c.excluded.insert(t->storage().unsafeGetStorageImpl());
      }
    }
    gmt::op_names_acquire();
    t_capturing = true;
  })
}

void gmt_saved_capture_end(void) {
  if (!t_capturing) return;
  t_capturing = false;
  gmt::op_names_release();
}

// Saved storages still alive, one entry each: (bytes, op). Returns the count; fills up to `cap`.
size_t gmt_saved_entries(int64_t* bytes, const char** ops, size_t cap) {
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mu);
  size_t i = 0;
  for (const auto& kv : c.storages) {
    if (i < cap) {
      bytes[i] = kv.second.nbytes;
      ops[i] = kv.second.op.c_str();  // valid until the next capture begins
    }
    ++i;
  }
  return c.storages.size();
}

int64_t gmt_saved_parameter_bytes(void) {
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.parameter_bytes;
}

int64_t gmt_saved_packed(void) {
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.packed;
}

}  // extern "C"
