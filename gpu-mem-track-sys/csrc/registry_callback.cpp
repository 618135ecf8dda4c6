// The registry's op callback: a global RecordFunction callback that records every tensor an op
// returns (registry_store.h keeps them), with the op that made it and its role, and keeps the op
// stack the recorder and the out-of-memory report name ops by.
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <atomic>
#include <mutex>

#include "recorder.h"
#include "registry_store.h"

namespace gmt_registry {
namespace {
// Reads the outputs in place: a copy of an IValue or a list would cost an allocation and atomic
// reference counts on every op.
void record_ivalue(Registry& r, const c10::IValue& v, int32_t op, bool returned, bool gradient) {
  if (v.isTensor()) {
    r.record(v.toTensor(), -1, op, returned, gradient);
  } else if (v.isList()) {  // tensor lists too
    for (const auto& e : v.toListRef()) record_ivalue(r, e, op, returned, gradient);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) record_ivalue(r, e, op, returned, gradient);
  }
}

// Counted with a plain load and store, not an atomic increment (a locked instruction on every
// op): exact while one thread at a time runs ops, as in the loops the benchmarks count.
std::atomic<uint64_t> g_callbacks{0};
// Set by benchmarks only (gmt_registry_set_hollow): the callbacks stay installed, so libtorch
// still runs them and boxes each op's outputs, but return at once. The difference to a recording
// registry is the registry's own work.
std::atomic<bool> g_hollow{false};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (g_hollow.load(std::memory_order_relaxed)) return nullptr;
  gmt::this_thread_ops().names.push_back(fn.name());
  return nullptr;
}

void record_outputs(const at::RecordFunction& fn, const gmt::OpStack& ops) {
  const std::vector<c10::IValue>& outputs = fn.outputs();
  if (outputs.empty()) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // The outermost op running (the call the program made: aten::conv2d rather than the
  // aten::mkldnn_convolution it runs); this op itself when it is the outermost.
  const int32_t op = r.op_id(ops.outermost_or(fn.name()));
  // The op stack still holds this op: depth 1 is the program's own call. Under an autograd node
  // (the backward pass) the ops' results are gradients flowing between nodes, not internal to a
  // call; what the AccumulateGrad node makes is a parameter's gradient.
  bool returned = ops.names.size() <= 1, gradient = false;
  if (!returned) {  // the common case, the program's own call, reads no traits
    const uint8_t traits = r.op_traits[op];
    returned = traits & kOpIsAutogradNode;
    gradient = traits & kOpIsAccumulateGrad;
  }
  for (const auto& v : outputs) record_ivalue(r, v, op, returned, gradient);
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (g_hollow.load(std::memory_order_relaxed)) return;
  g_callbacks.store(g_callbacks.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  gmt::OpStack& ops = gmt::this_thread_ops();
  record_outputs(fn, ops);
  gmt::op_stack_pop(ops);  // after recording: the outputs are named by the stack as it was
}
}  // namespace
}  // namespace gmt_registry

using namespace gmt_registry;

extern "C" {

gmt_error gmt_registry_install(void) {
  GMT_TRY({
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.installed.load()) {
      r.handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_op_start, &on_op_end)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
      r.installed.store(true);
      // Keeps the name of the op running on each thread, for the out-of-memory report.
      gmt::op_stack_kept_by_registry();
    }
  })
}

int gmt_registry_installed(void) { return registry().installed.load() ? 1 : 0; }

gmt_error gmt_registry_set_enabled(int enabled) {
  GMT_TRY({
    Registry& r = registry();
    if (!r.installed.load()) throw std::runtime_error("the tensor registry is not installed");
    // Never removeCallback while ops may run on other threads: disable/re-enable is safe.
    if (enabled) at::reenableCallback(r.handle);
    else at::disableCallback(r.handle);
  })
}

gmt_error gmt_registry_set_hollow(int hollow) {
  GMT_TRY({
    if (!registry().installed.load()) throw std::runtime_error("the tensor registry is not installed");
    g_hollow.store(hollow != 0);
  })
}

uint64_t gmt_registry_callbacks(void) { return g_callbacks.load(std::memory_order_relaxed); }

}  // extern "C"
