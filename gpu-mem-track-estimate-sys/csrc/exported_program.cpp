// torch.export programs (`.pt2`, an ExportedProgram saved by torch.export.save), run on the meta
// device op by op through the dispatcher, as eager PyTorch runs them: autograd records each call
// when the step trains. The Rust side reads the program's JSON (gpu-mem-track-estimate's
// exported.rs) and builds it here: placeholders (parameters, buffers, constants, user inputs) from
// their recorded sizes and dtypes - the weights are never read - and nodes, each an ATen op with
// its arguments. A value is freed after its last use, as the graph says, which is when eager code
// drops it (or earlier, for values eager Python keeps in a variable to the end of the function).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <caffe2/serialize/inline_container.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "internal.h"
#include "registry.h"

namespace {
struct Placeholder {
  std::string name;
  int32_t role;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
  bool requires_grad;
};

// An argument of a node: a constant IValue, or the value (or values) of earlier nodes.
struct Arg {
  c10::IValue constant;
  int32_t kind = GMT_EXPORTED_ARG_NONE;
  std::vector<int64_t> values;  // value ids: one (a tensor), or a list (-1: none)
};

struct Output {
  int64_t ret, elem, value;  // return index, element of a list return (-1: the return itself), id
};

struct Node {
  c10::OperatorHandle op;
  std::string name;  // aten::conv2d.default, for messages
  std::vector<Arg> args;  // one per schema argument, in order
  std::vector<Output> outputs;
  std::vector<int64_t> frees;  // values whose last use this node is
};

struct Program {
  std::vector<Placeholder> placeholders;  // value id = index
  std::vector<Node> nodes;
  std::vector<int64_t> outputs;
  int64_t values = 0;
};

c10::IValue constant_of(const gmt_exported_arg& a) {
  switch (a.kind) {
    case GMT_EXPORTED_ARG_NONE:
      return c10::IValue();
    case GMT_EXPORTED_ARG_INT:
    case GMT_EXPORTED_ARG_SCALAR_TYPE:
    case GMT_EXPORTED_ARG_MEMORY_FORMAT:
    case GMT_EXPORTED_ARG_LAYOUT:
      return c10::IValue(a.i);
    case GMT_EXPORTED_ARG_INTS:
      return c10::IValue(std::vector<int64_t>(a.ints, a.ints + a.n));
    case GMT_EXPORTED_ARG_FLOAT:
      return c10::IValue(a.f);
    case GMT_EXPORTED_ARG_FLOATS:
      return c10::IValue(std::vector<double>(a.floats, a.floats + a.n));
    case GMT_EXPORTED_ARG_BOOL:
      return c10::IValue(a.i != 0);
    case GMT_EXPORTED_ARG_BOOLS: {
      c10::List<bool> list;
      for (size_t i = 0; i < a.n; ++i) list.push_back(a.ints[i] != 0);
      return c10::IValue(list);
    }
    case GMT_EXPORTED_ARG_STRING:
      return c10::IValue(std::string(a.s ? a.s : ""));
    case GMT_EXPORTED_ARG_DEVICE:
      // What a device argument names, the estimate runs on: "the CPU means meta" puts a CPU or
      // CUDA device on meta where the op meets it.
      return c10::IValue(c10::Device(c10::kCPU));
    default:
      throw std::invalid_argument("unknown argument kind " + std::to_string(a.kind));
  }
}

// The tensors a run holds, by value id.
class Values {
 public:
  explicit Values(size_t n) : v_(n) {}
  at::Tensor& at(int64_t id) {
    if (id < 0 || static_cast<size_t>(id) >= v_.size()) throw std::out_of_range("value id out of range");
    return v_[static_cast<size_t>(id)];
  }
  const at::Tensor& get(int64_t id, const Node& node) {
    const at::Tensor& t = at(id);
    if (!t.defined()) throw std::runtime_error(node.name + " uses a value that is not (or no longer) defined");
    return t;
  }

 private:
  std::vector<at::Tensor> v_;
};

c10::IValue bind(const Arg& a, Values& values, const Node& node) {
  switch (a.kind) {
    case GMT_EXPORTED_ARG_TENSOR:
      return c10::IValue(values.get(a.values.at(0), node));
    case GMT_EXPORTED_ARG_TENSORS: {
      c10::List<at::Tensor> list;
      for (int64_t id : a.values) list.push_back(values.get(id, node));
      return c10::IValue(list);
    }
    case GMT_EXPORTED_ARG_OPTIONAL_TENSORS: {
      c10::List<std::optional<at::Tensor>> list;
      for (int64_t id : a.values) list.push_back(id < 0 ? std::nullopt : std::optional<at::Tensor>(values.get(id, node)));
      return c10::IValue(list);
    }
    default:
      return a.constant;
  }
}

c10::IValue run(const Program& p, const std::vector<at::Tensor>& placed, const at::Tensor& input) {
  Values values(static_cast<size_t>(p.values));
  bool first_input = true;
  for (size_t i = 0; i < p.placeholders.size(); ++i) {
    if (p.placeholders[i].role == GMT_EXPORTED_USER_INPUT && first_input) {
      values.at(static_cast<int64_t>(i)) = input;
      first_input = false;
    } else {
      values.at(static_cast<int64_t>(i)) = placed[i];
    }
  }
  for (const Node& n : p.nodes) {
    torch::jit::Stack stack;
    stack.reserve(n.args.size());
    for (const Arg& a : n.args) stack.push_back(bind(a, values, n));
    try {
      n.op.callBoxed(stack);
    } catch (const c10::NotImplementedError& e) {
      // The dispatcher's error for an op without a kernel for the device (also raised for a
      // dtype a kernel lacks): a missing kernel only if this op has none on meta.
      if (input.is_meta() && !gmt::has_meta_kernel(n.op)) throw gmt::NoMetaKernel(n.name, n.name + ": " + e.what_without_backtrace());
      throw std::runtime_error(n.name + ": " + e.what());
    } catch (const std::exception& e) {
      throw std::runtime_error(n.name + ": " + e.what());
    }
    for (const Output& o : n.outputs) {
      if (o.ret < 0 || static_cast<size_t>(o.ret) >= stack.size())
        throw std::runtime_error(n.name + " returned fewer values than the program names");
      const c10::IValue& r = stack[static_cast<size_t>(o.ret)];
      if (o.elem < 0) {
        if (!r.isTensor()) throw std::runtime_error(n.name + " returned a non-tensor where the program names a tensor");
        values.at(o.value) = r.toTensor();
      } else {
        if (!r.isTensorList()) throw std::runtime_error(n.name + " returned no tensor list where the program names one");
        const auto list = r.toTensorList();
        if (static_cast<size_t>(o.elem) >= list.size()) throw std::runtime_error(n.name + " returned a shorter list");
        values.at(o.value) = list.get(static_cast<size_t>(o.elem));
      }
    }
    stack.clear();
    for (int64_t id : n.frees) values.at(id) = at::Tensor();
  }
  std::vector<c10::IValue> outs;
  for (int64_t id : p.outputs) outs.emplace_back(values.at(id));
  return c10::ivalue::Tuple::create(std::move(outs));
}
}  // namespace

extern "C" {
gmt_error gmt_exported_program_json(const char* path, char** json) {
  GMT_TRY({
    if (!path || !json) throw std::invalid_argument("null argument");
    std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
    try {
      reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(path) + " is not a torch.export archive (.pt2): " + e.what());
    }
    std::string name;
    for (const std::string& r : reader->getAllRecords()) {
      if (r.rfind("models/", 0) == 0 && r.size() > 12 && r.compare(r.size() - 5, 5, ".json") == 0) {
        name = r;
        break;
      }
    }
    if (name.empty()) throw std::runtime_error(std::string(path) + " holds no models/*.json: not a torch.export archive");
    auto [data, size] = reader->getRecord(name);
    *json = gmt::dup_string(std::string(static_cast<const char*>(data.get()), size));
  })
}

void* gmt_exported_program_new(void) { return new (std::nothrow) Program(); }

void gmt_exported_program_free(void* program) { delete static_cast<Program*>(program); }

gmt_error gmt_exported_program_placeholder(void* program, const char* name, int32_t role, const int64_t* sizes,
                                           const int64_t* strides, size_t ndim, int32_t dtype,
                                           int32_t requires_grad) {
  GMT_TRY({
    if (!program || (ndim && (!sizes || !strides))) throw std::invalid_argument("null argument");
    auto* p = static_cast<Program*>(program);
    if (!p->nodes.empty()) throw std::logic_error("placeholders come before nodes");
    p->placeholders.push_back(Placeholder{name ? name : "", role, std::vector<int64_t>(sizes, sizes + ndim),
                                          std::vector<int64_t>(strides, strides + ndim),
                                          static_cast<c10::ScalarType>(dtype), requires_grad != 0});
    p->values = static_cast<int64_t>(p->placeholders.size());
  })
}

gmt_error gmt_exported_program_node(void* program, const char* op, const char* overload, const gmt_exported_arg* args,
                                    size_t nargs, const int64_t* outputs, size_t noutputs, const int64_t* frees,
                                    size_t nfrees, int64_t values) {
  GMT_TRY({
    if (!program || !op || !overload || (nargs && !args) || (noutputs && !outputs) || (nfrees && !frees))
      throw std::invalid_argument("null argument");
    auto* p = static_cast<Program*>(program);
    const std::string overload_name = std::string(overload) == "default" ? "" : overload;
    const std::string shown = std::string(op) + "." + overload;
    auto handle = c10::Dispatcher::singleton().findSchema({op, overload_name});
    if (!handle) throw std::runtime_error(shown + ": no such operator in this libtorch (exported by another torch?)");
    Node n{*handle, shown, {}, {}, std::vector<int64_t>(frees, frees + nfrees)};
    const auto& schema = handle->schema();
    for (const auto& formal : schema.arguments()) {
      const gmt_exported_arg* given = nullptr;
      for (size_t i = 0; i < nargs; ++i)
        if (args[i].name && formal.name() == args[i].name) given = &args[i];
      Arg a;
      if (given) {
        a.kind = given->kind;
        if (given->kind == GMT_EXPORTED_ARG_TENSOR) {
          a.values = {given->i};
        } else if (given->kind == GMT_EXPORTED_ARG_TENSORS || given->kind == GMT_EXPORTED_ARG_OPTIONAL_TENSORS) {
          a.values.assign(given->ints, given->ints + given->n);
        } else {
          a.constant = constant_of(*given);
          // A Python number where the schema takes a Tensor (`x.add_(1)`): a 0-dim wrapped number,
          // as Python's argument parser makes it.
          const auto type = formal.real_type();
          const bool tensor_formal = type->kind() == c10::TypeKind::TensorType ||
                                     (type->kind() == c10::TypeKind::OptionalType &&
                                      type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType);
          if (tensor_formal && (a.constant.isInt() || a.constant.isDouble() || a.constant.isBool())) {
            at::Tensor wrapped = at::scalar_to_tensor(a.constant.toScalar());
            wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
            a.constant = c10::IValue(std::move(wrapped));
          }
        }
      } else if (formal.default_value()) {
        a.constant = *formal.default_value();
      } else {
        throw std::runtime_error(shown + ": the program gives no argument `" + formal.name() + "`");
      }
      for (int64_t id : a.values)
        if (id >= values || id < -1) throw std::out_of_range(shown + ": an argument names an unknown value");
      n.args.push_back(std::move(a));
    }
    if (noutputs % 3 != 0) throw std::invalid_argument("outputs come in (return, element, value) triples");
    for (size_t i = 0; i < noutputs; i += 3) {
      if (outputs[i + 2] < 0 || outputs[i + 2] >= values) throw std::out_of_range(shown + ": an output id out of range");
      n.outputs.push_back(Output{outputs[i], outputs[i + 1], outputs[i + 2]});
    }
    for (int64_t id : n.frees)
      if (id < 0 || id >= values) throw std::out_of_range(shown + ": a freed id out of range");
    p->values = std::max(p->values, values);
    p->nodes.push_back(std::move(n));
  })
}

gmt_error gmt_exported_program_outputs(void* program, const int64_t* values, size_t n) {
  GMT_TRY({
    if (!program || (n && !values)) throw std::invalid_argument("null argument");
    auto* p = static_cast<Program*>(program);
    for (size_t i = 0; i < n; ++i)
      if (values[i] < 0 || values[i] >= p->values) throw std::out_of_range("a program output id out of range");
    p->outputs.assign(values, values + n);
  })
}

gmt_error gmt_estimate_exported(const void* program, const gmt_estimate_options* o, gmt_estimate_result* out) {
  GMT_TRY_RUN(out, {
    if (!program || !o || !out) throw std::invalid_argument("null estimate options");
    const auto* p = static_cast<const Program*>(program);
    gmt::run_estimate(
        o,
        [&](const c10::Device& device, c10::ScalarType dtype) {
          auto placed = std::make_shared<std::vector<at::Tensor>>();
          gmt::LoadedModel m;
          bool first_input = true;
          for (const Placeholder& ph : p->placeholders) {
            if (ph.role == GMT_EXPORTED_USER_INPUT && first_input) {  // the run's input takes its place
              first_input = false;
              placed->emplace_back();
              continue;
            }
            auto type = ph.dtype;
            if (ph.role != GMT_EXPORTED_USER_INPUT && c10::isFloatingType(type) && dtype != at::kFloat) type = dtype;
            at::Tensor t = at::empty_strided(ph.sizes, ph.strides, at::TensorOptions().device(device).dtype(type));
            if (ph.role == GMT_EXPORTED_PARAMETER) {
              if (o->train && ph.requires_grad && c10::isFloatingType(type)) t.requires_grad_(true);
              m.params.push_back(t);
            } else if (ph.role == GMT_EXPORTED_BUFFER) {
              m.buffers.push_back(t);
            }
            if (ph.role != GMT_EXPORTED_USER_INPUT) gmt::register_tensor(t, ph.name);
            placed->push_back(std::move(t));
          }
          m.forward = [p, placed](const at::Tensor& input) { return run(*p, *placed, input); };
          return m;
        },
        out);
  })
}
}  // extern "C"
