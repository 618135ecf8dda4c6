// "The CPU means meta" on the estimating thread. While a meta estimate builds a model and runs its
// step, code that names the CPU (tch's LSTM/GRU make their zero state with the device the model
// was built on; users write `Tensor::zeros(.., (kind, self.device))` in forward) must get meta
// tensors, or the first op that meets both fails ("Input and hidden tensors are not at the same
// device"). Without touching the model:
// - factories asked for the CPU (an explicit `device` argument: tch always passes one) make meta
//   tensors; tch names a meta tensor's device `Mps` (it has no variant for meta), so a device
//   taken from a meta tensor and handed back (`xs.device()`) means meta too;
// - a CPU tensor that reaches an op (one captured before the estimate) is replaced by a meta twin
//   of the same sizes, strides and dtype, as the GPU copy a real run would have made;
// - in TorchScript only, copies to the CPU stay on meta (traced graphs bake in
//   `aten::to(x, device="cpu")`); in tch code a copy to the CPU is there to read values, which a
//   meta tensor has none of, so it fails as it did ("Cannot copy out of meta tensor").
// - in TorchScript only, a CUDA device means meta too: a model traced on `cuda:0`, as users trace
//   where they train, has the GPU baked into its factories and copies (`aten::to(x,
//   device="cuda:0")`, `aten::ones(..., device="cuda:0")`), which would copy a meta tensor to the
//   GPU or need one.
// - an RNN that cuDNN would not take (`rnn_tanh`, `rnn_relu`, an LSTM with projections; every
//   LSTM and GRU when cudnn_rnn.cpp's path is off) takes the CPU's path of PyTorch's RNN.cpp: each
//   layer projects all time steps' input at once (one GEMM, then a slice per step), where the path
//   for other devices projects step by step; the two keep different tensors alive (see
//   `RnnAsOnCpu`). LSTMs and GRUs otherwise go on to cuDNN's path (cudnn_rnn.cpp).
// Left on the CPU: factories with no device (tch's from-data path copies the caller's bytes into
// the new tensor's memory, which a meta tensor has none of) and 0-dim CPU tensors (scalars, which
// every backend's ops accept as they are and whose values `.item()` reads).
//
// The mechanism is a dispatch-key mode: a boxed fallback on TESTING_ONLY_GenericMode, which
// libtorch itself never registers, included in this thread's local dispatch key set only while
// an estimate runs. Every op called on that thread passes through it first; other threads, and
// this one before and after, never do. The fallback excludes its key while it redispatches, as
// PyTorch's own modes do, so ops called inside a kernel (the meta-via-CPU fallback's CPU twins,
// composite ops' pieces) are left alone.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "common.h"
#include "internal.h"
#include "cudnn_rnn.h"

namespace {
constexpr c10::DispatchKey kModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

struct ThreadMode {
  int depth = 0;
  bool copies_too = false;  // TorchScript: copies to the CPU stay on meta
  bool was_included = false;
  int64_t made_on_cpu = 0;    // tensors ops returned on the CPU (from-data, no device given)
  int64_t moved_to_meta = 0;  // CPU tensors replaced by meta twins where an op met them
  std::vector<std::string> examples;
};
thread_local ThreadMode t_mode;

void note(const char* what, const c10::OperatorHandle& op, const at::Tensor& t) {
  if (t_mode.examples.size() >= 8) return;
  std::ostringstream s;
  s << what << " " << op.schema().name() << " " << t.sizes() << " " << t.scalar_type();
  t_mode.examples.push_back(s.str());
}

bool names_cpu(const c10::Device& d) { return d.is_cpu() || d.type() == c10::DeviceType::MPS; }

// A device argument the estimate puts on meta: the CPU, and in TorchScript a GPU as well.
bool means_meta(const c10::Device& d) { return names_cpu(d) || (t_mode.copies_too && d.is_cuda()); }

// A CPU tensor an op met: its meta twin (0-dim scalars stay as they are).
bool to_meta_twin(c10::IValue& v, const c10::OperatorHandle& op) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !t.is_cpu() || t.dim() == 0) return false;
  note("moved to meta at", op, t);
  at::Tensor twin = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  if (t.requires_grad() && twin.is_floating_point()) twin.requires_grad_(true);
  v = c10::IValue(std::move(twin));
  ++t_mode.moved_to_meta;
  return true;
}

bool replace_cpu_tensors(c10::IValue& v, const c10::OperatorHandle& op) {
  if (v.isTensor()) return to_meta_twin(v, op);
  bool changed = false;
  if (v.isTensorList()) {
    c10::List<at::Tensor> list = v.toTensorList().copy();  // the caller's list stays
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e(list.get(i));
      if (to_meta_twin(e, op)) {
        list.set(i, e.toTensor());
        changed = true;
      }
    }
    if (changed) v = c10::IValue(list);
  } else if (v.isList()) {  // lists of optional tensors
    c10::impl::GenericList list = v.toList().copy();
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e = list.get(i);
      if (to_meta_twin(e, op)) {
        list.set(i, e);
        changed = true;
      }
    }
    if (changed) v = c10::IValue(list);
  }
  return changed;
}

uint64_t backend_bits(const c10::IValue& v) {
  constexpr uint64_t kBackends = static_cast<uint64_t>(c10::full_backend_mask);
  uint64_t bits = 0;
  auto add = [&](const c10::IValue& e) {
    if (e.isTensor() && e.toTensor().defined()) bits |= e.toTensor().key_set().raw_repr() & kBackends;
  };
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (t.defined()) bits |= t.key_set().raw_repr() & kBackends;
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) add(e);
  } else {
    add(v);
  }
  return bits;
}


// PyTorch's RNN.cpp runs an RNN layer by layer; only a CPU input gets the whole sequence's input
// projection in one GEMM (`FullLayer`, `inputs.device().is_cpu()`), which then stays alive for
// the layer and is sliced per step. This is that path, op for op, for meta inputs, so that a
// meta estimate keeps what the CPU run keeps. Packed sequences and LSTMs with projections take
// PyTorch's own path.
class RnnAsOnCpu {
 public:
  enum class Cell { Lstm, Gru, Tanh, Relu };

  // The cell an op is, if it is one of the RNN ops this runs.
  // Every op of an estimate passes here: the four handles are looked up once, so this is four
  // pointer compares, not string compares.
  static std::optional<Cell> of(const c10::OperatorHandle& op) {
    using Known = std::pair<std::optional<c10::OperatorHandle>, Cell>;
    static const std::array<Known, 4> known = [] {
      auto& d = c10::Dispatcher::singleton();
      return std::array<Known, 4>{Known{d.findSchema({"aten::lstm", "input"}), Cell::Lstm},
                                  Known{d.findSchema({"aten::gru", "input"}), Cell::Gru},
                                  Known{d.findSchema({"aten::rnn_tanh", "input"}), Cell::Tanh},
                                  Known{d.findSchema({"aten::rnn_relu", "input"}), Cell::Relu}};
    }();
    for (const auto& [handle, cell] : known) {
      if (handle && *handle == op) return cell;
    }
    return std::nullopt;
  }

  // Runs the op on `stack` and returns true, or leaves the stack as it is and returns false.
  static bool run(Cell cell, torch::jit::Stack* stack) {
    // (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    const size_t base = stack->size() - 9;
    const at::Tensor input = (*stack)[base].toTensor();
    if (!input.is_meta() || input.dim() != 3) return false;
    std::vector<at::Tensor> hx =
        cell == Cell::Lstm ? (*stack)[base + 1].toTensorVector() : std::vector<at::Tensor>{(*stack)[base + 1].toTensor()};
    const std::vector<at::Tensor> flat = (*stack)[base + 2].toTensorVector();
    const bool has_biases = (*stack)[base + 3].toBool();
    const int64_t num_layers = (*stack)[base + 4].toInt();
    const double dropout_p = (*stack)[base + 5].toDouble();
    const bool train = (*stack)[base + 6].toBool();
    const bool bidirectional = (*stack)[base + 7].toBool();
    const bool batch_first = (*stack)[base + 8].toBool();
    const size_t per_layer = has_biases ? 4 : 2;
    const size_t directions = bidirectional ? 2 : 1;
    if (cell == Cell::Lstm && (hx.size() != 2 || hx[0].dim() != 3 || hx[1].dim() != 3 || hx[0].size(2) != hx[1].size(2)))
      return false;  // projections, or shapes PyTorch's own checks should report
    if (num_layers < 1 || flat.size() != per_layer * directions * static_cast<size_t>(num_layers) || hx[0].dim() != 3 ||
        hx[0].size(0) != num_layers * static_cast<int64_t>(directions))
      return false;
    // An LSTM or GRU that cuDNN takes runs its own path on meta (cudnn_rnn.cpp), reached by
    // dispatching the op on.
    if ((cell == Cell::Lstm || cell == Cell::Gru) && gmt::rnn_takes_cudnn_path(input, hx[0], hx.back().size(2)))
      return false;
    std::vector<Weights> weights;
    for (size_t i = 0; i < flat.size(); i += per_layer) {
      weights.push_back(has_biases ? Weights{flat[i], flat[i + 1], flat[i + 2], flat[i + 3]}
                                   : Weights{flat[i], flat[i + 1], at::Tensor(), at::Tensor()});
    }
    // Per layer and direction: (h, c), c only for an LSTM.
    std::vector<Hidden> hiddens;
    std::vector<at::Tensor> h0 = hx[0].unbind(0);
    std::vector<at::Tensor> c0 = cell == Cell::Lstm ? hx[1].unbind(0) : std::vector<at::Tensor>(h0.size());
    for (size_t i = 0; i < h0.size(); ++i) hiddens.emplace_back(h0[i], c0[i]);

    const RnnAsOnCpu rnn{cell};
    at::Tensor layer_input = batch_first ? input.transpose(0, 1) : input;
    std::vector<Hidden> final_hiddens;
    for (int64_t l = 0; l < num_layers; ++l) {
      if (bidirectional) {
        auto [output, fw, bw] = rnn.bidirectional_layer(layer_input, hiddens[2 * l], hiddens[2 * l + 1], weights[2 * l],
                                                        weights[2 * l + 1]);
        final_hiddens.push_back(std::move(fw));
        final_hiddens.push_back(std::move(bw));
        layer_input = std::move(output);
      } else {
        auto [output, last] = rnn.layer(layer_input, hiddens[l], weights[l]);
        final_hiddens.push_back(std::move(last));
        layer_input = std::move(output);
      }
      if (dropout_p != 0 && train && l < num_layers - 1) layer_input = at::dropout(layer_input, dropout_p, true);
    }
    at::Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
    std::vector<at::Tensor> hy, cy;
    for (auto& h : final_hiddens) {
      hy.push_back(std::move(h.first));
      cy.push_back(std::move(h.second));
    }
    torch::jit::drop(*stack, 9);
    stack->emplace_back(std::move(output));
    stack->emplace_back(at::stack(hy, 0));
    if (cell == Cell::Lstm) stack->emplace_back(at::stack(cy, 0));
    return true;
  }

 private:
  struct Weights {
    at::Tensor w_ih, w_hh, b_ih, b_hh;
  };
  using Hidden = std::pair<at::Tensor, at::Tensor>;

  explicit RnnAsOnCpu(Cell cell) : cell_(cell) {}

  Cell cell_;

  // One step; `projected` is this step's slice of the input projection.
  Hidden step(const at::Tensor& projected, const Hidden& hidden, const Weights& w) const {
    switch (cell_) {
      case Cell::Lstm: {
        const auto gates = at::linear(hidden.first, w.w_hh, w.b_hh).add_(projected);
        auto chunked = gates.unsafe_chunk(4, 1);
        auto ingate = chunked[0].sigmoid_();
        auto forgetgate = chunked[1].sigmoid_();
        auto cellgate = chunked[2].tanh_();
        auto outgate = chunked[3].sigmoid_();
        auto cy = (forgetgate * hidden.second).add_(ingate * cellgate);
        auto hy = outgate * cy.tanh();
        return {std::move(hy), std::move(cy)};
      }
      case Cell::Gru: {
        const auto igates = projected.unsafe_chunk(3, 1);
        auto hgates = at::linear(hidden.first, w.w_hh, w.b_hh).unsafe_chunk(3, 1);
        const auto reset = hgates[0].add_(igates[0]).sigmoid_();
        const auto update = hgates[1].add_(igates[1]).sigmoid_();
        const auto candidate = igates[2].add(hgates[2].mul_(reset)).tanh_();
        return {(hidden.first - candidate).mul_(update).add_(candidate), at::Tensor()};
      }
      case Cell::Tanh:
        return {at::tanh(at::linear(hidden.first, w.w_hh, w.b_hh).add_(projected)), at::Tensor()};
      case Cell::Relu:
        return {at::relu(at::linear(hidden.first, w.w_hh, w.b_hh).add_(projected)), at::Tensor()};
    }
    TORCH_CHECK(false, "unknown RNN cell");
  }

  // The steps of one direction over already projected inputs: (step outputs, last hidden).
  std::pair<std::vector<at::Tensor>, Hidden> steps(const std::vector<at::Tensor>& projected, Hidden hidden,
                                                   const Weights& w) const {
    std::vector<at::Tensor> outputs;
    for (const auto& x : projected) {
      hidden = step(x, hidden, w);
      outputs.push_back(hidden.first);
    }
    return {std::move(outputs), std::move(hidden)};
  }

  std::pair<at::Tensor, Hidden> layer(const at::Tensor& input, const Hidden& hidden, const Weights& w) const {
    const auto projected = at::linear(input, w.w_ih, w.b_ih);
    auto [outputs, last] = steps(projected.unbind(0), hidden, w);
    TORCH_CHECK(!outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
    return {at::stack(outputs, 0), std::move(last)};
  }

  std::tuple<at::Tensor, Hidden, Hidden> bidirectional_layer(const at::Tensor& input, const Hidden& fw_hidden,
                                                             const Hidden& bw_hidden, const Weights& fw_w,
                                                             const Weights& bw_w) const {
    auto projected = at::linear(input, fw_w.w_ih, fw_w.b_ih);
    std::vector<at::Tensor> step_inputs = projected.unbind(0);
    auto [fw_outputs, fw_last] = steps(step_inputs, fw_hidden, fw_w);
    TORCH_CHECK(!fw_outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
    auto fw_output = at::stack(fw_outputs, 0);
    // Reassigned as RNN.cpp does: the forward projection is freed once the backward one exists.
    projected = at::linear(input, bw_w.w_ih, bw_w.b_ih);
    step_inputs = projected.unbind(0);
    std::reverse(step_inputs.begin(), step_inputs.end());
    auto [bw_outputs, bw_last] = steps(step_inputs, bw_hidden, bw_w);
    std::reverse(bw_outputs.begin(), bw_outputs.end());
    auto bw_output = at::stack(bw_outputs, 0);
    return {at::cat({fw_output, bw_output}, fw_output.dim() - 1), std::move(fw_last), std::move(bw_last)};
  }
};

// Python's meta kernels (torch/_meta_registrations.py, which `import torch` registers over ATen's
// own) run an in-place op as its out-of-place reference and a copy: a temporary of self's size per
// call, and per tensor of a foreach op, which no GPU kernel makes (AdamW's step would hold one more
// parameter-sized tensor at its peak). An elementwise in-place op on meta tensors whose operands
// all have self's sizes and dtype changes nothing a meta tensor holds: where autograd has nothing
// to record, it is not run; self's version is bumped, as the op would.
bool elementwise_in_place(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> kOps = {
      "add", "sub", "mul", "div", "addcdiv", "addcmul", "lerp", "sqrt", "rsqrt", "pow", "clamp",
      "clamp_min", "clamp_max", "neg", "exp", "zero", "fill", "copy", "maximum", "minimum", "abs",
      "reciprocal", "sign", "sigmoid", "tanh", "relu", "log"};
  std::string name = op.schema().name();
  if (name.rfind("aten::", 0) != 0 || name.size() < 8 || name.back() != '_') return false;
  name = name.substr(6, name.size() - 7);
  if (name.rfind("_foreach_", 0) == 0) name = name.substr(9);
  return kOps.count(name) != 0;
}

bool meta_in_place_noop(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  if (args.empty() || rets.size() > 1 || !elementwise_in_place(op)) return false;
  const auto writes = [](const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); };
  if (!writes(args[0]) || (rets.size() == 1 && !writes(rets[0]))) return false;
  const size_t base = stack->size() - args.size();
  std::vector<at::Tensor> self;
  const c10::IValue& first = (*stack)[base];
  if (first.isTensor()) self.push_back(first.toTensor());
  else if (first.isTensorList()) self = first.toTensorVector();
  else return false;
  const bool grad = at::GradMode::is_enabled();
  const auto plain = [&](const at::Tensor& t) {
    return t.defined() && t.is_meta() && !(grad && t.requires_grad()) && c10::isFloatingType(t.scalar_type());
  };
  for (const at::Tensor& t : self)
    if (!plain(t)) return false;
  // Another operand: self's sizes and dtype, or a 0-dim tensor (a scalar); on meta, or a CPU scalar.
  const auto fits = [&](const at::Tensor& t, const at::Tensor& s) {
    if (!t.defined()) return false;
    if (grad && t.requires_grad()) return false;
    if (t.dim() == 0) return t.is_meta() || t.is_cpu();
    return t.is_meta() && t.sizes() == s.sizes() && t.scalar_type() == s.scalar_type();
  };
  for (size_t i = 1; i < args.size(); ++i) {
    if (writes(args[i])) return false;
    const c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      if (self.size() != 1 || !fits(v.toTensor(), self[0])) return false;
    } else if (v.isTensorList()) {
      const auto list = v.toTensorVector();
      if (list.size() != self.size()) return false;
      for (size_t j = 0; j < list.size(); ++j)
        if (!fits(list[j], self[j])) return false;
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())  // numbers (Scalar[]) only, no tensors
        if (!e.isInt() && !e.isDouble() && !e.isBool()) return false;
    }
  }
  for (const at::Tensor& t : self) t.unsafeGetTensorImpl()->bump_version();
  c10::IValue result = first;
  torch::jit::drop(*stack, args.size());
  if (rets.size() == 1) stack->push_back(std::move(result));
  return true;
}

void cpu_means_meta(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  const size_t base = stack->size() - n;
  bool moved = false;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (args[i].name() == "device" && v.isDevice() && means_meta(v.toDevice())) {
      // A copy to the CPU (`to`, `_to_copy`) stays a copy outside TorchScript.
      const std::string& name = op.schema().name();
      const bool copy = name == "aten::to" || name == "aten::_to_copy";
      if (!copy || t_mode.copies_too || v.toDevice().type() == c10::DeviceType::MPS) {
        v = c10::IValue(c10::Device(c10::kMeta));
        for (size_t j = 0; j < n; ++j) {  // meta memory cannot be pinned
          if (args[j].name() == "pin_memory" && !(*stack)[base + j].isNone()) (*stack)[base + j] = c10::IValue(false);
        }
      }
    } else if (replace_cpu_tensors(v, op)) {
      moved = true;
    }
  }
  if (moved) {
    // Only the backends changed (CPU to meta): keep the functionality keys the dispatcher
    // computed, take the backends from the arguments as they are now.
    uint64_t bits = 0;
    for (size_t i = 0; i < n; ++i) bits |= backend_bits((*stack)[base + i]);
    const uint64_t functionality = ks.raw_repr() & ~static_cast<uint64_t>(c10::full_backend_mask);
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 8
    ks = c10::DispatchKeySet(c10::DispatchKeySet::RAW, functionality | bits);  // from_raw_repr came in 2.8
#else
    ks = c10::DispatchKeySet::from_raw_repr(functionality | bits);
#endif
  }
  if (meta_in_place_noop(op, stack)) return;
  {
    c10::impl::ExcludeDispatchKeyGuard leave(kModeKey);
    // From here on an RNN's pieces run through the whole dispatcher (autograd included).
    const auto cell = RnnAsOnCpu::of(op);
    if (!cell || !RnnAsOnCpu::run(*cell, stack)) op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kModeKey), stack);
  }
  const size_t nret = op.schema().returns().size();
  for (size_t r = stack->size() - nret; r < stack->size(); ++r) {
    const c10::IValue& v = (*stack)[r];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu()) {
      note("made on the CPU by", op, v.toTensor());
      ++t_mode.made_on_cpu;
    }
  }
}

std::once_flag g_install_once;
std::unique_ptr<torch::Library> g_mode_lib;
std::string g_install_error;

void install() {
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kModeKey, __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_means_meta>());
    g_mode_lib = std::move(lib);  // kept for the process: dropping it would deregister the fallback
  } catch (const std::exception& e) {
    g_install_error = std::string("cannot make the CPU mean meta during estimates: ") + e.what();
  }
}
}  // namespace

extern "C" {
gmt_error gmt_cpu_means_meta_begin(int32_t copies_too) {
  GMT_TRY({
    std::call_once(g_install_once, install);
    if (!g_mode_lib) throw std::runtime_error(g_install_error);
    if (t_mode.depth++ == 0) {
      t_mode.copies_too = copies_too != 0;
      t_mode.was_included = c10::impl::tls_is_dispatch_key_included(kModeKey);
      c10::impl::tls_set_dispatch_key_included(kModeKey, true);
    }
  })
}

void gmt_cpu_means_meta_end(void) {
  if (t_mode.depth > 0 && --t_mode.depth == 0) c10::impl::tls_set_dispatch_key_included(kModeKey, t_mode.was_included);
}

void gmt_cpu_means_meta_counts(int64_t* made_on_cpu, int64_t* moved_to_meta) {
  if (made_on_cpu) *made_on_cpu = t_mode.made_on_cpu;
  if (moved_to_meta) *moved_to_meta = t_mode.moved_to_meta;
}

char* gmt_cpu_means_meta_examples(void) {
  std::string s;
  for (const auto& e : t_mode.examples) s += e + "\n";
  t_mode.examples.clear();
  return gmt::dup_string(s);
}
}  // extern "C"
