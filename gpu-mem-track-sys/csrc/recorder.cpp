// Allocation recorder: every allocation and free on the recorded device, in order, tagged with the
// estimation phase and the innermost op running on the allocating thread (from a RecordFunction
// start/end callback that is only enabled while recording). Allocators report to it (allocator.cpp,
// cuda_history.cpp, and the estimator's meta allocator through the same gmt:: functions).
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <execinfo.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "recorder.h"

namespace {
using Stack = std::array<void*, GMT_STACK_FRAMES>;

struct Recorder {
  std::mutex mu;
  // A ring when `capacity` > 0: `head` is the oldest event once it has wrapped.
  std::vector<gmt_alloc_event> events;
  std::vector<Stack> stacks;
  size_t capacity = 0, head = 0;
  uint64_t dropped = 0;
  bool with_stacks = false;
  std::chrono::steady_clock::time_point start;
  std::atomic<int32_t> site{-1};
  std::vector<int64_t> parameter_ids;
  // Event number after which the live tensors are walked (at the end of the running op).
  std::atomic<int64_t> walk_at{-1};
  // Walk the registry at the end of each op that raised the recording's peak of live bytes, so the last
  // walk is the peak's, from one run (estimates).
  std::atomic<bool> walk_peaks{false};
  int64_t pushed = 0;
  // The allocations made during the recording and not yet freed, by id: the event number of the
  // alloc and its size. Their bytes, and the highest those reached.
  struct Open {
    int64_t seq, size;
    bool host;  // tagged GMT_CAT_HOST: not in `live`
  };
  std::unordered_map<int64_t, Open> open;
  int64_t live = 0, peak = 0, peak_seq = -1;
  std::vector<std::string> op_names;  // index = op id
  std::unordered_map<std::string, int32_t> op_ids;
  std::atomic<int32_t> device_kind{GMT_DEV_ANY};
  std::atomic<bool> active{false};
  std::atomic<int32_t> phase{0};
  std::atomic<int32_t> iteration{0};
  at::CallbackHandle op_callback = 0;
  std::mutex op_mu;
  int op_users = 0;  // recordings and captures that need op names
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // leaked: frees may be reported during exit
  return *r;
}

// The ops running on this thread, outermost first. Kept by the registry's callback once it is
// installed (one callback per op instead of two), else by this file's.
thread_local gmt::OpStack t_ops;
std::atomic<bool> g_registry_keeps_stack{false};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (!g_registry_keeps_stack.load(std::memory_order_relaxed)) t_ops.names.push_back(fn.name());
  return nullptr;
}
void on_op_end(const at::RecordFunction&, at::ObserverContext*) {
  if (!g_registry_keeps_stack.load(std::memory_order_relaxed)) gmt::op_stack_pop(t_ops);
}

int32_t op_id(Recorder& r, const std::string& name) {  // caller holds r.mu
  auto it = r.op_ids.find(name);
  if (it != r.op_ids.end()) return it->second;
  const auto id = static_cast<int32_t>(r.op_names.size());
  r.op_names.push_back(name);
  r.op_ids.emplace(name, id);
  return id;
}

int32_t current_op(Recorder& r) { return op_id(r, gmt::current_op_name()); }
int32_t top_op(Recorder& r) { return op_id(r, gmt::top_op_name()); }

// Caller holds r.mu. Returns the event number.
int64_t push(Recorder& r, gmt_alloc_event e) {
  const int64_t seq = r.pushed++;
  if (seq == r.walk_at.load(std::memory_order_relaxed)) t_ops.walk_pending = true;
  if (e.is_free == GMT_EVENT_ALLOC) {
    r.open[e.id] = Recorder::Open{seq, e.size, false};
    r.live += e.size;
    // Strictly higher: the first event at the highest live bytes is the peak, as the estimate's
    // replay names it.
    if (r.live > r.peak) {
      r.peak = r.live;
      r.peak_seq = seq;
      if (r.walk_peaks.load(std::memory_order_relaxed)) t_ops.walk_pending = true;
    }
  } else if (e.is_free == GMT_EVENT_FREE) {
    const auto it = r.open.find(e.id);
    if (it != r.open.end()) {  // not made before the recording started
      if (!it->second.host) r.live -= it->second.size;
      r.open.erase(it);
    }
  }
  e.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - r.start).count();
  e.site = r.site.load(std::memory_order_relaxed);
  Stack stack{};
  if (r.with_stacks) {
    void* raw[GMT_STACK_FRAMES + 2];
    const int n = backtrace(raw, GMT_STACK_FRAMES + 2);
    const int skip = std::min(n, 2);  // push() and record_alloc/record_free
    e.nframes = n - skip;
    std::copy(raw + skip, raw + n, stack.begin());
  }
  if (r.capacity == 0 || r.events.size() < r.capacity) {
    r.events.push_back(e);
    if (r.with_stacks) r.stacks.push_back(stack);
    return seq;
  }
  r.events[r.head] = e;
  if (r.with_stacks) r.stacks[r.head] = stack;
  r.head = (r.head + 1) % r.capacity;
  ++r.dropped;
  return seq;
}

// Caller holds r.mu. The stored event with number `seq`, or null once the ring dropped it.
gmt_alloc_event* event_at(Recorder& r, int64_t seq) {
  const auto oldest = r.pushed - static_cast<int64_t>(r.events.size());
  if (seq < oldest || seq >= r.pushed) return nullptr;
  const auto slot = static_cast<size_t>(r.capacity == 0 ? seq : seq % static_cast<int64_t>(r.capacity));
  return &r.events[slot];
}

bool recording(Recorder& r, int32_t device_kind) {
  if (!r.active.load(std::memory_order_relaxed)) return false;
  const int32_t want = r.device_kind.load(std::memory_order_relaxed);
  return want == GMT_DEV_ANY || want == device_kind;
}

// Another allocator's storages (the estimator's meta allocator: data pointers null, sizes in the
// context): the deleter that marks them, and how their recorder id is read from the context.
std::atomic<gmt::DataDeleter> g_foreign_deleter{nullptr};
std::atomic<gmt::ForeignAllocationId> g_foreign_id{nullptr};
}  // namespace

namespace gmt {
void record_alloc(int32_t device_kind, int64_t id, int64_t size) {
  Recorder& r = recorder();
  if (!recording(r, device_kind)) return;
  std::lock_guard<std::mutex> lock(r.mu);
  push(r, gmt_alloc_event{id, size, GMT_EVENT_ALLOC, static_cast<uint8_t>(r.phase.load()), static_cast<uint8_t>(device_kind),
                          static_cast<uint8_t>(r.iteration.load()), current_op(r), 0, -1, 0, top_op(r), 0});
}

void record_free(int32_t device_kind, int64_t id) { record_free_sized(device_kind, id, 0); }

void record_free_sized(int32_t device_kind, int64_t id, int64_t size) {
  Recorder& r = recorder();
  if (!recording(r, device_kind)) return;
  std::lock_guard<std::mutex> lock(r.mu);
  push(r, gmt_alloc_event{id, size, GMT_EVENT_FREE, static_cast<uint8_t>(r.phase.load()),
                          static_cast<uint8_t>(device_kind), static_cast<uint8_t>(r.iteration.load()), current_op(r),
                          0, -1, 0, top_op(r), 0});
}

void record_segment(int32_t device_kind, int64_t address, int64_t size, bool alloc) {
  Recorder& r = recorder();
  if (!recording(r, device_kind)) return;
  std::lock_guard<std::mutex> lock(r.mu);
  // Segments are reserved memory, not allocations: they do not count towards live/peak.
  push(r, gmt_alloc_event{address, size, static_cast<uint8_t>(alloc ? GMT_EVENT_SEGMENT_ALLOC : GMT_EVENT_SEGMENT_FREE),
                          static_cast<uint8_t>(r.phase.load()), static_cast<uint8_t>(device_kind),
                          static_cast<uint8_t>(r.iteration.load()), current_op(r), 0, -1, 0, top_op(r), 0});
}

const char* current_op_name() { return t_ops.names.empty() ? "<no op>" : t_ops.names.back(); }
const char* top_op_name() { return t_ops.outermost_or("<no op>"); }

OpStack& this_thread_ops() { return t_ops; }

void op_stack_pop(OpStack& ops) {
  if (!ops.names.empty()) ops.names.pop_back();
  if (ops.walk_pending) {
    // Outside the allocator and the recorder lock: the registry walk may free tensors.
    ops.walk_pending = false;
    take_peak_walk(recorder().device_kind.load());
  }
}

void op_stack_kept_by_registry() { g_registry_keeps_stack.store(true); }

void record_oom(int32_t device_kind, int64_t requested, int64_t device_free) {
  Recorder& r = recorder();
  if (!recording(r, device_kind)) return;
  std::lock_guard<std::mutex> lock(r.mu);
  push(r, gmt_alloc_event{device_free, requested, GMT_EVENT_OOM, static_cast<uint8_t>(r.phase.load()),
                          static_cast<uint8_t>(device_kind), static_cast<uint8_t>(r.iteration.load()), current_op(r),
                          0, -1, 0, top_op(r), 0});
}

int32_t allocation_category(int64_t id) {
  Recorder& r = recorder();
  if (!r.active.load(std::memory_order_relaxed) || id < 0) return GMT_CAT_NONE;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(id);
  if (it == r.open.end()) return GMT_CAT_NONE;
  const gmt_alloc_event* e = event_at(r, it->second.seq);
  return e && e->id == id ? e->category : GMT_CAT_NONE;
}

void op_names_acquire() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.op_mu);
  if (r.op_users++ > 0) return;
  if (r.op_callback == 0) {
    r.op_callback = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end).scopes({at::RecordScope::FUNCTION}));
  } else {
    at::reenableCallback(r.op_callback);
  }
}

void op_names_release() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.op_mu);
  if (r.op_users > 0 && --r.op_users == 0 && r.op_callback != 0) at::disableCallback(r.op_callback);
}

int64_t allocation_id(const void* storage_impl) {
  const auto* s = static_cast<const c10::StorageImpl*>(storage_impl);
  if (!s) return -1;
  const c10::DataPtr& d = s->data_ptr();
  const gmt::DataDeleter foreign = g_foreign_deleter.load(std::memory_order_acquire);
  if (foreign && d.get_deleter() == foreign) return g_foreign_id.load(std::memory_order_acquire)(d.get_context());
  return d.get() ? reinterpret_cast<int64_t>(d.get()) : -1;
}

void tag_allocation(int64_t id, int32_t category) {
  Recorder& r = recorder();
  if (!r.active.load(std::memory_order_relaxed) || id < 0) return;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(id);
  if (it == r.open.end()) return;  // made before the recording started
  // What the program declared outranks what autograd did with it: a registered buffer or an
  // input that a layer saves for backward stays a buffer or an input. Memory on the host is
  // never the GPU's, whatever else it is (an offloaded parameter).
  const auto rank = [](int32_t c) {
    return c == GMT_CAT_NONE ? 0 : c == GMT_CAT_ACTIVATION ? 1 : c == GMT_CAT_INPUT ? 2 : c == GMT_CAT_HOST ? 4 : 3;
  };
  gmt_alloc_event* e = event_at(r, it->second.seq);
  if (!e || e->id != id || rank(category) <= rank(e->category)) return;
  e->category = category;
  if (category == GMT_CAT_HOST && !it->second.host) {
    // Host memory leaves the live bytes whose peaks are walked; it was live at the last peak
    // when made before it.
    it->second.host = true;
    r.live -= it->second.size;
    if (it->second.seq <= r.peak_seq) r.peak -= it->second.size;
  }
}

void site_allocation(int64_t id, int32_t site) {
  Recorder& r = recorder();
  if (!r.active.load(std::memory_order_relaxed) || id < 0) return;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(id);
  if (it == r.open.end()) return;  // made before the recording started
  gmt_alloc_event* e = event_at(r, it->second.seq);
  if (e && e->id == id) e->site = site;
}

void set_foreign_allocation_ids(DataDeleter deleter, ForeignAllocationId id_of) {
  // The reader first: allocation_id reads the deleter, then the reader.
  g_foreign_id.store(id_of, std::memory_order_release);
  g_foreign_deleter.store(deleter, std::memory_order_release);
}

void tag_parameter(int64_t id) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.parameter_ids.push_back(id);
}

void set_phase(int32_t phase, int32_t iteration) {
  recorder().phase.store(phase);
  recorder().iteration.store(iteration);
}
}  // namespace gmt

extern "C" {

namespace {
// The phase is set before the recorder turns on, so no event of another thread gets a stale one.
gmt_error start_recording(int32_t device_kind, size_t max_events, int with_stacks, int32_t phase) {
  GMT_TRY({
    Recorder& r = recorder();
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (r.active.load()) throw std::runtime_error("an allocation recording is already running");
      r.events.clear();
      r.stacks.clear();
      r.parameter_ids.clear();
      r.open.clear();
      r.capacity = max_events;
      r.head = 0;
      r.dropped = 0;
      r.with_stacks = with_stacks != 0;
      if (max_events > 0) {
        r.events.reserve(max_events);
        if (r.with_stacks) r.stacks.reserve(max_events);
      }
      r.live = r.peak = 0;
      r.peak_seq = -1;
      r.pushed = 0;
      r.phase.store(phase);
      r.iteration.store(0);
      r.site.store(-1);
      r.start = std::chrono::steady_clock::now();
      r.device_kind.store(device_kind);
    }
    gmt::op_names_acquire();
    r.active.store(true);
  })
}

}  // namespace

// A live program's history starts outside any phase; an estimate starts by loading the model.
gmt_error gmt_recorder_start_history(int32_t device_kind, size_t max_events, int with_stacks) {
  return start_recording(device_kind, max_events, with_stacks, GMT_PHASE_NONE);
}

gmt_error gmt_recorder_start(int32_t device_kind) { return start_recording(device_kind, 0, 0, GMT_PHASE_LOAD); }

int gmt_recorder_active(void) { return recorder().active.load() ? 1 : 0; }

void gmt_recorder_progress(int32_t* phase, int32_t* iteration) {
  if (phase) *phase = recorder().phase.load(std::memory_order_relaxed);
  if (iteration) *iteration = recorder().iteration.load(std::memory_order_relaxed);
}

void gmt_recorder_set_site(int32_t site) { recorder().site.store(site, std::memory_order_relaxed); }

void gmt_recorder_walk_at(int64_t event) { recorder().walk_at.store(event); }

void gmt_recorder_walk_peaks(int on) { recorder().walk_peaks.store(on != 0); }

size_t gmt_recorder_copy(gmt_alloc_event* out, uint64_t* stacks, size_t cap, uint64_t* dropped) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (dropped) *dropped = r.dropped;
  const size_t n = std::min(cap, r.events.size());
  for (size_t i = 0; i < n; ++i) {
    const size_t k = (r.head + i) % r.events.size();
    out[i] = r.events[k];
    if (stacks) {
      for (size_t f = 0; f < GMT_STACK_FRAMES; ++f)
        stacks[i * GMT_STACK_FRAMES + f] = r.with_stacks ? reinterpret_cast<uint64_t>(r.stacks[k][f]) : 0;
    }
  }
  return n;
}

gmt_error gmt_recorder_stop(void) {
  GMT_TRY({
    Recorder& r = recorder();
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (!r.active.load()) return nullptr;
      r.active.store(false);
      r.walk_at.store(-1);
      r.walk_peaks.store(false);
    }
    gmt::op_names_release();
  })
}

void gmt_recorder_set_phase(int32_t phase, int32_t iteration) { gmt::set_phase(phase, iteration); }

void gmt_recorder_tag_tensor(const void* tensor, int32_t category) {
  const auto* t = static_cast<const at::Tensor*>(tensor);
  if (t && t->defined()) gmt_recorder_tag_tensor_impl(t->unsafeGetTensorImpl(), category);
}

void gmt_recorder_tag_tensor_impl(const void* impl, int32_t category) {
  const auto* t = static_cast<const c10::TensorImpl*>(impl);
  if (!t || !t->has_storage()) return;
  gmt::tag_allocation(gmt::allocation_id(t->storage().unsafeGetStorageImpl()), category);
}

int32_t gmt_recorder_tensor_impl_category(const void* impl) {
  const auto* t = static_cast<const c10::TensorImpl*>(impl);
  if (!t || !t->has_storage()) return -1;
  const int64_t id = gmt::allocation_id(t->storage().unsafeGetStorageImpl());
  Recorder& r = recorder();
  if (!r.active.load(std::memory_order_relaxed) || id < 0) return -1;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(id);
  if (it == r.open.end()) return -1;
  const gmt_alloc_event* e = event_at(r, it->second.seq);
  return e && e->id == id ? e->category : -1;
}

void gmt_recorder_site_tensor_impl(const void* impl, int32_t site) {
  const auto* t = static_cast<const c10::TensorImpl*>(impl);
  if (!t || !t->has_storage()) return;
  gmt::site_allocation(gmt::allocation_id(t->storage().unsafeGetStorageImpl()), site);
}

size_t gmt_recorder_len(void) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events.size();
}

size_t gmt_recorder_parameter_ids(int64_t* out, size_t cap) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  for (size_t i = 0; i < std::min(cap, r.parameter_ids.size()); ++i) out[i] = r.parameter_ids[i];
  return r.parameter_ids.size();
}

const char* gmt_recorder_op_name(int32_t op) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (op < 0 || static_cast<size_t>(op) >= r.op_names.size()) return "<unknown>";
  return r.op_names[op].c_str();
}

}  // extern "C"
