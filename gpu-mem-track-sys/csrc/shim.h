// The C boundary of the gpu-mem-track shim. Every function that can fail returns a heap-allocated
// error message (free it with gmt_free_string) or NULL on success; no C++ exception crosses it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef char* gmt_error;
void gmt_free_string(char* s);

// Device kinds as seen by the shim (decoupled from c10::DeviceType's numbering).
enum gmt_device_kind { GMT_DEV_ANY = -1, GMT_DEV_CPU = 0, GMT_DEV_CUDA = 1, GMT_DEV_META = 2, GMT_DEV_OTHER = 3 };

// ---- linking (torch_cuda_link.cpp) ----
// 1 when this build references libtorch_cuda (the libtorch in use ships it), which keeps it linked
// into every binary that calls this; 0 with a CPU-only libtorch. Call it on a path every user runs.
int gmt_torch_cuda_linked(void);

// ---- live-tensor registry (registry.cpp) ----
typedef struct {
  uint64_t impl_id;        // TensorImpl address: identity while the tensor is alive
  uint64_t storage_id;     // StorageImpl address, 0 when the tensor has no storage
  int64_t storage_nbytes;  // bytes of the whole storage (shared by views)
  int64_t nbytes;          // numel * itemsize of this tensor
  uint64_t seq;            // registration order (older tensors own shared storages)
  int64_t dims_offset;     // into the walk's dims array
  int32_t ndim;
  int32_t scalar_type;     // c10::ScalarType value; name via gmt_scalar_type_name
  int32_t device_kind;     // gmt_device_kind
  int32_t device_index;
  int32_t name_id;         // -1 = unnamed; name via gmt_registry_name
  uint8_t requires_grad;
  uint8_t is_leaf;
  uint8_t storage_shared;  // another TensorImpl (a view, or one the registry cannot see) holds it
  uint8_t pad_;
  int32_t op_id;           // the op that returned it (-1: registered explicitly); name via gmt_registry_op_name
  int32_t category;        // gmt_category the tracker knows (name, .grad of a named parameter, history tag)
  int32_t class_id;        // its class: name via gmt_registry_class_name
  int32_t role;            // gmt_tensor_role
} gmt_tensor_record;
static_assert(sizeof(gmt_tensor_record) == 88, "gmt_tensor_record is mirrored in gpu-mem-track-sys/src/lib.rs: change both");

typedef struct gmt_walk gmt_walk;

gmt_error gmt_registry_install(void);          // idempotent, thread-safe
int gmt_registry_installed(void);
gmt_error gmt_registry_set_enabled(int enabled);  // pause/resume the op callback (benchmarks)
// Benchmarks only: non-zero keeps the op callback installed but makes it return at once (nothing
// is recorded, no op stack is kept), so that what the registry's own work costs can be measured
// against what libtorch's RecordFunction costs for it.
gmt_error gmt_registry_set_hollow(int hollow);
gmt_error gmt_registry_register(const void* tensor, const char* name);  // tensor: at::Tensor*
// The same for a tensor given by its c10::TensorImpl* (Python's Tensor._cdata), which must be
// alive for the call.
gmt_error gmt_registry_register_impl(void* impl, const char* name);
// The same for a buffer a torch.compile'd graph's code allocated (inductor's empty_strided_cpu,
// past the dispatcher, so no op returns it): its log line says `inductor buffer`.
gmt_error gmt_registry_register_inductor_buffer(void* impl);
// Drops the registry's entry of a TensorImpl (its weak reference), if any: torch.utils.swap_tensors
// refuses tensors held weakly; the caller registers both tensors again after swapping them.
gmt_error gmt_registry_forget_impl(void* impl);
size_t gmt_registry_entries(void);             // entries, dead ones included until pruned
uint64_t gmt_registry_callbacks(void);  // op callbacks seen since installation (exact while one thread at a time runs ops)
// Threads a grouped walk of a large registry uses, the caller's included (default: the cores, at
// most 4); set: from 1 (walk alone) to 16.
size_t gmt_registry_walk_threads(void);
// The calling thread's word (held != 0) that it holds Python's GIL for its walks from now on, so
// that a walk reads the tensors that have a Python object without pinning them; 0 withdraws it.
// Returns the word it replaces. Only a thread that holds the GIL for all its walks may give it.
int gmt_registry_walks_hold_gil(int held);
void gmt_registry_set_walk_threads(size_t threads);
const char* gmt_registry_name(int32_t id);     // stable for the process lifetime
const char* gmt_registry_op_name(int32_t id);  // the op of gmt_tensor_record.op_id; stable; NULL if unknown
// Tensor classes: 0 "torch.Tensor" and 1 "torch.nn.parameter.Parameter" by the autograd rule (a
// leaf that requires grad) for tensors without a Python object; with one, its Python class (built
// against torch 2.10 or later, else the autograd rule: see gmt_registry_python_classes).
const char* gmt_registry_class_name(int32_t id);  // stable; NULL if unknown
// Names a Python type (PyTypeObject*, which the caller keeps alive) for the log, as
// "module.qualname"; a type not named prints its tp_name. Takes the registry's lock: never call it
// holding the GIL (a walk holding the lock may wait for the GIL to release a tensor).
gmt_error gmt_registry_name_class(const void* type, const char* name);
int gmt_registry_python_classes(void);  // 1: this build reads tensors' Python classes
const char* gmt_scalar_type_name(int32_t scalar_type);  // c10 name: "Float", "BFloat16", ...
int64_t gmt_scalar_type_itemsize(int32_t scalar_type);

gmt_walk* gmt_walk_new(void);
void gmt_walk_free(gmt_walk* s);
// Fills `s` with every live registered tensor on the device (kind GMT_DEV_ANY = all devices;
// index -1 = any index of that kind). Prunes dead entries. `category` stays GMT_CAT_NONE.
gmt_error gmt_walk_run(gmt_walk* s, int32_t device_kind, int32_t device_index);
// As gmt_walk_run, and fills each record's `category` (slower: for the out-of-memory report).
gmt_error gmt_walk_run_categorized(gmt_walk* s, int32_t device_kind, int32_t device_index);
// The grouped form of a walk (what one track() needs): totals per log group, no record per
// tensor. `detail` 0: only the overall totals.
typedef struct {
  int32_t group;  // gmt_registry_group id
  uint8_t view;   // 1: tensors whose storage another tensor owns (no bytes)
  uint8_t pad_[3];
  int64_t count;
  int64_t bytes;  // storages owned
  int64_t views;  // view 0: the other tensors holding the storages this group owns
} gmt_group_total;
static_assert(sizeof(gmt_group_total) == 32, "gmt_group_total is mirrored in gpu-mem-track-sys/src/lib.rs: change both");
typedef struct {
  int64_t tensor_bytes;   // bytes of unique storages
  int64_t tensor_count;   // live tensors on the device
  int64_t storage_count;  // unique storages
} gmt_walk_totals;
static_assert(sizeof(gmt_walk_totals) == 24, "gmt_walk_totals is mirrored in gpu-mem-track-sys/src/lib.rs: change both");
gmt_error gmt_walk_run_grouped(gmt_walk* s, int32_t device_kind, int32_t device_index, int32_t detail);
const gmt_group_total* gmt_walk_groups(const gmt_walk* s, size_t* len);
// The storage sizes (bytes) whose data addresses later grouped walks collect (none: the default).
void gmt_walk_watch_storage_sizes(gmt_walk* s, const int64_t* sizes, size_t n);
// The data addresses of the live storages of a watched size the last grouped walk met (a storage
// may repeat: once per tensor holding it).
const uint64_t* gmt_walk_watched(const gmt_walk* s, size_t* len);
void gmt_walk_totals_of(const gmt_walk* s, gmt_walk_totals* out);
// What the registry knows a tensor is, from the program's structure (the same with or without a
// memory history): the gradient of a named parameter, what an optimizer step made, or what an op
// made inside a call that did not return it (max-pool's indices, a mask saved for backward), or a
// buffer a torch.compile'd graph's code allocated (gmt_registry_register_inductor_buffer).
enum gmt_tensor_role {
  GMT_ROLE_NONE = 0,
  GMT_ROLE_GRADIENT = 1,
  GMT_ROLE_OPTIMIZER_STATE = 2,
  GMT_ROLE_INTERNAL = 3,
  GMT_ROLE_INDUCTOR_BUFFER = 4
};
// While the allocation recorder records: tags the allocations holding every explicitly registered
// tensor's storage, leaves that require grad as parameters (and their .grad as gradients), the
// others as buffers (gmt_recorder_tag_tensor for each).
void gmt_registry_tag_allocations(void);
// Tensors ops return between an entering (1) and a leaving (0) call are optimizer state.
void gmt_registry_optimizer_step(int32_t entering);
// A log group of the registry (ids are stable for the process): copies up to `cap` sizes and
// returns the number of dimensions, or -1 for an unknown id. `class_id`: see gmt_registry_class_name;
// `op_id`: the op that made its tensors.
int64_t gmt_registry_group(int32_t id, int64_t* sizes, size_t cap, int32_t* scalar_type, int32_t* class_id,
                           int32_t* op_id, int32_t* role);
size_t gmt_walk_len(const gmt_walk* s);
const gmt_tensor_record* gmt_walk_records(const gmt_walk* s);
const int64_t* gmt_walk_dims(const gmt_walk* s, size_t* len);

// ---- TorchScript modules (module.cpp) ----
// module: torch::jit::script::Module*. Registers named parameters and buffers (recursively),
// names prefixed by `prefix`. Writes the number registered to *count.
gmt_error gmt_register_module(void* module, const char* prefix, size_t* count);

// ---- wrapped CPU allocator (allocator.cpp) ----
typedef struct {
  int64_t current;      // bytes live now
  int64_t peak;         // highest `current` since the window was last reset
  int64_t total_peak;   // highest `current` since installation
  int64_t allocations;  // counts since installation
  int64_t frees;
} gmt_alloc_stats;
static_assert(sizeof(gmt_alloc_stats) == 40, "gmt_alloc_stats is mirrored in gpu-mem-track-sys/src/lib.rs: change both");

gmt_error gmt_cpu_allocator_install(void);     // idempotent, thread-safe
int gmt_cpu_allocator_installed(void);
// A peak window: `peak` of a window is the maximum since its last reset. -1 when none is free.
int32_t gmt_cpu_allocator_open_window(void);
void gmt_cpu_allocator_close_window(int32_t window);
// window -1 reads only the global figures (peak = total_peak).
void gmt_cpu_allocator_stats(int32_t window, int reset_peak, gmt_alloc_stats* out);
// Refuse allocations that would take the live bytes past `bytes` (-1: no limit) with c10's
// OutOfMemoryError, after reporting the out-of-memory (gmt_oom_set_callback).
void gmt_cpu_allocator_set_limit(int64_t bytes);
int64_t gmt_cpu_allocator_limit(void);
// The live allocations (address, bytes), at most `cap`; returns how many there are.
size_t gmt_cpu_allocator_live(int64_t* addrs, int64_t* sizes, size_t cap);

// ---- out of memory (oom.cpp) ----
typedef struct {
  int32_t device_kind;   // gmt_device_kind
  int32_t device_index;
  int64_t requested;     // bytes the failed allocation asked for
  int64_t device_total;  // CUDA: the device's memory (or what the memory fraction allows); CPU: the limit
  int64_t device_free;   // CUDA: free memory per the driver; CPU: the limit minus the live bytes
  const char* op;        // innermost op running on the failing thread ("<no op>" outside any)
  const char* top_op;    // outermost op running on it (the call the program made)
} gmt_oom_event;
static_assert(sizeof(gmt_oom_event) == 48, "gmt_oom_event is mirrored in gpu-mem-track-sys/src/lib.rs: change both");
// Called on the failing thread before the allocation error is thrown. The callback must not
// allocate on the failing device; an out-of-memory inside it is not reported again.
typedef void (*gmt_oom_callback)(const gmt_oom_event*);
void gmt_oom_set_callback(gmt_oom_callback callback);  // NULL: none
// Reports CUDA out-of-memory errors of every device to the callback (cuda_history.cpp); once per
// process. Fails without CUDA or without the CUDA headers at build time.
gmt_error gmt_cuda_oom_observer_attach(void);
// One block of the CUDA caching allocator's segments (its own snapshot, no history needed).
typedef struct {
  uint64_t segment_address, segment_size;
  uint64_t address, size, requested_size;
  int32_t allocated;  // 1: handed out; 0: cached, free
  int32_t is_large;   // the segment comes from the large pool
} gmt_cuda_block;
static_assert(sizeof(gmt_cuda_block) == 48, "gmt_cuda_block is mirrored in gpu-mem-track-sys/src/lib.rs: change both");
// The blocks of `device`'s segments, in address order: fills up to `cap`, sets *count to how many
// there are (cuda_history.cpp). Fails without CUDA or the CUDA headers at build time.
gmt_error gmt_cuda_blocks(int32_t device, gmt_cuda_block* out, size_t cap, size_t* count);

// ---- CUDA caching allocator (cuda.cpp) ----
typedef struct {
  int64_t allocated_current, allocated_peak;
  int64_t reserved_current, reserved_peak;
  int64_t active_current;
  int64_t num_alloc_retries;        // cudaMalloc failures retried after freeing the cache
  int64_t num_ooms;                 // out-of-memory errors raised
} gmt_cuda_stats;
static_assert(sizeof(gmt_cuda_stats) == 56, "gmt_cuda_stats is mirrored in gpu-mem-track-sys/src/lib.rs: change both");

int32_t gmt_cuda_device_count(void);          // 0 when CUDA is absent; never throws
const char* gmt_libtorch_location(void);       // the file libtorch_cpu was loaded from, or NULL
gmt_error gmt_cuda_stats_read(int32_t device, int reset_peak, gmt_cuda_stats* out);
// The driver's free memory of `device` (cudaMemGetInfo), -1 where libtorch lacks
// DeviceAllocator::getMemoryInfo (< 2.10). A call into the driver: the tracker caches it.
gmt_error gmt_cuda_device_free(int32_t device, int64_t* free_bytes);
gmt_error gmt_cuda_empty_cache(void);
// CUDA history (cuda_history.cpp): reports the caching allocator's alloc/free/segment events of
// `device` to the allocation recorder. Fails when CUDA or the device is unavailable, or when this
// build had no CUDA headers (gmt_cuda_history_compiled() == 0).
int gmt_cuda_history_compiled(void);
gmt_error gmt_cuda_history_attach(int32_t device);
void gmt_cuda_history_detach(void);

// ---- allocation recorder (recorder.cpp) ----
typedef struct {
  int64_t id;           // allocation identity (meta: sequence number; CPU: data pointer)
  int64_t size;         // bytes (a free: 0, or the block size when the allocator reports it)
  uint8_t is_free;      // gmt_event_kind: 0 alloc, 1 free; CUDA also reports segments (2, 3)
  uint8_t phase;        // estimation phase set by the estimator
  uint8_t device_kind;  // gmt_device_kind
  uint8_t iteration;    // estimation iteration (1-based; 0 outside iterations)
  int32_t op;           // innermost op at the time; name via gmt_recorder_op_name
  int64_t time_ns;      // since the recording started
  int32_t site;         // track-site tag set by the caller (gmt_recorder_set_site), -1 = none
  int32_t nframes;      // native frames captured (stacks on)
  int32_t top_op;       // outermost op at the time (the user-level call); name via gmt_recorder_op_name
  int32_t category;     // an allocation's gmt_category tag, GMT_CAT_NONE when nothing tagged it
} gmt_alloc_event;
static_assert(sizeof(gmt_alloc_event) == 48, "gmt_alloc_event is mirrored in gpu-mem-track-sys/src/lib.rs: change both");

// Deep enough to reach the caller through libtorch's dispatch and tch's wrappers in unoptimised builds.
#define GMT_STACK_FRAMES 48
// What the tracker learnt an allocation holds (tags; untagged allocations are judged by lifetime).
enum gmt_category { GMT_CAT_NONE = 0, GMT_CAT_PARAMETER = 1, GMT_CAT_BUFFER = 2, GMT_CAT_GRADIENT = 3,
                    GMT_CAT_ACTIVATION = 4, GMT_CAT_INPUT = 5,
                    // memory a CPU kernel library took raw from the CPU allocator (oneDNN's scratchpads):
                    // never a tensor's storage, tagged when it comes back (allocator.cpp)
                    GMT_CAT_KERNEL_SCRATCH = 6,
                    // a GPU library's workspace (the estimator's cuDNN RNN workspace on meta)
                    GMT_CAT_WORKSPACE = 7,
                    // what a distributed program's FSDP or DDP made (the estimator tags them from Python)
                    GMT_CAT_SHARDED_PARAMETER = 8, GMT_CAT_UNSHARDED_PARAMETER = 9, GMT_CAT_SHARDED_GRADIENT = 10,
                    GMT_CAT_UNSHARDED_GRADIENT = 11, GMT_CAT_DDP_BUCKET = 12, GMT_CAT_ALL_GATHER_BUFFER = 13,
                    GMT_CAT_REDUCE_SCATTER_BUFFER = 14,
                    // memory the program keeps on the host while its GPU computes (FSDP's CPU offload,
                    // the CPU optimizer step on it): tagged by the estimator, never GPU memory
                    GMT_CAT_HOST = 15 };
// GMT_EVENT_OOM: an allocation of `size` bytes failed; `id` holds the device's free bytes.
enum gmt_event_kind { GMT_EVENT_ALLOC = 0, GMT_EVENT_FREE = 1, GMT_EVENT_SEGMENT_ALLOC = 2, GMT_EVENT_SEGMENT_FREE = 3,
                      GMT_EVENT_OOM = 4 };

// GMT_PHASE_NONE: a live program outside any phase it declared.
enum gmt_phase { GMT_PHASE_LOAD = 0, GMT_PHASE_INPUT = 1, GMT_PHASE_FORWARD = 2, GMT_PHASE_BACKWARD = 3,
                 GMT_PHASE_OPTIMIZER = 4, GMT_PHASE_NONE = 5 };

// Records every allocation/free of `device_kind` (GMT_DEV_ANY: all) until stopped. Clears the
// previous recording; the events stay readable until the next start.
gmt_error gmt_recorder_start(int32_t device_kind);
// As gmt_recorder_start, keeping at most `max_events` (oldest dropped; 0 = all) and, when
// `with_stacks`, the native return addresses of each event.
gmt_error gmt_recorder_start_history(int32_t device_kind, size_t max_events, int with_stacks);
int gmt_recorder_active(void);
void gmt_recorder_progress(int32_t* phase, int32_t* iteration);  // current phase, for progress bars
void gmt_recorder_set_site(int32_t site);
// Before a recording: walk the live tensors at the end of the op during which event number
// `event` (0-based) is recorded; read with gmt_peak_walk(). Reset when the recording stops.
void gmt_recorder_walk_at(int64_t event);
// Before a recording: walk the live tensors at the end of each op that raised the recording's
// peak of live bytes, so that gmt_peak_walk() ends as the peak's. Reset when it stops.
void gmt_recorder_walk_peaks(int on);
gmt_walk* gmt_peak_walk(void);
// Copies the stored events in order (and, when `stacks` is not null, GMT_STACK_FRAMES addresses
// per event); returns how many were copied. `dropped` (optional) gets the count overwritten.
size_t gmt_recorder_copy(gmt_alloc_event* out, uint64_t* stacks, size_t cap, uint64_t* dropped);
gmt_error gmt_recorder_stop(void);
void gmt_recorder_set_phase(int32_t phase, int32_t iteration);
// Tags the recorded allocation holding the tensor's storage (tensor: at::Tensor*) with a
// gmt_category; no-op when nothing records or the allocation was made before the recording.
void gmt_recorder_tag_tensor(const void* tensor, int32_t category);
// The same for a tensor given by its c10::TensorImpl* (Python's Tensor._cdata).
void gmt_recorder_tag_tensor_impl(const void* impl, int32_t category);
// The gmt_category of the recorded allocation holding the storage of the tensor whose
// c10::TensorImpl* is `impl` (GMT_CAT_NONE when untagged); -1 when nothing records or the storage
// is not a recorded allocation.
int32_t gmt_recorder_tensor_impl_category(const void* impl);
// Sets the site (gmt_recorder_set_site's index) of the recorded allocation holding the storage of
// the tensor whose c10::TensorImpl* is `impl`; no-op as above.
void gmt_recorder_site_tensor_impl(const void* impl, int32_t site);
size_t gmt_recorder_len(void);
// Allocation ids tagged as parameters by the estimator; returns the count, fills up to `cap`.
size_t gmt_recorder_parameter_ids(int64_t* out, size_t cap);  // highest live bytes among recorded allocations
const char* gmt_recorder_op_name(int32_t op);

// ---- memory saved for backward (saved.cpp) ----
// Starts capturing the tensors autograd saves on this thread; `excluded` are at::Tensor* whose
// storages are left out (the inputs). Parameters (leaves requiring grad) are always left out.
gmt_error gmt_saved_capture_begin(const void* const* excluded, size_t n_excluded);
// While a memory history records: tag every tensor saved for backward (any thread) as an activation.
gmt_error gmt_saved_history(int enabled);
void gmt_saved_capture_end(void);
// Live saved storages: fills up to `cap` (bytes, op name) pairs; returns how many there are.
size_t gmt_saved_entries(int64_t* bytes, const char** ops, size_t cap);
int64_t gmt_saved_parameter_bytes(void);
int64_t gmt_saved_packed(void);

#ifdef __cplusplus
}
#endif
