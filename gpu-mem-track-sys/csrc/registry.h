// Internal to the shim: explicit registration, shared by registry.cpp and module.cpp.
#pragma once
#include <ATen/core/Tensor.h>
#include <string>

namespace gmt {
// Adds `t` to the live-tensor registry (or names it if already there). Thread-safe.
void register_tensor(const at::Tensor& t, const std::string& name);
}  // namespace gmt
