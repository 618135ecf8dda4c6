// Meta (shape-only) kernels for ops libtorch C++ has no Meta implementation for. Python torch
// registers these from torch/_meta_registrations.py at import; a C++ program never gets them.
// Each returns empty tensors of the right shape and dtype, so the meta allocator sees the same
// allocations a real run would make.
#include <atomic>
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/dropout_compositeimplicitautograd_dispatch.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "attention.h"
#include "internal.h"
#include "recorder.h"

namespace {
using at::Tensor;
using c10::IntArrayRef;
using OptTensor = std::optional<Tensor>;

using gmt::stats_options;

// One statistic per row of a norm over the last `normalized` dimensions: the leading sizes, then
// a 1 for each normalised dimension.
std::vector<int64_t> norm_stat_shape(const Tensor& x, size_t normalized) {
  const int64_t axis = x.dim() - static_cast<int64_t>(normalized);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().begin() + axis);
  shape.resize(x.dim(), 1);
  return shape;
}

std::vector<int64_t> conv_output_size(const Tensor& in, const Tensor& w, IntArrayRef stride, IntArrayRef pad,
                                      IntArrayRef dil, bool transposed, IntArrayRef opad, int64_t groups) {
  TORCH_CHECK(in.dim() == w.dim(), "meta convolution: input has ", in.dim(), " dims, weight ", w.dim());
  const int64_t spatial = in.dim() - 2;
  auto at = [](IntArrayRef a, int64_t k) { return a.size() == 1 ? a[0] : a[k]; };
  std::vector<int64_t> out{in.size(0), transposed ? w.size(1) * groups : w.size(0)};
  for (int64_t k = 0; k < spatial; ++k) {
    const int64_t i = in.size(k + 2), kw = w.size(k + 2);
    const int64_t s = at(stride, k), p = at(pad, k), d = at(dil, k);
    if (transposed) {
      const int64_t op = opad.empty() ? 0 : at(opad, k);
      out.push_back((i - 1) * s - 2 * p + d * (kw - 1) + op + 1);
    } else {
      out.push_back((i + 2 * p - d * (kw - 1) - 1) / s + 1);
    }
  }
  return out;
}

// The workspace a cuDNN convolution may take, as PyTorch's caching allocator sees it
// (aten/src/ATen/native/cudnn/Conv_v8.cpp, run_conv_plan): the size of the engine cuDNN's
// heuristics pick, known only on the GPU. On an H200 (PyTorch 2.11, cuDNN 9) every engine the
// torchvision models took needed at most the call's three operands again (input, output, weight:
// the layout copies a fused engine makes) plus 16 bytes, 10 % more for a weight gradient with
// split reductions (ResNet-18's first convolution: 134.5 MB against 122.1 MB of operands). The
// high end of an estimate places 9/8 of the operands at each call; the low end none.
std::mutex g_conv_workspaces_mu;
std::vector<std::pair<int64_t, int64_t>> g_conv_workspaces;

void note_conv_workspace(const Tensor& first_output, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (!first_output.defined() || !first_output.has_storage()) return;
  const int64_t operands = static_cast<int64_t>(a.nbytes() + b.nbytes() + c.nbytes());
  const int64_t id = gmt::allocation_id(first_output.storage().unsafeGetStorageImpl());
  std::lock_guard<std::mutex> lock(g_conv_workspaces_mu);
  g_conv_workspaces.emplace_back(id, operands / 8 * 9 + 16);
}

Tensor convolution_meta(const Tensor& in, const Tensor& w, const OptTensor&, IntArrayRef stride, IntArrayRef pad,
                        IntArrayRef dil, bool transposed, IntArrayRef opad, int64_t groups) {
  Tensor out = at::empty(conv_output_size(in, w, stride, pad, dil, transposed, opad, groups), in.options());
  note_conv_workspace(out, in, out, w);
  return out;
}

std::tuple<Tensor, Tensor, Tensor> convolution_backward_meta(const Tensor& grad_out, const Tensor& in,
                                                              const Tensor& w, IntArrayRef, IntArrayRef, IntArrayRef,
                                                              bool transposed, IntArrayRef, int64_t groups,
                                                              std::array<bool, 3> mask) {
  const int64_t c_out = transposed ? w.size(1) * groups : w.size(0);
  Tensor grad_in = mask[0] ? at::empty_like(in) : Tensor();
  Tensor grad_w = mask[1] ? at::empty_like(w) : Tensor();
  Tensor grad_b = mask[2] ? at::empty({c_out}, w.options()) : Tensor();
  const Tensor& first = grad_in.defined() ? grad_in : grad_w.defined() ? grad_w : grad_b;
  note_conv_workspace(first, grad_out, in, w);
  return {grad_in, grad_w, grad_b};
}

// ---- batch norm (every entry point the dispatcher may pick)
std::tuple<Tensor, Tensor, Tensor> native_batch_norm_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                           const OptTensor&, const OptTensor&, bool training, double,
                                                           double) {
  const int64_t c = x.size(1);
  auto stats = stats_options(x);
  return {at::empty_like(x), at::empty({training ? c : 0}, stats), at::empty({training ? c : 0}, stats)};
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm_backward_meta(const Tensor&, const Tensor& x, const OptTensor& w,
                                                                    const OptTensor&, const OptTensor&,
                                                                    const OptTensor&, const OptTensor&, bool, double,
                                                                    std::array<bool, 3> mask) {
  const int64_t c = x.size(1);
  auto opts = w.has_value() && w->defined() ? w->options() : x.options();
  return {mask[0] ? at::empty_like(x) : Tensor(), mask[1] ? at::empty({c}, opts) : Tensor(),
          mask[2] ? at::empty({c}, opts) : Tensor()};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_with_update_meta(const Tensor& x, const OptTensor& w,
                                                                       const OptTensor& b, Tensor& rm, Tensor& rv,
                                                                       double momentum, double eps) {
  auto [out, mean, invstd] = native_batch_norm_meta(x, w, b, rm, rv, true, momentum, eps);
  return {out, mean, invstd, at::empty({0}, x.options().dtype(at::kByte))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_no_update_meta(const Tensor& x, const OptTensor& w,
                                                                     const OptTensor& b, const OptTensor& rm,
                                                                     const OptTensor& rv, double momentum, double eps) {
  auto [out, mean, invstd] = native_batch_norm_meta(x, w, b, rm, rv, false, momentum, eps);
  return {out, mean, invstd, at::empty({0}, x.options().dtype(at::kByte))};
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_backward_meta(const Tensor& go, const Tensor& x, const Tensor& w,
                                                             const OptTensor& rm, const OptTensor& rv,
                                                             const OptTensor& sm, const OptTensor& sv, bool update,
                                                             double eps, std::array<bool, 3> mask, const Tensor&) {
  return native_batch_norm_backward_meta(go, x, w, rm, rv, sm, sv, update, eps, mask);
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit_meta(const Tensor& x, const OptTensor& w,
                                                                 const OptTensor& b, Tensor& rm, Tensor& rv,
                                                                 bool training, double momentum, double eps) {
  return native_batch_norm_meta(x, w, b, rm, rv, training, momentum, eps);
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit_no_stats_meta(const Tensor& x, const OptTensor& w,
                                                                          const OptTensor& b, bool training,
                                                                          double momentum, double eps) {
  return native_batch_norm_meta(x, w, b, std::nullopt, std::nullopt, training, momentum, eps);
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit_no_training_meta(const Tensor& x, const OptTensor& w,
                                                                             const OptTensor& b, const Tensor& rm,
                                                                             const Tensor& rv, double momentum,
                                                                             double eps) {
  return native_batch_norm_meta(x, w, b, rm, rv, false, momentum, eps);
}

// ---- group norm
std::tuple<Tensor, Tensor, Tensor> native_group_norm_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                           int64_t n, int64_t, int64_t, int64_t group, double) {
  return {at::empty_like(x), at::empty({n, group}, x.options()), at::empty({n, group}, x.options())};
}

std::tuple<Tensor, Tensor, Tensor> native_group_norm_backward_meta(const Tensor&, const Tensor& x, const Tensor&,
                                                                    const Tensor&, const OptTensor& w, int64_t,
                                                                    int64_t c, int64_t, int64_t,
                                                                    std::array<bool, 3> mask) {
  auto opts = w.has_value() && w->defined() ? w->options() : x.options();
  return {mask[0] ? at::empty_like(x) : Tensor(), mask[1] ? at::empty({c}, opts) : Tensor(),
          mask[2] ? at::empty({c}, opts) : Tensor()};
}

// ---- layer norm
std::tuple<Tensor, Tensor, Tensor> native_layer_norm_meta(const Tensor& x, c10::SymIntArrayRef normalized,
                                                           const OptTensor&, const OptTensor&, double) {
  const auto stat_shape = norm_stat_shape(x, normalized.size());
  auto stats = stats_options(x);
  return {at::empty_like(x), at::empty(stat_shape, stats), at::empty(stat_shape, stats)};
}

std::tuple<Tensor, Tensor, Tensor> native_layer_norm_backward_meta(const Tensor&, const Tensor& x,
                                                                    c10::SymIntArrayRef, const Tensor&, const Tensor&,
                                                                    const OptTensor& w, const OptTensor& b,
                                                                    std::array<bool, 3> mask) {
  auto like = [&](const OptTensor& t) { return t.has_value() && t->defined() ? at::empty_like(*t) : Tensor(); };
  return {mask[0] ? at::empty_like(x) : Tensor(), mask[1] ? like(w) : Tensor(), mask[2] ? like(b) : Tensor()};
}

// ---- adaptive pooling (the general case; output 1x1 is a mean and never gets here)
Tensor adaptive_avg_pool2d_meta(const Tensor& x, c10::SymIntArrayRef out) {
  auto sizes = x.sizes().vec();
  TORCH_CHECK(out.size() == 2 && sizes.size() >= 2, "meta adaptive_avg_pool2d: bad output size");
  sizes[sizes.size() - 2] = out[0].expect_int();
  sizes[sizes.size() - 1] = out[1].expect_int();
  return at::empty(sizes, x.options());
}

Tensor adaptive_avg_pool2d_backward_meta(const Tensor&, const Tensor& x) { return at::empty_like(x); }

// ---- elementwise and indexing
Tensor relu_meta(const Tensor& x) { return at::empty_like(x); }
Tensor& relu__meta(Tensor& x) { return x; }

Tensor index_select_meta(const Tensor& self, int64_t dim, const Tensor& index) {
  auto sizes = self.sizes().vec();
  if (self.dim() > 0) sizes[c10::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(sizes, self.options());
}

Tensor embedding_dense_backward_meta(const Tensor& grad, const Tensor&, c10::SymInt num_weights, c10::SymInt, bool) {
  return at::empty({num_weights.expect_int(), grad.size(-1)}, grad.options());
}

// As the CPU and CUDA kernels: a TensorIterator over the condition and both values (cast to the
// result type first), so the result takes the inputs' layout (a transposed input, a transposed
// result).
Tensor where_meta(const Tensor& cond, const Tensor& self, const Tensor& other) {
  const auto dtype = at::result_type(self, other);
  // The iterator resizes an empty output as the kernels' does; resize_ on meta takes no memory
  // from the allocator, so the result gets a counted allocation of the layout it found.
  Tensor probe = at::empty({0}, self.options().dtype(dtype));
  auto iter = at::TensorIteratorConfig()
                  .check_all_same_dtype(false)
                  .add_output(probe)
                  .add_const_input(cond)
                  .add_const_input(self.scalar_type() == dtype ? self : self.to(dtype))
                  .add_const_input(other.scalar_type() == dtype ? other : other.to(dtype))
                  .build();
  const Tensor& r = iter.output();
  return at::empty_strided(r.sizes(), r.strides(), r.options());
}

// out= variants: resize_ on meta bypasses the allocator, so `out` gets a freshly allocated
// storage of the right size instead; the allocation is then counted like a real one.

Tensor& where_out_meta(const Tensor& cond, const Tensor& self, const Tensor& other, Tensor& out) {
  const auto shape = at::infer_size(at::infer_size(cond.sizes(), self.sizes()), other.sizes());
  if (out.sizes() != at::IntArrayRef(shape)) out.set_(where_meta(cond, self, other));
  return out;
}

// at::dropout takes the fused kernel (native_dropout: the output and a bool mask) for a CUDA
// tensor in training with 0 < p < 1 (Dropout.cpp, is_fused_kernel_acceptable); on any other
// device it draws float noise of the input's size and keeps it for backward, four bytes an
// element where a GPU keeps one. Meta tensors stand for CUDA ones, so they take the fused kernel.
Tensor dropout_as_on_cuda(const Tensor& x, double p, bool train) {
  if (train && p > 0 && p < 1 && x.sym_numel() > 0) return std::get<0>(at::native_dropout(x, p, train));
  return at::compositeimplicitautograd::dropout(x, p, train);
}

// RMSNorm: at::rms_norm calls the fused kernel, which keeps the input and one float rstd per
// row for backward (layer_norm.cpp, rms_norm_symint); with no Meta kernel, meta tensors would
// run its composite body, whose autograd keeps the normalised activation as well. From torch 2.9
// (its backward's header says which): torch 2.8's `_fused_rms_norm` has another schema, which a
// kernel of this signature must not be registered for (the library would fail to load), and
// older torches have neither.
#if __has_include(<ATen/ops/_fused_rms_norm_backward.h>)
#define GMT_FUSED_RMS_NORM_META_KERNELS(X)     \
  X("_fused_rms_norm", fused_rms_norm_meta) \
  X("_fused_rms_norm_backward", fused_rms_norm_backward_meta)
std::tuple<Tensor, Tensor> fused_rms_norm_meta(const Tensor& x, IntArrayRef normalized, const OptTensor&,
                                               std::optional<double>) {
  return {at::empty(x.sizes(), x.options()), at::empty(norm_stat_shape(x, normalized.size()), stats_options(x))};
}

std::tuple<Tensor, Tensor> fused_rms_norm_backward_meta(const Tensor&, const Tensor& x, IntArrayRef, const Tensor&,
                                                        const OptTensor& w, std::array<bool, 2> mask) {
  const bool weight = mask[1] && w.has_value() && w->defined();
  return {mask[0] ? at::empty(x.sizes(), x.options()) : Tensor(), weight ? at::empty(w->sizes(), w->options()) : Tensor()};
}
#else
#define GMT_FUSED_RMS_NORM_META_KERNELS(X)
#endif

// ---- dropout, activations and their backwards, roll. The meta-via-CPU fallback would run these
// too, but they are elementwise over whole activations (a 7B model's MLP: hundreds of MiB per
// call), so copying their inputs to the CPU and computing them is the cost to avoid. Each
// allocates what the CUDA kernel allocates.
std::tuple<Tensor, Tensor> native_dropout_meta(const Tensor& x, double, std::optional<bool>) {
  // CUDA: the output and a bool mask of the input's shape, in training and not.
  return {at::empty_like(x), at::empty_like(x, x.options().dtype(at::kBool))};
}

Tensor native_dropout_backward_meta(const Tensor& grad, const Tensor&, double) { return at::empty_like(grad); }

Tensor like_first(const Tensor& x) { return at::empty_like(x); }
Tensor hardtanh_meta(const Tensor& x, const c10::Scalar&, const c10::Scalar&) { return at::empty_like(x); }
Tensor hardtanh_backward_meta(const Tensor& grad, const Tensor&, const c10::Scalar&, const c10::Scalar&) {
  return at::empty_like(grad);
}
Tensor hardswish_backward_meta(const Tensor& grad, const Tensor&) { return at::empty_like(grad); }
Tensor glu_backward_meta(const Tensor&, const Tensor& self, int64_t) { return at::empty_like(self); }
// Contiguous, as both kernels make it (zeros_like with LEGACY_CONTIGUOUS_MEMORY_FORMAT).
Tensor mse_loss_backward_meta(const Tensor&, const Tensor& self, const Tensor&, int64_t) {
  return at::empty(self.sizes(), self.options());
}

// CUDA's roll writes a contiguous result (of a contiguous copy of a strided input).
Tensor roll_meta(const Tensor& self, c10::SymIntArrayRef, IntArrayRef) { return at::empty(self.sizes(), self.options()); }

// JIT constant pooling compares tensor constants; meta tensors hold no data: never equal.
bool equal_meta(const Tensor&, const Tensor&) { return false; }

// `.item()` on meta: there is no value. Zero keeps shape-only programs going; control flow that
// depends on data cannot be estimated on meta (use --allow-cpu).
std::atomic<int64_t> g_meta_scalar_reads{0};

c10::Scalar local_scalar_dense_meta(const Tensor& t) {
  // Counted so an estimate can say that the run read values it does not have.
  g_meta_scalar_reads.fetch_add(1, std::memory_order_relaxed);
  if (t.is_floating_point()) return c10::Scalar(0.0);
  if (t.scalar_type() == at::kBool) return c10::Scalar(false);
  return c10::Scalar(static_cast<int64_t>(0));
}

// Module::to() and set_data() check this; meta-to-meta copies are fine.
bool compatible_shallow_copy_meta(const Tensor&, const Tensor&) { return true; }
}  // namespace

// Every hand-written meta kernel, once: registered below, listed for gmt_meta_kernels_registered
// (meta_kernel_check.cpp checks each against the CPU kernel).
#define GMT_HAND_WRITTEN_META_KERNELS(X) \
  X("convolution_overrideable", convolution_meta) \
  X("convolution_backward_overrideable", convolution_backward_meta) \
  X("native_batch_norm", native_batch_norm_meta) \
  X("native_batch_norm_backward", native_batch_norm_backward_meta) \
  X("_batch_norm_with_update", batch_norm_with_update_meta) \
  X("_batch_norm_no_update", batch_norm_no_update_meta) \
  X("batch_norm_backward", batch_norm_backward_meta) \
  X("_native_batch_norm_legit", native_batch_norm_legit_meta) \
  X("_native_batch_norm_legit.no_stats", native_batch_norm_legit_no_stats_meta) \
  X("_native_batch_norm_legit_no_training", native_batch_norm_legit_no_training_meta) \
  X("native_group_norm", native_group_norm_meta) \
  X("native_group_norm_backward", native_group_norm_backward_meta) \
  X("native_layer_norm", native_layer_norm_meta) \
  X("native_layer_norm_backward", native_layer_norm_backward_meta) \
  X("_adaptive_avg_pool2d", adaptive_avg_pool2d_meta) \
  X("_adaptive_avg_pool2d_backward", adaptive_avg_pool2d_backward_meta) \
  X("relu", relu_meta) \
  X("relu_", relu__meta) \
  X("index_select", index_select_meta) \
  X("embedding_dense_backward", embedding_dense_backward_meta) \
  X("where.self", where_meta) \
  X("_safe_softmax", gmt::safe_softmax_meta) \
  X("where.self_out", where_out_meta) \
  X("equal", equal_meta) \
  X("_local_scalar_dense", local_scalar_dense_meta) \
  X("_has_compatible_shallow_copy_type", compatible_shallow_copy_meta) \
  X("_scaled_dot_product_flash_attention_for_cpu", gmt::flash_attention_meta) \
  X("_scaled_dot_product_flash_attention_for_cpu_backward", gmt::flash_attention_backward_meta) \
  X("_scaled_dot_product_efficient_attention", gmt::efficient_attention_meta) \
  X("_scaled_dot_product_efficient_attention_backward", gmt::efficient_attention_backward_meta) \
  GMT_FUSED_RMS_NORM_META_KERNELS(X) \
  X("native_dropout", native_dropout_meta) \
  X("native_dropout_backward", native_dropout_backward_meta) \
  X("hardtanh", hardtanh_meta) \
  X("hardtanh_backward", hardtanh_backward_meta) \
  X("hardswish", like_first) \
  X("hardswish_backward", hardswish_backward_meta) \
  X("glu_backward", glu_backward_meta) \
  X("mse_loss_backward", mse_loss_backward_meta) \
  X("roll", roll_meta)

TORCH_LIBRARY_IMPL(aten, Meta, m) {
#define GMT_REGISTER(name, kernel) m.impl(name, kernel);
  GMT_HAND_WRITTEN_META_KERNELS(GMT_REGISTER)
#undef GMT_REGISTER
}

namespace {
const char* const kHandWritten[] = {
#define GMT_NAME(name, kernel) name,
    GMT_HAND_WRITTEN_META_KERNELS(GMT_NAME)
#undef GMT_NAME
};
}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradMeta, m) {
  m.impl("scaled_dot_product_attention", gmt::sdpa_as_on_cuda);
  m.impl("dropout", dropout_as_on_cuda);
}

namespace {
// ---- every other op: its CPU kernel on CPU twins of the meta inputs
// Ops without a Meta (or composite) kernel get this boxed Meta kernel: meta tensor arguments become
// zeroed CPU tensors of the same sizes, strides and dtype, the CPU kernel runs, and its tensor
// results come back as meta tensors of the sizes, strides and dtypes it produced (allocated on
// meta, so the recording sees them as the op's allocations; the CPU twins and the kernel's own
// temporaries are CPU memory, which a meta recording does not record). A result that aliases an
// argument (in-place and out= variants) is that argument. The cost is one op's inputs at a time.
struct FallbackCount {
  int64_t calls = 0;
  int64_t bytes = 0;  // bytes of CPU twins materialised
};
std::mutex g_fallback_mu;
std::map<std::string, FallbackCount> g_fallback_counts;

// Ops whose results depend on the values, which meta tensors do not have (they see zeros).
bool reads_values(const std::string& op) {
  static const char* const kOps[] = {"aten::nonzero", "aten::unique_dim", "aten::_unique", "aten::_unique2",
                                     "aten::unique_consecutive", "aten::unique_dim_consecutive",
                                     "aten::masked_select", "aten::bincount", "aten::histc"};
  for (const char* o : kOps)
    if (op == o) return true;
  return false;
}

Tensor cpu_twin(const Tensor& t, int64_t* bytes) {
  Tensor cpu = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
  cpu.zero_();
  *bytes += static_cast<int64_t>(cpu.storage().nbytes());
  return cpu;
}

Tensor meta_twin(const Tensor& t) { return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)); }

c10::IValue to_cpu(const c10::IValue& v, int64_t* bytes) {
  if (v.isTensor()) {
    const Tensor& t = v.toTensor();
    return t.defined() && t.is_meta() ? c10::IValue(cpu_twin(t, bytes)) : v;
  }
  if (v.isTensorList()) {
    c10::List<Tensor> out;
    for (const Tensor& t : v.toTensorList()) out.push_back(t.defined() && t.is_meta() ? cpu_twin(t, bytes) : t);
    return c10::IValue(out);
  }
  if (v.isList()) {  // optional tensors (index.Tensor's indices): a copy, the caller's list stays
    c10::impl::GenericList list = v.toList().copy();
    for (size_t i = 0; i < list.size(); ++i) {
      const c10::IValue e = list.get(i);
      if (e.isTensor() && e.toTensor().defined() && e.toTensor().is_meta()) list.set(i, cpu_twin(e.toTensor(), bytes));
    }
    return c10::IValue(list);
  }
  return v;
}

c10::IValue to_meta(const c10::IValue& v) {
  if (v.isTensor()) {
    const Tensor& t = v.toTensor();
    return t.defined() ? c10::IValue(meta_twin(t)) : v;
  }
  if (v.isTensorList()) {
    c10::List<Tensor> out;
    for (const Tensor& t : v.toTensorList()) out.push_back(t.defined() ? meta_twin(t) : t);
    return c10::IValue(out);
  }
  return v;
}

void meta_via_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  TORCH_CHECK(stack->size() >= nargs, "meta-via-CPU fallback: stack too short for ", schema.name());
  const size_t base = stack->size() - nargs;
  const std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  int64_t bytes = 0;
  for (size_t i = 0; i < nargs; ++i) (*stack)[base + i] = to_cpu(args[i], &bytes);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  const size_t nret = schema.returns().size();
  const size_t ret_base = stack->size() - nret;
  for (size_t r = 0; r < nret; ++r) {
    auto& out = (*stack)[ret_base + r];
    const c10::AliasInfo* ra = schema.returns()[r].alias_info();
    std::optional<c10::IValue> alias;
    if (ra && ra->isWrite()) {
      for (size_t i = 0; i < nargs && !alias; ++i) {
        const c10::AliasInfo* aa = schema.arguments()[i].alias_info();
        if (aa && aa->beforeSets() == ra->beforeSets()) alias = args[i];
      }
    }
    if (alias && alias->isTensor() && out.isTensor()) {
      // An out= argument the CPU kernel resized (logical_not.out from an empty result): give the
      // meta argument the result's shape, with storage of its own so the allocation is counted.
      at::Tensor arg = alias->toTensor();
      const at::Tensor& cpu = out.toTensor();
      if (arg.defined() && cpu.defined() && (arg.sizes() != cpu.sizes() || arg.strides() != cpu.strides()))
        arg.set_(meta_twin(cpu));
    }
    out = alias ? *alias : to_meta(out);
  }
  const std::string name = schema.name();
  if (reads_values(name)) g_meta_scalar_reads.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  FallbackCount& c = g_fallback_counts[schema.overload_name().empty() ? name : name + "." + schema.overload_name()];
  ++c.calls;
  c.bytes += bytes;
}

std::once_flag g_fallback_once;
std::unique_ptr<torch::Library> g_fallback_lib;
int64_t g_fallback_ops = 0;

// Registers meta_via_cpu for every aten op with a CPU kernel and no Meta or composite kernel. Run
// once, after the static registrations above (so the hand-written kernels are kept).
void install_fallback() {
  auto& d = c10::Dispatcher::singleton();
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  for (const auto& name : d.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = d.findOp(name);
    if (!op) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::Meta) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CPU))
      continue;
    const std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&meta_via_cpu>());
    ++g_fallback_ops;
  }
  g_fallback_lib = std::move(lib);  // kept for the process: dropping it would deregister them
}
}  // namespace

namespace gmt {
void meta_fallback_install() {
  std::call_once(g_fallback_once, install_fallback);
}

// Referenced by the estimators so the linker keeps this object (and its registrations) when the
// shim is linked as a static library.
int meta_kernels_linked() { return 1; }
}  // namespace gmt

extern "C" {
const char* const* gmt_meta_kernels_registered(size_t* count) {
  if (count) *count = sizeof(kHandWritten) / sizeof(kHandWritten[0]);
  return kHandWritten;
}

int64_t gmt_meta_scalar_reads(void) { return g_meta_scalar_reads.load(std::memory_order_relaxed); }


int64_t gmt_meta_fallback_ops(void) { return g_fallback_ops; }

size_t gmt_conv_workspaces(int64_t* ids, int64_t* bytes, size_t cap) {
  std::lock_guard<std::mutex> lock(g_conv_workspaces_mu);
  for (size_t i = 0; i < g_conv_workspaces.size() && i < cap; ++i) {
    if (ids) ids[i] = g_conv_workspaces[i].first;
    if (bytes) bytes[i] = g_conv_workspaces[i].second;
  }
  return g_conv_workspaces.size();
}

void gmt_conv_workspaces_clear(void) {
  std::lock_guard<std::mutex> lock(g_conv_workspaces_mu);
  g_conv_workspaces.clear();
}

size_t gmt_meta_fallback_counts(const char** ops, int64_t* calls, int64_t* bytes, size_t cap) {
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  size_t i = 0;
  for (const auto& [name, c] : g_fallback_counts) {  // std::map: nodes and keys stay put
    if (i < cap) {
      if (ops) ops[i] = name.c_str();
      if (calls) calls[i] = c.calls;
      if (bytes) bytes[i] = c.bytes;
    }
    ++i;
  }
  return i;
}
}  // extern "C"
