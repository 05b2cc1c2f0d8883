// torch_rbln._C: the native core. Each concern lives in its own file and adds its bindings here.
#include <torch/extension.h>

namespace torch_rbln {
void bind_runtime(pybind11::module_& m);  // Runtime.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch-rbln native core";
  m.attr("ABI") = 1;
  torch_rbln::bind_runtime(m);
}
