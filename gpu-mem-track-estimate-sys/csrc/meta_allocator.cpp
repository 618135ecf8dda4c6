// The tracking Meta allocator: meta tensors hold no data, so each allocation is numbered and its
// size travels in the DataPtr context; allocations and frees go to the tracker's recorder, which
// reads a meta storage's number through the hook installed here (gmt::set_foreign_allocation_ids).
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>

#include "common.h"
#include "internal.h"
#include "recorder.h"

namespace {
struct MetaBlock {
  int64_t id;
  int64_t size;
  bool recorded;  // made outside gmt_meta_unrecorded_begin/end: reported, and so is its free
};
std::atomic<int64_t> g_meta_next_id{1};
std::atomic<int64_t> g_meta_current{0};
// gmt_meta_unrecorded_begin/end nesting on this thread.
thread_local int t_unrecorded = 0;

void meta_delete(void* ctx) {
  auto* b = static_cast<MetaBlock*>(ctx);
  if (b->recorded) {
    g_meta_current.fetch_sub(b->size, std::memory_order_relaxed);
    gmt::record_free(GMT_DEV_META, b->id);
  }
  delete b;
}

int64_t meta_id(const void* ctx) { return static_cast<const MetaBlock*>(ctx)->id; }

struct TrackingMetaAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    auto* b = new MetaBlock{g_meta_next_id.fetch_add(1, std::memory_order_relaxed), static_cast<int64_t>(n),
                            t_unrecorded == 0};
    if (b->recorded) {
      g_meta_current.fetch_add(b->size, std::memory_order_relaxed);
      gmt::record_alloc(GMT_DEV_META, b->id, b->size);
    }
    // The data pointer must stay null on meta; the context carries the size.
    return c10::DataPtr(nullptr, b, &meta_delete, c10::Device(c10::DeviceType::Meta));
  }
  void copy_data(void*, const void*, std::size_t) const override {}
};
std::once_flag g_meta_once;
}  // namespace

extern "C" {

gmt_error gmt_meta_allocator_install(void) {
  GMT_TRY({
    std::call_once(g_meta_once, [] {
      // The recorder learns to read meta storages' numbers before the first one exists.
      gmt::set_foreign_allocation_ids(&meta_delete, &meta_id);
      static TrackingMetaAllocator meta;
      c10::SetAllocator(c10::DeviceType::Meta, &meta, /*priority=*/100);
    });
    // Ops without a Meta kernel then run their CPU kernel instead of failing the estimate.
    gmt::meta_fallback_install();
  })
}

int64_t gmt_meta_allocator_current(void) { return g_meta_current.load(); }

gmt_error gmt_meta_storage_resize(void* storage_impl, int64_t nbytes) {
  GMT_TRY({
    auto* s = static_cast<c10::StorageImpl*>(storage_impl);
    if (!s || nbytes < 0) throw std::invalid_argument("meta storage resize: null storage or negative size");
    if (s->device_type() != c10::DeviceType::Meta) throw std::invalid_argument("meta storage resize: not a meta storage");
    if (!s->resizable()) throw std::runtime_error("Trying to resize storage that is not resizable");
    c10::Allocator* allocator = s->allocator() ? s->allocator() : c10::GetAllocator(c10::DeviceType::Meta);
    // As a GPU storage resizes: a new block of the new size (none for 0); the old one's free is
    // recorded when its DataPtr goes.
    c10::DataPtr fresh = nbytes > 0 ? allocator->allocate(static_cast<size_t>(nbytes))
                                    : c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta));
    s->set_data_ptr_noswap(std::move(fresh));
    s->set_nbytes(static_cast<size_t>(nbytes));
  })
}

int32_t gmt_meta_storage_recorded(const void* storage_impl) {
  const auto* s = static_cast<const c10::StorageImpl*>(storage_impl);
  if (!s || s->device_type() != c10::DeviceType::Meta) return -1;
  const c10::DataPtr& d = s->data_ptr();
  if (d.get_deleter() != &meta_delete) return -1;  // empty, or not this allocator's
  return static_cast<const MetaBlock*>(d.get_context())->recorded ? 1 : 0;
}

void gmt_meta_unrecorded_begin(void) { ++t_unrecorded; }
void gmt_meta_unrecorded_end(void) {
  if (t_unrecorded > 0) --t_unrecorded;
}

}  // extern "C"
