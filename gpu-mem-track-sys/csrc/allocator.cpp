// Exact CPU allocation accounting: the default CPU allocator wrapped so every allocation and free
// is counted. Peaks are kept per "window" so several trackers each see the peak since their own
// previous track.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "common.h"
#include "oom.h"
#include "recorder.h"

namespace {
constexpr int kWindows = 32;

struct CpuAccounting {
  std::mutex mu;
  std::unordered_map<void*, size_t> live;
  int64_t current = 0, total_peak = 0, allocations = 0, frees = 0;
  int64_t window_peak[kWindows] = {};
  uint32_t window_open = 0;  // bit i set: window i in use

  void on_alloc(void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    live.emplace(p, n);
    current += static_cast<int64_t>(n);
    ++allocations;
    total_peak = std::max(total_peak, current);
    for (uint32_t open = window_open; open; open &= open - 1) {
      int i = __builtin_ctz(open);
      window_peak[i] = std::max(window_peak[i], current);
    }
  }
  void on_free(void* p) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = live.find(p);
      if (it == live.end()) return;
      current -= static_cast<int64_t>(it->second);
      ++frees;
      live.erase(it);
    }
    gmt::record_free(GMT_DEV_CPU, reinterpret_cast<int64_t>(p));
  }
};

CpuAccounting& accounting() {
  static CpuAccounting* a = new CpuAccounting();  // leaked: frees may arrive during exit
  return *a;
}

// Live-byte limit (-1: none): what a laptop needs to reproduce a GPU's out-of-memory.
std::atomic<int64_t> g_limit{-1};

// Whether `n` more bytes stay within the limit; the live bytes now in `*live`.
bool within_limit(size_t n, int64_t limit, int64_t* live) {
  CpuAccounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  *live = a.current;
  return a.current + static_cast<int64_t>(n) <= limit;
}

c10::Allocator* g_orig = nullptr;
c10::DeleterFnPtr g_orig_deleter = nullptr;

void tracking_delete(void* p) {
  accounting().on_free(p);
  g_orig_deleter(p);
}

// What comes back through the raw deleter was handed out raw (`raw_allocate`), never as a
// tensor's storage: oneDNN's scratchpads and reordered weights (PyTorch gives ideep's engine the
// CPU allocator's raw calls). A recording tags it as kernel scratch, memory only the CPU's
// kernels take from the allocator, which a CPU run's estimate keeps apart from the GPU's figures.
void tracking_raw_delete(void* p) {
  gmt::tag_allocation(reinterpret_cast<int64_t>(p), GMT_CAT_KERNEL_SCRATCH);
  tracking_delete(p);
}

struct TrackingCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const int64_t limit = g_limit.load(std::memory_order_relaxed);
    int64_t live = 0;
    if (limit >= 0 && n > 0 && !within_limit(n, limit, &live)) {
      gmt::report_oom(GMT_DEV_CPU, -1, static_cast<int64_t>(n), limit, std::max<int64_t>(0, limit - live));
      // The error c10's own CPU allocator raises when malloc fails, so the program sees what it
      // would see on a machine that really ran out.
      TORCH_CHECK_WITH(OutOfMemoryError, false, "DefaultCPUAllocator: not enough memory: you tried to allocate ", n,
                       " bytes.");
    }
    c10::DataPtr d = g_orig->allocate(n);
    void* p = d.get();
    if (!p) return d;  // n == 0
    if (d.get_context() != p || d.get_deleter() != g_orig_deleter) return d;  // not ours to re-wrap
    d.release_context();  // take ownership; re-wrap with our deleter (context == data, as before)
    accounting().on_alloc(p, n);
    gmt::record_alloc(GMT_DEV_CPU, reinterpret_cast<int64_t>(p), static_cast<int64_t>(n));
    return c10::DataPtr(p, p, &tracking_delete, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracking_raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

std::once_flag g_install_once;
bool g_installed = false;
}  // namespace

extern "C" {

gmt_error gmt_cpu_allocator_install(void) {
  GMT_TRY({
    std::call_once(g_install_once, [] {
      static TrackingCpuAllocator tracker;
      g_orig = c10::GetCPUAllocator();
      g_orig_deleter = g_orig->raw_deleter();
      if (!g_orig_deleter) throw std::runtime_error("the CPU allocator has no raw deleter; cannot wrap it");
      c10::SetCPUAllocator(&tracker, /*priority=*/100);
      g_installed = true;
    });
    if (!g_installed) throw std::runtime_error("installing the tracking CPU allocator failed earlier");
  })
}

int gmt_cpu_allocator_installed(void) { return g_installed ? 1 : 0; }

int32_t gmt_cpu_allocator_open_window(void) {
  CpuAccounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  for (int i = 0; i < kWindows; ++i) {
    if (!(a.window_open & (1u << i))) {
      a.window_open |= 1u << i;
      a.window_peak[i] = a.current;
      return i;
    }
  }
  return -1;
}

void gmt_cpu_allocator_close_window(int32_t window) {
  if (window < 0 || window >= kWindows) return;
  CpuAccounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  a.window_open &= ~(1u << window);
}

void gmt_cpu_allocator_stats(int32_t window, int reset_peak, gmt_alloc_stats* out) {
  CpuAccounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  gmt_alloc_stats s{};
  s.current = a.current;
  s.total_peak = a.total_peak;
  s.allocations = a.allocations;
  s.frees = a.frees;
  const bool valid = window >= 0 && window < kWindows && (a.window_open & (1u << window));
  s.peak = valid ? a.window_peak[window] : a.total_peak;
  if (valid && reset_peak) a.window_peak[window] = a.current;
  if (out) *out = s;
}

void gmt_cpu_allocator_set_limit(int64_t bytes) { g_limit.store(bytes < 0 ? -1 : bytes); }

int64_t gmt_cpu_allocator_limit(void) { return g_limit.load(); }

size_t gmt_cpu_allocator_live(int64_t* addrs, int64_t* sizes, size_t cap) {
  CpuAccounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.mu);
  size_t i = 0;
  for (const auto& [p, n] : a.live) {
    if (i < cap) {
      if (addrs) addrs[i] = reinterpret_cast<int64_t>(p);
      if (sizes) sizes[i] = static_cast<int64_t>(n);
    }
    ++i;
  }
  return i;
}

}  // extern "C"
