// Checks every hand-written meta kernel (meta_kernels.cpp) against the CPU kernel of the same op:
// each case builds inputs on the CPU (seeded random values), runs the op there and on meta twins
// of the same sizes, strides and dtypes, and compares every tensor result's sizes, strides and
// dtype. Several shapes per op, a strided (transposed) input among them where the op takes one.
// Where meta computes what a GPU allocates and the CPU kernel differs on purpose, the case says
// so and compares what both must agree on.
#include <ATen/ATen.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "internal.h"

namespace {
using at::Tensor;
using OptTensor = std::optional<Tensor>;

// A case: the op it checks (as registered), a label for its shapes, and the call, given inputs
// on one device (the same list, CPU or meta twins).
struct Case {
  const char* op;
  std::string shapes;
  std::function<std::vector<Tensor>()> inputs;  // CPU inputs
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, bool meta)> call;
  bool compare_strides = true;
};

Tensor rnd(at::IntArrayRef s) { return at::randn(s); }

std::vector<Tensor> tuple3(const std::tuple<Tensor, Tensor, Tensor>& t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t)};
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream s;
  s << t.sizes() << " strides " << t.strides() << " " << t.scalar_type();
  return s.str();
}

std::vector<Case> cases() {
  std::vector<Case> c;
  // convolution: meta takes convolution_overrideable (the CPU has convolution itself)
  for (auto [in, w, stride, pad, groups, transposed] :
       std::vector<std::tuple<std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t, bool>>{
           {{2, 4, 9, 9}, {8, 4, 3, 3}, 1, 1, 1, false},
           {{1, 4, 10, 7}, {6, 2, 3, 3}, 2, 0, 2, false},
           {{2, 4, 5, 5}, {4, 3, 2, 2}, 2, 0, 1, true},
           {{2, 3, 11}, {5, 3, 4}, 1, 2, 1, false}}) {
    const size_t spatial = in.size() - 2;
    c.push_back({"convolution_overrideable", describe(rnd(in)) + " * " + describe(rnd(w)),
                 [in = in, w = w] { return std::vector<Tensor>{rnd(in), rnd(w)}; },
                 [=](const std::vector<Tensor>& a, bool meta) {
                   const std::vector<int64_t> s(spatial, stride), p(spatial, pad), d(spatial, 1), op(spatial, 0);
                   auto f = meta ? &at::convolution_overrideable : &at::convolution;
                   return std::vector<Tensor>{f(a[0], a[1], std::nullopt, s, p, d, transposed, op, groups)};
                 }});
    c.push_back({"convolution_backward_overrideable", describe(rnd(in)) + " * " + describe(rnd(w)),
                 [in = in, w = w, spatial, stride, pad, groups, transposed] {
                   Tensor x = rnd(in), wt = rnd(w);
                   const std::vector<int64_t> s(spatial, stride), p(spatial, pad), d(spatial, 1), op(spatial, 0);
                   Tensor y = at::convolution(x, wt, std::nullopt, s, p, d, transposed, op, groups);
                   return std::vector<Tensor>{at::randn_like(y), x, wt};
                 },
                 [=](const std::vector<Tensor>& a, bool meta) {
                   const std::vector<int64_t> s(spatial, stride), p(spatial, pad), d(spatial, 1), op(spatial, 0);
                   if (meta)
                     return tuple3(at::convolution_backward_overrideable(a[0], a[1], a[2], s, p, d, transposed, op,
                                                                         groups, {true, true, true}));
                   return tuple3(at::convolution_backward(a[0], a[1], a[2], std::vector<int64_t>{a[2].size(transposed ? 1 : 0) * (transposed ? groups : 1)},
                                                          s, p, d, transposed, op, groups, {true, true, true}));
                 }});
  }
  // batch norm, every entry point
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 3, 5, 5}, {2, 6, 7}, {8, 16}}) {
    const int64_t ch = shape[1];
    auto inputs = [shape, ch] { return std::vector<Tensor>{rnd(shape), rnd({ch}), rnd({ch}), rnd({ch}), rnd({ch}).abs()}; };
    for (bool training : {true, false}) {
      c.push_back({"native_batch_norm", describe(rnd(shape)) + (training ? " train" : " eval"), inputs,
                   [training](const std::vector<Tensor>& a, bool) {
                     return tuple3(at::native_batch_norm(a[0], a[1], a[2], a[3].clone(), a[4].clone(), training, 0.1, 1e-5));
                   }});
      c.push_back({"_native_batch_norm_legit", describe(rnd(shape)) + (training ? " train" : " eval"), inputs,
                   [training](const std::vector<Tensor>& a, bool) {
                     Tensor rm = a[3].clone(), rv = a[4].clone();
                     return tuple3(at::_native_batch_norm_legit(a[0], a[1], a[2], rm, rv, training, 0.1, 1e-5));
                   }});
    }
    c.push_back({"_native_batch_norm_legit.no_stats", describe(rnd(shape)), inputs,
                 [](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::_native_batch_norm_legit(a[0], a[1], a[2], true, 0.1, 1e-5));
                 }});
    c.push_back({"_native_batch_norm_legit_no_training", describe(rnd(shape)), inputs,
                 [](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::_native_batch_norm_legit_no_training(a[0], a[1], a[2], a[3], a[4], 0.1, 1e-5));
                 }});
    c.push_back({"_batch_norm_with_update", describe(rnd(shape)), inputs,
                 [](const std::vector<Tensor>& a, bool) {
                   Tensor rm = a[3].clone(), rv = a[4].clone();
                   auto [o, m, v, r] = at::_batch_norm_with_update(a[0], a[1], a[2], rm, rv, 0.1, 1e-5);
                   // The reserve is a placeholder on both (0 bytes); its dtype differs by backend.
                   return std::vector<Tensor>{o, m, v};
                 }});
    c.push_back({"_batch_norm_no_update", describe(rnd(shape)), inputs,
                 [](const std::vector<Tensor>& a, bool) {
                   auto [o, m, v, r] = at::_batch_norm_no_update(a[0], a[1], a[2], a[3], a[4], 0.1, 1e-5);
                   return std::vector<Tensor>{o, m, v};
                 }});
    auto backward_inputs = [shape, ch] {
      Tensor x = rnd(shape), w = rnd({ch}), b = rnd({ch}), rm = rnd({ch}), rv = rnd({ch}).abs();
      auto [y, mean, invstd] = at::native_batch_norm(x, w, b, rm.clone(), rv.clone(), true, 0.1, 1e-5);
      return std::vector<Tensor>{at::randn_like(y), x, w, rm, rv, mean, invstd};
    };
    c.push_back({"native_batch_norm_backward", describe(rnd(shape)), backward_inputs,
                 [](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::native_batch_norm_backward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], true, 1e-5,
                                                                {true, true, true}));
                 }});
    c.push_back({"batch_norm_backward", describe(rnd(shape)), backward_inputs,
                 [](const std::vector<Tensor>& a, bool meta) {
                   Tensor reserve = at::empty({0}, a[1].options().dtype(at::kByte));
                   return tuple3(at::batch_norm_backward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], true, 1e-5,
                                                         {true, true, true}, reserve));
                 }});
  }
  // group norm
  for (auto [shape, groups] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{2, 8, 5, 5}, 4}, {{3, 6, 7}, 2}}) {
    const int64_t n = shape[0], ch = shape[1];
    int64_t hw = 1;
    for (size_t k = 2; k < shape.size(); ++k) hw *= shape[k];
    c.push_back({"native_group_norm", describe(rnd(shape)),
                 [shape = shape, ch] { return std::vector<Tensor>{rnd(shape), rnd({ch}), rnd({ch})}; },
                 [=](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::native_group_norm(a[0], a[1], a[2], n, ch, hw, groups, 1e-5));
                 }});
    c.push_back({"native_group_norm_backward", describe(rnd(shape)),
                 [=, shape = shape] {
                   Tensor x = rnd(shape), w = rnd({ch}), b = rnd({ch});
                   auto [y, mean, rstd] = at::native_group_norm(x, w, b, n, ch, hw, groups, 1e-5);
                   return std::vector<Tensor>{at::randn_like(y), x, mean, rstd, w};
                 },
                 [=](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::native_group_norm_backward(a[0], a[1], a[2], a[3], a[4], n, ch, hw, groups,
                                                                {true, true, true}));
                 }});
  }
  // layer norm
  for (auto [shape, normalized] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{4, 7, 16}, {16}}, {{2, 3, 4, 5}, {4, 5}}, {{6, 32}, {32}}}) {
    c.push_back({"native_layer_norm", describe(rnd(shape)),
                 [shape = shape, normalized = normalized] {
                   return std::vector<Tensor>{rnd(shape), rnd(normalized), rnd(normalized)};
                 },
                 [normalized = normalized](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::native_layer_norm(a[0], normalized, a[1], a[2], 1e-5));
                 }});
    c.push_back({"native_layer_norm_backward", describe(rnd(shape)),
                 [shape = shape, normalized = normalized] {
                   Tensor x = rnd(shape), w = rnd(normalized), b = rnd(normalized);
                   auto [y, mean, rstd] = at::native_layer_norm(x, normalized, w, b, 1e-5);
                   return std::vector<Tensor>{at::randn_like(y), x, mean, rstd, w, b};
                 },
                 [normalized = normalized](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::native_layer_norm_backward(a[0], a[1], normalized, a[2], a[3], a[4], a[5],
                                                                {true, true, true}));
                 }});
  }
  // adaptive average pooling
  for (auto [shape, out] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 3, 9, 9}, {3, 3}}, {{3, 7, 6}, {2, 4}}}) {
    c.push_back({"_adaptive_avg_pool2d", describe(rnd(shape)), [shape = shape] { return std::vector<Tensor>{rnd(shape)}; },
                 [out = out](const std::vector<Tensor>& a, bool) {
                   return std::vector<Tensor>{at::_adaptive_avg_pool2d(a[0], out)};
                 }});
    c.push_back({"_adaptive_avg_pool2d_backward", describe(rnd(shape)),
                 [shape = shape, out = out] {
                   Tensor x = rnd(shape);
                   return std::vector<Tensor>{at::randn_like(at::_adaptive_avg_pool2d(x, out)), x};
                 },
                 [](const std::vector<Tensor>& a, bool) {
                   return std::vector<Tensor>{at::_adaptive_avg_pool2d_backward(a[0], a[1])};
                 }});
  }
  // elementwise: contiguous, and a transposed (strided) input
  auto elementwise = [&c](const char* op, std::function<std::vector<Tensor>(const std::vector<Tensor>&)> f,
                          int n_inputs) {
    for (bool transposed : {false, true}) {
      for (auto shape : std::vector<std::vector<int64_t>>{{4, 6}, {2, 3, 8, 5}}) {
        c.push_back({op, describe(rnd(shape)) + (transposed ? " transposed" : ""),
                     [=] {
                       std::vector<Tensor> v;
                       for (int i = 0; i < n_inputs; ++i) {
                         Tensor t = rnd(shape);
                         v.push_back(transposed ? t.transpose(0, 1) : t);
                       }
                       return v;
                     },
                     [f](const std::vector<Tensor>& a, bool) { return f(a); }});
      }
    }
  };
  elementwise("relu", [](const auto& a) { return std::vector<Tensor>{at::relu(a[0])}; }, 1);
  elementwise("relu_", [](const auto& a) {
    Tensor x = a[0].clone();
    return std::vector<Tensor>{at::relu_(x)};
  }, 1);
  elementwise("hardtanh", [](const auto& a) { return std::vector<Tensor>{at::hardtanh(a[0], -1, 1)}; }, 1);
  elementwise("hardtanh_backward", [](const auto& a) {
    return std::vector<Tensor>{at::hardtanh_backward(a[0], a[1], -1, 1)};
  }, 2);
  elementwise("hardswish", [](const auto& a) { return std::vector<Tensor>{at::hardswish(a[0])}; }, 1);
  elementwise("hardswish_backward", [](const auto& a) {
    return std::vector<Tensor>{at::hardswish_backward(a[0], a[1])};
  }, 2);
  elementwise("mse_loss_backward", [](const auto& a) {
    return std::vector<Tensor>{at::mse_loss_backward(a[0].sum(), a[1], a[2], at::Reduction::Mean)};
  }, 3);
  elementwise("native_dropout", [](const auto& a) {
    auto [out, mask] = at::native_dropout(a[0], 0.25, true);
    return std::vector<Tensor>{out, mask};
  }, 1);
  elementwise("native_dropout_backward", [](const auto& a) {
    return std::vector<Tensor>{at::native_dropout_backward(a[0], a[1].gt(0), 1.25)};
  }, 2);
  elementwise("roll", [](const auto& a) { return std::vector<Tensor>{at::roll(a[0], {1}, {0})}; }, 1);
  elementwise("roll", [](const auto& a) { return std::vector<Tensor>{at::roll(a[0], {2, -1}, {0, 1})}; }, 1);
  elementwise("where.self", [](const auto& a) { return std::vector<Tensor>{at::where(a[0].gt(0), a[1], a[2])}; }, 3);
  elementwise("_safe_softmax", [](const auto& a) { return std::vector<Tensor>{at::_safe_softmax(a[0], -1)}; }, 1);
  elementwise("where.self_out", [](const auto& a) {
    Tensor out = at::empty({0}, a[1].options());
    at::where_out(out, a[0].gt(0), a[1], a[2]);
    return std::vector<Tensor>{out};
  }, 3);
  for (auto [shape, dim] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{6, 8}, 1}, {{4, 6, 5}, 1}}) {
    c.push_back({"glu_backward", describe(rnd(shape)),
                 [shape = shape, dim = dim] {
                   Tensor x = rnd(shape);
                   return std::vector<Tensor>{at::randn_like(at::glu(x, dim)), x};
                 },
                 [dim = dim](const std::vector<Tensor>& a, bool) {
                   return std::vector<Tensor>{at::glu_backward(a[0], a[1], dim)};
                 }});
  }
  // indexing and embeddings
  for (auto [shape, dim, n] : std::vector<std::tuple<std::vector<int64_t>, int64_t, int64_t>>{{{10, 4}, 0, 6}, {{3, 9, 2}, 1, 4}}) {
    c.push_back({"index_select", describe(rnd(shape)),
                 [shape = shape, dim = dim, n = n] {
                   return std::vector<Tensor>{rnd(shape), at::randint(shape[dim], {n}, at::kLong)};
                 },
                 [dim = dim](const std::vector<Tensor>& a, bool) {
                   return std::vector<Tensor>{at::index_select(a[0], dim, a[1])};
                 }});
  }
  for (auto [ids, weights, width] : std::vector<std::tuple<std::vector<int64_t>, int64_t, int64_t>>{{{4, 7}, 50, 16}, {{9}, 12, 8}}) {
    c.push_back({"embedding_dense_backward", "ids " + describe(at::zeros(ids)),
                 [ids = ids, weights = weights, width = width] {
                   std::vector<int64_t> g = ids;
                   g.push_back(width);
                   return std::vector<Tensor>{rnd(g), at::randint(weights, ids, at::kLong)};
                 },
                 [weights = weights](const std::vector<Tensor>& a, bool) {
                   return std::vector<Tensor>{at::embedding_dense_backward(a[0], a[1], weights, -1, false)};
                 }});
  }
  // attention: meta routes scaled_dot_product_attention to the fused CPU kernel's schema
  for (auto [b, h, l, s, e] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{{2, 4, 16, 16, 8}, {1, 2, 7, 9, 16}}) {
    c.push_back({"_scaled_dot_product_flash_attention_for_cpu", "q " + describe(rnd({b, h, l, e})),
                 [=] { return std::vector<Tensor>{rnd({b, h, l, e}), rnd({b, h, s, e}), rnd({b, h, s, e})}; },
                 [](const std::vector<Tensor>& a, bool) {
                   auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(a[0], a[1], a[2]);
                   return std::vector<Tensor>{out, lse};
                 },
                 // Meta lays the output out as GPU fused kernels write it, (batch, seq, heads,
                 // dim) transposed, so a later transpose-reshape is a view as on a GPU; the CPU
                 // kernel writes it contiguous. Same sizes, dtypes and bytes.
                 /*compare_strides=*/false});
    c.push_back({"_scaled_dot_product_flash_attention_for_cpu_backward", "q " + describe(rnd({b, h, l, e})),
                 [=] {
                   Tensor q = rnd({b, h, l, e}), k = rnd({b, h, s, e}), v = rnd({b, h, s, e});
                   auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v);
                   return std::vector<Tensor>{at::randn_like(out), q, k, v, out, lse};
                 },
                 [](const std::vector<Tensor>& a, bool) {
                   return tuple3(at::_scaled_dot_product_flash_attention_for_cpu_backward(a[0], a[1], a[2], a[3], a[4],
                                                                                           a[5], 0.0, false));
                 },
                 /*compare_strides=*/false});  // as above: the gradients' layout is not the CPU's
  }
  // Memory-efficient attention has no CPU kernel: its output is held to the fused CPU kernel's
  // (the logsumexp differs on purpose: padded to 32 rows, as on a GPU), its gradients to what
  // autograd gives the math path on the CPU, the mask's among them.
  for (auto [b, h, l, s, e] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{{2, 4, 16, 16, 8}, {1, 2, 7, 9, 16}}) {
    c.push_back({"_scaled_dot_product_efficient_attention", "q " + describe(rnd({b, h, l, e})),
                 [=] { return std::vector<Tensor>{rnd({b, h, l, e}), rnd({b, h, s, e}), rnd({b, h, s, e}), rnd({b, h, l, s})}; },
                 [](const std::vector<Tensor>& a, bool meta) {
                   if (!meta) return std::vector<Tensor>{std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(a[0], a[1], a[2]))};
                   auto r = at::_scaled_dot_product_efficient_attention(a[0], a[1], a[2], a[3], true);
                   return std::vector<Tensor>{std::get<0>(r), std::get<1>(r)};
                 },
                 /*compare_strides=*/false});
    c.push_back({"_scaled_dot_product_efficient_attention_backward", "q " + describe(rnd({b, h, l, e})) + " mask " + describe(rnd({b, h, l, s})),
                 [=] {
                   Tensor q = rnd({b, h, l, e}), k = rnd({b, h, s, e}), v = rnd({b, h, s, e});
                   return std::vector<Tensor>{rnd({b, h, l, e}), q, k, v, rnd({b, h, l, s}), at::randn_like(q), rnd({b, h, (l + 31) / 32 * 32})};
                 },
                 [](const std::vector<Tensor>& a, bool meta) {
                   if (!meta) {
                     std::vector<Tensor> leaves;
                     for (size_t i = 1; i <= 4; ++i) leaves.push_back(a[i].detach().requires_grad_());
                     at::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], leaves[3]).backward(a[0]);
                     return std::vector<Tensor>{leaves[0].grad(), leaves[1].grad(), leaves[2].grad(), leaves[3].grad()};
                   }
                   const Tensor seed = at::empty({}, a[0].options().dtype(at::kLong));
                   auto r = at::_scaled_dot_product_efficient_attention_backward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], seed, seed, 0.0, {true, true, true, true});
                   return std::vector<Tensor>{std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
                 },
                 /*compare_strides=*/false});
  }
  // RMSNorm: the fused kernel's forward has a CPU body (its composite), its backward is
  // compared with what autograd gives that body on the CPU. The fused ops came in torch 2.8 and
  // 2.9; the Python package builds against older torches too.
#if __has_include(<ATen/ops/_fused_rms_norm_backward.h>)
  for (auto [shape, norm, kind, weighted] : std::vector<std::tuple<std::vector<int64_t>, std::vector<int64_t>, at::ScalarType, bool>>{
           {{4, 6, 8}, {8}, at::kFloat, true}, {{3, 10}, {10}, at::kFloat, false}, {{2, 5, 4, 6}, {4, 6}, at::kBFloat16, true}}) {
    const auto make = [shape = shape, norm = norm, kind = kind, weighted = weighted] {
      Tensor x = rnd(shape).to(kind);
      Tensor w = weighted ? rnd(norm).to(kind) : Tensor();
      return std::vector<Tensor>{x, w};
    };
    c.push_back({"_fused_rms_norm", describe(make()[0]), make,
                 [norm = norm](const std::vector<Tensor>& a, bool) {
                   const OptTensor w = a[1].defined() ? OptTensor(a[1]) : std::nullopt;
                   auto [out, rstd] = at::_fused_rms_norm(a[0], norm, w, 1e-6);
                   return std::vector<Tensor>{out, rstd};
                 }});
    c.push_back({"_fused_rms_norm_backward", describe(make()[0]),
                 [make, norm = norm] {
                   auto xw = make();
                   const OptTensor w = xw[1].defined() ? OptTensor(xw[1]) : std::nullopt;
                   Tensor rstd = std::get<1>(at::_fused_rms_norm(xw[0], norm, w, 1e-6));
                   return std::vector<Tensor>{at::randn_like(xw[0]), xw[0], xw[1], rstd};
                 },
                 [norm = norm](const std::vector<Tensor>& a, bool meta) {
                   const bool weighted = a[2].defined();
                   if (!meta) {
                     Tensor x = a[1].detach().requires_grad_();
                     Tensor w = weighted ? a[2].detach().requires_grad_() : Tensor();
                     at::rms_norm(x, norm, weighted ? OptTensor(w) : std::nullopt, 1e-6).backward(a[0]);
                     return std::vector<Tensor>{x.grad(), weighted ? w.grad() : Tensor()};
                   }
                   auto [gx, gw] = at::_fused_rms_norm_backward(a[0], a[1], norm, a[3], weighted ? OptTensor(a[2]) : std::nullopt, {true, weighted});
                   return std::vector<Tensor>{gx, gw};
                 }});
  }
#endif
  return c;
}

// The meta twin of a CPU input: same sizes, strides and dtype (an absent optional input stays absent).
Tensor meta_twin(const Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}
}  // namespace

extern "C" gmt_error gmt_meta_kernels_check(char** report) {
  GMT_TRY({
    at::manual_seed(0);
    std::ostringstream out;
    for (const Case& c : cases()) {
      std::vector<Tensor> cpu_in = c.inputs();
      std::vector<Tensor> meta_in;
      for (const Tensor& t : cpu_in) meta_in.push_back(meta_twin(t));
      std::string verdict = "ok";
      try {
        std::vector<Tensor> want = c.call(cpu_in, false);
        std::vector<Tensor> got = c.call(meta_in, true);
        for (size_t i = 0; i < want.size() && verdict == "ok"; ++i) {
          const Tensor& w = want[i];
          const Tensor& g = i < got.size() ? got[i] : Tensor();
          const bool same = w.defined() == g.defined() &&
                            (!w.defined() || (w.sizes() == g.sizes() && w.scalar_type() == g.scalar_type() &&
                                              (!c.compare_strides || w.numel() <= 1 || w.strides() == g.strides())));
          if (!same) verdict = "result " + std::to_string(i) + ": cpu " + describe(w) + ", meta " + describe(g);
          else if (g.defined() && !g.is_meta()) verdict = "result " + std::to_string(i) + " is not a meta tensor";
        }
      } catch (const std::exception& e) {
        std::string m = e.what();
        verdict = "failed: " + m.substr(0, m.find('\n'));
      }
      out << c.op << "\t" << c.shapes << "\t" << verdict << "\n";
    }
    // Kernels that answer with a value, not a shape: what a shape-only run needs of them.
    const Tensor m = at::empty({3}, at::TensorOptions().device(at::kMeta));
    auto value = [&](const char* op, const char* what, bool ok) {
      out << op << "\t" << what << "\t" << (ok ? "ok" : "wrong value") << "\n";
    };
    value("equal", "[3] meta with itself: false (no data; JIT constant pooling must not merge)", !at::equal(m, m));
    value("_local_scalar_dense", "[] meta .item(): 0", m.sum().item<double>() == 0.0);
    value("_has_compatible_shallow_copy_type", "CPU variable takes meta data: true",
          at::_has_compatible_shallow_copy_type(at::empty({3}), m));
    *report = gmt::dup_string(out.str());
  })
}
