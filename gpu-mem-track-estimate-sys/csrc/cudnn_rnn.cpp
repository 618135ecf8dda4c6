// LSTM and GRU on meta take cuDNN's path, as they do on a CUDA device.
//
// On a CUDA device `aten::lstm`/`aten::gru` call `_cudnn_rnn` (aten/src/ATen/native/cudnn/RNN.cpp)
// whenever cuDNN accepts the input; on meta they would take the CPU's path (RNN.cpp: a linear per
// step, cell ops whose autograd nodes keep their own tensors), which keeps different tensors. This
// file replaces the autograd kernel of both ops on meta with a function that allocates what
// `_cudnn_rnn` and `_cudnn_rnn_backward` allocate, in their order:
//   forward:  the contiguous sequence-first copy of a batch-first input (freed on return), the
//             output, hy, cy, cuDNN's workspace (freed on return) and, when training, its reserve
//             space (kept for backward);
//   backward: zeros for undefined output gradients, the contiguous copy of a batch-first gradient,
//             dx, dhx, dcx and a workspace (backward data: the copy and the workspace are freed on
//             return), then the flat weight gradient `dw` (every parameter's gradient is a view of
//             it, as on the GPU), the input's contiguous copy and a workspace (backward weights).
// The weights are taken as flattened into one buffer, as tch (built on CUDA) and nn.LSTM do, so no
// per-call copy of them is made.
//
// The workspace and reserve sizes are cuDNN's (cudnnGetRNNTempSpaceSizes), closed source. Measured
// on an H200 (PyTorch 2.11, cuDNN 9, float32; scripts/gpu/gpu_rnn_sizes.py: LSTM and GRU, 1 and 2
// layers, one and two directions, batch x steps x features x hidden from 8x16x24x32 to
// 64x128x128x512), with D directions, L layers, S steps, B batch rows, H hidden units, G gates
// (4 LSTM, 3 GRU) and E bytes an element:
//   reserve   = D x S x B x H x E x (P x L + L - 1) + 256, P = 5 (LSTM) or 6 (GRU): exact in
//               every case (per layer the gates and the cell, plus each inner layer's output);
//   workspace = 8 MiB x L x D + r x D x S x B x G x H x E, one per call (forward, backward data,
//               backward weights, all three the same size), r = 1.5 + 0.5 (D - 1) + 0.3 (L - 1)
//               + 0.15 (L - 1)(D - 1), 0.2 more for a GRU: within 1 % of every case from
//               32x64x65x256 up. cuDNN picks other kernels for small ones (16x32x64x128 took
//               4.5 MB more than this, of 14.5 MB), which stay a few MB under.
#include <ATen/ATen.h>
#include <ATen/NativeFunctions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <tuple>
#include <vector>

#include "recorder.h"
#include "internal.h"
#include "cudnn_rnn.h"

namespace {
using at::Tensor;
using at::TensorList;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Off in tests that hold a meta run to a CPU run of PyTorch's own RNN path.
std::atomic<bool> g_follow_cudnn{true};

struct RnnGeometry {
  int64_t gates = 4;  // 4 LSTM, 3 GRU
  int64_t layers = 1;
  int64_t directions = 1;
  int64_t hidden = 0;
  bool train = true;
  bool batch_first = false;
};

int64_t steps_x_batch(const Tensor& input) { return input.size(0) * input.size(1); }

int64_t reserve_bytes(const RnnGeometry& g, const Tensor& input) {
  const int64_t per_layer = g.gates == 4 ? 5 : 6;
  const int64_t values = per_layer * g.layers + g.layers - 1;
  return g.directions * steps_x_batch(input) * g.hidden * input.element_size() * values + 256;
}

int64_t workspace_bytes(const RnnGeometry& g, const Tensor& input) {
  // r in hundredths: 150 + 50 (D - 1) + 30 (L - 1) + 15 (L - 1)(D - 1), 20 more for a GRU.
  const int64_t d = g.directions - 1, l = g.layers - 1;
  const int64_t r = 150 + 50 * d + 30 * l + 15 * l * d + (g.gates == 3 ? 20 : 0);
  const int64_t projection = g.directions * steps_x_batch(input) * g.gates * g.hidden * input.element_size();
  return (int64_t{8} << 20) * g.layers * g.directions + projection * r / 100;
}

Tensor bytes(int64_t n, const Tensor& like) { return at::empty({n}, like.options().dtype(at::kByte)); }

// cuDNN's workspace for one call: recorded as a workspace (what the GPU timeline calls it).
Tensor workspace_of(int64_t n, const Tensor& like) {
  Tensor w = bytes(n, like);
  gmt::tag_allocation(gmt::allocation_id(w.storage().unsafeGetStorageImpl()), GMT_CAT_WORKSPACE);
  return w;
}

// Sequence-first and contiguous, as `_cudnn_rnn` makes its `x` (a copy when batch-first).
Tensor sequence_first(const Tensor& t, bool batch_first) {
  return (batch_first ? t.transpose(0, 1) : t).contiguous();
}

class CudnnRnnOnMeta : public torch::autograd::Function<CudnnRnnOnMeta> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& hx,
                               const std::optional<Tensor>& cx, TensorList params, RnnGeometry g) {
    const int64_t seq = input.size(g.batch_first ? 1 : 0), batch = input.size(g.batch_first ? 0 : 1);
    Tensor x = sequence_first(input, g.batch_first);
    Tensor output = at::empty({seq, batch, g.directions * g.hidden}, input.options());
    Tensor hy = at::empty({g.layers * g.directions, batch, g.hidden}, hx.options());
    Tensor cy = cx ? at::empty(cx->sizes(), cx->options()) : at::empty({0}, hx.options());
    Tensor workspace = workspace_of(workspace_bytes(g, x), x);
    Tensor reserve = bytes(g.train ? reserve_bytes(g, x) : 0, x);
    workspace.reset();
    x.reset();
    if (g.batch_first) output.transpose_(0, 1);
    std::vector<Tensor> saved{input, hx, cx.value_or(Tensor()), output, reserve};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["gates"] = g.gates;
    ctx->saved_data["layers"] = g.layers;
    ctx->saved_data["directions"] = g.directions;
    ctx->saved_data["hidden"] = g.hidden;
    ctx->saved_data["batch_first"] = g.batch_first;
    return {output, hy, cy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &hx = saved[1], &cx = saved[2];
    RnnGeometry g;
    g.gates = ctx->saved_data["gates"].toInt();
    g.layers = ctx->saved_data["layers"].toInt();
    g.directions = ctx->saved_data["directions"].toInt();
    g.hidden = ctx->saved_data["hidden"].toInt();
    g.batch_first = ctx->saved_data["batch_first"].toBool();
    // Undefined output gradients arrive as zeros (the function materialises them, as
    // `_cudnn_rnn_backward` does with zeros_like).
    Tensor dx, dhx, dcx;
    {
      Tensor dy = sequence_first(grads[0], g.batch_first);
      dx = g.batch_first ? at::empty({input.size(1), input.size(0), input.size(2)}, input.options())
                         : at::empty(input.sizes(), input.options());
      dhx = at::empty(hx.sizes(), hx.options());
      if (cx.defined()) dcx = at::empty(cx.sizes(), cx.options());
      Tensor workspace = workspace_of(workspace_bytes(g, dy), dy);
    }
    if (g.batch_first) dx.transpose_(0, 1);
    variable_list out{dx, dhx, dcx};
    int64_t numel = 0;
    for (size_t i = 5; i < saved.size(); ++i) numel += saved[i].numel();
    {
      Tensor dw = at::zeros({numel}, input.options());
      Tensor x = sequence_first(input, g.batch_first);
      Tensor workspace = workspace_of(workspace_bytes(g, x), x);
      int64_t offset = 0;
      for (size_t i = 5; i < saved.size(); ++i) {
        const Tensor& p = saved[i];
        out.push_back(dw.narrow(0, offset, p.numel()).view(p.sizes()));
        offset += p.numel();
      }
    }
    out.emplace_back();  // the geometry
    return out;
  }
};

RnnGeometry geometry(int64_t gates, int64_t layers, bool train, bool bidirectional,
                     bool batch_first, int64_t hidden) {
  RnnGeometry g;
  g.gates = gates;
  g.layers = layers;
  g.directions = bidirectional ? 2 : 1;
  g.hidden = hidden;
  g.train = train;
  g.batch_first = batch_first;
  return g;
}

std::tuple<Tensor, Tensor, Tensor> lstm_on_meta(const Tensor& input, TensorList hx, TensorList params, bool has_biases,
                                                int64_t layers, double dropout, bool train, bool bidirectional,
                                                bool batch_first) {
  // hx = (h0, c0); the cell state's last dimension is the hidden size (h0's is the projection's).
  const int64_t hidden = hx.size() == 2 ? hx[1].size(-1) : -1;
  if (hx.size() != 2 || !gmt::rnn_takes_cudnn_path(input, hx[0], hidden)) {
    return at::native::lstm(input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first);
  }
  const auto g = geometry(4, layers, train, bidirectional, batch_first, hidden);
  auto out = CudnnRnnOnMeta::apply(input, hx[0], std::optional<Tensor>(hx[1]), params, g);
  return {out[0], out[1], out[2]};
}

std::tuple<Tensor, Tensor> gru_on_meta(const Tensor& input, const Tensor& hx, TensorList params, bool has_biases,
                                       int64_t layers, double dropout, bool train, bool bidirectional,
                                       bool batch_first) {
  const int64_t hidden = hx.dim() == 3 ? hx.size(2) : -1;
  if (!gmt::rnn_takes_cudnn_path(input, hx, hidden)) {
    return at::native::gru(input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first);
  }
  const auto g = geometry(3, layers, train, bidirectional, batch_first, hidden);
  auto out = CudnnRnnOnMeta::apply(input, hx, std::optional<Tensor>(), params, g);
  return {out[0], out[1]};
}
}  // namespace

// What `cudnn_is_acceptable` and `_cudnn_impl` accept, on meta: a 3-d float input (the packed
// `.data` overloads keep PyTorch's path) and no LSTM projections.
bool gmt::rnn_takes_cudnn_path(const Tensor& input, const Tensor& hx, int64_t hidden) {
  const auto t = input.scalar_type();
  const bool dtype = t == at::kFloat || t == at::kHalf || t == at::kDouble || t == at::kBFloat16;
  return g_follow_cudnn.load(std::memory_order_relaxed) && input.is_meta() && input.dim() == 3 && dtype &&
         hx.dim() == 3 && hx.size(2) == hidden;
}

TORCH_LIBRARY_IMPL(aten, AutogradMeta, m) {
  m.impl("lstm.input", lstm_on_meta);
  m.impl("gru.input", gru_on_meta);
}

extern "C" {
void gmt_meta_rnn_follows_cudnn(int on) { g_follow_cudnn.store(on != 0, std::memory_order_relaxed); }
}
