// scaled_dot_product_attention's kernels on meta (attention.cpp), registered by meta_kernels.cpp.
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

namespace gmt {
// scaled_dot_product_attention at AutogradMeta: the kernel the target GPU picks, through its schema.
at::Tensor sdpa_as_on_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& mask, double dropout, bool is_causal,
                           std::optional<double> scale, bool enable_gqa);
// Meta kernels of the fused kernels' schemas and of the math path's softmax.
std::tuple<at::Tensor, at::Tensor> flash_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                        double dropout, bool is_causal,
                                                        const std::optional<at::Tensor>& mask,
                                                        std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward_meta(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, double dropout, bool is_causal, const std::optional<at::Tensor>& mask,
    std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& bias,
    bool compute_log_sumexp, double dropout, bool is_causal, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_backward_meta(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& seed, const at::Tensor& offset, double dropout,
    std::array<bool, 4> grad_input_mask, bool is_causal, std::optional<double> scale);
at::Tensor safe_softmax_meta(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype);
}  // namespace gmt
