// Whole-model estimation of TorchScript modules, run on the meta device (or CPU) with the
// allocation recorder on, and the static (IR) estimate. The only translation unit with the heavy
// <torch/script.h>.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/symbolic_shape_analysis.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/script.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "common.h"
#include "internal.h"
#include "recorder.h"
#include "registry.h"

// ---- eager lifetimes: keep values alive as CPython's reference counting would.
namespace {
// gmt::keep_alive: a use that the interpreter must keep (conservative alias analysis = side
// effects, so no pass removes it); running it does nothing. Registered on first use, and only if
// no other copy of this shim in the process registered it already.
void register_keep_alive() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (c10::Dispatcher::singleton().findSchema({"gmt::keep_alive", ""})) return;
    static torch::Library library(torch::Library::FRAGMENT, "gmt", std::nullopt, __FILE__, __LINE__);
    library.def(torch::schema("keep_alive(Tensor[] values) -> ()", c10::AliasAnalysisKind::CONSERVATIVE),
                [](const std::vector<at::Tensor>&) {});
  });
}

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool is_tensor(const Value* v) { return v->type()->cast<c10::TensorType>() != nullptr; }

// The Python variable a value was bound to (`out` for %out.3); empty for expression temporaries.
std::string variable_of(const Value* v) {
  if (!v->hasDebugName()) return "";
  std::string name = v->debugNameBase();
  const bool numeric = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
  return numeric ? "" : name;
}

std::string without_trailing_digits(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && s[end - 1] >= '0' && s[end - 1] <= '9') --end;
  return s.substr(0, end);
}

// One Python variable rebound several times reaches a saved-and-loaded module as out, out0,
// out1, ... (the serializer numbers each rebinding; unrolled loops such as nn.Sequential's
// `input = module(input)` give input0, input1, ...). Maps every name of such a family to its stem;
// other names map to themselves. Distinct variables named x1 and x2 in the source are merged too,
// which frees x1 early: the TorchScript lifetime, never a longer one.
std::unordered_map<std::string, std::string> rebound_variables(Graph& g) {
  std::unordered_map<std::string, std::unordered_set<std::string>> family;  // stem -> names
  auto add = [&](const Value* v) {
    const std::string name = is_tensor(v) ? variable_of(v) : "";
    const std::string stem = without_trailing_digits(name);
    if (!stem.empty()) family[stem].insert(name);
  };
  for (const Value* in : g.inputs()) add(in);
  for (const Node* n : g.nodes())
    for (const Value* out : n->outputs()) add(out);
  std::unordered_map<std::string, std::string> rename;
  for (const auto& [stem, names] : family)
    if (names.size() > 1)
      for (const auto& name : names) rename[name] = stem;
  return rename;
}

// Adds a use of `values` before `before`, so the interpreter frees them only after it.
void keep_alive_until(Graph& g, Node* before, std::vector<Value*> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  if (values.empty()) return;
  torch::jit::WithInsertPoint guard(before);
  Node* list = g.insertNode(g.createList(c10::TensorType::get(), values));
  g.insertNode(g.create(c10::Symbol::fromQualString("gmt::keep_alive"), {list->output()}, 0));
}

// One function body: a local lives until the statement that rebinds its name, or the return; the
// inputs of a call (also unnamed temporaries on the Python stack) until the call returns.
void apply_eager_lifetimes(Graph& g) {
  const auto rename = rebound_variables(g);
  const auto variable = [&](const Value* v) {
    std::string name = is_tensor(v) ? variable_of(v) : "";
    auto it = rename.find(name);
    return it == rename.end() ? name : it->second;
  };
  std::unordered_map<std::string, Value*> bound;
  for (Value* in : g.inputs())
    if (!variable(in).empty()) bound[variable(in)] = in;
  const std::vector<Node*> nodes(g.nodes().begin(), g.nodes().end());
  for (Node* n : nodes) {
    std::vector<Value*> release;
    if (n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction)
      for (Value* in : n->inputs())
        if (is_tensor(in)) release.push_back(in);
    for (Value* out : n->outputs()) {
      const std::string name = variable(out);
      if (name.empty()) continue;
      auto [it, fresh] = bound.try_emplace(name, out);
      if (!fresh) {
        // A loop rebinding its carried value (`for ..: x = f(x)`) drops the old one in its first
        // iteration, as the interpreter does: holding it to the loop's end would overstate.
        const bool carried = n->kind() == c10::prim::Loop &&
                             std::find(n->inputs().begin(), n->inputs().end(), it->second) != n->inputs().end();
        if (!carried) release.push_back(it->second);
        it->second = out;
      }
    }
    keep_alive_until(g, n->next(), release);
  }
  std::vector<Value*> locals;
  for (const auto& kv : bound) locals.push_back(kv.second);
  keep_alive_until(g, g.return_node(), locals);
}

void apply_eager_lifetimes(torch::jit::script::Module& module) {
  register_keep_alive();
  std::unordered_set<const torch::jit::Function*> done;  // submodules of one class share methods
  for (const auto& m : module.modules())
    for (const auto& method : m.get_methods())
      if (done.insert(&method.function()).second) apply_eager_lifetimes(*method.graph());
}
}  // namespace

namespace {
// Sum of every tensor in a model output (tensor, tuple, list, dict values), as the loss.
at::Tensor loss_of(const c10::IValue& v, int64_t& numel) {
  if (v.isTensor()) {
    numel += v.toTensor().numel();
    return v.toTensor().sum();
  }
  std::vector<c10::IValue> items;
  if (v.isTuple()) items = v.toTupleRef().elements().vec();
  else if (v.isList()) items = v.toListRef().vec();
  else if (v.isGenericDict())
    for (const auto& kv : v.toGenericDict()) items.push_back(kv.value());
  at::Tensor total;
  for (const auto& item : items) {
    at::Tensor part = loss_of(item, numel);
    if (part.defined()) total = total.defined() ? total + part : part;
  }
  return total;
}

struct RecorderGuard {
  RecorderGuard(int32_t kind) {
    if (char* e = gmt_recorder_start(kind)) {
      std::string msg(e);
      gmt_free_string(e);
      throw std::runtime_error(msg);
    }
  }
  ~RecorderGuard() { gmt_free_string(gmt_recorder_stop()); }
};

// The first non-empty line of libtorch's message (after any Python-style "RuntimeError: "), so
// "cannot load X as TorchScript: <reason>" never ends in an empty reason.
// gmt_cpu_means_meta_begin/end for a scope, copies to the CPU included (TorchScript).
struct CpuMeansMeta {
  CpuMeansMeta() {
    if (char* e = gmt_cpu_means_meta_begin(1)) {
      std::string msg(e);
      gmt_free_string(e);
      throw std::runtime_error(msg);
    }
  }
  ~CpuMeansMeta() { gmt_cpu_means_meta_end(); }
  CpuMeansMeta(const CpuMeansMeta&) = delete;
  CpuMeansMeta& operator=(const CpuMeansMeta&) = delete;
};

std::string short_message(const std::exception& e) {
  std::string w = e.what();
  auto p = w.rfind("RuntimeError: ");
  if (p != std::string::npos) w = w.substr(p + 14);
  size_t start = 0;
  while (start < w.size()) {
    size_t end = w.find('\n', start);
    if (end == std::string::npos) end = w.size();
    std::string line = w.substr(start, end - start);
    if (line.find_first_not_of(" \t\r") != std::string::npos) return line;
    start = end + 1;
  }
  return "libtorch gave no reason (not a TorchScript archive, or a damaged one)";
}
}  // namespace

namespace gmt {
bool has_meta_kernel(const c10::OperatorHandle& op) {
  using K = c10::DispatchKey;
  return op.hasKernelForDispatchKey(K::Meta) || op.hasKernelForDispatchKey(K::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional) ||
         op.hasKernelForDispatchKey(K::CompositeImplicitAutograd);
}
}  // namespace gmt

namespace {
bool has_meta_path(const c10::OperatorName& name) {
  auto op = c10::Dispatcher::singleton().findOp(name);
  if (!op) return true;  // not a dispatcher op (prim::, a builtin): nothing to check
  // A CPU kernel is enough: the meta-via-CPU fallback runs it.
  return gmt::has_meta_kernel(*op) || op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

// The first op of the forward graph (inlined, nested blocks first as they run) with no kernel on
// meta as the dispatcher stands now (the fallback's kernels included once installed), or "".
std::string first_op_without_meta_kernel(torch::jit::Block* block) {
  for (torch::jit::Node* n : block->nodes()) {
    for (torch::jit::Block* b : n->blocks()) {
      std::string inner = first_op_without_meta_kernel(b);
      if (!inner.empty()) return inner;
    }
    const torch::jit::Operator* op = n->maybeOperator();
    if (!op) continue;
    auto handle = c10::Dispatcher::singleton().findOp(op->schema().operator_name());
    if (handle && !gmt::has_meta_kernel(*handle)) return op->schema().name();
  }
  return "";
}

void collect_without_meta(torch::jit::Block* block, std::vector<std::string>& out) {
  for (torch::jit::Node* n : block->nodes()) {
    for (torch::jit::Block* b : n->blocks()) collect_without_meta(b, out);
    if (!n->kind().is_aten()) continue;
    const torch::jit::Operator* op = n->maybeOperator();
    if (!op) continue;
    const c10::FunctionSchema& schema = op->schema();
    if (has_meta_path(schema.operator_name())) continue;
    std::ostringstream line;
    line << schema << "\t";
    // The Python source the archive was scripted from when its debug info says so, else the
    // archive's own code.
    torch::jit::SourceRange range = n->sourceRange();
    if (auto original = range.findSourceRangeThatGenerated()) range = *original;
    if (auto flc = range.file_line_col()) {
      line << std::get<0>(*flc) << " line " << std::get<1>(*flc);
    } else {
      line << "graph node " << n->kind().toQualString();
    }
    if (std::find(out.begin(), out.end(), line.str()) == out.end()) out.push_back(line.str());
  }
}
}  // namespace

// Calls `f` on every node of the graphs the module runs (each method once: submodules of one
// class share theirs), nested blocks included.
void for_each_node(torch::jit::script::Module& module, const std::function<void(torch::jit::Node*)>& f) {
  std::function<void(torch::jit::Block*)> walk = [&](torch::jit::Block* block) {
    for (torch::jit::Node* n : block->nodes()) {
      for (torch::jit::Block* b : n->blocks()) walk(b);
      f(n);
    }
  };
  std::unordered_set<const torch::jit::Function*> done;
  for (const auto& m : module.modules())
    for (const auto& method : m.get_methods())
      if (done.insert(&method.function()).second) walk(method.graph()->block());
}

// Makes every use of node n's one output use the constant `value` instead.
void replace_with_constant(torch::jit::Node* n, const c10::IValue& value) {
  torch::jit::WithInsertPoint here(n);
  n->output()->replaceAllUsesWith(n->owningGraph()->insertConstant(value));
}

// A model traced on a GPU has it baked into its graphs: `prim::Constant[value="cuda:0"]` devices
// (and scripted code `torch.device("cuda")`, an `aten::device` of a constant string) feeding its
// factories and copies. The CPU-means-meta mode puts such arguments on meta when they reach the
// dispatcher, but TorchScript's own `aten::to(Tensor, Device?, ...)` initialises CUDA before it
// dispatches, which fails where there is no GPU. Every such device becomes meta in the graphs of
// the module and its submodules, before the run.
void gpu_devices_to_meta(torch::jit::script::Module& module) {
  for_each_node(module, [](torch::jit::Node* n) {
    if (n->outputs().size() != 1 || n->output()->type()->kind() != c10::TypeKind::DeviceObjType) return;
    bool gpu = false;
    if (n->kind() == c10::prim::Constant) {
      const auto v = torch::jit::toIValue(n->output());
      gpu = v && v->isDevice() && v->toDevice().is_cuda();
    } else if (n->kind() == c10::aten::device && n->inputs().size() == 1) {
      const auto v = torch::jit::toIValue(n->input());
      gpu = v && v->isString() && v->toStringRef().rfind("cuda", 0) == 0;
    }
    if (gpu) replace_with_constant(n, c10::IValue(c10::Device(c10::kMeta)));
  });
}

// A trace turns Python arithmetic on a shape into tensor ops with 0-dim tensor constants
// (`seq_length + 0` in a Hugging Face encoder's `position_ids[:, past : seq + past]`), which
// `aten::Int` then reads back as a shape. Loaded on meta such a constant has no value and reads
// as 0, so the slice comes out empty. Each 0-dim meta constant of the graphs takes its value from
// the file's constants read on the CPU, where that is unambiguous: the graphs do not say which
// entry of the file's table a constant is, so a dtype whose 0-dim constants in the file do not all
// hold one value is left as it is (its reads stay counted as meta reads).
void scalar_constants_from_file(const std::string& path, torch::jit::script::Module& module) {
  std::map<c10::ScalarType, std::optional<at::Tensor>> value_of;  // nullopt: several values
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (!reader.hasRecord("constants.pkl")) return;
    const c10::IValue table = torch::jit::readArchiveAndTensors("constants", "", "", std::nullopt, std::nullopt,
                                                                c10::Device(c10::kCPU), reader);
    if (!table.isTuple()) return;
    for (const c10::IValue& e : table.toTupleRef().elements()) {
      if (!e.isTensor() || e.toTensor().dim() != 0) continue;
      const at::Tensor& t = e.toTensor();
      auto [it, fresh] = value_of.try_emplace(t.scalar_type(), t);
      if (!fresh && it->second && !it->second->equal(t)) it->second.reset();
    }
  } catch (const std::exception&) {
    return;  // a file the loader read but this cannot: the constants stay as loaded
  }
  for_each_node(module, [&](torch::jit::Node* n) {
    if (n->kind() != c10::prim::Constant || n->outputs().size() != 1) return;
    const auto v = torch::jit::toIValue(n->output());
    if (!v || !v->isTensor()) return;
    const at::Tensor& t = v->toTensor();
    if (!t.defined() || !t.is_meta() || t.dim() != 0) return;
    auto it = value_of.find(t.scalar_type());
    if (it != value_of.end() && it->second) replace_with_constant(n, c10::IValue(it->second->clone()));
  });
}

// Every aten op the model's forward calls (methods and submodules inlined) that can run neither
// on meta nor through the meta-via-CPU fallback: "schema\twhere" a line.
extern "C" gmt_error gmt_script_ops_without_meta(const char* path, char** report) {
  GMT_TRY({
    if (!path || !report) throw std::invalid_argument("null argument");
    auto module = torch::jit::load(path, c10::Device(c10::DeviceType::Meta));
    auto graph = module.get_method("forward").graph()->copy();
    torch::jit::Inline(*graph);
    std::vector<std::string> lines;
    collect_without_meta(graph->block(), lines);
    std::string joined;
    for (const auto& l : lines) joined += l + "\n";
    *report = gmt::dup_string(joined);
  })
}

namespace {
// Every forward call of a TorchScript model this process has made.
std::atomic<int64_t> g_forward_passes{0};
}  // namespace

extern "C" int64_t gmt_estimate_forward_passes(void) { return g_forward_passes.load(std::memory_order_relaxed); }

namespace gmt {
void run_estimate(const gmt_estimate_options* o, const ModelLoader& load, gmt_estimate_result* out) {
  const bool meta = o->device_kind == GMT_DEV_META;
  if (meta) {
    (void)gmt::meta_kernels_linked();
    if (char* e = gmt_meta_allocator_install()) {
      std::string msg(e);
      gmt_free_string(e);
      throw std::runtime_error(msg);
    }
  } else if (o->device_kind != GMT_DEV_CPU) {
    throw std::invalid_argument("estimates run on the meta device or the CPU");
  }
  const c10::Device device(meta ? c10::DeviceType::Meta : c10::DeviceType::CPU);
  const auto dtype = static_cast<c10::ScalarType>(o->dtype);
  gmt_estimate_result r{};
  RecorderGuard recording(o->device_kind);

  gmt::set_phase(GMT_PHASE_LOAD, 0);
  LoadedModel model = load(device, dtype);
  const std::vector<at::Tensor>& params = model.params;
  for (const auto& p : params) {
    r.param_count += p.numel();
    if (p.has_storage()) gmt::tag_parameter(gmt::allocation_id(p.storage().unsafeGetStorageImpl()));
  }
  r.param_bytes = gmt::unique_storage_bytes(params);
  r.buffer_bytes = gmt::unique_storage_bytes(model.buffers);

  // From here on, on this thread, the CPU means meta (traced graphs copy to the CPU they were
  // traced on; scripted code makes tensors there).
  std::optional<CpuMeansMeta> cpu_means_meta;
  if (meta) cpu_means_meta.emplace();

  gmt::set_phase(GMT_PHASE_INPUT, 0);
  const std::vector<int64_t> shape(o->input_shape, o->input_shape + o->input_ndim);
  at::Tensor input = o->input_is_index ? at::zeros(shape, at::TensorOptions().device(device).dtype(at::kLong))
                                       : at::rand(shape, at::TensorOptions().device(device).dtype(dtype));
  r.input_bytes = static_cast<int64_t>(input.nbytes());

  gmt::OptimizerState opt;
  opt.kind = o->optimizer;
  const int32_t iterations = o->train ? std::max(1, o->iterations) : 1;
  for (int32_t it = 1; it <= iterations; ++it) {
    gmt::set_phase(GMT_PHASE_FORWARD, it);
    c10::IValue result;
    {
      std::optional<at::NoGradGuard> no_grad;
      if (!o->train) no_grad.emplace();
      const auto failed = [&](const std::exception& e) {
        std::string shape_text = "[";
        for (size_t i = 0; i < shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
        return "forward failed for input " + shape_text + "] " + c10::toString(input.scalar_type()) + ": " +
               short_message(e);
      };
      try {
        g_forward_passes.fetch_add(1, std::memory_order_relaxed);
        result = model.forward(input);
      } catch (const gmt::NoMetaKernel& e) {
        throw gmt::NoMetaKernel(e.op, failed(e));
      } catch (const c10::NotImplementedError& e) {
        // The dispatcher's error for an op without a kernel for the device (also raised for a
        // dtype a kernel lacks): a missing kernel only if the graph names an op without one.
        const std::string op = meta && model.op_without_meta_kernel ? model.op_without_meta_kernel() : "";
        if (!op.empty()) throw gmt::NoMetaKernel(op, failed(e));
        throw gmt::ModelRejected(failed(e));
      } catch (const std::exception& e) {
        throw gmt::ModelRejected(failed(e));
      }
    }
    if (!o->train) {
      int64_t numel = 0;
      if (result.isTensor()) numel = result.toTensor().numel();
      r.output_numel = numel;
      break;
    }
    gmt::set_phase(GMT_PHASE_BACKWARD, it);
    int64_t numel = 0;
    at::Tensor loss = loss_of(result, numel);
    r.output_numel = numel;
    if (!loss.defined()) throw gmt::ModelRejected("the model output holds no tensor to train on");
    result = c10::IValue();
    loss.backward();
    loss = at::Tensor();
    std::vector<at::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    r.grad_bytes = gmt::unique_storage_bytes(grads);
    gmt::set_phase(GMT_PHASE_OPTIMIZER, it);
    opt.update(params);
    r.optimizer_state_bytes = opt.bytes();
    // zero_grad(set_to_none=True) happens before the next forward in a usual loop.
    if (it < iterations)
      for (auto p : params) p.mutable_grad() = at::Tensor();
  }
  *out = r;
}
}  // namespace gmt

extern "C" gmt_error gmt_estimate_torchscript(const gmt_estimate_options* o, gmt_estimate_result* out) {
  GMT_TRY_RUN(out, {
    if (!o || !o->path || !out) throw std::invalid_argument("null estimate options");
    const bool meta = o->device_kind == GMT_DEV_META;
    gmt::run_estimate(
        o,
        [&](const c10::Device& device, c10::ScalarType dtype) {
          auto module = std::make_shared<torch::jit::script::Module>();
          try {
            *module = torch::jit::load(o->path, device);
          } catch (const std::exception& e) {
            throw gmt::ModelRejected(std::string("cannot load ") + o->path + " as TorchScript: " + short_message(e));
          }
          if (meta) {
            gpu_devices_to_meta(*module);
            scalar_constants_from_file(o->path, *module);
          }
          // Eager PyTorch runs op by op with autograd per op: no graph-executor passes (autodiff
          // subgraphs, fusion) that would change what is saved for backward.
          std::shared_ptr<torch::jit::GraphOptimizerEnabledGuard> eager_executor;
          if (o->eager_lifetimes) {
            apply_eager_lifetimes(*module);
            eager_executor = std::make_shared<torch::jit::GraphOptimizerEnabledGuard>(false);
          }
          if (dtype != at::kFloat) module->to(dtype);
          module->train(o->train != 0);
          gmt::LoadedModel m;
          for (const auto& p : module->parameters()) m.params.push_back(p);
          for (const auto& b : module->buffers()) m.buffers.push_back(b);
          // Named in the registry, so the live tensors at the peak show them as parameters.
          for (const auto& p : module->named_parameters(true)) gmt::register_tensor(p.value, p.name);
          for (const auto& b : module->named_buffers(true)) gmt::register_tensor(b.value, b.name);
          m.forward = [module, eager_executor](const at::Tensor& input) { return module->forward({input}); };
          m.op_without_meta_kernel = [module] {
            auto graph = module->get_method("forward").graph()->copy();
            torch::jit::Inline(*graph);
            return first_op_without_meta_kernel(graph->block());
          };
          return m;
        },
        out);
  })
}

// ---- static estimate: shape propagation plus last-use liveness over the inlined forward graph.
namespace {
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

int64_t concrete_bytes(Value* v) {
  auto tt = v->type()->cast<c10::TensorType>();
  if (!tt) return -1;
  auto sizes = tt->sizes().concrete_sizes();
  if (!sizes) return -1;
  int64_t n = static_cast<int64_t>(tt->scalarType() ? c10::elementSize(*tt->scalarType()) : 4);
  for (auto d : *sizes)
    if (__builtin_mul_overflow(n, d, &n))
      throw std::overflow_error("a tensor of this run has more than 2^63 bytes (input too large)");
  return n;
}

// Replaces `self.x.y` attribute chains by graph inputs (tensors, typed from the module) or
// constants (scalars), so shape propagation sees concrete parameter shapes.
int64_t lift_attributes(Graph& g, const torch::jit::script::Module& m) {
  std::unordered_map<Value*, c10::IValue> vals{{g.inputs()[0], m._ivalue()}};
  std::vector<Node*> dead;
  int64_t param_bytes = 0;
  for (Node* n : g.nodes()) {
    if (n->kind() != c10::prim::GetAttr) continue;
    auto src = vals.find(n->input());
    if (src == vals.end() || !src->second.isObject()) continue;
    c10::IValue v = src->second.toObject()->getAttr(n->s(c10::attr::name));
    vals[n->output()] = v;
    if (v.isTensor()) {
      Value* in = g.addInput(n->s(c10::attr::name));
      in->setType(c10::TensorType::create(v.toTensor()));
      n->output()->replaceAllUsesWith(in);
      param_bytes += static_cast<int64_t>(v.toTensor().nbytes());
      dead.push_back(n);
    } else if (v.isBool() || v.isInt() || v.isDouble()) {
      torch::jit::WithInsertPoint guard(n);
      n->output()->replaceAllUsesWith(g.insertConstant(v));
      dead.push_back(n);
    }
  }
  for (auto it = dead.rbegin(); it != dead.rend(); ++it)
    if (!(*it)->hasUses()) (*it)->destroy();
  return param_bytes;
}

// Every value a node (or a node in its sub-blocks) reads.
void collect_inputs(Node* n, std::vector<Value*>& out) {
  for (Value* v : n->inputs()) out.push_back(v);
  for (auto* b : n->blocks())
    for (Node* inner : b->nodes()) collect_inputs(inner, out);
}
}  // namespace

extern "C" gmt_error gmt_estimate_static(const char* path, const int64_t* shape, int32_t ndim, int32_t dtype,
                                         int32_t is_index, gmt_static_result* out) {
  GMT_TRY_RUN(out, {
    if (!path || !out) throw std::invalid_argument("null static estimate arguments");
    const auto start = std::chrono::steady_clock::now();
    torch::jit::script::Module m;
    try {
      m = torch::jit::load(path, c10::Device(c10::DeviceType::CPU));
    } catch (const std::exception& e) {
      throw gmt::ModelRejected(std::string("cannot load ") + path + " as TorchScript: " + short_message(e));
    }
    m.eval();
    auto g = m.get_method("forward").graph()->copy();
    torch::jit::Inline(*g);
    if (g->inputs().size() != 2)
      throw gmt::ModelRejected("the static estimate handles forward(self, x) with one tensor input; this forward takes " +
                               std::to_string(g->inputs().size() - 1));
    gmt_static_result r{};
    r.param_bytes = lift_attributes(*g, m);
    torch::jit::ConstantPropagation(g);
    torch::jit::EliminateDeadCode(g);
    const std::vector<int64_t> in_shape(shape, shape + ndim);
    const auto in_type = is_index ? at::kLong : static_cast<c10::ScalarType>(dtype);
    g->inputs()[1]->setType(c10::TensorType::createContiguous(in_type, at::kCPU, in_shape));
    torch::jit::PropagateShapesOnGraph(g);

    // Alias roots: an output whose schema says it aliases its first input shares that storage.
    std::vector<Node*> order(g->nodes().begin(), g->nodes().end());
    std::unordered_map<Value*, Value*> root;
    auto root_of = [&](Value* v) {
      auto it = root.find(v);
      return it == root.end() ? v : it->second;
    };
    std::unordered_map<Value*, size_t> last_use;
    for (size_t i = 0; i < order.size(); ++i) {
      Node* n = order[i];
      const auto* schema = n->maybeSchema();
      for (size_t k = 0; k < n->outputs().size(); ++k)
        if (schema && k < schema->returns().size() && schema->returns()[k].alias_info() && !n->inputs().empty())
          root[n->outputs()[k]] = root_of(n->inputs()[0]);
      std::vector<Value*> ins;
      collect_inputs(n, ins);
      for (Value* v : ins) last_use[root_of(v)] = i;
    }
    for (Value* v : g->outputs()) last_use[root_of(v)] = order.size();
    int64_t live = 0;
    std::vector<std::vector<int64_t>> frees(order.size() + 1);
    for (size_t i = 0; i < order.size(); ++i) {
      for (Value* o : order[i]->outputs()) {
        if (!o->type()->cast<c10::TensorType>()) continue;
        ++r.tensor_values;
        const int64_t b = concrete_bytes(o);
        if (b < 0) {
          ++r.unknown_shapes;
          continue;
        }
        if (root.count(o)) continue;  // a view: no new memory
        if (__builtin_add_overflow(live, b, &live))
          throw std::overflow_error("the activations of this run exceed 2^63 bytes (input too large)");
        if (live > r.activation_peak) {
          r.activation_peak = live;
          r.peak_node = static_cast<int32_t>(i);
        }
        auto lu = last_use.find(o);
        frees[lu == last_use.end() ? i : lu->second].push_back(b);
      }
      for (int64_t b : frees[i]) live -= b;
    }
    r.nodes = static_cast<int64_t>(order.size());
    if (r.peak_node >= 0 && static_cast<size_t>(r.peak_node) < order.size()) {
      const std::string kind = order[r.peak_node]->kind().toQualString();
      std::snprintf(r.peak_op, sizeof(r.peak_op), "%s", kind.c_str());
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *out = r;
  })
}
