// What walks of the registry add up, internal to the shim: the shared storages a grouped walk
// meets, each thread's share of the totals, and the buffer (gmt_walk) that keeps them between
// walks. The full walk is registry_records.cpp's, the grouped walk registry_walk.cpp's.
#pragma once
#include <array>
#include <vector>

#include "registry_store.h"

namespace gmt_registry {
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
  gmt_walk_totals totals{};
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
  // Pins and replaced storage references, released by the calling thread once the walk is done
  // and the registry's lock is free: a last reference's release runs the tensor's destructor,
  // which for a tensor owned by a Python object takes the GIL (the caller may hold it while it
  // waits for the helpers) and may run Python code.
  std::vector<at::Tensor> pins;
  std::vector<WeakStorage> released_storages;
  // The storage sizes the walk's caller watches (gmt_walk_watch_storage_sizes), and the
  // addresses of the data of the storages met of those sizes (a storage once per tensor).
  const std::vector<int64_t>* watch_sizes = nullptr;
  std::vector<uint64_t> watched;

  // Empties this share for a walk (also after one that threw).
  void reset(size_t groups, const std::vector<int64_t>* watch) {
    watch_sizes = watch;
    watched.clear();
    totals = gmt_walk_totals{};
    for (int32_t g : touched) by_group[g] = {0, 0, 0, 0};
    touched.clear();
    if (by_group.size() < groups) by_group.resize(groups, {0, 0, 0, 0});
    shared.clear();
    later.clear();
    spans.clear();
    pins.clear();
    released_storages.clear();
  }

  // Releases the pins and references kept (on the calling thread, after the registry's lock),
  // fetching each tensor's refcount ahead.
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
    if (__builtin_expect(!watch_sizes->empty(), 0)) {
      for (int64_t w : *watch_sizes) {
        // SAFETY: the storage's memory is live (the entry's weak reference); its data address
        // is only compared, so a release racing with this read is harmless.
        if (w == storage_nbytes) {
          watched.push_back(storage_address(storage));
          break;
        }
      }
    }
    if (storage_uses > 1) {
      // numel from the sizes (as TensorImpl keeps it): numel_ may lie on a line read for it alone.
      int64_t numel = 1;
      for (int64_t d : stored_sizes(impl)) numel *= d;
      shared_storage(storage, SharedUse{storage_nbytes, numel * static_cast<int64_t>(impl->itemsize()), seq, group});
    } else {
      totals.tensor_bytes += storage_nbytes;
      ++totals.storage_count;
      add(group, false, storage_nbytes);
    }
  }

  // Adds this share's totals and groups into `into`.
  void merge_into(WalkShare& into) const {
    into.watched.insert(into.watched.end(), watched.begin(), watched.end());
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
}  // namespace gmt_registry

struct gmt_walk {
  std::vector<gmt_tensor_record> records;
  std::vector<int64_t> dims;
  // gmt_walk_run_grouped: the totals per (group, view) and overall.
  std::vector<gmt_group_total> groups;
  gmt_walk_totals totals{};
  // The storage sizes whose data addresses a grouped walk collects, and those it collected: the
  // tracker tells a library's workspace from a tensor of the same size by them.
  std::vector<int64_t> watch_sizes;
  std::vector<uint64_t> watched;
  // Scratch of the grouped walk, kept between walks: what each of its threads adds up (the
  // calling thread's first, into which the others' are merged).
  std::vector<gmt_registry::WalkShare> shares;
  // The shared storages, kept from walk to walk so that a tensor finds its storage's slot by
  // its entry's hint (Entry::shared_slot), without a lookup, and slots come in walk order: by
  // slot, the storage (null: a free slot), the walk that last met it and its owner so far.
  struct SharedSlot {
    const void* storage;
    uint64_t walk;
    gmt_registry::SharedUse owner;
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
  void meet_shared(gmt_registry::WalkShare& into, const void* storage, uint32_t& hint,
                   const gmt_registry::SharedUse& use) {
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

namespace gmt_registry {
// Every live tensor on the device as a record (categorize: with its category), pruning the dead.
gmt_error take_records(gmt_walk* s, int32_t device_kind, int32_t device_index, bool categorize);
}  // namespace gmt_registry
