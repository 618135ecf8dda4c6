// The live-tensor registry: a global RecordFunction callback remembers every tensor an op returns
// through a weak reference, so a walk can list the tensors still alive without a garbage
// collector walk. Explicit registration covers what ops never return (module parameters). This
// file: the registry itself, registration and the C interface to its names, groups and classes.
// Its store is registry_store.h; its jobs are registry_callback.cpp (filling it),
// registry_walk.cpp (the grouped walk) and registry_records.cpp (the walk that lists each tensor).
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "recorder.h"
#include "registry.h"
#include "registry_store.h"

namespace gmt_registry {
Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: callbacks may fire during exit
  return *r;
}
}  // namespace gmt_registry

using namespace gmt_registry;

namespace gmt {
void register_tensor(const at::Tensor& t, const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.record(t, name.empty() ? -1 : r.intern(name), -1);
}
}  // namespace gmt

namespace {
// The tensor of a TensorImpl the caller holds (Python's `_cdata`), as a new strong reference
// dropped on return: the caller's object keeps the tensor alive.
at::Tensor borrowed_tensor(void* impl) {
  if (!impl) throw std::invalid_argument("null TensorImpl pointer");
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
      static_cast<c10::TensorImpl*>(impl)));
}
}  // namespace

extern "C" {

void gmt_free_string(char* s) { std::free(s); }

gmt_error gmt_registry_register(const void* tensor, const char* name) {
  GMT_TRY({
    if (!tensor) throw std::invalid_argument("null tensor pointer");
    gmt::register_tensor(*static_cast<const at::Tensor*>(tensor), name ? name : "");
  })
}

gmt_error gmt_registry_register_impl(void* impl, const char* name) {
  GMT_TRY({ gmt::register_tensor(borrowed_tensor(impl), name ? name : ""); })
}

gmt_error gmt_registry_register_inductor_buffer(void* impl) {
  GMT_TRY({
    const at::Tensor t = borrowed_tensor(impl);
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.record(t, -1, -1, true, false, /*inductor_buffer=*/true);
  })
}

gmt_error gmt_registry_forget_impl(void* impl) {
  GMT_TRY({
    if (!impl) throw std::invalid_argument("null TensorImpl pointer");
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    // Its weak reference goes with its entry: torch.utils.swap_tensors refuses a tensor anything
    // holds weakly. A name's strong reference is left (named tensors are not swapped).
    if (const uint32_t* i = r.index.find(impl)) r.remove_at(*i);
  })
}

void gmt_registry_tag_allocations(void) {
  if (!gmt_recorder_active()) return;
  std::vector<at::Tensor> named;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (size_t i = 0; i < r.entries.size(); ++i) {
      if (r.origins[i].name_id < 0) continue;
      if (auto impl = r.entries[i].weak.lock()) named.emplace_back(std::move(impl));
    }
  }
  // Outside the registry lock: dropping these references may free memory.
  for (const at::Tensor& t : named) {
    const bool parameter = t.is_leaf() && t.requires_grad();
    gmt_recorder_tag_tensor(&t, parameter ? GMT_CAT_PARAMETER : GMT_CAT_BUFFER);
    if (parameter && t.grad().defined()) {
      const at::Tensor grad = t.grad();
      gmt_recorder_tag_tensor(&grad, GMT_CAT_GRADIENT);
    }
  }
}

size_t gmt_registry_entries(void) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.entries.size();
}

const char* gmt_registry_name(int32_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (id < 0 || static_cast<size_t>(id) >= r.names.size()) return nullptr;
  return r.names[id].c_str();
}

const char* gmt_registry_op_name(int32_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (id < 0 || static_cast<size_t>(id) >= r.op_names.size()) return nullptr;
  return r.op_names[id].c_str();
}

const char* gmt_scalar_type_name(int32_t scalar_type) {
  if (scalar_type < 0 || scalar_type >= static_cast<int32_t>(c10::ScalarType::NumOptions)) return "Undefined";
  return c10::toString(static_cast<c10::ScalarType>(scalar_type));
}

int64_t gmt_scalar_type_itemsize(int32_t scalar_type) {
  if (scalar_type < 0 || scalar_type >= static_cast<int32_t>(c10::ScalarType::NumOptions)) return 0;
  try {
    return static_cast<int64_t>(c10::elementSize(static_cast<c10::ScalarType>(scalar_type)));
  } catch (...) {
    return 0;
  }
}

int64_t gmt_registry_group(int32_t id, int64_t* sizes, size_t cap, int32_t* scalar_type, int32_t* class_id,
                           int32_t* op_id, int32_t* role) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (id < 0 || static_cast<size_t>(id) >= r.groups.size()) return -1;
  const GroupDef& g = r.groups[id];
  if (sizes) std::copy_n(g.sizes.begin(), std::min(cap, g.sizes.size()), sizes);
  if (scalar_type) *scalar_type = g.scalar_type;
  if (class_id) *class_id = g.class_id;
  if (op_id) *op_id = g.op_id;
  if (role) *role = g.role;
  return static_cast<int64_t>(g.sizes.size());
}

void gmt_registry_optimizer_step(int32_t entering) {
  registry().optimizer_steps.fetch_add(entering ? 1 : -1, std::memory_order_relaxed);
}

const char* gmt_registry_class_name(int32_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (id < 0 || static_cast<size_t>(id) >= r.class_names.size()) return nullptr;
  return r.class_names[id].c_str();  // a deque's elements never move
}

gmt_error gmt_registry_name_class(const void* type, const char* name) {
  GMT_TRY({
    if (!type || !name || !*name) throw std::invalid_argument("a class needs a type and a name");
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const int32_t id = r.class_id_named(name);
    // Tensors already grouped under the type's tp_name keep that group; new ones get this name.
    r.python_classes[type] = Registry::PythonClass{id, true};
  })
}

int gmt_registry_python_classes(void) { return GMT_PYTHON_CLASS; }

}  // extern "C"
