// torch_rbln._C: the native core. Each concern lives in its own file and adds its bindings here.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch-rbln native core";
  m.attr("ABI") = 1;
}
