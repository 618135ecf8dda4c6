// A flat open-addressing map from pointers to small integers: the registry's per-op lookup.
// std::unordered_map allocates a node per insert and misses the cache on every probe, which
// made up most of the registry's per-op cost.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace gmt {
class PtrIndex {
 public:
  PtrIndex() { rehash(kMinCapacity); }

  // Inserts (key, value) unless key is present; returns the stored value's slot and whether it
  // was inserted. The pointer is valid until the next insertion or erase.
  std::pair<uint32_t*, bool> try_emplace(const void* key, uint32_t value) {
    if ((count_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    size_t i = home(key);
    while (slots_[i].key) {
      if (slots_[i].key == key) return {&slots_[i].value, false};
      i = (i + 1) & mask_;
    }
    slots_[i] = Slot{key, value};
    ++count_;
    return {&slots_[i].value, true};
  }

  uint32_t* find(const void* key) {
    for (size_t i = home(key); slots_[i].key; i = (i + 1) & mask_)
      if (slots_[i].key == key) return &slots_[i].value;
    return nullptr;
  }

  // Backward-shift deletion: no tombstones, so probes stay short however many tensors die.
  void erase(const void* key) {
    size_t i = home(key);
    while (slots_[i].key != key) {
      if (!slots_[i].key) return;
      i = (i + 1) & mask_;
    }
    for (size_t j = (i + 1) & mask_; slots_[j].key; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = nullptr;
    --count_;
  }

  size_t size() const { return count_; }

  // Empties the map. It keeps its capacity, unless that is far above what it held (a registry that
  // once held many more tensors): then it shrinks, so that clearing (each prune) stays in
  // proportion to what the map holds.
  void clear() {
    if (count_ == 0) return;
    if (slots_.size() > kMinCapacity && slots_.size() > 8 * count_) {
      size_t capacity = kMinCapacity;
      while (capacity < 4 * count_) capacity *= 2;
      slots_.clear();
      rehash(capacity);  // nothing to move: an empty map of that capacity
      return;
    }
    for (Slot& s : slots_) s.key = nullptr;
    count_ = 0;
  }

 private:
  static constexpr size_t kMinCapacity = 1024;

  struct Slot {
    const void* key;
    uint32_t value;
  };

  size_t home(const void* key) const {
    // Fibonacci hashing: allocator addresses differ mostly in the middle bits.
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{nullptr, 0});
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    count_ = 0;
    for (const Slot& s : old)
      if (s.key) try_emplace(s.key, s.value);
  }

  std::vector<Slot> slots_;
  size_t count_ = 0;
  size_t mask_ = 0;
  unsigned shift_ = 64;
};
}  // namespace gmt
