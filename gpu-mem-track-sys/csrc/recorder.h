// Internal to the shim: the allocation recorder shared by the allocators (which report events)
// and the estimators (which start/stop it and set phases).
#pragma once
#include <cstdint>

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
// Current estimation phase / op tag for new events.
void set_phase(int32_t phase, int32_t iteration);
// The innermost op running on this thread, while op names are tracked (recording or capturing).
const char* current_op_name();
// The recorder identity of a storage's allocation (meta: its number; CPU: its address), or -1.
int64_t allocation_id(const void* storage_impl);
// Tags the recorded allocation `id` (still live) with a gmt_category.
void tag_allocation(int64_t id, int32_t category);
// Marks allocations as parameters for the current recording.
void tag_parameter(int64_t id);
// Snapshots the registry's live tensors of a device into the peak snapshot (registry.cpp).
void take_peak_snapshot(int32_t device_kind);
// Reference-counted switch of the op-name callback (RecordFunction start/end).
void op_names_acquire();
void op_names_release();
}  // namespace gmt
