// The metadata-only ops (torch_rbln/dispatch/views.py names them): PyTorch's own CPU kernel on
// the rbln tensor itself, a redispatch below PrivateUse1, so the result shares the rbln storage
// and keeps device == rbln. They make no decision and record no event, so they need no Python:
// a C++ boxed kernel does exactly what the Python one did, without its ~3 us per call.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace py = pybind11;

namespace torch_rbln {

namespace {

void redispatch_to_cpu(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

torch::Library& library() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

}  // namespace

void bind_views(py::module_& m) {
  m.def("register_views", [](const std::vector<std::string>& names) {
    for (const auto& name : names) {
      library().impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&redispatch_to_cpu>());
    }
  }, "Register the metadata-only ops (aten overload names, 'view' or 'set_.source_Storage_"
     "storage_offset') on PrivateUse1: each runs its CPU kernel on the rbln tensor itself.");
}

}  // namespace torch_rbln
