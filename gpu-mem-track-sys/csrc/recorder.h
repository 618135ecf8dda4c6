// Internal to the shim, and exported to the estimator's native code: the allocation recorder shared
// by the allocators (which report events) and the estimators (which start/stop it and set phases).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gmt {
// Reports an allocation/free to the recorder when it is recording that device kind. Cheap when
// it is not (one relaxed atomic load).
void record_alloc(int32_t device_kind, int64_t id, int64_t size);
void record_free(int32_t device_kind, int64_t id);
// A free whose size the allocator reports (CUDA), so frees of blocks allocated before the recording
// keep their size.
void record_free_sized(int32_t device_kind, int64_t id, int64_t size);
// A caching-allocator segment reserved (alloc) or released; not an allocation.
void record_segment(int32_t device_kind, int64_t address, int64_t size, bool alloc);
// An allocation of `requested` bytes failed (history: the `oom` entry PyTorch's trace has).
void record_oom(int32_t device_kind, int64_t requested, int64_t device_free);
// The gmt_category a recording tagged the live allocation `id` with (GMT_CAT_NONE when none).
int32_t allocation_category(int64_t id);
// Current estimation phase / op tag for new events.
void set_phase(int32_t phase, int32_t iteration);
// The innermost op running on this thread, while op names are tracked (recording or capturing).
const char* current_op_name();
// The outermost op running on this thread (the call the program made), or "<no op>".
const char* top_op_name();
// The ops running on a thread, outermost first, and whether a peak walk waits for the innermost
// op to end. An op's start callback pushes its name, its end callback pops it (op_stack_pop).
struct OpStack {
  std::vector<const char*> names;
  bool walk_pending = false;

  // The outermost op running, or `fallback` outside any. The name lives at least as long as that
  // op runs (a dispatcher op's for the process; an autograd node's only while it runs).
  const char* outermost_or(const char* fallback) const { return names.empty() ? fallback : names.front(); }
};
// This thread's op stack: one thread-local lookup, for the per-op callbacks that read it several
// times (each lookup of a thread_local from a shared library is a call).
OpStack& this_thread_ops();
// Pops the innermost op and takes a pending peak walk.
void op_stack_pop(OpStack& ops);
// From now on the registry's callback keeps the op stack (its start/end run for every op anyway).
void op_stack_kept_by_registry();
// The recorder identity of a storage's allocation (meta: its number; CPU: its address), or -1.
int64_t allocation_id(const void* storage_impl);
// Tags the recorded allocation `id` (still live) with a gmt_category.
void tag_allocation(int64_t id, int32_t category);
// Sets the site of the recorded allocation `id` (still live): the module that owns a parameter,
// whatever module was running when it was made.
void site_allocation(int64_t id, int32_t site);
// Marks allocations as parameters for the current recording.
void tag_parameter(int64_t id);
// Storages of an allocator outside the shim whose data pointers say nothing (the estimator's meta
// allocator: null, each allocation numbered in its DataPtr context): those with `deleter` get their
// recorder id from `id_of(context)`. One such allocator; it registers itself when installed.
using DataDeleter = void (*)(void*);
using ForeignAllocationId = int64_t (*)(const void* context);
void set_foreign_allocation_ids(DataDeleter deleter, ForeignAllocationId id_of);
// Walks the registry's live tensors of a device into the peak walk (registry.cpp).
void take_peak_walk(int32_t device_kind);
// Reference-counted switch of the op-name callback (RecordFunction start/end).
void op_names_acquire();
void op_names_release();
}  // namespace gmt
