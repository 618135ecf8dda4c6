// LSTM and GRU on meta take cuDNN's path (cudnn_rnn.cpp).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace gmt {
// Whether an `aten::lstm.input`/`aten::gru.input` call on meta takes cuDNN's path: cuDNN would take
// the input on a GPU, and gmt_meta_rnn_follows_cudnn is on. `hidden`: the state's hidden size (an
// LSTM's cell state's), which an LSTM with projections does not share with h0.
bool rnn_takes_cudnn_path(const at::Tensor& input, const at::Tensor& hx, int64_t hidden);
}  // namespace gmt
