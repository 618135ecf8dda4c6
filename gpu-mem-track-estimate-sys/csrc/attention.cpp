// scaled_dot_product_attention on meta as on a GPU: the kernel select_sdp_backend picks for the
// target GPU (gmt_meta_target_device), run through that kernel's schema so that autograd keeps
// what it keeps, and those kernels' Meta implementations.
#include <ATen/ATen.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <optional>
#include <tuple>

#include "attention.h"
#include "estimate.h"
#include "internal.h"

namespace {
using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Fused attention kernels write (batch, seq, heads, dim) and return it as (batch, heads, seq,
// dim), so a later `.transpose(1, 2).reshape(...)` is a view, not a copy.
Tensor heads_transposed(int64_t batch, int64_t heads, int64_t seq, int64_t dim, const c10::TensorOptions& options) {
  return at::empty({batch, seq, heads, dim}, options).transpose(1, 2);
}

// On meta scaled_dot_product_attention would always take the math path, which materialises and
// keeps the [B, H, L, S] attention weights. A GPU takes the first of flash, memory-efficient and
// math attention whose constraints the call meets (transformers/cuda/sdp_utils.cpp). Flash
// attention runs as the fused CPU kernel's schema, whose autograd formula saves what the CUDA
// one saves: the output and a [B, H, L] logsumexp.

// The compute capability of the GPU a meta run stands for, major * 10 + minor.
std::atomic<int> g_target_sm{90};
// Calls of scaled_dot_product_attention per kernel taken: flash, memory-efficient, math.
std::array<std::atomic<int64_t>, 3> g_attention_kernels{};

enum class Attention { flash, efficient, math };

// PyTorch 2.15 gave memory-efficient attention grouped-query heads, and every fused kernel a
// single key/value head broadcast over the query heads (pytorch#191085). The same change added
// the third parameter of this check, which is how the headers the shim builds against tell.
template <bool B>
constexpr auto fused_attention_broadcasts_kv(int) -> decltype(&sdp::check_batch_size_and_num_heads_dense<B, true, B>, true) {
  return true;
}
template <bool B>
constexpr bool fused_attention_broadcasts_kv(...) {
  return false;
}
constexpr bool kEfficientTakesGroupedHeads = fused_attention_broadcasts_kv<true>(0);

bool reduced_float(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// What select_sdp_backend (sdp_utils.cpp) picks on a GPU of compute capability `sm` for dense
// inputs, the user's backend switches (torch.backends.cuda.enable_*_sdp, sdpa_kernel) included.
// cuDNN attention, first on some sm90/sm100 set-ups, keeps what flash attention keeps.
Attention cuda_attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& mask,
                                double dropout, bool is_causal, bool enable_gqa, int sm) {
  auto& ctx = at::globalContext();
  const bool masked = mask.has_value() && mask->defined();
  // Nested (jagged) inputs have their own rules; the math path is what meta runs for them.
  if (q.is_nested() || k.is_nested() || v.is_nested()) return Attention::math;
  const bool fused_shapes = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) > 0 && k.size(2) > 0 &&
                            q.size(0) == k.size(0) && q.size(0) == v.size(0);
  if (!fused_shapes) return Attention::math;
  const int64_t hq = q.size(1), hk = k.size(1), hv = v.size(1);
  const bool same_heads = hq == hk && hq == hv;
  const bool grouped = enable_gqa && hk == hv && hk > 0 && hq % hk == 0;
  const bool one_kv_head = kEfficientTakesGroupedHeads && hk == 1 && hv == 1;
  const auto t = q.scalar_type();
  const bool half = reduced_float(t);
  const bool same_dtype = k.scalar_type() == t && v.scalar_type() == t;
  const int64_t dq = q.size(3), dk = k.size(3), dv = v.size(3);
  const bool unit_strides = q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1;
  const bool requires_grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());

  const bool sm86_89_120 = (sm >= 86 && sm <= 89) || (sm >= 120 && sm <= 121);
  const bool flash = ctx.userEnabledFlashSDP() && sm >= 80 && sm <= 121 && !masked && same_dtype && half &&
                     dq == dk && dq == dv && dq <= 256 && (unit_strides || dq == 1) &&
                     (same_heads || grouped || one_kv_head) && (!is_causal || q.size(2) == k.size(2)) &&
                     !(requires_grad && sm86_89_120 && !(dq <= 192 || (dropout == 0 && dq > 224)));
  if (flash) return Attention::flash;

  // Memory-efficient attention: GEMM alignment of the head dimension and of the inputs' offsets.
  const int64_t gemm_rows = sm >= 80 ? 4 : 1;
  const bool tensor_cores = sm >= 80 || (sm >= 70 && half);
  const int64_t alignment = tensor_cores ? std::max<int64_t>(gemm_rows, half ? 8 : 4) : gemm_rows;
  const bool dtype_ok = same_dtype && (t == at::kHalf || t == at::kFloat || (t == at::kBFloat16 && sm >= 80));
  const bool offsets_aligned = sm < 80 || (q.storage_offset() % alignment == 0 && k.storage_offset() % alignment == 0 &&
                                           v.storage_offset() % alignment == 0);
  const bool efficient = ctx.userEnabledMemEfficientSDP() && sm >= 50 && dtype_ok && dq == dk && dq > 0 && dv > 0 &&
                         dq % alignment == 0 && dv % alignment == 0 && offsets_aligned && unit_strides &&
                         (!masked || mask->stride(-1) == 1) &&
                         (same_heads || (kEfficientTakesGroupedHeads && grouped) || one_kv_head);
  if (efficient) return Attention::efficient;
  TORCH_CHECK(ctx.userEnabledMathSDP(), "No available kernel. Aborting execution. (gpu-mem-track: on an sm", sm,
              " GPU no enabled scaled_dot_product_attention kernel takes these inputs)");
  return Attention::math;
}

// A boolean mask becomes an additive one of the query's dtype (attention.cpp,
// convert_boolean_attn_mask): a new tensor of the mask's sizes, which the kernel then keeps.
OptTensor additive_mask(const OptTensor& mask, const Tensor& q) {
  if (!mask.has_value() || !mask->defined() || mask->scalar_type() != at::kBool) return mask;
  return at::where(mask->logical_not(), -std::numeric_limits<double>::infinity(),
                   at::scalar_tensor(0.0, q.options().dtype(q.scalar_type())));
}

// Flash attention pads the head dimension to a multiple of 8 (attention.cpp, pad_last_dim).
Tensor head_dim_padded(const Tensor& t) {
  const int64_t d = t.size(-1);
  return d % 8 == 0 ? t : at::pad(t, {0, 8 - d % 8});
}

}  // namespace

namespace gmt {
// The math path's softmax: on a GPU, _safe_softmax's composite body: softmax, a bool test of each
// score, all() of each row, a where. Python torch's meta decomposition of all() goes through an
// int64 sum of the test, eight bytes a score that no GPU allocates; all()'s own allocation is
// its [.., 1] result, made here directly.
Tensor safe_softmax_meta(const Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  Tensor out = at::softmax(self, dim, dtype);
  Tensor masked = self.eq(-std::numeric_limits<double>::infinity());
  auto row_shape = self.sizes().vec();
  if (!row_shape.empty()) row_shape[c10::maybe_wrap_dim(dim, self.dim())] = 1;
  Tensor masked_rows = at::empty(row_shape, masked.options());
  return at::where(masked_rows, at::scalar_tensor(0.0, out.options()), out);
}

std::tuple<Tensor, Tensor> flash_attention_meta(const Tensor& q, const Tensor& k, const Tensor& v, double, bool,
                                                const OptTensor&, std::optional<double>) {
  const int64_t b = q.size(0), h = q.size(1), l = q.size(2);
  return {heads_transposed(b, h, l, v.size(-1), q.options()), at::empty({b, h, l}, stats_options(q))};
}

std::tuple<Tensor, Tensor, Tensor> flash_attention_backward_meta(const Tensor&, const Tensor& q, const Tensor& k,
                                                                 const Tensor& v, const Tensor&, const Tensor&,
                                                                 double, bool, const OptTensor&,
                                                                 std::optional<double>) {
  Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  const int64_t b = q.size(0), h = q.size(1), l = q.size(2), d = q.size(3);
  // The flash backward's own buffers, freed as it returns (flash_api.cpp, mha_bwd): the softmax
  // row sums and the query gradient accumulated in float, rows rounded to 128.
  const int64_t rows = (l + 127) / 128 * 128, width = d <= 192 ? (d + 31) / 32 * 32 : 256;
  [[maybe_unused]] Tensor softmax_d = at::empty({b, h, rows}, q.options().dtype(at::kFloat));
  [[maybe_unused]] Tensor dq_accum = at::empty({b, rows, h, width}, q.options().dtype(at::kFloat));
  if (q.dim() == 4 && k.dim() == 4 && k.size(1) != q.size(1)) {
    // Grouped-query attention: the key and value gradients are computed per query head,
    // (batch, seq, query heads, dim), then each group is summed into the result (dk_expanded,
    // dv_expanded).
    const int64_t s = k.size(2);
    [[maybe_unused]] Tensor dk_expanded = at::empty({b, s, h, k.size(3)}, k.options());
    [[maybe_unused]] Tensor dv_expanded = at::empty({b, s, h, v.size(3)}, v.options());
  }
  return {gq, gk, gv};
}

// Memory-efficient attention saves the output, a logsumexp padded to 32 rows and the mask; its
// backward also gives the mask's gradient, of the mask's (expanded) sizes with the last dimension
// padded to 16 (attention/cuda/attention.cu).
std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_attention_meta(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                    const OptTensor&, bool compute_log_sumexp, double,
                                                                    bool, std::optional<double>) {
  const int64_t b = q.size(0), h = q.size(1), l = q.size(2);
  Tensor out = heads_transposed(b, h, l, v.size(-1), q.options());
  Tensor lse = at::empty({b, h, compute_log_sumexp ? (l + 31) / 32 * 32 : 0}, q.options().dtype(at::kFloat));
  const auto seed = q.options().dtype(at::kLong);
  return {out, lse, at::empty({}, seed), at::empty({}, seed)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_attention_backward_meta(
    const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor&,
    const Tensor&, const Tensor&, const Tensor&, double, std::array<bool, 4> mask, bool, std::optional<double>) {
  auto permuted = [](const Tensor& t) { return heads_transposed(t.size(0), t.size(1), t.size(2), t.size(3), t.options()); };
  // The kernel writes all three gradients whichever are asked for (attention_backward.cu).
  Tensor gq = permuted(q), gk = permuted(k), gv = permuted(v), grad_bias;
  if (mask[3] && bias.defined()) {
    auto sizes = bias.sizes().vec();
    const int64_t last = sizes.back();
    sizes.back() = (last + 15) / 16 * 16;
    grad_bias = at::empty(sizes, bias.options()).slice(-1, 0, last);
  }
  {
    // Then the gradient of the output times the output, summed per row, in float (delta), freed
    // as it returns. Half-precision kernels compute it themselves; others take
    // (grad_out * out).sum(-1).transpose(-2, -1).contiguous(), whose temporaries live together.
    const int64_t b = q.size(0), h = q.size(1), m = q.size(2);
    const auto floats = q.options().dtype(at::kFloat);
    Tensor products, rows;
    if (!reduced_float(q.scalar_type())) {
      products = at::empty({b, m, h, v.size(3)}, floats);
      rows = at::empty({b, m, h}, floats);
    }
    [[maybe_unused]] Tensor delta = at::empty({b, h, m}, floats);
  }
  return {mask[0] ? gq : Tensor(), mask[1] ? gk : Tensor(), mask[2] ? gv : Tensor(), grad_bias};
}

Tensor sdpa_as_on_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& mask, double dropout,
                       bool is_causal, std::optional<double> scale, bool enable_gqa) {
  // The checks scaled_dot_product_attention makes before choosing (attention.cpp,
  // validate_sdpa_input): a program's bad call fails here as it would on a GPU.
  TORCH_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
              "Expected query, key, and value to have the same dtype, but got query.dtype: ", q.dtype(),
              " key.dtype: ", k.dtype(), " and value.dtype: ", v.dtype(), " instead.");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(),
              "Expected query, key, and value to have the same device type, but got query.device: ", q.device(),
              " key.device: ", k.device(), " and value.device: ", v.device(), " instead.");
  TORCH_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
              "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: ", q.dim(),
              " key.dim: ", k.dim(), " and value.dim: ", v.dim(), " instead.");
  if (mask.has_value() && mask->defined()) {
    const auto t = mask->dtype();
    TORCH_CHECK(t == at::kBool || t == at::kFloat || t == q.dtype(),
                "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: ", t,
                " and  query.dtype: ", q.dtype(), " instead.");
    TORCH_CHECK(!q.is_nested() && !k.is_nested(),
                "Scaled_dot_product_attention: Nested tensors for query / key are not supported when an explicit "
                "attn_mask is set");
  }
  const Attention kernel =
      cuda_attention_kernel(q, k, v, mask, dropout, is_causal, enable_gqa, g_target_sm.load(std::memory_order_relaxed));
  g_attention_kernels[static_cast<size_t>(kernel)].fetch_add(1, std::memory_order_relaxed);
  switch (kernel) {
    case Attention::flash: {
      const int64_t d = q.size(-1);
      Tensor out = std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
          head_dim_padded(q), head_dim_padded(k), head_dim_padded(v), dropout, is_causal, std::nullopt, scale));
      return out.size(-1) == d ? out : out.slice(-1, 0, d);
    }
    case Attention::efficient: {
      OptTensor bias = additive_mask(mask, q);
      if (bias.has_value() && bias->defined()) {
        // preprocess_mask: a mask whose strides are not multiples of 8 is copied into a padded
        // one; either is then expanded to (batch, heads, query, key).
        Tensor m = *bias;
        bool aligned = m.stride(-1) == 1;
        for (int64_t i = 0; i + 1 < m.dim(); ++i) aligned = aligned && m.stride(i) % 8 == 0;
        if (!aligned) {
          const int64_t last = m.size(-1);
          m = at::pad(m, {0, 8 - last % 8}).slice(-1, 0, last);
        }
        bias = m.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
      }
      const bool log_sumexp =
          at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, bias, log_sumexp, dropout, is_causal, scale));
    }
    case Attention::math:
      // The composite implementation; its ops record their own autograd nodes.
      return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, additive_mask(mask, q), dropout, is_causal,
                                                                std::nullopt, scale, enable_gqa));
  }
  return Tensor();
}

}  // namespace gmt

extern "C" {
void gmt_meta_target_device(int major, int minor) {
  g_target_sm.store(major * 10 + minor, std::memory_order_relaxed);
}

void gmt_meta_attention_kernels(int64_t* calls) {
  for (size_t i = 0; i < g_attention_kernels.size(); ++i) calls[i] = g_attention_kernels[i].load(std::memory_order_relaxed);
}
}  // extern "C"
