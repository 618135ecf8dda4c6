// The grouped walk (what a track!() reads): count, bytes and views per log group, without a record
// per tensor, read by up to three helper threads besides the caller on a large registry.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "registry_walk.h"

namespace gmt_registry {
namespace {
// Whether a pinned tensor is a leaf that requires grad (printed as a Parameter), without
// requires_grad()'s out-of-line wrapper. is_leaf() first: a view's requires_grad() reads its base
// tensor (a cache miss per view), and a view autograd made (of an activation) is no leaf.
inline bool is_parameter(const c10::TensorImpl* impl, const at::TensorBase& t) {
  const c10::AutogradMetaInterface* meta = (impl->*member_of(AutogradMetaField{})).get();
  return meta && t.is_leaf() && meta->requires_grad();
}

// The grouped walk, split so that several threads can read the registry at once (it is bound by
// memory latency: each thread keeps its own misses in flight). Each thread walks chunks of the
// entries and adds the common case, a live tensor whose group still holds, into its own
// WalkShare. What changes the registry waits for the calling thread, after the others are done:
// a dead entry's removal, a group to intern. So do the storages shared by several tensors that a
// helper met; the calling thread finds the owners of those it meets itself as it goes.
struct WalkFilter {
  int32_t device_kind;
  int32_t device_index;
  bool detail;      // group the tensors (else only the totals)
  bool gil_held;    // the calling thread holds Python's GIL for the whole walk
};

// The calling thread's word that it holds the GIL (gmt_registry_walks_hold_gil).
thread_local bool t_gil_held = false;

// Whether a tensor cannot die while the walk runs without being pinned: under the GIL, one that
// has a Python object. From torch 2.10 on, a TensorImpl with a Python object holds its last
// reference through that object ("PyObject preservation"): the object's own release, and a C++
// owner's hand-over of the last reference to it (decref_pyobject), both need the GIL, which the
// calling thread holds until every helper is done. Pinning such a tensor instead would take the
// GIL itself (try_incref_pyobject, then decref_pyobject on release), on a helper thread a new
// Python thread state each time: most of a walk's time when a quarter of the tensors are views.
inline bool alive_under_gil(const WalkFilter& filter, const c10::TensorImpl* impl) {
#if GMT_PYTHON_CLASS
  return filter.gil_held && impl->pyobj_slot()->load_pyobj() != nullptr;
#else
  (void)filter;
  (void)impl;
  return false;
#endif
}

// A tensor read in place, its reference count untouched (as c10::MaybeOwned borrows one): for a
// tensor that alive_under_gil keeps alive.
class Borrowed {
 public:
  explicit Borrowed(c10::TensorImpl* impl)
      : t_(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(impl)) {}
  ~Borrowed() { t_.unsafeReleaseTensorImpl(); }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  const at::TensorBase& get() const { return t_; }

 private:
  at::TensorBase t_;
};

// Walks entries [begin, end) as one thread of a grouped walk (the caller holds r.mu; other
// threads walk other entries). Changes only these entries' storage references and `share`, and
// for the calling thread (`helper` false) the walk's shared storages; a helper keeps its pins
// and replaced references in `share`, and the shared storages it met.
void walk_chunk(Registry& r, const WalkFilter& filter, gmt_walk& s, WalkShare& share, bool helper, uint32_t chunk,
                size_t begin, size_t end) {
  auto& entries = r.entries;
  const auto later_begin = static_cast<uint32_t>(share.later.size());
  auto later = [&](size_t i) { share.later.push_back(static_cast<uint32_t>(i)); };
  // What a walk reads of a TensorImpl and of its StorageImpl is fetched that many entries
  // ahead: a walk is bound by memory, and the entries themselves stream in by the hardware's
  // prefetch. Only the lines read are fetched: of a TensorImpl (176 bytes, 3 or 4 cache lines),
  // its head (refcount, storage_, autograd_meta_), its first sizes and its tail (dtype, device,
  // key set), not the strides between; of a StorageImpl, its refcount and byte count. Written
  // out in the loop: GCC 12 drops __builtin_prefetch from an inlined lambda.
  constexpr size_t kAhead = 16;
  // Byte offsets in a TensorImpl (torch 2.9 to 2.15 on 64-bit targets; a wrong offset only
  // fetches a line in vain): refcount to autograd_meta_, the dimension count to the third size,
  // data_type_ to key_set_; in a StorageImpl: refcount, byte count.
  constexpr size_t kHead = 8, kHeadEnd = 31, kSizes = 56, kSizesEnd = 87, kTail = 160, kTailEnd = 175;
  constexpr size_t kStorageHead = 8, kStorageEnd = 56;
  for (size_t i = begin; i < end; ++i) {
    if (i + kAhead < end) {
      const Entry& a = entries[i + kAhead];
      const char* impl = reinterpret_cast<const char*>(a.impl());
      // A prefetch never faults, whatever (even null) the address.
      const char* storage = reinterpret_cast<const char*>(a.storage._unsafe_get_target());
      __builtin_prefetch(impl + kHead);
      __builtin_prefetch(impl + kHeadEnd);
      __builtin_prefetch(impl + kSizes);
      __builtin_prefetch(impl + kSizesEnd);
      __builtin_prefetch(impl + kTail);
      __builtin_prefetch(impl + kTailEnd);
      __builtin_prefetch(storage + kStorageHead);
      __builtin_prefetch(storage + kStorageEnd);
    }
    Entry& e = entries[i];
    // Subclasses (whose sizes may throw or come from elsewhere) and dead entries: later.
    if (!e.plain || e.weak.expired()) {
      later(i);
      continue;
    }
    const c10::TensorImpl* impl = e.impl();
    auto met_shared = [&](const c10::StorageImpl* storage, const SharedUse& use) {
      if (helper) share.shared.push_back(WalkShare::SharedMet{static_cast<uint32_t>(i), e.shared_slot, storage, use});
      else s.meet_shared(share, storage, e.shared_slot, use);
    };
    // The fast path, without pinning the tensor (two atomic read-modify-writes, most of the
    // walk's time). SAFETY: the entry's weak references keep the memory of the TensorImpl and
    // of e.storage's StorageImpl allocated (not destroyed) whatever other threads do, so every
    // read below is of live memory. What another thread may change meanwhile, when it drops the
    // tensor's last reference, is what TensorImpl::release_resources() resets: the `storage_`
    // and `autograd_meta_` pointers, and the objects they own may be freed. The fast path reads
    // those two pointers' values only (storage_ as an atomic load), never what they point to: a
    // null autograd_meta_ means requires_grad() is false (so the tensor is not a parameter and
    // is_leaf is not needed), and a storage_ equal to e.storage's target is that same
    // StorageImpl (the weak reference keeps its address from being reused), read through
    // e.storage. Sizes, dtype, device and numel are fields of a plain TensorImpl that
    // release_resources() leaves alone. Anything else (Python tensors, autograd meta, a storage
    // not seen before) takes the pinned path. A tensor dying during the walk is counted or not,
    // as when it dies just after its pin.
    if (!impl->is_python_dispatch() && !has_autograd_meta(impl)) {
      const c10::StorageImpl* storage = storage_target(impl);
      if (storage && storage == e.storage._unsafe_get_target()) {
        if (on_device(impl, filter.device_kind, filter.device_index)) {
          const int32_t group = filter.detail ? r.held_group(e, impl, false) : -1;
          if (filter.detail && group < 0) {
            later(i);
            continue;
          }
          share.tally(impl, group, e.seq, storage, e.storage.use_count(), met_shared);
        }
        continue;
      }
    }
    // A live tensor that cannot die meanwhile (pinned, or kept alive by the GIL), read whole.
    auto read = [&](const at::TensorBase& t) {
      const c10::StorageImpl* storage = nullptr;
      uint32_t storage_uses = 0;
      // has_storage() is out of line; a plain TensorImpl has storage when storage_ is set.
      if (impl->unsafe_storage()) {
        const c10::Storage& st = impl->unsafe_storage();
        storage = st.unsafeGetStorageImpl();
        storage_uses = static_cast<uint32_t>(st.use_count());
        if (storage != e.storage._unsafe_get_target()) {
          if (helper) share.released_storages.push_back(std::move(e.storage));
          e.storage = st.getWeakStorageImpl();
        }
      }
      if (on_device(impl, filter.device_kind, filter.device_index)) {
        const bool parameter = is_parameter(impl, t);
        const int32_t group = filter.detail ? r.held_group(e, impl, parameter) : -1;
        if (filter.detail && group < 0) later(i);
        else share.tally(impl, group, e.seq, storage, storage_uses, met_shared);
      }
    };
    // SAFETY: alive_under_gil says the tensor outlives the walk; e.weak keeps its memory.
    if (alive_under_gil(filter, impl)) {
      read(Borrowed(const_cast<c10::TensorImpl*>(impl)).get());
      continue;
    }
    // A helper never pins a tensor while the caller holds the GIL: pinning one whose Python object
    // another thread is making or dropping meanwhile takes the GIL (try_incref_pyobject), which
    // the caller keeps until every helper is done, and the walk never ends. The caller pins it
    // after them (later), under its GIL.
    if (helper && filter.gil_held) {
      later(i);
      continue;
    }
    auto strong = e.weak.lock();
    if (!strong) {
      later(i);
      continue;
    }
    at::Tensor t(std::move(strong));
    read(t);
    if (helper || filter.gil_held) share.pins.push_back(std::move(t));
  }
  share.spans.push_back(WalkShare::Span{chunk, later_begin, static_cast<uint32_t>(share.later.size())});
}

// Threads that help the calling thread walk a large registry (threads named gmt-walk): started on
// the first such walk, then asleep between walks. A walk never waits for a helper that has not started its part (the
// caller takes every chunk left), so a busy, slow or missing helper only costs speed.
class WalkHelpers {
 public:
  // A walk's chunks, taken one at a time by whichever thread comes first.
  struct Job {
    std::atomic<size_t> next{0};
    std::atomic<int> active{0};  // threads between taking their first chunk and their last
    size_t entries = 0, chunks = 0;
    size_t workers = 1;  // the caller (worker 0) and the helpers 1 .. workers - 1
    // Valid while some chunk is unfinished: the caller waits for every chunk taken.
    std::function<void(size_t worker, uint32_t chunk, size_t begin, size_t end)> body;
    std::mutex error_mu;
    std::exception_ptr error;  // the first a chunk threw
  };
  static constexpr size_t kChunk = 1024;

  static WalkHelpers& get() {
    static WalkHelpers* h = new WalkHelpers();  // leaked on purpose, as the registry
    return *h;
  }

  // The helpers a walk of `entries` entries uses (0: the caller walks alone): none for small
  // walks (waking a thread costs more), nor in a forked child (the helpers stayed behind).
  size_t helpers_for(size_t entries) {
    if (entries < 4 * kChunk) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ != 0 && pid_ != getpid()) return 0;
    pid_ = getpid();
    // Started as first needed; a thread that cannot be started leaves the walk to those there are.
    while (started_ + 1 < threads_) {
      try {
        std::thread(&WalkHelpers::serve, this, started_ + 1).detach();
        ++started_;
      } catch (const std::system_error&) {
        threads_ = started_ + 1;
      }
    }
    return threads_ - 1;
  }

  // The threads a walk of a large registry uses, the caller's included.
  size_t threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

  void set_threads(size_t threads) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_ = std::max<size_t>(1, std::min<size_t>(threads, kMaxThreads));
  }

  // Runs job->body over every chunk, on this thread as worker 0 and on the helpers; returns when
  // all are done. Rethrows the first error a chunk threw.
  void run(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = job;
      ++generation_;
    }
    cv_.notify_all();
    take_chunks(*job, 0);
    // Only chunks already taken are waited for: one each at most, short.
    for (unsigned spins = 0; job->active.load() != 0; ++spins) {
      if (spins < 1024) cpu_relax();
      else std::this_thread::yield();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_ == job) current_.reset();
    }
    std::lock_guard<std::mutex> lock(job->error_mu);
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  static constexpr size_t kMaxThreads = 16;
  static constexpr std::chrono::microseconds kStayAwake{200};

  // Memory latency bounds a walk: a few threads keep enough misses in flight. No more than the
  // cores this process may run on (its affinity: a container's or taskset's share).
  WalkHelpers() {
    size_t cores = std::thread::hardware_concurrency();
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<size_t>(CPU_COUNT(&set));
#endif
    threads_ = std::max<size_t>(1, std::min<size_t>(cores, 4));
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  void serve(size_t worker) {
#ifdef __linux__
    pthread_setname_np(pthread_self(), "gmt-walk");
#endif
    uint64_t seen = 0;
    for (;;) {
      // Tracks often come in runs (a track!() after each layer): a helper that has just walked
      // waits a little for the next walk awake, sparing it the wake-up (tens of µs), then sleeps.
      const auto until = std::chrono::steady_clock::now() + kStayAwake;
      for (unsigned spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        cpu_relax();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        job = current_;
      }
      if (job) take_chunks(*job, worker);
    }
  }

  static void take_chunks(Job& job, size_t worker) {
    if (worker >= job.workers) return;  // started for a walk with more threads
    // Counted active before taking a chunk: the caller, once every chunk is taken, sees any
    // thread still in one (sequentially consistent order of `active` and `next`).
    job.active.fetch_add(1);
    for (;;) {
      const size_t chunk = job.next.fetch_add(1);
      if (chunk >= job.chunks) break;
      const size_t begin = chunk * kChunk;
      try {
        job.body(worker, static_cast<uint32_t>(chunk), begin, std::min(job.entries, begin + kChunk));
      } catch (...) {
        // Never out of a helper (that would terminate the program), nor out of the caller
        // before the helpers are done with the walk: kept for run() to rethrow.
        std::lock_guard<std::mutex> lock(job.error_mu);
        if (!job.error) job.error = std::current_exception();
      }
    }
    job.active.fetch_sub(1);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};  // walks started; changed under mu_
  std::shared_ptr<Job> current_;
  size_t threads_ = 1;  // wanted, the caller's included
  size_t started_ = 0;  // helpers started
  pid_t pid_ = 0;
};

// What gmt_walk_run_grouped adds up: count and bytes per (group, owned or view), by the rule
// of the records' grouping (a storage shared by several tensors is owned by its largest, then
// oldest, tensor), without a record per tensor.
gmt_error take_grouped(gmt_walk* s, int32_t device_kind, int32_t device_index, bool detail) {
  GMT_TRY({
    if (!s) throw std::invalid_argument("null walk");
    s->groups.clear();
    s->totals = gmt_walk_totals{};
    s->watched.clear();
    ++s->walk;
    s->walk_slots.clear();
    const WalkFilter filter{device_kind, device_index, detail, t_gil_held};
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      ++r.walks;  // gradients are found again, once, if a new entry needs its group
      auto& entries = r.entries;
      const size_t n = entries.size();
      WalkHelpers& helpers = WalkHelpers::get();
      const size_t workers = 1 + helpers.helpers_for(n);
      if (s->shares.size() < workers) s->shares.resize(workers);
      for (size_t w = 0; w < workers; ++w) s->shares[w].reset(r.groups.size(), &s->watch_sizes);
      const size_t chunks = workers > 1 ? (n + WalkHelpers::kChunk - 1) / WalkHelpers::kChunk : 1;
      if (workers > 1) {
        auto job = std::make_shared<WalkHelpers::Job>();
        job->entries = n;
        job->chunks = chunks;
        job->workers = workers;
        job->body = [&](size_t worker, uint32_t chunk, size_t begin, size_t end) {
          walk_chunk(r, filter, *s, s->shares[worker], worker != 0, chunk, begin, end);
        };
        helpers.run(job);
      } else {
        walk_chunk(r, filter, *s, s->shares[0], false, 0, 0, n);
      }
      WalkShare& caller = s->shares[0];
      // The shared storages the helpers met, while the entries are where the walk met them.
      for (size_t w = 1; w < workers; ++w) {
        for (const auto& met : s->shares[w].shared) {
          uint32_t hint = met.slot_hint;
          s->meet_shared(caller, met.storage, hint, met.use);
          if (hint != met.slot_hint) entries[met.entry].shared_slot = hint;
        }
      }
      // Then what the threads left, from the last entry down: removing entry i moves the last
      // entry into i, and that one is already done.
      std::vector<std::pair<const WalkShare*, const WalkShare::Span*>> spans(chunks, {nullptr, nullptr});
      for (size_t w = 0; w < workers; ++w) {
        for (const auto& span : s->shares[w].spans) spans[span.chunk] = {&s->shares[w], &span};
      }
      for (size_t c = chunks; c-- > 0;) {
        const auto [share, span] = spans[c];
        if (!span) continue;
        for (uint32_t k = span->end; k-- > span->begin;) {
          const size_t i = share->later[k];
          Entry& e = entries[i];
          auto strong = e.weak.lock();
          if (!strong) {
            r.remove_at(i);
            continue;
          }
          const at::Tensor& t = caller.pins.emplace_back(std::move(strong));
          const c10::TensorImpl* impl = e.impl();
          const c10::StorageImpl* storage = nullptr;
          uint32_t storage_uses = 0;
          if (e.plain ? static_cast<bool>(impl->unsafe_storage()) : impl->has_storage()) {
            const c10::Storage& st = impl->unsafe_storage();
            storage = st.unsafeGetStorageImpl();
            storage_uses = static_cast<uint32_t>(st.use_count());
            if (storage != e.storage._unsafe_get_target()) e.storage = st.getWeakStorageImpl();
          }
          if (!on_device(impl, device_kind, device_index)) continue;
          const bool parameter = is_parameter(impl, t);
          int32_t group = -1;
          if (detail) {
            group = r.group_of(i, impl, parameter);
            if (static_cast<size_t>(group) >= caller.by_group.size()) {
              caller.by_group.resize(r.groups.size(), {0, 0, 0, 0});
            }
          }
          auto met_shared = [&](const c10::StorageImpl* st, const SharedUse& use) {
            s->meet_shared(caller, st, e.shared_slot, use);
          };
          caller.tally(impl, group, e.seq, storage, storage_uses, met_shared);
        }
      }
      for (size_t w = 1; w < workers; ++w) s->shares[w].merge_into(caller);
      r.prune_at = std::max(kMinPruneAt, entries.size() * 2);
    }
    // The pins go after the registry's lock: a last reference's release runs the tensor's
    // destructor, which may run Python (a subclass's finalizer), and Python may hand the GIL to
    // a thread that then waits for that lock.
    for (auto& share : s->shares) share.release_kept();
    WalkShare& caller = s->shares[0];
    s->totals = caller.totals;
    s->watched.swap(caller.watched);
    s->forget_unmet_storages();
    for (uint32_t i : s->walk_slots) {
      const SharedUse& owner = s->shared[i].owner;
      s->totals.tensor_bytes += owner.storage_nbytes;
      ++s->totals.storage_count;
      caller.add(owner.group, false, owner.storage_nbytes);
      if (owner.group >= 0) caller.by_group[owner.group][3] += s->shared[i].views;
    }
    for (int32_t g : caller.touched) {
      const auto& t = caller.by_group[g];
      if (t[0] > 0) s->groups.push_back(gmt_group_total{g, 0, {0, 0, 0}, t[0], t[1], t[3]});
      if (t[2] > 0) s->groups.push_back(gmt_group_total{g, 1, {0, 0, 0}, t[2], 0, 0});
    }
  })
}
}  // namespace
}  // namespace gmt_registry

using namespace gmt_registry;

extern "C" {

int gmt_registry_walks_hold_gil(int held) {
  const bool was = t_gil_held;
  t_gil_held = held != 0;
  return was ? 1 : 0;
}

size_t gmt_registry_walk_threads(void) { return WalkHelpers::get().threads(); }
void gmt_registry_set_walk_threads(size_t threads) { WalkHelpers::get().set_threads(threads); }

gmt_error gmt_walk_run_grouped(gmt_walk* s, int32_t device_kind, int32_t device_index, int32_t detail) {
  return take_grouped(s, device_kind, device_index, detail != 0);
}

void gmt_walk_watch_storage_sizes(gmt_walk* s, const int64_t* sizes, size_t n) {
  if (!s) return;
  s->watch_sizes.assign(sizes, sizes + (sizes ? n : 0));
}

const uint64_t* gmt_walk_watched(const gmt_walk* s, size_t* len) {
  if (len) *len = s ? s->watched.size() : 0;
  return s ? s->watched.data() : nullptr;
}

const gmt_group_total* gmt_walk_groups(const gmt_walk* s, size_t* len) {
  if (len) *len = s ? s->groups.size() : 0;
  return s ? s->groups.data() : nullptr;
}

void gmt_walk_totals_of(const gmt_walk* s, gmt_walk_totals* out) {
  if (out) *out = s ? s->totals : gmt_walk_totals{};
}

}  // extern "C"
