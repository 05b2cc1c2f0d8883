// The common case of `cat` (torch_rbln/dispatch/data_movement.py, the reference) without
// Python: every tensor an rbln tensor of one device and one dtype, no listener on the event
// stream. It runs where the data is, as the Python kernel does and with the same events: on
// the device when a non-empty source's latest data is there (host-latest sources pushed first,
// the result device-latest, the runtime's `v2v_multi` primitive timed), else on the host views
// (nothing crosses, the result host-latest). Every other call (mixed dtypes or devices, a CPU
// tensor, out=, a listener, the warm path switched off) goes to the Python kernel, registered on
// PrivateUse2 for that.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <chrono>
#include <vector>

#include "Events.h"
#include "Storage.h"

namespace py = pybind11;

namespace torch_rbln {

bool warm_path_on();                        // WarmPath.cpp: TORCH_RBLN_NATIVE_WARM_PATH
bool spans_whole_storage(const at::Tensor& t);  // WarmPath.cpp: layout.spans_storage(t)

namespace {

events::Counter* v2v_multi = nullptr;

void to_python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
}

void cat_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  // cat(Tensor[] tensors, int dim=0)
  const auto& tl = (*stack)[stack->size() - 2];
  const auto& dim_v = (*stack)[stack->size() - 1];
  if (!warm_path_on() || events::detail::listening.load(std::memory_order_relaxed) ||
      !tl.isTensorList() || !dim_v.isInt()) {
    return to_python(op, stack);
  }
  const auto list = tl.toTensorList();
  const size_t n = list.size();
  if (n == 0) {
    return to_python(op, stack);
  }
  std::vector<at::Tensor> ts;
  ts.reserve(n);
  bool on_device = false;
  for (size_t i = 0; i < n; ++i) {
    at::Tensor t = list.get(i);
    if (!t.defined() || !t.is_privateuseone() || t.key_set().has(c10::DispatchKey::Python) ||
        (i > 0 && (t.scalar_type() != ts[0].scalar_type() ||
                   t.device().index() != ts[0].device().index()))) {
      return to_python(op, stack);
    }
    if (t.numel() != 0 && state_of(t)->residency != Residency::Host) {
      on_device = true;  // data_movement._on_device
    }
    ts.push_back(std::move(t));
  }
  const int64_t dim = dim_v.toInt();
  const c10::DeviceIndex index = ts[0].device().index();
  at::Tensor out;
  if (on_device) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<at::Tensor> views;
    views.reserve(n);
    for (const auto& t : ts) {  // data_movement._dev: device_input
      StorageState* s = state_of(t);
      s->device_read();
      views.push_back(s->device_input_alias(t));
    }
    at::Tensor res = at::cat(views, dim);
    if (!spans_whole_storage(res)) {  // results.deliver_device
      res = res.clone(at::MemoryFormat::Contiguous);
    }
    out = new_device_tensor(res, res.numel() * static_cast<int64_t>(res.itemsize()), index);
    events::record(v2v_multi, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - t0).count());
  } else {
    std::vector<at::Tensor> views;
    views.reserve(n);
    for (const auto& t : ts) {  // data_movement._host: host_input
      StorageState* s = state_of(t);
      s->host_read();
      views.push_back(s->host_alias(t));
    }
    at::Tensor res = at::cat(views, dim);
    if (!spans_whole_storage(res)) {  // results.wrap_result
      res = res.clone(at::MemoryFormat::Contiguous);
    }
    out = wrap_host(res, index);
  }
  torch::jit::drop(*stack, 2);
  stack->emplace_back(std::move(out));
}

torch::Library& library() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

}  // namespace

void bind_data_movement(py::module_& m) {
  m.def("register_native_cat", []() {
    v2v_multi = events::counter("runtime", "v2v_multi");
    library().impl("cat", torch::CppFunction::makeFromBoxedFunction<&cat_kernel>());
  }, "Serve aten::cat's common case natively; its Python kernel must be registered on "
     "PrivateUse2.");
}

}  // namespace torch_rbln
