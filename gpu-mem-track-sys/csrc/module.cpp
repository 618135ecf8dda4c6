// TorchScript modules' parameters and buffers, registered with the live-tensor registry:
// torch::jit::load creates them without any op the registry sees. Only the module's API, not the
// whole of <torch/script.h> (which the estimator's torchscript.cpp needs).
#include <torch/csrc/jit/api/module.h>

#include <string>

#include "common.h"
#include "registry.h"

extern "C" gmt_error gmt_register_module(void* module, const char* prefix, size_t* count) {
  GMT_TRY({
    if (!module) throw std::invalid_argument("null module pointer");
    auto* m = static_cast<torch::jit::script::Module*>(module);
    const std::string pre = prefix ? prefix : "";
    size_t n = 0;
    for (const auto& p : m->named_parameters(/*recurse=*/true)) {
      gmt::register_tensor(p.value, pre + p.name);
      ++n;
    }
    for (const auto& b : m->named_buffers(/*recurse=*/true)) {
      gmt::register_tensor(b.value, pre + b.name);
      ++n;
    }
    if (count) *count = n;
  })
}
