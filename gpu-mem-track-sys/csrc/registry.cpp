// Live-tensor registry: a global RecordFunction callback remembers every tensor an op returns
// through a weak reference, so a snapshot can list the tensors still alive without a garbage
// collector walk. Explicit registration covers what ops never return (module parameters).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <torch/version.h>

#include "common.h"
#include "ptr_index.h"
#include "recorder.h"
#include "registry.h"

namespace {
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// Whether a TensorImpl is a plain one: exactly c10::TensorImpl (no subclass whose sizes, device
// or storage come from elsewhere). Only these are read without a pin (see take_grouped).
bool is_plain(const c10::TensorImpl* impl) { return typeid(*impl) == typeid(c10::TensorImpl); }

// TensorImpl::autograd_meta() is out of line: a call through the PLT for every tensor a walk
// reads. The walk reads the field itself, through a member pointer that an explicit template
// instantiation may take of a private member ([temp.spec.general]): the compiler's own offset,
// right for whatever libtorch the shim is built against.
struct AutogradMetaField {
  using type = std::unique_ptr<c10::AutogradMetaInterface> c10::TensorImpl::*;
  friend type member_of(AutogradMetaField);
};
template <class Field, typename Field::type Member>
struct PrivateMember {
  friend typename Field::type member_of(Field) { return Member; }
};
template struct PrivateMember<AutogradMetaField, &c10::TensorImpl::autograd_meta_>;

// Whether the tensor has autograd metadata (without it, requires_grad() is false), as
// TensorImpl::autograd_meta() would say.
inline bool has_autograd_meta(const c10::TensorImpl* impl) { return (impl->*member_of(AutogradMetaField{})) != nullptr; }

// A registered tensor as the walks read it: 32 bytes, two to a cache line (the walks stream the
// entries; what only registration and full snapshots read is in EntryOrigin, beside it).
struct Entry {
  WeakImpl weak;  // the tensor; its target is the TensorImpl
  // The StorageImpl the tensor held when a snapshot last pinned it (null before), by a weak
  // reference: its memory (not its data) stays valid however the tensor or storage die, so a
  // snapshot reads its byte count and use count without pinning the tensor (see take_grouped).
  WeakStorage storage{c10::intrusive_ptr<c10::StorageImpl>()};
  uint64_t seq : 63;   // registration order
  uint64_t plain : 1;  // is_plain(tensor), set when recorded (a TensorImpl's class never changes)
  int32_t group = -1;  // its log group when last seen (see Registry::group_of); -1 before
  // Where a grouped walk last found its storage among the shared ones (gmt_snapshot::shared), a
  // hint checked before use: it spares a hash lookup per tensor that shares its storage.
  uint32_t shared_slot = UINT32_MAX;

  Entry(WeakImpl tensor, uint64_t order, bool is_plain) : weak(std::move(tensor)), seq(order), plain(is_plain) {}
  c10::TensorImpl* impl() const { return weak._unsafe_get_target(); }
};
static_assert(sizeof(Entry) == 32, "two entries to a cache line");

// Where a registered tensor came from, by the same index as its Entry.
struct EntryOrigin {
  int32_t name_id;  // its registered name; -1: none
  int32_t op_id;    // the op that returned it; -1 when registered explicitly
  int32_t role;     // gmt_tensor_role as registered: optimizer state or internal (gradients are found by walks)
};

// A log group as the registry interns it: what a `+`/`-` line is keyed by, with the op that made
// the tensors (the Rust side drops it unless the tracker groups by op).
struct GroupDef {
  std::vector<int64_t> sizes;
  int32_t scalar_type;
  int32_t class_id;  // Registry::class_names
  // The class is the Python object's: fixed for the TensorImpl's life, not re-checked by a walk.
  // Otherwise it is the autograd rule's (kParameterClass for a leaf requiring grad), re-checked.
  bool python_class;
  int32_t op_id;
  int32_t role;  // gmt_tensor_role
};

// The classes a tensor without a Python object gets (tch's, or one Python never saw): the
// autograd rule, a leaf that requires grad prints as a Parameter.
constexpr int32_t kTensorClass = 0;
constexpr int32_t kParameterClass = 1;

// Whether libtorch keeps a pinned tensor's Python object alive (the PyObject preservation of
// torch 2.10 on: while other C++ references exist, the TensorImpl holds one on its PyObject), so
// that a pinned tensor's Python class can be read without the GIL.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
#define GMT_PYTHON_CLASS 1
#else
#define GMT_PYTHON_CLASS 0
#endif

// Dead entries keep ~176 B each (the weak reference pins the TensorImpl's memory) until pruned.
// Pruning is amortised: when the registry doubles past its last live size. Pruning early lets
// malloc reuse the dead TensorImpls' memory while it is still in cache.
constexpr size_t kMinPruneAt = 4096;
// Op-name addresses remembered before the cache starts over.
constexpr size_t kMaxOpAddresses = 4096;

// Entries live in a vector so snapshots walk contiguous memory and can prefetch the TensorImpls
// ahead; `index` finds an entry by TensorImpl for the per-op de-duplication.
struct Registry {
  std::mutex mu;
  std::vector<Entry> entries;
  std::vector<EntryOrigin> origins;  // by entry index
  gmt::PtrIndex index;
  std::deque<std::string> names;  // append-only: c_str() pointers stay valid
  std::unordered_map<std::string, int32_t> name_ids;
  // Op names by the address RecordFunction gives (the schema's name, alive as long as the op).
  std::unordered_map<const char*, int32_t> op_ids;     // address -> id cache
  std::unordered_map<std::string, int32_t> op_texts;  // text -> id
  std::deque<std::string> op_names;  // append-only, index = op id
  const char* last_op = nullptr;     // the last op looked up and its id: ops come in runs
  int32_t last_op_id = -1;
  // Log groups, interned: a tensor's shape, dtype and class rarely change after an op returns
  // it, so an entry keeps its group id and a snapshot only checks that it still holds. Like the
  // op names, the table only grows (one small entry per distinct shape, dtype, class and op ever
  // seen): an id must stay valid while any tracker still reads the groups of its last walk
  // (gmt_registry_group, after the walk and outside this lock), so none is reused.
  std::vector<GroupDef> groups;
  std::unordered_map<std::string, int32_t> group_ids;  // packed (sizes, dtype, op, class) -> id
  // Tensor classes by id (append-only, like the op names): the two of the autograd rule, then
  // Python classes as a walk first meets them. Python types the package named (which it keeps
  // alive) map to its names; any other type to its tp_name, checked again on each lookup since
  // a type nobody keeps may die and another be made at its address.
  std::deque<std::string> class_names{"torch.Tensor", "torch.nn.parameter.Parameter"};
  struct PythonClass {
    int32_t id;
    bool named;  // by the package (gmt_registry_name_class)
  };
  std::unordered_map<const void*, PythonClass> python_classes;  // PyTypeObject* -> class
  uint64_t next_seq = 0;
  std::atomic<int32_t> optimizer_steps{0};  // running (gmt_registry_optimizer_step)
  // Storages of named parameters' gradients, found once per grouped walk when a new entry needs
  // its group (grads_walk: the walk they were found for).
  std::unordered_set<const void*> grads;
  uint64_t grads_walk = 0;
  uint64_t walks = 0;
  size_t prune_at = kMinPruneAt;
  at::CallbackHandle handle = 0;
  std::atomic<bool> installed{false};

  // Caller holds mu. `returned`: the outermost op running returns it (the program's call), rather
  // than an op that call ran; what an inner op made is internal until the outer call returns it,
  // or a view of it. `gradient`: made inside autograd's AccumulateGrad (a parameter's .grad).
  void record(const at::Tensor& t, int32_t name_id, int32_t op_id, bool returned = true, bool gradient = false) {
    if (!t.defined()) return;
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto [slot, inserted] = index.try_emplace(impl, static_cast<uint32_t>(entries.size()));
    if (returned && op_id >= 0) {
      if (!inserted && origins[*slot].role == GMT_ROLE_INTERNAL) origins[*slot].role = GMT_ROLE_NONE;
      if (t.is_view()) {
        const uint32_t* base = index.find(t._base().unsafeGetTensorImpl());
        if (base && origins[*base].role == GMT_ROLE_INTERNAL) origins[*base].role = GMT_ROLE_NONE;
      }
    }
    if (!inserted) {
      if (name_id >= 0) origins[*slot].name_id = name_id;
      return;  // keep the first registration's order (and the innermost op that returned it)
    }
    const int32_t role = optimizer_steps.load(std::memory_order_relaxed) > 0 ? GMT_ROLE_OPTIMIZER_STATE
                         : gradient                                       ? GMT_ROLE_GRADIENT
                         : (!returned && op_id >= 0)                      ? GMT_ROLE_INTERNAL
                                                                          : GMT_ROLE_NONE;
    entries.emplace_back(WeakImpl(t.getIntrusivePtr()), next_seq++, is_plain(impl));
    origins.push_back(EntryOrigin{name_id, op_id, role});
    if (entries.size() >= prune_at) {
      prune();
      prune_at = std::max(kMinPruneAt, entries.size() * 2);
    }
  }

  // Caller holds mu. Swap-removes entry i; the entry moved into i must be looked at again.
  void remove_at(size_t i) {
    index.erase(entries[i].impl());
    if (i + 1 != entries.size()) {
      entries[i] = std::move(entries.back());
      origins[i] = origins.back();
      *index.find(entries[i].impl()) = static_cast<uint32_t>(i);
    }
    entries.pop_back();
    origins.pop_back();
  }

  void prune() {
    for (size_t i = 0; i < entries.size();) {
      if (entries[i].weak.expired()) remove_at(i);
      else ++i;
    }
  }

  // Caller holds mu. Ops are interned by their text. A dispatcher op's name has one address for
  // the process, so addresses are a cache in front of the text; an autograd node's name is built
  // per call and its address may be reused by other text, so every cache hit is checked.
  int32_t op_id(const char* name) {
    if (!name) name = "<unnamed op>";
    if (name == last_op && std::strcmp(op_names[last_op_id].c_str(), name) == 0) return last_op_id;
    auto hit = op_ids.find(name);
    int32_t id;
    if (hit != op_ids.end() && std::strcmp(op_names[hit->second].c_str(), name) == 0) {
      id = hit->second;
    } else {
      auto [it, inserted] = op_texts.try_emplace(name, static_cast<int32_t>(op_names.size()));
      if (inserted) op_names.emplace_back(name);
      id = it->second;
      if (op_ids.size() >= kMaxOpAddresses) op_ids.clear();  // addresses of per-call names pile up
      op_ids[name] = id;
    }
    last_op = name;
    last_op_id = id;
    return id;
  }

  // The group entry e's tensor was last seen in, if its shape, dtype and class still match it
  // (-1 otherwise, or before it was first seen). Only reads: a walk's threads call it at once.
  // Inlined into the walk: this check is most of a walk's work per tensor once memory is read.
  __attribute__((always_inline)) int32_t held_group(const Entry& e, const c10::TensorImpl* impl,
                                                    bool parameter) const {
    if (e.group < 0) return -1;
    const GroupDef& g = groups[e.group];
    const c10::IntArrayRef sizes = impl->sizes();
    // A loop rather than std::equal: that calls memcmp, slow for a few dimensions.
    bool same = g.scalar_type == static_cast<int32_t>(impl->dtype().toScalarType()) &&
                (g.python_class || (g.class_id == kParameterClass) == parameter) && g.sizes.size() == sizes.size();
    for (size_t d = 0; same && d < sizes.size(); ++d) same = g.sizes[d] == sizes[d];
    return __builtin_expect(same, 1) ? e.group : -1;
  }

  // Caller holds mu. The group of live entry i's tensor, which the caller pins, interned on
  // first sight or when its shape, dtype or class changed since (resize_, requires_grad_).
  int32_t group_of(size_t i, const c10::TensorImpl* impl, bool parameter) {
    Entry& e = entries[i];
    const int32_t held = held_group(e, impl, parameter);
    if (held >= 0) return held;
    const auto [class_id, python] = class_of(impl, parameter);
    e.group = intern_group(impl->sizes(), static_cast<int32_t>(impl->dtype().toScalarType()), class_id, python,
                           origins[i].op_id, role_of(origins[i], impl));
    return e.group;
  }

  // Caller holds mu and pins the tensor: its role. A named parameter's gradient is one whatever
  // made it (autograd's AccumulateGrad may have, inside the backward pass), found by this walk.
  int32_t role_of(const EntryOrigin& origin, const c10::TensorImpl* impl) {
    if (!impl->has_storage()) return origin.role;
    if (grads_walk != walks) {
      grads_walk = walks;
      find_grads(grads);
    }
    return grads.count(impl->unsafe_storage().unsafeGetStorageImpl()) ? GMT_ROLE_GRADIENT : origin.role;
  }

  // Caller holds mu. The storages of the named parameters' gradients.
  void find_grads(std::unordered_set<const void*>& out) {
    out.clear();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (origins[i].name_id < 0) continue;
      auto impl = entries[i].weak.lock();
      if (!impl) continue;
      const at::Tensor t(std::move(impl));
      if (t.requires_grad() && t.grad().defined() && t.grad().has_storage())
        out.insert(t.grad().storage().unsafeGetStorageImpl());
    }
  }

  int32_t intern_group(c10::IntArrayRef sizes, int32_t scalar_type, int32_t class_id, bool python, int32_t op_id,
                       int32_t role) {
    std::string key(sizes.size() * sizeof(int64_t) + 4 * sizeof(int32_t) + 1, '\0');
    char* k = key.data();
    std::memcpy(k, sizes.data(), sizes.size() * sizeof(int64_t));
    k += sizes.size() * sizeof(int64_t);
    std::memcpy(k, &scalar_type, sizeof scalar_type);
    std::memcpy(k + sizeof(int32_t), &op_id, sizeof op_id);
    std::memcpy(k + 2 * sizeof(int32_t), &class_id, sizeof class_id);
    std::memcpy(k + 3 * sizeof(int32_t), &role, sizeof role);
    k[4 * sizeof(int32_t)] = python ? 1 : 0;
    auto [it, inserted] = group_ids.try_emplace(std::move(key), static_cast<int32_t>(groups.size()));
    if (inserted) {
      groups.push_back(
          GroupDef{std::vector<int64_t>(sizes.begin(), sizes.end()), scalar_type, class_id, python, op_id, role});
    }
    return it->second;
  }

  // Caller holds mu and pins the tensor. Its class: its Python object's type where it has one
  // (and libtorch keeps that object alive under the pin), else the autograd rule. Second: whether
  // the class is the Python object's.
  std::pair<int32_t, bool> class_of(const c10::TensorImpl* impl, bool parameter) {
#if GMT_PYTHON_CLASS
    if (const void* obj = impl->pyobj_slot()->load_pyobj()) {
      // SAFETY: the caller's pin keeps the Python object alive (PyObject preservation), and the
      // object keeps its type alive. A PyObject starts with its reference count and its type
      // pointer; a type object with those and ob_size, then tp_name (the layout the stable ABI
      // fixes for builds with the GIL, the only ones an abi3 package loads into).
      const void* type = static_cast<const void* const*>(obj)[1];
      const char* tp_name = static_cast<const char* const*>(type)[3];
      auto hit = python_classes.find(type);
      if (hit != python_classes.end() && (hit->second.named || class_names[hit->second.id] == tp_name)) {
        return {hit->second.id, true};
      }
      const int32_t id = class_id_named(tp_name ? tp_name : "<unnamed class>");
      python_classes[type] = PythonClass{id, false};
      return {id, true};
    }
#endif
    return {parameter ? kParameterClass : kTensorClass, false};
  }

  // Caller holds mu. The id of the class named `name`, added when new.
  int32_t class_id_named(const char* name) {
    for (size_t c = 0; c < class_names.size(); ++c) {
      if (class_names[c] == name) return static_cast<int32_t>(c);
    }
    class_names.emplace_back(name);
    return static_cast<int32_t>(class_names.size() - 1);
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

void record_ivalue(Registry& r, const c10::IValue& v, int32_t op, bool returned, bool gradient) {
  if (v.isTensor()) {
    r.record(v.toTensor(), -1, op, returned, gradient);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) r.record(t, -1, op, returned, gradient);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) record_ivalue(r, e, op, returned, gradient);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) record_ivalue(r, e, op, returned, gradient);
  }
}

std::atomic<uint64_t> g_callbacks{0};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  gmt::op_stack_push(fn.name());
  return nullptr;
}

void record_outputs(const at::RecordFunction& fn) {
  auto outputs = fn.outputs();
  if (outputs.empty()) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // The outermost op running (the call the program made: aten::conv2d rather than the
  // aten::mkldnn_convolution it runs); this op itself when it is the outermost.
  const char* outermost = gmt::outermost_op_or(fn.name());
  const int32_t op = r.op_id(outermost);
  // The op stack still holds this op: depth 1 is the program's own call. Under an autograd node
  // (the backward pass) the ops' results are gradients flowing between nodes, not internal to a
  // call; what the AccumulateGrad node makes is a parameter's gradient.
  bool returned = gmt::op_stack_depth() <= 1, gradient = false;
  if (!returned) {  // the common case, the program's own call, compares no names
    returned = std::strstr(outermost, "autograd::") != nullptr || std::strstr(outermost, "Backward") != nullptr;
    gradient = returned && std::strstr(outermost, "AccumulateGrad") != nullptr;
  }
  for (const auto& v : outputs) record_ivalue(r, v, op, returned, gradient);
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  g_callbacks.fetch_add(1, std::memory_order_relaxed);
  record_outputs(fn);
  gmt::op_stack_pop();  // after recording: the outputs are named by the stack as it was
}

inline __attribute__((always_inline)) int32_t device_kind_of(c10::DeviceType t) {
  switch (t) {
    case c10::DeviceType::CPU: return GMT_DEV_CPU;
    case c10::DeviceType::CUDA: return GMT_DEV_CUDA;
    case c10::DeviceType::Meta: return GMT_DEV_META;
    default: return GMT_DEV_OTHER;
  }
}
}  // namespace

namespace {
inline __attribute__((always_inline)) int32_t device_index_of(const c10::TensorImpl* impl, int32_t kind) {
  return impl->device().has_index() ? impl->device().index() : (kind == GMT_DEV_CUDA ? 0 : -1);
}

// Whether the tensor is on the device a snapshot asked for (kind GMT_DEV_ANY: all; index -1: any).
inline __attribute__((always_inline)) bool on_device(const c10::TensorImpl* impl, int32_t device_kind,
                                                    int32_t device_index) {
  const int32_t kind = device_kind_of(impl->device_type());
  const int32_t index = device_index_of(impl, kind);
  return (device_kind == GMT_DEV_ANY || device_kind == kind) && (device_index < 0 || index < 0 || device_index == index);
}

// The StorageImpl a TensorImpl's storage_ points to, read atomically: it is only compared, never
// dereferenced, so another thread resetting storage_ meanwhile (release_resources) is harmless.
const c10::StorageImpl* storage_target(const c10::TensorImpl* impl) {
  // A Storage is an intrusive_ptr<StorageImpl>, which is its target pointer alone.
  static_assert(sizeof(c10::Storage) == sizeof(c10::StorageImpl*));
  const auto* field = reinterpret_cast<c10::StorageImpl* const*>(&impl->unsafe_storage());
  return __atomic_load_n(field, __ATOMIC_RELAXED);
}

// A tensor whose storage other tensors share too, met by the grouped walk (views and the tensor
// they view keep each other's storage: a quarter of a training step's tensors and more).
struct SharedUse {
  int64_t storage_nbytes;
  int64_t nbytes;
  uint64_t seq;
  int32_t group;

  // The owner of a shared storage is its largest tensor, then the oldest.
  bool owns_rather_than(const SharedUse& other) const {
    return nbytes > other.nbytes || (nbytes == other.nbytes && seq < other.seq);
  }
};
// What one thread of a grouped walk adds up.
struct WalkShare {
  gmt_snapshot_totals totals{};
  // by group id: owned count, owned bytes, views (in this group), views of storages it owns
  std::vector<std::array<int64_t, 4>> by_group;
  std::vector<int32_t> touched;                 // the group ids added to
  // A tensor whose storage others hold too: its slot among the shared storages is found after.
  struct SharedMet {
    uint32_t entry;
    uint32_t slot_hint;  // the entry's shared_slot as the walk read it
    const c10::StorageImpl* storage;
    SharedUse use;
  };
  std::vector<SharedMet> shared;
  std::vector<uint32_t> later;  // entries for the calling thread, ascending within each chunk
  struct Span {
    uint32_t chunk, begin, end;  // a chunk's entries in `later`
  };
  std::vector<Span> spans;
  // A helper's pins and replaced storage references, released by the calling thread: a last
  // reference's release runs the tensor's destructor, which for a tensor owned by a Python
  // object takes the GIL, and the caller may hold the GIL while it waits for the helpers.
  std::vector<at::Tensor> pins;
  std::vector<WeakStorage> released_storages;

  // Empties this share for a walk (also after one that threw).
  void reset(size_t groups) {
    totals = gmt_snapshot_totals{};
    for (int32_t g : touched) by_group[g] = {0, 0, 0, 0};
    touched.clear();
    if (by_group.size() < groups) by_group.resize(groups, {0, 0, 0, 0});
    shared.clear();
    later.clear();
    spans.clear();
    pins.clear();
    released_storages.clear();
  }

  // Releases the pins and references a helper kept (on the calling thread, under the registry
  // lock, as a walk alone releases its own), fetching each tensor's refcount ahead.
  void release_kept() {
    constexpr size_t kAhead = 16;
    for (size_t k = 0; k < pins.size(); ++k) {
      if (k + kAhead < pins.size()) __builtin_prefetch(pins[k + kAhead].unsafeGetTensorImpl(), 1);
      pins[k].reset();
    }
    pins.clear();
    released_storages.clear();
  }

  __attribute__((always_inline)) void add(int32_t group, bool view, int64_t bytes) {
    if (group < 0) return;
    auto& t = by_group[group];
    if (t[0] == 0 && t[2] == 0) touched.push_back(group);
    if (view) {
      ++t[2];
    } else {
      ++t[0];
      t[1] += bytes;
    }
  }

  // A live tensor on the device, in `group` (-1: not grouped), with its storage (null: none)
  // and the number of tensors holding it; `shared` is the caller's way with shared storages.
  template <class Shared>
  __attribute__((always_inline)) void tally(const c10::TensorImpl* impl, int32_t group, uint64_t seq,
                                            const c10::StorageImpl* storage, uint32_t storage_uses,
                                            Shared&& shared_storage) {
    ++totals.tensor_count;
    if (!storage) {
      add(group, true, 0);  // nothing to own
      return;
    }
    const auto storage_nbytes = static_cast<int64_t>(storage->nbytes());
    if (storage_uses > 1) {
      // numel from the sizes (as TensorImpl keeps it): numel_ may lie on a line read for it alone.
      int64_t numel = 1;
      for (int64_t d : impl->sizes()) numel *= d;
      shared_storage(storage, SharedUse{storage_nbytes, numel * static_cast<int64_t>(impl->itemsize()), seq, group});
    } else {
      totals.tensor_bytes += storage_nbytes;
      ++totals.storage_count;
      add(group, false, storage_nbytes);
    }
  }

  // Adds this share's totals and groups into `into`.
  void merge_into(WalkShare& into) const {
    into.totals.tensor_count += totals.tensor_count;
    into.totals.tensor_bytes += totals.tensor_bytes;
    into.totals.storage_count += totals.storage_count;
    for (int32_t g : touched) {
      const auto& from = by_group[g];
      auto& to = into.by_group[g];
      if (to[0] == 0 && to[2] == 0) into.touched.push_back(g);
      for (size_t k = 0; k < 4; ++k) to[k] += from[k];
    }
  }
};
}  // namespace

struct gmt_snapshot {
  std::vector<gmt_tensor_record> records;
  std::vector<int64_t> dims;
  // gmt_snapshot_take_grouped: the totals per (group, view) and overall.
  std::vector<gmt_group_total> groups;
  gmt_snapshot_totals totals{};
  // Scratch of the grouped walk, kept between snapshots: what each of its threads adds up (the
  // calling thread's first, into which the others' are merged).
  std::vector<WalkShare> shares;
  // The shared storages, kept from walk to walk so that a tensor finds its storage's slot by
  // its entry's hint (Entry::shared_slot), without a lookup, and slots come in walk order: by
  // slot, the storage (null: a free slot), the walk that last met it and its owner so far.
  struct SharedSlot {
    const void* storage;
    uint64_t walk;
    SharedUse owner;
    int64_t views;  // the other tensors met holding it this walk
  };
  std::vector<SharedSlot> shared;
  gmt::PtrIndex shared_index;  // storage -> slot
  std::vector<uint32_t> free_slots;
  std::vector<uint32_t> walk_slots;  // the slots met by this walk, in the order first met
  uint64_t walk = 0;

  // The slot of a shared storage, for entry e (whose hint it updates).
  SharedSlot& shared_slot(const void* storage, uint32_t& hint) {
    if (hint < shared.size() && shared[hint].storage == storage) return shared[hint];
    if (const uint32_t* found = shared_index.find(storage)) {
      hint = *found;
    } else {
      if (free_slots.empty()) {
        hint = static_cast<uint32_t>(shared.size());
        shared.push_back(SharedSlot{storage, 0, {}, 0});
      } else {
        hint = free_slots.back();
        free_slots.pop_back();
        shared[hint] = SharedSlot{storage, 0, {}, 0};
      }
      shared_index.try_emplace(storage, hint);
    }
    return shared[hint];
  }

  // A storage shared by several tensors, met by this walk through an entry whose slot hint is
  // `hint`: the owner so far, or a view of it (then so is the owner it displaces).
  void meet_shared(WalkShare& into, const void* storage, uint32_t& hint, const SharedUse& use) {
    SharedSlot& slot = shared_slot(storage, hint);
    if (slot.walk != walk) {  // first met
      slot.walk = walk;
      slot.owner = use;
      slot.views = 0;
      walk_slots.push_back(hint);
      return;
    }
    ++slot.views;
    if (use.owns_rather_than(slot.owner)) {
      into.add(slot.owner.group, true, 0);
      slot.owner = use;
    } else {
      into.add(use.group, true, 0);
    }
  }

  // Frees the slots of the storages this walk did not meet.
  void forget_unmet_storages() {
    for (size_t i = 0; i < shared.size(); ++i) {
      SharedSlot& sl = shared[i];
      if (sl.storage && sl.walk != walk) {
        shared_index.erase(sl.storage);
        sl.storage = nullptr;
        free_slots.push_back(static_cast<uint32_t>(i));
      }
    }
  }
};

namespace {
// What the tracker knows a tensor holds: a name given at registration (a parameter or a buffer),
// the gradient of a named parameter, or the category a running history tagged its allocation with.
int32_t category_of(const at::Tensor& t, int32_t name_id, const std::unordered_set<const void*>& grads) {
  if (name_id >= 0) return t.is_leaf() && t.requires_grad() ? GMT_CAT_PARAMETER : GMT_CAT_BUFFER;
  if (!t.has_storage()) return GMT_CAT_NONE;
  const void* storage = t.storage().unsafeGetStorageImpl();
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

gmt_error take_snapshot(gmt_snapshot* s, int32_t device_kind, int32_t device_index, bool categorize) {
  GMT_TRY({
    if (!s) throw std::invalid_argument("null snapshot");
    s->records.clear();
    s->dims.clear();
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto& entries = r.entries;
    std::unordered_set<const void*> grads;  // storages of named parameters' .grad
    if (categorize) {
      for (size_t i = 0; i < entries.size(); ++i) {
        if (r.origins[i].name_id < 0) continue;
        auto impl = entries[i].weak.lock();
        if (!impl) continue;
        const at::Tensor t(std::move(impl));
        if (t.requires_grad() && t.grad().defined() && t.grad().has_storage())
          grads.insert(t.grad().storage().unsafeGetStorageImpl());
      }
    }
    std::unordered_set<const void*> role_grads;  // as the grouped walk finds gradients
    r.find_grads(role_grads);
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
        rec.nbytes = impl->numel() * static_cast<int64_t>(impl->itemsize());
        rec.seq = e.seq;
        const auto sizes = impl->sizes();
        rec.dims_offset = static_cast<int64_t>(s->dims.size());
        rec.ndim = static_cast<int32_t>(sizes.size());
        s->dims.insert(s->dims.end(), sizes.begin(), sizes.end());
        rec.scalar_type = static_cast<int32_t>(impl->dtype().toScalarType());
        rec.device_kind = kind;
        rec.device_index = index;
        rec.name_id = origin.name_id;
        rec.requires_grad = impl->requires_grad() ? 1 : 0;
        // is_leaf only matters for tensors that require grad (the Parameter class).
        rec.is_leaf = rec.requires_grad ? (t.is_leaf() ? 1 : 0) : 1;
        rec.class_id = r.class_of(impl, rec.requires_grad && rec.is_leaf).first;
        rec.op_id = origin.op_id;
        rec.category = categorize ? category_of(t, rec.name_id, grads) : GMT_CAT_NONE;
        rec.role = impl->has_storage() && role_grads.count(impl->unsafe_storage().unsafeGetStorageImpl())
                       ? GMT_ROLE_GRADIENT
                       : origin.role;
        s->records.push_back(rec);
      }
    });
  })
}

// The grouped walk, split so that several threads can read the registry at once (it is bound by
// memory latency: each thread keeps its own misses in flight). Each thread walks chunks of the
// entries and adds the common case, a live tensor whose group still holds, into its own
// WalkShare. What changes the registry waits for the calling thread, after the others are done:
// a dead entry's removal, a group to intern. So do the storages shared by several tensors that a
// helper met; the calling thread finds the owners of those it meets itself as it goes.
struct WalkFilter {
  int32_t device_kind;
  int32_t device_index;
  bool detail;  // group the tensors (else only the totals)
};

// Walks entries [begin, end) as one thread of a grouped walk (the caller holds r.mu; other
// threads walk other entries). Changes only these entries' storage references and `share`, and
// for the calling thread (`helper` false) the snapshot's shared storages; a helper keeps its pins
// and replaced references in `share`, and the shared storages it met.
void walk_chunk(Registry& r, const WalkFilter& filter, gmt_snapshot& s, WalkShare& share, bool helper, uint32_t chunk,
                size_t begin, size_t end) {
  auto& entries = r.entries;
  const auto later_begin = static_cast<uint32_t>(share.later.size());
  auto later = [&](size_t i) { share.later.push_back(static_cast<uint32_t>(i)); };
  // What a walk reads of a TensorImpl and of its StorageImpl is fetched that many entries
  // ahead: a walk is bound by memory, and the entries themselves stream in by the hardware's
  // prefetch. Only the lines read are fetched: of a TensorImpl (176 bytes, 3 or 4 cache lines),
  // its head (refcount, storage_, autograd_meta_), its first sizes and its tail (dtype, device,
  // key set), not the strides between; of a StorageImpl, its refcount and byte count. Written
  // out in the loop: GCC 12 drops __builtin_prefetch from an inlined lambda.
  constexpr size_t kAhead = 16;
  // Byte offsets in a TensorImpl (torch 2.9 to 2.15 on 64-bit targets; a wrong offset only
  // fetches a line in vain): refcount to autograd_meta_, the dimension count to the third size,
  // data_type_ to key_set_; in a StorageImpl: refcount, byte count.
  constexpr size_t kHead = 8, kHeadEnd = 31, kSizes = 56, kSizesEnd = 87, kTail = 160, kTailEnd = 175;
  constexpr size_t kStorageHead = 8, kStorageEnd = 56;
  for (size_t i = begin; i < end; ++i) {
    if (i + kAhead < end) {
      const Entry& a = entries[i + kAhead];
      const char* impl = reinterpret_cast<const char*>(a.impl());
      // A prefetch never faults, whatever (even null) the address.
      const char* storage = reinterpret_cast<const char*>(a.storage._unsafe_get_target());
      __builtin_prefetch(impl + kHead);
      __builtin_prefetch(impl + kHeadEnd);
      __builtin_prefetch(impl + kSizes);
      __builtin_prefetch(impl + kSizesEnd);
      __builtin_prefetch(impl + kTail);
      __builtin_prefetch(impl + kTailEnd);
      __builtin_prefetch(storage + kStorageHead);
      __builtin_prefetch(storage + kStorageEnd);
    }
    Entry& e = entries[i];
    // Subclasses (whose sizes may throw or come from elsewhere) and dead entries: later.
    if (!e.plain || e.weak.expired()) {
      later(i);
      continue;
    }
    const c10::TensorImpl* impl = e.impl();
    auto met_shared = [&](const c10::StorageImpl* storage, const SharedUse& use) {
      if (helper) share.shared.push_back(WalkShare::SharedMet{static_cast<uint32_t>(i), e.shared_slot, storage, use});
      else s.meet_shared(share, storage, e.shared_slot, use);
    };
    // The fast path, without pinning the tensor (two atomic read-modify-writes, most of the
    // walk's time). SAFETY: the entry's weak references keep the memory of the TensorImpl and
    // of e.storage's StorageImpl allocated (not destroyed) whatever other threads do, so every
    // read below is of live memory. What another thread may change meanwhile, when it drops the
    // tensor's last reference, is what TensorImpl::release_resources() resets: the `storage_`
    // and `autograd_meta_` pointers, and the objects they own may be freed. The fast path reads
    // those two pointers' values only (storage_ as an atomic load), never what they point to: a
    // null autograd_meta_ means requires_grad() is false (so the tensor is not a parameter and
    // is_leaf is not needed), and a storage_ equal to e.storage's target is that same
    // StorageImpl (the weak reference keeps its address from being reused), read through
    // e.storage. Sizes, dtype, device and numel are fields of a plain TensorImpl that
    // release_resources() leaves alone. Anything else (Python tensors, autograd meta, a storage
    // not seen before) takes the pinned path. A tensor dying during the walk is counted or not,
    // as when it dies just after its pin.
    if (!impl->is_python_dispatch() && !has_autograd_meta(impl)) {
      const c10::StorageImpl* storage = storage_target(impl);
      if (storage && storage == e.storage._unsafe_get_target()) {
        if (on_device(impl, filter.device_kind, filter.device_index)) {
          const int32_t group = filter.detail ? r.held_group(e, impl, false) : -1;
          if (filter.detail && group < 0) {
            later(i);
            continue;
          }
          share.tally(impl, group, e.seq, storage, e.storage.use_count(), met_shared);
        }
        continue;
      }
    }
    auto strong = e.weak.lock();
    if (!strong) {
      later(i);
      continue;
    }
    at::Tensor t(std::move(strong));
    const c10::StorageImpl* storage = nullptr;
    uint32_t storage_uses = 0;
    // has_storage() is out of line; a plain TensorImpl has storage when storage_ is set.
    if (impl->unsafe_storage()) {
      const c10::Storage& st = impl->unsafe_storage();
      storage = st.unsafeGetStorageImpl();
      storage_uses = static_cast<uint32_t>(st.use_count());
      if (storage != e.storage._unsafe_get_target()) {
        if (helper) share.released_storages.push_back(std::move(e.storage));
        e.storage = st.getWeakStorageImpl();
      }
    }
    if (on_device(impl, filter.device_kind, filter.device_index)) {
      // requires_grad() without its out-of-line wrapper: autograd meta decides.
      const c10::AutogradMetaInterface* meta = (impl->*member_of(AutogradMetaField{})).get();
      const bool parameter = meta && meta->requires_grad() && t.is_leaf();
      const int32_t group = filter.detail ? r.held_group(e, impl, parameter) : -1;
      if (filter.detail && group < 0) later(i);
      else share.tally(impl, group, e.seq, storage, storage_uses, met_shared);
    }
    if (helper) share.pins.push_back(std::move(t));
  }
  share.spans.push_back(WalkShare::Span{chunk, later_begin, static_cast<uint32_t>(share.later.size())});
}

// Threads that help the calling thread walk a large registry (threads named gmt-walk): started on
// the first such walk, then asleep between walks. A walk never waits for a helper that has not started its part (the
// caller takes every chunk left), so a busy, slow or missing helper only costs speed.
class WalkHelpers {
 public:
  // A walk's chunks, taken one at a time by whichever thread comes first.
  struct Job {
    std::atomic<size_t> next{0};
    std::atomic<int> active{0};  // threads between taking their first chunk and their last
    size_t entries = 0, chunks = 0;
    size_t workers = 1;  // the caller (worker 0) and the helpers 1 .. workers - 1
    // Valid while some chunk is unfinished: the caller waits for every chunk taken.
    std::function<void(size_t worker, uint32_t chunk, size_t begin, size_t end)> body;
    std::mutex error_mu;
    std::exception_ptr error;  // the first a chunk threw
  };
  static constexpr size_t kChunk = 1024;

  static WalkHelpers& get() {
    static WalkHelpers* h = new WalkHelpers();  // leaked on purpose, as the registry
    return *h;
  }

  // The helpers a walk of `entries` entries uses (0: the caller walks alone): none for small
  // walks (waking a thread costs more), nor in a forked child (the helpers stayed behind).
  size_t helpers_for(size_t entries) {
    if (entries < 4 * kChunk) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ != 0 && pid_ != getpid()) return 0;
    pid_ = getpid();
    // Started as first needed; a thread that cannot be started leaves the walk to those there are.
    while (started_ + 1 < threads_) {
      try {
        std::thread(&WalkHelpers::serve, this, started_ + 1).detach();
        ++started_;
      } catch (const std::system_error&) {
        threads_ = started_ + 1;
      }
    }
    return threads_ - 1;
  }

  // The threads a walk of a large registry uses, the caller's included.
  size_t threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

  void set_threads(size_t threads) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_ = std::max<size_t>(1, std::min<size_t>(threads, kMaxThreads));
  }

  // Runs job->body over every chunk, on this thread as worker 0 and on the helpers; returns when
  // all are done. Rethrows the first error a chunk threw.
  void run(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = job;
      ++generation_;
    }
    cv_.notify_all();
    take_chunks(*job, 0);
    // Only chunks already taken are waited for: one each at most, short.
    for (unsigned spins = 0; job->active.load() != 0; ++spins) {
      if (spins < 1024) cpu_relax();
      else std::this_thread::yield();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_ == job) current_.reset();
    }
    std::lock_guard<std::mutex> lock(job->error_mu);
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  static constexpr size_t kMaxThreads = 16;
  static constexpr std::chrono::microseconds kStayAwake{200};

  // Memory latency bounds a walk: a few threads keep enough misses in flight. No more than the
  // cores this process may run on (its affinity: a container's or taskset's share).
  WalkHelpers() {
    size_t cores = std::thread::hardware_concurrency();
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<size_t>(CPU_COUNT(&set));
#endif
    threads_ = std::max<size_t>(1, std::min<size_t>(cores, 4));
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  void serve(size_t worker) {
#ifdef __linux__
    pthread_setname_np(pthread_self(), "gmt-walk");
#endif
    uint64_t seen = 0;
    for (;;) {
      // Tracks often come in runs (a track!() after each layer): a helper that has just walked
      // waits a little for the next walk awake, sparing it the wake-up (tens of µs), then sleeps.
      const auto until = std::chrono::steady_clock::now() + kStayAwake;
      for (unsigned spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        cpu_relax();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        job = current_;
      }
      if (job) take_chunks(*job, worker);
    }
  }

  static void take_chunks(Job& job, size_t worker) {
    if (worker >= job.workers) return;  // started for a walk with more threads
    // Counted active before taking a chunk: the caller, once every chunk is taken, sees any
    // thread still in one (sequentially consistent order of `active` and `next`).
    job.active.fetch_add(1);
    for (;;) {
      const size_t chunk = job.next.fetch_add(1);
      if (chunk >= job.chunks) break;
      const size_t begin = chunk * kChunk;
      try {
        job.body(worker, static_cast<uint32_t>(chunk), begin, std::min(job.entries, begin + kChunk));
      } catch (...) {
        // Never out of a helper (that would terminate the program), nor out of the caller
        // before the helpers are done with the snapshot: kept for run() to rethrow.
        std::lock_guard<std::mutex> lock(job.error_mu);
        if (!job.error) job.error = std::current_exception();
      }
    }
    job.active.fetch_sub(1);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};  // walks started; changed under mu_
  std::shared_ptr<Job> current_;
  size_t threads_ = 1;  // wanted, the caller's included
  size_t started_ = 0;  // helpers started
  pid_t pid_ = 0;
};

// What gmt_snapshot_take_grouped adds up: count and bytes per (group, owned or view), by the rule
// of the records' grouping (a storage shared by several tensors is owned by its largest, then
// oldest, tensor), without a record per tensor.
gmt_error take_grouped(gmt_snapshot* s, int32_t device_kind, int32_t device_index, bool detail) {
  GMT_TRY({
    if (!s) throw std::invalid_argument("null snapshot");
    s->groups.clear();
    s->totals = gmt_snapshot_totals{};
    ++s->walk;
    s->walk_slots.clear();
    const WalkFilter filter{device_kind, device_index, detail};
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      ++r.walks;  // gradients are found again, once, if a new entry needs its group
      auto& entries = r.entries;
      const size_t n = entries.size();
      WalkHelpers& helpers = WalkHelpers::get();
      const size_t workers = 1 + helpers.helpers_for(n);
      if (s->shares.size() < workers) s->shares.resize(workers);
      for (size_t w = 0; w < workers; ++w) s->shares[w].reset(r.groups.size());
      const size_t chunks = workers > 1 ? (n + WalkHelpers::kChunk - 1) / WalkHelpers::kChunk : 1;
      if (workers > 1) {
        auto job = std::make_shared<WalkHelpers::Job>();
        job->entries = n;
        job->chunks = chunks;
        job->workers = workers;
        job->body = [&](size_t worker, uint32_t chunk, size_t begin, size_t end) {
          walk_chunk(r, filter, *s, s->shares[worker], worker != 0, chunk, begin, end);
        };
        helpers.run(job);
        for (size_t w = 1; w < workers; ++w) s->shares[w].release_kept();
      } else {
        walk_chunk(r, filter, *s, s->shares[0], false, 0, 0, n);
      }
      WalkShare& caller = s->shares[0];
      // The shared storages the helpers met, while the entries are where the walk met them.
      for (size_t w = 1; w < workers; ++w) {
        for (const auto& met : s->shares[w].shared) {
          uint32_t hint = met.slot_hint;
          s->meet_shared(caller, met.storage, hint, met.use);
          if (hint != met.slot_hint) entries[met.entry].shared_slot = hint;
        }
      }
      // Then what the threads left, from the last entry down: removing entry i moves the last
      // entry into i, and that one is already done.
      std::vector<std::pair<const WalkShare*, const WalkShare::Span*>> spans(chunks, {nullptr, nullptr});
      for (size_t w = 0; w < workers; ++w) {
        for (const auto& span : s->shares[w].spans) spans[span.chunk] = {&s->shares[w], &span};
      }
      for (size_t c = chunks; c-- > 0;) {
        const auto [share, span] = spans[c];
        if (!span) continue;
        for (uint32_t k = span->end; k-- > span->begin;) {
          const size_t i = share->later[k];
          Entry& e = entries[i];
          auto strong = e.weak.lock();
          if (!strong) {
            r.remove_at(i);
            continue;
          }
          const at::Tensor t(std::move(strong));
          const c10::TensorImpl* impl = e.impl();
          const c10::StorageImpl* storage = nullptr;
          uint32_t storage_uses = 0;
          if (e.plain ? static_cast<bool>(impl->unsafe_storage()) : impl->has_storage()) {
            const c10::Storage& st = impl->unsafe_storage();
            storage = st.unsafeGetStorageImpl();
            storage_uses = static_cast<uint32_t>(st.use_count());
            if (storage != e.storage._unsafe_get_target()) e.storage = st.getWeakStorageImpl();
          }
          if (!on_device(impl, device_kind, device_index)) continue;
          const c10::AutogradMetaInterface* meta = (impl->*member_of(AutogradMetaField{})).get();
          const bool parameter = meta && meta->requires_grad() && t.is_leaf();
          int32_t group = -1;
          if (detail) {
            group = r.group_of(i, impl, parameter);
            if (static_cast<size_t>(group) >= caller.by_group.size()) {
              caller.by_group.resize(r.groups.size(), {0, 0, 0, 0});
            }
          }
          auto met_shared = [&](const c10::StorageImpl* st, const SharedUse& use) {
            s->meet_shared(caller, st, e.shared_slot, use);
          };
          caller.tally(impl, group, e.seq, storage, storage_uses, met_shared);
        }
      }
      for (size_t w = 1; w < workers; ++w) s->shares[w].merge_into(caller);
      r.prune_at = std::max(kMinPruneAt, entries.size() * 2);
    }
    WalkShare& caller = s->shares[0];
    s->totals = caller.totals;
    s->forget_unmet_storages();
    for (uint32_t i : s->walk_slots) {
      const SharedUse& owner = s->shared[i].owner;
      s->totals.tensor_bytes += owner.storage_nbytes;
      ++s->totals.storage_count;
      caller.add(owner.group, false, owner.storage_nbytes);
      if (owner.group >= 0) caller.by_group[owner.group][3] += s->shared[i].views;
    }
    for (int32_t g : caller.touched) {
      const auto& t = caller.by_group[g];
      if (t[0] > 0) s->groups.push_back(gmt_group_total{g, 0, {0, 0, 0}, t[0], t[1], t[3]});
      if (t[2] > 0) s->groups.push_back(gmt_group_total{g, 1, {0, 0, 0}, t[2], 0, 0});
    }
  })
}
}  // namespace

namespace gmt {
void take_peak_snapshot(int32_t device_kind) {
  char* err = gmt_snapshot_take(gmt_peak_snapshot(), device_kind, -1);
  gmt_free_string(err);  // a failed walk leaves an empty snapshot
}

void register_tensor(const at::Tensor& t, const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.record(t, name.empty() ? -1 : r.intern(name), -1);
}
}  // namespace gmt

extern "C" {

void gmt_free_string(char* s) { std::free(s); }

gmt_error gmt_registry_install(void) {
  GMT_TRY({
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.installed.load()) {
      r.handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_op_start, &on_op_end)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
      r.installed.store(true);
      // Keeps the name of the op running on each thread, for the out-of-memory report.
      gmt::op_stack_kept_by_registry();
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

gmt_error gmt_registry_register_impl(void* impl, const char* name) {
  GMT_TRY({
    if (!impl) throw std::invalid_argument("null TensorImpl pointer");
    // A new strong reference, dropped on return: the caller's object keeps the tensor alive.
    const at::Tensor t(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
        static_cast<c10::TensorImpl*>(impl)));
    gmt::register_tensor(t, name ? name : "");
  })
}

void gmt_recorder_tag_registered(void) {
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

size_t gmt_registry_walk_threads(void) { return WalkHelpers::get().threads(); }
void gmt_registry_set_walk_threads(size_t threads) { WalkHelpers::get().set_threads(threads); }

size_t gmt_registry_entries(void) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.entries.size();
}

uint64_t gmt_registry_callbacks(void) { return g_callbacks.load(std::memory_order_relaxed); }

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

gmt_snapshot* gmt_snapshot_new(void) { return new (std::nothrow) gmt_snapshot(); }
void gmt_snapshot_free(gmt_snapshot* s) { delete s; }

gmt_error gmt_snapshot_take(gmt_snapshot* s, int32_t device_kind, int32_t device_index) {
  return take_snapshot(s, device_kind, device_index, false);
}

gmt_error gmt_snapshot_take_categorized(gmt_snapshot* s, int32_t device_kind, int32_t device_index) {
  return take_snapshot(s, device_kind, device_index, true);
}

gmt_error gmt_snapshot_take_grouped(gmt_snapshot* s, int32_t device_kind, int32_t device_index, int32_t detail) {
  return take_grouped(s, device_kind, device_index, detail != 0);
}

const gmt_group_total* gmt_snapshot_groups(const gmt_snapshot* s, size_t* len) {
  if (len) *len = s ? s->groups.size() : 0;
  return s ? s->groups.data() : nullptr;
}

void gmt_snapshot_totals_of(const gmt_snapshot* s, gmt_snapshot_totals* out) {
  if (out) *out = s ? s->totals : gmt_snapshot_totals{};
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

gmt_snapshot* gmt_peak_snapshot(void) {
  static gmt_snapshot* peak = new gmt_snapshot();
  return peak;
}

size_t gmt_snapshot_len(const gmt_snapshot* s) { return s ? s->records.size() : 0; }
const gmt_tensor_record* gmt_snapshot_records(const gmt_snapshot* s) { return s ? s->records.data() : nullptr; }
const int64_t* gmt_snapshot_dims(const gmt_snapshot* s, size_t* len) {
  if (len) *len = s ? s->dims.size() : 0;
  return s ? s->dims.data() : nullptr;
}

}  // extern "C"
