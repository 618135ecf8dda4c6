// Live-tensor registry: a global RecordFunction callback remembers every tensor an op returns
// through a weak reference, so a snapshot can list the tensors still alive without a garbage
// collector walk. Explicit registration covers what ops never return (module parameters).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "registry.h"

namespace {
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct Entry {
  WeakImpl weak;
  uint64_t seq;
  int32_t name_id;
};

// Dead entries keep ~176 B each (the weak reference pins the TensorImpl's memory) until pruned.
// Pruning is amortised: when the map doubles past its last live size.
constexpr size_t kMinPruneAt = 1 << 16;

struct Registry {
  std::mutex mu;
  std::unordered_map<c10::TensorImpl*, Entry> entries;
  std::deque<std::string> names;  // append-only: c_str() pointers stay valid
  std::unordered_map<std::string, int32_t> name_ids;
  uint64_t next_seq = 0;
  size_t prune_at = kMinPruneAt;
  at::CallbackHandle handle = 0;
  std::atomic<bool> installed{false};

  // Caller holds mu.
  void record(const at::Tensor& t, int32_t name_id) {
    if (!t.defined()) return;
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto it = entries.find(impl);
    if (it != entries.end()) {
      if (name_id >= 0) it->second.name_id = name_id;
      return;  // keep the first registration's order
    }
    entries.emplace(impl, Entry{WeakImpl(t.getIntrusivePtr()), next_seq++, name_id});
    if (entries.size() >= prune_at) {
      prune();
      prune_at = std::max(kMinPruneAt, entries.size() * 2);
    }
  }

  void prune() {
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second.weak.expired()) it = entries.erase(it);
      else ++it;
    }
  }

  int32_t intern(const std::string& name) {
    auto it = name_ids.find(name);
    if (it != name_ids.end()) return it->second;
    int32_t id = static_cast<int32_t>(names.size());
    names.push_back(name);
    name_ids.emplace(name, id);
    return id;
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: callbacks may fire during exit
  return *r;
}

void record_ivalue(Registry& r, const c10::IValue& v) {
  if (v.isTensor()) {
    r.record(v.toTensor(), -1);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) r.record(t, -1);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) record_ivalue(r, e);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) record_ivalue(r, e);
  }
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  auto outputs = fn.outputs();
  if (outputs.empty()) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& v : outputs) record_ivalue(r, v);
}

int32_t device_kind_of(c10::DeviceType t) {
  switch (t) {
    case c10::DeviceType::CPU: return GMT_DEV_CPU;
    case c10::DeviceType::CUDA: return GMT_DEV_CUDA;
    case c10::DeviceType::Meta: return GMT_DEV_META;
    default: return GMT_DEV_OTHER;
  }
}
}  // namespace

struct gmt_snapshot {
  std::vector<gmt_tensor_record> records;
  std::vector<int64_t> dims;
};

namespace gmt {
void register_tensor(const at::Tensor& t, const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.record(t, name.empty() ? -1 : r.intern(name));
}
}  // namespace gmt

extern "C" {

void gmt_free_string(char* s) { std::free(s); }

gmt_error gmt_registry_install(void) {
  GMT_TRY({
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.installed.load()) {
      r.handle = at::addGlobalCallback(at::RecordFunctionCallback(nullptr, &on_op_end)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
      r.installed.store(true);
    }
  })
}

int gmt_registry_installed(void) { return registry().installed.load() ? 1 : 0; }

gmt_error gmt_registry_set_enabled(int enabled) {
  GMT_TRY({
    Registry& r = registry();
    if (!r.installed.load()) throw std::runtime_error("the tensor registry is not installed");
    // Never removeCallback while ops may run on other threads: disable/re-enable is safe.
    if (enabled) at::reenableCallback(r.handle);
    else at::disableCallback(r.handle);
  })
}

gmt_error gmt_registry_register(const void* tensor, const char* name) {
  GMT_TRY({
    if (!tensor) throw std::invalid_argument("null tensor pointer");
    gmt::register_tensor(*static_cast<const at::Tensor*>(tensor), name ? name : "");
  })
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

gmt_snapshot* gmt_snapshot_new(void) { return new (std::nothrow) gmt_snapshot(); }
void gmt_snapshot_free(gmt_snapshot* s) { delete s; }

gmt_error gmt_snapshot_take(gmt_snapshot* s, int32_t device_kind, int32_t device_index) {
  GMT_TRY({
    if (!s) throw std::invalid_argument("null snapshot");
    s->records.clear();
    s->dims.clear();
    // Strong references taken during the walk are released after the lock: dropping the last one
    // runs the tensor's deleter, which must not happen under the registry lock.
    std::vector<c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> keep;
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    keep.reserve(r.entries.size());
    s->records.reserve(r.entries.size());
    for (auto it = r.entries.begin(); it != r.entries.end();) {
      auto strong = it->second.weak.lock();
      if (!strong) {
        it = r.entries.erase(it);
        continue;
      }
      c10::TensorImpl* t = strong.get();
      const auto dev = t->device_type();
      const int32_t kind = device_kind_of(dev);
      const int32_t index = t->device().has_index() ? t->device().index() : (kind == GMT_DEV_CUDA ? 0 : -1);
      if ((device_kind == GMT_DEV_ANY || device_kind == kind) &&
          (device_index < 0 || index < 0 || device_index == index)) {
        gmt_tensor_record rec{};
        rec.impl_id = reinterpret_cast<uint64_t>(t);
        if (t->has_storage()) {
          const c10::Storage& st = t->unsafe_storage();
          rec.storage_id = reinterpret_cast<uint64_t>(st.unsafeGetStorageImpl());
          rec.storage_nbytes = static_cast<int64_t>(st.nbytes());
        }
        rec.nbytes = t->numel() * static_cast<int64_t>(t->itemsize());
        rec.seq = it->second.seq;
        auto sizes = t->sizes();
        rec.dims_offset = static_cast<int64_t>(s->dims.size());
        rec.ndim = static_cast<int32_t>(sizes.size());
        s->dims.insert(s->dims.end(), sizes.begin(), sizes.end());
        rec.scalar_type = static_cast<int32_t>(t->dtype().toScalarType());
        rec.device_kind = kind;
        rec.device_index = index;
        rec.name_id = it->second.name_id;
        rec.requires_grad = t->requires_grad() ? 1 : 0;
        rec.is_leaf = (t->autograd_meta() == nullptr || at::Tensor(strong).is_leaf()) ? 1 : 0;
        s->records.push_back(rec);
      }
      keep.push_back(std::move(strong));
      ++it;
    }
    r.prune_at = std::max(kMinPruneAt, r.entries.size() * 2);
  })
}

size_t gmt_snapshot_len(const gmt_snapshot* s) { return s ? s->records.size() : 0; }
const gmt_tensor_record* gmt_snapshot_records(const gmt_snapshot* s) { return s ? s->records.data() : nullptr; }
const int64_t* gmt_snapshot_dims(const gmt_snapshot* s, size_t* len) {
  if (len) *len = s ? s->dims.size() : 0;
  return s ? s->dims.data() : nullptr;
}

}  // extern "C"
