// torch_rbln._C: the native core. Each concern lives in its own file and adds its bindings here.
#include <pybind11/pybind11.h>

namespace torch_rbln {
void bind_guard(pybind11::module_& m);
void bind_stream(pybind11::module_& m);
void bind_generator(pybind11::module_& m);
void bind_pinned_allocator(pybind11::module_& m);
void bind_hooks(pybind11::module_& m);
void bind_async_copy(pybind11::module_& m);
}  // namespace torch_rbln

namespace torch_rbln {
void bind_runtime(pybind11::module_& m);  // Runtime.cpp
void bind_warm_path(pybind11::module_& m);  // WarmPath.cpp
void bind_profiler(pybind11::module_& m);  // Profiler.cpp
void bind_views(pybind11::module_& m);  // Views.cpp
void bind_data_movement(pybind11::module_& m);  // DataMovement.cpp
void bind_autocast(pybind11::module_& m);  // Autocast.cpp
void bind_numerics(pybind11::module_& m);  // Numerics.cpp
void bind_paged_attention(pybind11::module_& m);  // PagedAttention.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch-rbln native core";
  m.attr("ABI") = 1;
  torch_rbln::bind_runtime(m);
  torch_rbln::bind_guard(m);
  torch_rbln::bind_stream(m);
  torch_rbln::bind_generator(m);
  torch_rbln::bind_pinned_allocator(m);
  torch_rbln::bind_hooks(m);
  torch_rbln::bind_async_copy(m);
  torch_rbln::bind_warm_path(m);
  torch_rbln::bind_profiler(m);
  torch_rbln::bind_views(m);
  torch_rbln::bind_data_movement(m);
  torch_rbln::bind_autocast(m);
  torch_rbln::bind_numerics(m);
  torch_rbln::bind_paged_attention(m);
}
