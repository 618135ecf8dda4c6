// Internal to the shim: where the allocators report an allocation they are about to refuse.
#pragma once
#include <cstdint>

#include "shim.h"

namespace gmt {
// Runs the out-of-memory callback (gmt_oom_set_callback) on this thread; returns when it has
// written its report. Never throws; does nothing when called from inside a report.
void report_oom(int32_t device_kind, int32_t device_index, int64_t requested, int64_t device_total,
                int64_t device_free) noexcept;
// Whether this thread is inside a report (its allocations are refused without another report).
bool reporting_oom() noexcept;
}  // namespace gmt
