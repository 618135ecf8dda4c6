// The live-tensor registry's store, internal to the shim: the registered tensors (a weak
// reference each), their origins, the interned log groups, op names and classes, and the device
// helpers every walk reads tensors with. The registry's jobs are in their own files: the op
// callback that fills it (registry_callback.cpp), the full walk (registry_records.cpp), the
// grouped walk with its helper threads (registry_walk.cpp), and the rest of its C interface
// (registry.cpp).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/version.h>

#include "common.h"
#include "ptr_index.h"

namespace gmt_registry {
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// Whether a TensorImpl is a plain one: exactly c10::TensorImpl (no subclass whose sizes, device
// or storage come from elsewhere). Only these are read without a pin (see take_grouped).
inline bool is_plain(const c10::TensorImpl* impl) { return typeid(*impl) == typeid(c10::TensorImpl); }

// Fields of a TensorImpl read in place, through member pointers that an explicit template
// instantiation may take of private members ([temp.spec.general]): the compiler's own offsets,
// right for whatever libtorch the shim is built against.
struct AutogradMetaField {
  using type = std::unique_ptr<c10::AutogradMetaInterface> c10::TensorImpl::*;
  friend type member_of(AutogradMetaField);
};
struct DeviceField {
  using type = std::optional<c10::Device> c10::TensorImpl::*;
  friend type member_of(DeviceField);
};
struct SizesField {
  using type = c10::impl::SizesAndStrides c10::TensorImpl::*;
  friend type member_of(SizesField);
};
struct StorageDataField {
  using type = c10::DataPtr c10::StorageImpl::*;
  friend type member_of(StorageDataField);
};
template <class Field, typename Field::type Member>
struct PrivateMember {
  friend typename Field::type member_of(Field) { return Member; }
};
template struct PrivateMember<AutogradMetaField, &c10::TensorImpl::autograd_meta_>;
template struct PrivateMember<DeviceField, &c10::TensorImpl::device_opt_>;
template struct PrivateMember<SizesField, &c10::TensorImpl::sizes_and_strides_>;
template struct PrivateMember<StorageDataField, &c10::StorageImpl::data_ptr_>;

// Whether the tensor has autograd metadata (without it, requires_grad() is false), as
// TensorImpl::autograd_meta() would say without its call through the PLT (a walk reads it for
// every tensor).
inline bool has_autograd_meta(const c10::TensorImpl* impl) { return (impl->*member_of(AutogradMetaField{})) != nullptr; }

// A tensor's sizes and device as its TensorImpl stores them. Walks read these, never sizes() or
// device(): for a Python tensor subclass that answers them from Python (FakeTensor, wrapper
// subclasses with custom sizes), those run Python code under the registry's lock, and Python
// may hand the GIL to a thread that then waits for that lock, forever. A subclass's stored
// sizes are those it was made with; its stored device is where its own storage is (FakeTensor's:
// meta), which is what the memory log counts.
inline c10::IntArrayRef stored_sizes(const c10::TensorImpl* impl) {
  return impl->is_python_dispatch() ? (impl->*member_of(SizesField{})).sizes_arrayref() : impl->sizes();
}
// The address of a storage's data, as a number to compare (never to read through): the field
// itself, as StorageImpl::data_ptr() would throw for a storage without data (FakeTensor's).
inline uint64_t storage_address(const c10::StorageImpl* storage) {
  return reinterpret_cast<uint64_t>((storage->*member_of(StorageDataField{})).get());
}
inline int64_t stored_numel(const c10::TensorImpl* impl) {
  if (!impl->is_python_dispatch()) return impl->numel();
  int64_t numel = 1;
  for (int64_t d : stored_sizes(impl)) numel *= d;
  return numel;
}

// A registered tensor as the walks read it: 32 bytes, two to a cache line (the walks stream the
// entries; what only registration and full walks read is in EntryOrigin, beside it).
struct Entry {
  WeakImpl weak;  // the tensor; its target is the TensorImpl
  // The StorageImpl the tensor held when a walk last pinned it (null before), by a weak
  // reference: its memory (not its data) stays valid however the tensor or storage die, so a
  // walk reads its byte count and use count without pinning the tensor (see take_grouped).
  WeakStorage storage{c10::intrusive_ptr<c10::StorageImpl>()};
  uint64_t seq : 63;   // registration order
  uint64_t plain : 1;  // is_plain(tensor), set when recorded (a TensorImpl's class never changes)
  int32_t group = -1;  // its log group when last seen (see Registry::group_of); -1 before
  // Where a grouped walk last found its storage among the shared ones (gmt_walk::shared), a
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
// Pruning is amortised: when the registry doubles past its last live size, and at 256 entries
// at least. Pruning early lets malloc reuse the dead TensorImpls' memory while it is still in
// cache: from 4096, this cut the registry's own work on a small model's step by a fifth on one
// thread and by two fifths with the backward on another (benches/registry_own_work).
constexpr size_t kMinPruneAt = 256;
// Op-name addresses the op cache holds (a power of two).
constexpr size_t kOpSlots = 256;

// What an op's name says, for the op callback: an autograd node (its results are gradients
// flowing between nodes, not internal to a call), and the node that makes a parameter's .grad.
constexpr uint8_t kOpIsAutogradNode = 1, kOpIsAccumulateGrad = 2;
inline uint8_t traits_of(const char* name) {
  const bool node = std::strstr(name, "autograd::") != nullptr || std::strstr(name, "Backward") != nullptr;
  return (node ? kOpIsAutogradNode : 0) | (node && std::strstr(name, "AccumulateGrad") ? kOpIsAccumulateGrad : 0);
}

// Entries live in a vector so walks read contiguous memory and can prefetch the TensorImpls
// ahead; `index` finds an entry by TensorImpl for the per-op de-duplication.
struct Registry {
  std::mutex mu;
  std::vector<Entry> entries;
  std::vector<EntryOrigin> origins;  // by entry index
  gmt::PtrIndex index;
  std::deque<std::string> names;  // append-only: c_str() pointers stay valid
  std::unordered_map<std::string, int32_t> name_ids;
  // Op names by the address RecordFunction gives (the schema's name, alive as long as the op).
  // A direct-mapped cache of name addresses in front of op_texts (see op_id).
  struct OpSlot {
    const char* address = nullptr;
    const char* text = nullptr;  // the interned name (op_names' c_str, which never moves)
    int32_t id = -1;
  };
  std::array<OpSlot, kOpSlots> op_slots{};
  std::unordered_map<std::string, int32_t> op_texts;  // text -> id
  std::deque<std::string> op_names;  // append-only, index = op id
  std::vector<uint8_t> op_traits;    // by op id: what its name says (kOpIs*), read once per op
  // Log groups, interned: a tensor's shape, dtype and class rarely change after an op returns
  // it, so an entry keeps its group id and a walk only checks that it still holds. Like the
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
  std::vector<WeakImpl> named;  // the tensors registered with a name (parameters, buffers)
  uint64_t grads_walk = 0;
  uint64_t walks = 0;
  size_t prune_at = kMinPruneAt;
  at::CallbackHandle handle = 0;
  std::atomic<bool> installed{false};

  // Caller holds mu. `returned`: the outermost op running returns it (the program's call), rather
  // than an op that call ran; what an inner op made is internal until the outer call returns it,
  // or a view of it. `gradient`: made inside autograd's AccumulateGrad (a parameter's .grad).
  // `inductor_buffer`: allocated by a torch.compile'd graph's code, past the dispatcher.
  void record(const at::Tensor& t, int32_t name_id, int32_t op_id, bool returned = true, bool gradient = false,
              bool inductor_buffer = false) {
    if (!t.defined()) return;
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto [slot, inserted] = index.try_emplace(impl, static_cast<uint32_t>(entries.size()));
    if (returned && op_id >= 0) {
      // The first time a tensor is returned (not only made by an inner op), a view's base is no
      // longer internal either; later returns of the same tensor need no lookup of the base.
      const bool first_return = inserted || origins[*slot].role == GMT_ROLE_INTERNAL;
      if (!inserted && origins[*slot].role == GMT_ROLE_INTERNAL) origins[*slot].role = GMT_ROLE_NONE;
      // Without autograd metadata a tensor is no view (is_view() would ask libtorch to say so).
      if (first_return && has_autograd_meta(impl) && t.is_view()) {
        const uint32_t* base = index.find(t._base().unsafeGetTensorImpl());
        if (base && origins[*base].role == GMT_ROLE_INTERNAL) origins[*base].role = GMT_ROLE_NONE;
      }
    }
    if (!inserted) {
      if (name_id >= 0 && origins[*slot].name_id < 0) named.emplace_back(t.getIntrusivePtr());
      if (name_id >= 0) origins[*slot].name_id = name_id;
      return;  // keep the first registration's order (and the innermost op that returned it)
    }
    const int32_t role = optimizer_steps.load(std::memory_order_relaxed) > 0 ? GMT_ROLE_OPTIMIZER_STATE
                         : gradient                                       ? GMT_ROLE_GRADIENT
                         : inductor_buffer                                ? GMT_ROLE_INDUCTOR_BUFFER
                         : (!returned && op_id >= 0)                      ? GMT_ROLE_INTERNAL
                                                                          : GMT_ROLE_NONE;
    entries.emplace_back(WeakImpl(t.getIntrusivePtr()), next_seq++, is_plain(impl));
    origins.push_back(EntryOrigin{name_id, op_id, role});
    if (name_id >= 0) named.emplace_back(t.getIntrusivePtr());
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

  // Caller holds mu. Drops the dead entries. Most are dead when it runs (the tensors of the steps
  // since the last walk), so the survivors are moved down in order and the index is built anew,
  // rather than erasing each dead one from it.
  void prune() {
    size_t kept = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].weak.expired()) continue;
      if (kept != i) {
        entries[kept] = std::move(entries[i]);
        origins[kept] = origins[i];
      }
      ++kept;
    }
    entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(kept), entries.end());
    origins.resize(kept);
    index.clear();
    for (size_t i = 0; i < kept; ++i) index.try_emplace(entries[i].impl(), static_cast<uint32_t>(i));
    named.erase(std::remove_if(named.begin(), named.end(), [](const WeakImpl& w) { return w.expired(); }),
                named.end());
  }

  // Caller holds mu. Ops are interned by their text. A dispatcher op's name has one address for
  // the process, so addresses are a cache in front of the text: one slot per address, which a
  // per-call name (an autograd node's, built per call, its address reused by other text) simply
  // overwrites; every hit is checked against the text.
  int32_t op_id(const char* name) {
    if (!name) name = "<unnamed op>";
    OpSlot& slot = op_slots[(reinterpret_cast<uintptr_t>(name) * 0x9E3779B97F4A7C15ull) >> 56];
    static_assert(kOpSlots == 256, "the slot is the hash's top 8 bits");
    if (slot.address == name && std::strcmp(slot.text, name) == 0) return slot.id;
    auto [it, inserted] = op_texts.try_emplace(name, static_cast<int32_t>(op_names.size()));
    if (inserted) {
      op_names.emplace_back(name);
      op_traits.push_back(traits_of(name));
    }
    slot = OpSlot{name, op_names[it->second].c_str(), it->second};
    return it->second;
  }

  // The group entry e's tensor was last seen in, if its shape, dtype and class still match it
  // (-1 otherwise, or before it was first seen). Only reads: a walk's threads call it at once.
  // Inlined into the walk: this check is most of a walk's work per tensor once memory is read.
  __attribute__((always_inline)) int32_t held_group(const Entry& e, const c10::TensorImpl* impl,
                                                    bool parameter) const {
    if (e.group < 0) return -1;
    const GroupDef& g = groups[e.group];
    const c10::IntArrayRef sizes = stored_sizes(impl);
    // A loop rather than std::equal: that calls memcmp, slow for a few dimensions.
    bool same = g.scalar_type == static_cast<int32_t>(c10::typeMetaToScalarType(impl->dtype())) &&
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
    e.group = intern_group(stored_sizes(impl), static_cast<int32_t>(c10::typeMetaToScalarType(impl->dtype())), class_id, python,
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

  // Caller holds mu. The storages of the named parameters' gradients, from the named entries
  // alone (the dead ones dropped).
  void find_grads(std::unordered_set<const void*>& out) {
    out.clear();
    for (size_t i = 0; i < named.size();) {
      auto impl = named[i].lock();
      if (!impl) {
        named[i] = std::move(named.back());
        named.pop_back();
        continue;
      }
      const at::Tensor t(std::move(impl));
      if (t.requires_grad() && t.grad().defined() && t.grad().has_storage())
        out.insert(t.grad().storage().unsafeGetStorageImpl());
      ++i;
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

// The process's registry (leaked on purpose: callbacks may fire during exit).
Registry& registry();

inline __attribute__((always_inline)) int32_t device_kind_of(c10::DeviceType t) {
  switch (t) {
    case c10::DeviceType::CPU: return GMT_DEV_CPU;
    case c10::DeviceType::CUDA: return GMT_DEV_CUDA;
    case c10::DeviceType::Meta: return GMT_DEV_META;
    default: return GMT_DEV_OTHER;
  }
}

inline __attribute__((always_inline)) int32_t device_index_of(const c10::TensorImpl* impl, int32_t kind) {
  const std::optional<c10::Device>& device = impl->*member_of(DeviceField{});
  return device && device->has_index() ? device->index() : (kind == GMT_DEV_CUDA ? 0 : -1);
}

// Whether the tensor is on the device a walk asked for (kind GMT_DEV_ANY: all; index -1: any).
inline __attribute__((always_inline)) bool on_device(const c10::TensorImpl* impl, int32_t device_kind,
                                                    int32_t device_index) {
  const int32_t kind = device_kind_of(impl->device_type());
  const int32_t index = device_index_of(impl, kind);
  return (device_kind == GMT_DEV_ANY || device_kind == kind) && (device_index < 0 || index < 0 || device_index == index);
}

// The StorageImpl a TensorImpl's storage_ points to, read atomically: it is only compared, never
// dereferenced, so another thread resetting storage_ meanwhile (release_resources) is harmless.
inline const c10::StorageImpl* storage_target(const c10::TensorImpl* impl) {
  // A Storage is an intrusive_ptr<StorageImpl>, which is its target pointer alone.
  static_assert(sizeof(c10::Storage) == sizeof(c10::StorageImpl*));
  const auto* field = reinterpret_cast<c10::StorageImpl* const*>(&impl->unsafe_storage());
  return __atomic_load_n(field, __ATOMIC_RELAXED);
}
}  // namespace gmt_registry
