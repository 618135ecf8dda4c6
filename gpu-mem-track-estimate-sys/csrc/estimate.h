// The C boundary of the estimator's native code (gpu-mem-track-estimate-sys): meta kernels and the
// meta allocator, "the CPU means meta", TorchScript runs and the static graph estimate, tch
// steps and optimizers. It stands on the tracker's shim (shim.h: errors, device kinds, the
// allocation recorder), whose headers gpu-mem-track-sys exports; the tracker never calls into it.
// As there, a function that can fail returns a malloc'd error message (gmt_free_string) or NULL.
#pragma once
#include "shim.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- meta kernels (meta_kernels.cpp) ----
// Whether LSTM and GRU on meta take cuDNN's path (cudnn_rnn.cpp; the default) or
// PyTorch's own, the CPU's.
void gmt_meta_rnn_follows_cudnn(int on);
// The compute capability of the GPU a meta run stands for (9.0 by default): which kernel
// scaled_dot_product_attention takes there (flash, memory-efficient or math attention).
void gmt_meta_target_device(int major, int minor);
// Calls of scaled_dot_product_attention on meta since the process started, per kernel taken:
// calls[0] flash, calls[1] memory-efficient, calls[2] math (three elements).
void gmt_meta_attention_kernels(int64_t* calls);
// How many times `.item()` (aten::_local_scalar_dense) ran on a meta tensor since the process
// started: each returned 0, so data-dependent control flow may have taken another branch.
int64_t gmt_meta_scalar_reads(void);
// Ops that run their CPU kernel on CPU twins of their meta inputs (no Meta kernel of their own);
// registered when the meta allocator is installed.
int64_t gmt_meta_fallback_ops(void);
// The ops with a hand-written meta kernel (static names, `*count` of them).
const char* const* gmt_meta_kernels_registered(size_t* count);
// Runs every hand-written meta kernel and the CPU kernel of the same op on inputs of several
// shapes (meta_kernel_check.cpp); `*report` gets one line a case: "op\tshapes\tok" or what differs.
gmt_error gmt_meta_kernels_check(char** report);
// Per op that went through that fallback since the process started: its name (stable for the
// process), calls and bytes of CPU twins materialised. Fills up to `cap`; returns how many ops.
size_t gmt_meta_fallback_counts(const char** ops, int64_t* calls, int64_t* bytes, size_t cap);
// The largest workspace a cuDNN convolution engine may take for each convolution call of a meta
// run, keyed by the allocation id of the call's first output (meta_kernels.cpp): copies up to `cap`
// (id, bytes) pairs and returns how many there are. gmt_conv_workspaces_clear empties the table.
size_t gmt_conv_workspaces(int64_t* ids, int64_t* bytes, size_t cap);
void gmt_conv_workspaces_clear(void);

// ---- meta allocator (meta_allocator.cpp) ----
// Meta tensors hold no data: this allocator gives each allocation a number and reports it to the
// tracker's allocation recorder; it also registers the meta-via-CPU fallback (meta_kernels.cpp).
gmt_error gmt_meta_allocator_install(void);  // idempotent
int64_t gmt_meta_allocator_current(void);    // live meta bytes
// Resizes a meta storage as a GPU storage resizes (`UntypedStorage.resize_`, with which FSDP frees
// and re-allocates unsharded parameters; libtorch's meta resize only sets the size): a new block of
// `nbytes` (none for 0) replaces the old, so the recorder sees the free and the allocation.
// `storage_impl` is a c10::StorageImpl*.
gmt_error gmt_meta_storage_resize(void* storage_impl, int64_t nbytes);
// While on (calls nest; this thread only), meta allocations and their frees are not reported:
// tensors that stand for no memory on any device (DTensor's sharding propagation runs the op on
// global-shape fakes to learn its output's shape).
void gmt_meta_unrecorded_begin(void);
void gmt_meta_unrecorded_end(void);
// Whether a meta storage's block is recorded: 1 recorded, 0 made while unrecorded (the program's
// own meta tensors, DTensor's fakes), -1 no block of the tracking allocator (empty, not meta).
int32_t gmt_meta_storage_recorded(const void* storage_impl);

// ---- "the CPU means meta" on this thread (cpu_means_meta.cpp) ----
// While on (calls nest; end on the thread that began), factories asked for the CPU make meta
// tensors and CPU tensors that reach an op become meta twins; copies to the CPU stay on meta only
// when `copies_too` (TorchScript). Other threads are never affected.
gmt_error gmt_cpu_means_meta_begin(int32_t copies_too);
void gmt_cpu_means_meta_end(void);
// This thread's totals since it started: tensors ops returned on the CPU while on, and CPU
// tensors moved to meta where an op met them.
void gmt_cpu_means_meta_counts(int64_t* made_on_cpu, int64_t* moved_to_meta);
// Up to 8 of them ("moved to meta at aten::add [4, 8] Float"), one a line; clears the list.
char* gmt_cpu_means_meta_examples(void);
// ---- TorchScript estimation (torchscript.cpp) ----
// The optimizers the estimator runs (tch_steps.cpp), for TorchScript and tch models.
enum gmt_optimizer { GMT_OPT_NONE = 0, GMT_OPT_SGD = 1, GMT_OPT_SGD_MOMENTUM = 2, GMT_OPT_ADAM = 3, GMT_OPT_ADAMW = 4 };
typedef struct {
  const char* path;
  const int64_t* input_shape;
  int32_t input_ndim;
  int32_t dtype;          // c10::ScalarType for parameters and float inputs (6 = float32)
  int32_t input_is_index; // integer token ids (int64) instead of a float input
  int32_t train;          // 0: inference (no grad); 1: training steps
  int32_t optimizer;      // gmt_optimizer
  int32_t iterations;     // training iterations (2 shows the steady state)
  int32_t device_kind;    // GMT_DEV_META or GMT_DEV_CPU
  int32_t eager_lifetimes; // hold values as eager Python would (locals until rebound/return, call inputs until the call returns)
} gmt_estimate_options;
static_assert(sizeof(gmt_estimate_options) == 48, "gmt_estimate_options is mirrored in gpu-mem-track-estimate-sys/src/lib.rs: change both");

// What kind of failure a run's error message is, so that callers sort errors by kind, never by
// their text (a result's `failure`; GMT_FAILURE_NONE for libtorch's and the shim's own failures).
enum gmt_failure {
  GMT_FAILURE_NONE = 0,
  GMT_FAILURE_MODEL = 1,           // the file is not a model this can run, or its forward rejects the input
  GMT_FAILURE_NO_META_KERNEL = 2,  // an op reached the meta device with no kernel there (`failed_op`)
};

// Sizes of what the run created; timing and peaks come from the recorded events. When the run
// fails, only `failure` and `failed_op` are written.
typedef struct {
  int64_t param_count, param_bytes, buffer_bytes, input_bytes, grad_bytes, optimizer_state_bytes;
  int64_t output_numel;
  int32_t failure;      // gmt_failure
  char failed_op[124];  // GMT_FAILURE_NO_META_KERNEL: the op (aten::batch_norm_stats), NUL-terminated
} gmt_estimate_result;
static_assert(sizeof(gmt_estimate_result) == 184, "gmt_estimate_result is mirrored in gpu-mem-track-estimate-sys/src/lib.rs: change both");

// Loads and runs the module on the device with the allocator recorder on; the recording stays
// readable afterwards (gmt_recorder_*).
gmt_error gmt_estimate_torchscript(const gmt_estimate_options* options, gmt_estimate_result* out);
// Forward passes of TorchScript models this process has run (each call of a model's forward, in
// any gmt_estimate_torchscript): what a test counts to hold an estimate to one run.
int64_t gmt_estimate_forward_passes(void);
// Every aten op of the model's forward (inlined) with neither a Meta, composite nor CPU kernel:
// `*report` gets "schema\tfile line N" a line (empty: none).
gmt_error gmt_script_ops_without_meta(const char* path, char** report);

// Static inference estimate from the TorchScript IR: shapes propagated from the input, tensors freed
// after their last use. Activation bytes exclude parameters and the input.
typedef struct {
  int64_t activation_peak;  // highest live activation bytes
  int64_t param_bytes;
  int64_t nodes, tensor_values, unknown_shapes;
  int32_t peak_node;
  int32_t failure;  // gmt_failure, when the call fails
  char peak_op[64];
  double seconds;
} gmt_static_result;
static_assert(sizeof(gmt_static_result) == 120, "gmt_static_result is mirrored in gpu-mem-track-estimate-sys/src/lib.rs: change both");
gmt_error gmt_estimate_static(const char* path, const int64_t* shape, int32_t ndim, int32_t dtype, int32_t is_index,
                              gmt_static_result* out);

// ---- torch.export programs (exported_program.cpp) ----
// The JSON of a .pt2 archive's program (its models/*.json record), malloc'd into `*json`.
gmt_error gmt_exported_program_json(const char* path, char** json);
// A program as the Rust side builds it from that JSON: placeholders, then nodes, then outputs.
// Values are numbered: placeholders 0.. in order, then what nodes return.
enum gmt_exported_role { GMT_EXPORTED_USER_INPUT = 0, GMT_EXPORTED_PARAMETER = 1, GMT_EXPORTED_BUFFER = 2,
                         GMT_EXPORTED_CONSTANT = 3 };
enum gmt_exported_arg_kind { GMT_EXPORTED_ARG_NONE = 0, GMT_EXPORTED_ARG_TENSOR = 1, GMT_EXPORTED_ARG_TENSORS = 2,
                             GMT_EXPORTED_ARG_OPTIONAL_TENSORS = 3, GMT_EXPORTED_ARG_INT = 4, GMT_EXPORTED_ARG_INTS = 5,
                             GMT_EXPORTED_ARG_FLOAT = 6, GMT_EXPORTED_ARG_FLOATS = 7, GMT_EXPORTED_ARG_BOOL = 8,
                             GMT_EXPORTED_ARG_BOOLS = 9, GMT_EXPORTED_ARG_STRING = 10,
                             GMT_EXPORTED_ARG_SCALAR_TYPE = 11, GMT_EXPORTED_ARG_MEMORY_FORMAT = 12,
                             GMT_EXPORTED_ARG_LAYOUT = 13, GMT_EXPORTED_ARG_DEVICE = 14 };
// One named argument of a node. TENSOR: `i` is the value; TENSORS / OPTIONAL_TENSORS: `ints[n]`
// (-1: none); INT, BOOL, SCALAR_TYPE, MEMORY_FORMAT, LAYOUT (c10 codes): `i`; INTS, BOOLS: `ints`;
// FLOAT: `f`; FLOATS: `floats`; STRING: `s`; DEVICE: `s` the type, `i` the index (-1: none).
typedef struct {
  int32_t kind;
  const char* name;
  int64_t i;
  double f;
  const int64_t* ints;
  const double* floats;
  size_t n;
  const char* s;
} gmt_exported_arg;
static_assert(sizeof(gmt_exported_arg) == 64, "gmt_exported_arg is mirrored in gpu-mem-track-estimate-sys/src/lib.rs: change both");
void* gmt_exported_program_new(void);  // NULL when out of memory
void gmt_exported_program_free(void* program);
// A placeholder (role: gmt_exported_role; dtype: c10::ScalarType).
gmt_error gmt_exported_program_placeholder(void* program, const char* name, int32_t role, const int64_t* sizes,
                                           const int64_t* strides, size_t ndim, int32_t dtype, int32_t requires_grad);
// A node: `op` (aten::conv2d) and its overload ("default" for none); `outputs` are (return index,
// list element or -1, value) triples; `frees` the values whose last use it is; `values` how many
// values the program has after it.
gmt_error gmt_exported_program_node(void* program, const char* op, const char* overload, const gmt_exported_arg* args,
                                    size_t nargs, const int64_t* outputs, size_t noutputs, const int64_t* frees,
                                    size_t nfrees, int64_t values);
gmt_error gmt_exported_program_outputs(void* program, const int64_t* values, size_t n);
// Runs the program as gmt_estimate_torchscript runs a file (options->path names it; its first user
// input is the run's input).
gmt_error gmt_estimate_exported(const void* program, const gmt_estimate_options* options, gmt_estimate_result* out);

// ---- tch models (tch_steps.cpp) ----
// Moves a variable's data to the device (GMT_DEV_META/CPU) in place, converting floating dtypes
// to `dtype` (-1: keep). `tensor` is an at::Tensor*.
gmt_error gmt_tensor_to_device_in_place(void* tensor, int32_t device_kind, int32_t dtype);
gmt_error gmt_tag_parameter_tensor(const void* tensor);
// A new at::Tensor* (random floats or zero integers) that the caller owns.
gmt_error gmt_make_tensor(const int64_t* shape, int32_t ndim, int32_t dtype, int32_t device_kind, void** out);
void* gmt_optimizer_new(int32_t kind);
gmt_error gmt_optimizer_step(void* optimizer, const void* const* params, size_t n);
int64_t gmt_optimizer_state_bytes(void* optimizer);
void gmt_optimizer_free(void* optimizer);
// Reports the gradients' bytes, then drops them (zero_grad(set_to_none=True)).
gmt_error gmt_grads_set_to_none(const void* const* params, size_t n, int64_t* grad_bytes);

#ifdef __cplusplus
}
#endif
