// Two data movements of every eager forward, in their common case, without Python; their
// Python kernels stay the reference, registered on PrivateUse2, and take every other call.
//
// `cat` (torch_rbln/dispatch/data_movement.py): every tensor an rbln tensor of one device and one dtype, no listener on the event
// stream. It runs where the data is, as the Python kernel does and with the same events: on
// the device when a non-empty source's latest data is there (host-latest sources pushed first,
// the result device-latest, the runtime's `v2v_multi` primitive timed), else on the host views
// (nothing crosses, the result host-latest). Every other call (mixed dtypes or devices, a CPU
// tensor, out=, a listener, the warm path switched off) goes to the Python kernel.
//
// `_copy_from` between two rbln tensors of one device (torch_rbln/dispatch/copy.py, `_d2d`):
// the copy table's device-to-device rows with their events: a direct copy of device-latest
// bytes on the device (`v2v`, runtime `v2v`), of host-latest or synced bytes on the host
// (`v2v_slow`, `v2v_reject`), anything else (a dtype conversion, a broadcast, a strided copy)
// through the host (`bounce copy_d2d_host_bounce`). Host <-> device copies, non_blocking ones and
// calls with a listener go to the Python kernel.
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
bool spans_bytes(const at::Tensor& t, int64_t nbytes);  // layout.spans_storage(t, nbytes)
// WarmPath.cpp: results.deliver_device of a fresh result (copied first unless it spans its own
// storage and is no view)
at::Tensor new_device_result(at::Tensor result, c10::DeviceIndex index);

namespace {

events::Counter* v2v_multi = nullptr;
events::Counter* v2v_runtime = nullptr;
events::Counter* v2v_copy = nullptr;
events::Counter* bounce_d2d = nullptr;
events::Counter* slow_synced = nullptr;
events::Counter* slow_host = nullptr;
events::Counter* reject_host = nullptr;

int64_t since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              t0).count();
}

void to_python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
}

void cat_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  // cat(Tensor[] tensors, int dim=0)
  const auto& tl = (*stack)[stack->size() - 2];
  const auto& dim_v = (*stack)[stack->size() - 1];
  if (!warm_path_on() || events::python_path_wanted() ||
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
    if (t.numel() != 0) {  // data_movement._on_device (a queued copy into it finishes first)
      StorageState* s = state_of(t);
      s->settle();
      on_device = on_device || s->residency != Residency::Host;
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
    out = new_device_result(at::cat(views, dim), index);
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

// _copy_from(Tensor self, Tensor dst, bool non_blocking=False) -> Tensor
void copy_from_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const auto& sv = (*stack)[stack->size() - n];
  const auto& dv = (*stack)[stack->size() - n + 1];
  if (!warm_path_on() || events::python_path_wanted() ||
      !sv.isTensor() || !dv.isTensor()) {
    return to_python(op, stack);
  }
  const at::Tensor src = sv.toTensor();
  const at::Tensor dst = dv.toTensor();
  if (!src.is_privateuseone() || !dst.is_privateuseone() ||
      src.key_set().has(c10::DispatchKey::Python) || dst.key_set().has(c10::DispatchKey::Python)) {
    return to_python(op, stack);
  }
  if (dst.numel() != 0) {
    StorageState* db = state_for_write(dst);  // first: a lazy clone gets memory of its own
    StorageState* sb = state_of(src);
    const int64_t nbytes = src.numel() * static_cast<int64_t>(src.itemsize());
    const bool same = sb == db;
    const bool direct = src.scalar_type() == dst.scalar_type() && src.sizes() == dst.sizes() &&
                        src.is_contiguous() && dst.is_contiguous() && !same &&
                        src.device() == dst.device();
    if (direct) {
      sb->settle();  // a queued copy into the source finishes before its residency is read
    }
    if (direct && sb->residency == Residency::Device) {
      const auto t0 = std::chrono::steady_clock::now();
      db->device_write(spans_bytes(dst, db->nbytes));
      const int64_t s0 = events::span_start();
      db->device_alias(dst).copy_(sb->device_alias(src));
      events::record_copy(v2v_copy, nbytes, dst.device().index(), s0);
      events::record(v2v_runtime, since(t0));
    } else if (direct) {  // the latest bytes are on the host: the runtime serves the copy there
      const bool host = sb->residency == Residency::Host;
      events::record(host ? slow_host : slow_synced, nbytes);
      if (host) {
        events::record(reject_host, nbytes);
      }
      db->host_write(spans_bytes(dst, db->nbytes));
      db->host_alias(dst).copy_(sb->host_alias(src));
    } else {  // a dtype conversion, broadcast, strided or cross-device copy through the host
      // (within one storage both aliases share one CPU storage: the CPU's copy_ decides about
      // overlap, as copy.py's _d2d)
      events::record(bounce_d2d, nbytes);
      sb->host_read();
      const at::Tensor src_cpu = sb->host_alias(src);
      db->host_write(spans_bytes(dst, db->nbytes));
      db->host_alias(dst).copy_(src_cpu);
    }
  }
  torch::jit::drop(*stack, n);
  stack->emplace_back(dst);
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
  m.def("register_native_copy", []() {
    v2v_runtime = events::counter("runtime", "v2v");
    v2v_copy = events::counter("v2v", "");
    bounce_d2d = events::counter("bounce", "copy_d2d_host_bounce");
    slow_synced = events::counter("v2v_slow", "src_synced_host_served");
    slow_host = events::counter("v2v_slow", "src_not_on_device");
    reject_host = events::counter("v2v_reject", "src_not_on_device");
    library().impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<&copy_from_kernel>());
  }, "Serve aten::_copy_from between two rbln tensors natively; its Python kernel must be "
     "registered on PrivateUse2.");
}

}  // namespace torch_rbln
