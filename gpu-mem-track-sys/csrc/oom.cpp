// Out-of-memory reports: the CPU allocator's limit and the CUDA caching allocator's observer both
// end here, on the failing thread, before the allocation error is thrown.
#include <atomic>
#include <mutex>

#include "oom.h"
#include "recorder.h"

namespace {
std::atomic<gmt_oom_callback> g_callback{nullptr};
// One report at a time, so two threads failing together write two whole blocks.
std::mutex g_report_mu;
// An allocation that fails inside a report is refused without another report (no recursion).
thread_local bool t_reporting = false;
}  // namespace

namespace gmt {
void report_oom(int32_t device_kind, int32_t device_index, int64_t requested, int64_t device_total,
                int64_t device_free) noexcept {
  if (t_reporting) return;
  t_reporting = true;
  try {
    // CUDA's trace hook records its own OOM entry under the allocator lock.
    if (device_kind != GMT_DEV_CUDA) record_oom(device_kind, requested, device_free);
    if (gmt_oom_callback cb = g_callback.load()) {
      const gmt_oom_event e{device_kind, device_index, requested, device_total, device_free,
                            current_op_name(), top_op_name()};
      std::lock_guard<std::mutex> lock(g_report_mu);
      cb(&e);
    }
  } catch (...) {
    // A report must never turn the program's out-of-memory error into another one.
  }
  t_reporting = false;
}

bool reporting_oom() noexcept { return t_reporting; }
}  // namespace gmt

extern "C" void gmt_oom_set_callback(gmt_oom_callback callback) { g_callback.store(callback); }
