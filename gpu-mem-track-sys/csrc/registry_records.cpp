// The full walk: every live registered tensor on a device as a record (shape, dtype, bytes,
// name, op, category), for tagging a history, the estimator's peak tensors and the out-of-memory
// report's holders. The tracker's log reads the grouped walk (registry_walk.cpp) instead.
#include <ATen/core/Tensor.h>

#include <mutex>
#include <unordered_set>

#include "recorder.h"
#include "registry_walk.h"

namespace gmt_registry {
namespace {
// What the tracker knows a tensor holds: a name given at registration (a parameter or a buffer),
// the gradient of a named parameter, or the category a running history tagged its allocation with.
int32_t category_of(const at::Tensor& t, int32_t name_id, const std::unordered_set<const void*>& grads) {
  if (name_id >= 0) return t.is_leaf() && t.requires_grad() ? GMT_CAT_PARAMETER : GMT_CAT_BUFFER;
  if (!t.has_storage()) return GMT_CAT_NONE;
  const void* storage = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (grads.count(storage)) return GMT_CAT_GRADIENT;
  return gmt::allocation_category(gmt::allocation_id(storage));
}

// Caller holds r.mu. Calls f(entry, origin, tensor) for every live entry, pruning the dead ones,
// the tensor pinned while f reads it. Memory latency dominates large registries: the TensorImpls
// are prefetched a few entries ahead.
template <class F>
void for_each_live(Registry& r, F&& f) {
  auto& entries = r.entries;
  constexpr size_t kAhead = 8;
  for (size_t i = 0; i < entries.size();) {
    if (i + kAhead < entries.size()) {
      const char* ahead = reinterpret_cast<const char*>(entries[i + kAhead].impl());
      __builtin_prefetch(ahead);
      __builtin_prefetch(ahead + 64);
      __builtin_prefetch(ahead + 128);
    }
    auto strong = entries[i].weak.lock();
    if (!strong) {
      r.remove_at(i);
      continue;
    }
    const at::Tensor t(std::move(strong));
    f(entries[i], r.origins[i], t);
    ++i;
  }
  r.prune_at = std::max(kMinPruneAt, entries.size() * 2);
}

}  // namespace

gmt_error take_records(gmt_walk* s, int32_t device_kind, int32_t device_index, bool categorize) {
  GMT_TRY({
    if (!s) throw std::invalid_argument("null walk");
    s->records.clear();
    s->dims.clear();
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto& entries = r.entries;
    // The storages of the named parameters' .grad: a record's role (as the grouped walk finds
    // gradients) and, categorized, its category.
    std::unordered_set<const void*> grads;
    r.find_grads(grads);
    s->records.reserve(entries.size());
    for_each_live(r, [&](const Entry& e, const EntryOrigin& origin, const at::Tensor& t) {
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      const int32_t kind = device_kind_of(impl->device_type());
      const int32_t index = device_index_of(impl, kind);
      if (on_device(impl, device_kind, device_index)) {
        gmt_tensor_record rec{};
        rec.impl_id = reinterpret_cast<uint64_t>(impl);
        if (impl->has_storage()) {
          const c10::Storage& st = impl->unsafe_storage();
          rec.storage_id = reinterpret_cast<uint64_t>(st.unsafeGetStorageImpl());
          rec.storage_nbytes = static_cast<int64_t>(st.nbytes());
          // Only one TensorImpl holds it: this tensor owns it without a lookup.
          rec.storage_shared = st.use_count() > 1 ? 1 : 0;
        }
        rec.nbytes = stored_numel(impl) * static_cast<int64_t>(impl->itemsize());
        rec.seq = e.seq;
        const auto sizes = stored_sizes(impl);
        rec.dims_offset = static_cast<int64_t>(s->dims.size());
        rec.ndim = static_cast<int32_t>(sizes.size());
        s->dims.insert(s->dims.end(), sizes.begin(), sizes.end());
        rec.scalar_type = static_cast<int32_t>(c10::typeMetaToScalarType(impl->dtype()));
        rec.device_kind = kind;
        rec.device_index = index;
        rec.name_id = origin.name_id;
        rec.requires_grad = impl->requires_grad() ? 1 : 0;
        // is_leaf only matters for tensors that require grad (the Parameter class).
        rec.is_leaf = rec.requires_grad ? (t.is_leaf() ? 1 : 0) : 1;
        rec.class_id = r.class_of(impl, rec.requires_grad && rec.is_leaf).first;
        rec.op_id = origin.op_id;
        rec.category = categorize ? category_of(t, rec.name_id, grads) : GMT_CAT_NONE;
        rec.role = impl->has_storage() && grads.count(impl->unsafe_storage().unsafeGetStorageImpl())
                       ? GMT_ROLE_GRADIENT
                       : origin.role;
        s->records.push_back(rec);
      }
    });
  })
}
}  // namespace gmt_registry

using namespace gmt_registry;

namespace gmt {
void take_peak_walk(int32_t device_kind) {
  char* err = gmt_walk_run(gmt_peak_walk(), device_kind, -1);
  gmt_free_string(err);  // a failed walk leaves an empty walk
}

}  // namespace gmt

extern "C" {

gmt_walk* gmt_walk_new(void) { return new (std::nothrow) gmt_walk(); }
void gmt_walk_free(gmt_walk* s) { delete s; }

gmt_error gmt_walk_run(gmt_walk* s, int32_t device_kind, int32_t device_index) {
  return take_records(s, device_kind, device_index, false);
}

gmt_error gmt_walk_run_categorized(gmt_walk* s, int32_t device_kind, int32_t device_index) {
  return take_records(s, device_kind, device_index, true);
}

gmt_walk* gmt_peak_walk(void) {
  static gmt_walk* peak = new gmt_walk();
  return peak;
}

size_t gmt_walk_len(const gmt_walk* s) { return s ? s->records.size() : 0; }
const gmt_tensor_record* gmt_walk_records(const gmt_walk* s) { return s ? s->records.data() : nullptr; }
const int64_t* gmt_walk_dims(const gmt_walk* s, size_t* len) {
  if (len) *len = s ? s->dims.size() : 0;
  return s ? s->dims.data() : nullptr;
}

}  // extern "C"
