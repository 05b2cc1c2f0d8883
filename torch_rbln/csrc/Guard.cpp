// The PrivateUse1 device guard: current device (thread-local), device count, streams, events.
//
// PyTorch reaches the guard from C++ everywhere (DeviceGuard, torch.Stream / torch.Event,
// torch.accelerator, the autograd engine's device threads), so it has to be C++. The device
// count stays Python's decision (runtime/devices.py plans the RBLN_* mapping): before the
// mapping is committed the guard asks Python each time; at commit Python hands over the final
// count and no Python call is made afterwards.
#include "Guard.h"

#include <atomic>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>

#include "Stream.h"

namespace py = pybind11;

namespace torch_rbln {
namespace {

thread_local c10::DeviceIndex tls_device = 0;
std::atomic<int> committed_count{-1};   // -1: not committed yet, ask Python
PyObject* count_source = nullptr;       // runtime.devices.count (kept alive for the process)

int ask_python() noexcept {
  if (count_source == nullptr || !Py_IsInitialized() || _Py_IsFinalizing()) {
    return 0;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  int n = 0;
  PyObject* r = PyObject_CallNoArgs(count_source);
  if (r != nullptr) {
    n = static_cast<int>(PyLong_AsLong(r));
    Py_DECREF(r);
  }
  if (PyErr_Occurred()) {   // a warning turned into an error, ...: no usable device
    PyErr_Clear();
    n = 0;
  }
  PyGILState_Release(gil);
  return n < 0 ? 0 : n;
}

}  // namespace

c10::DeviceIndex current_device() noexcept { return tls_device; }

void set_device(c10::DeviceIndex index) noexcept { tls_device = index; }

c10::DeviceIndex exchange_device(c10::DeviceIndex index) noexcept {
  c10::DeviceIndex prev = tls_device;
  tls_device = index;
  return prev;
}

c10::DeviceIndex device_count() noexcept {
  int n = committed_count.load(std::memory_order_acquire);
  return static_cast<c10::DeviceIndex>(n >= 0 ? n : ask_python());
}

bool mapping_committed() noexcept { return committed_count.load() >= 0; }

void check_index(c10::DeviceIndex index) {
  c10::DeviceIndex n = device_count();
  TORCH_CHECK_VALUE(n > 0, "No RBLN device is available: the RBLN_* configuration leaves no "
                    "logical device (see torch.rbln.device_summary())");
  TORCH_CHECK_VALUE(index >= 0 && index < n, "rbln device index ", static_cast<int>(index),
                    " is out of range [0, ", static_cast<int>(n), ")");
}

namespace {

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    if (d.index() != tls_device) {
      check_index(d.index());
    }
    return c10::Device(kType, exchange_device(d.index()));
  }
  c10::Device getDevice() const override { return c10::Device(kType, tls_device); }
  void setDevice(c10::Device d) const override {
    if (d.index() != tls_device) {
      check_index(d.index());
    }
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { set_device(d.index()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  c10::Stream getStream(c10::Device d) const override {
    return current_stream(d.index());
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return default_stream(d.index());
  }
  c10::Stream getNewStream(c10::Device d, int /*priority: accepted, ignored*/) const override {
    return new_stream(d.index());
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high priority*/) const override {
    return new_stream(d.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  bool queryStream(const c10::Stream& s) const override { return query_stream(s); }
  void synchronizeStream(const c10::Stream& s) const override { synchronize_stream(s); }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    synchronize_device(index_or_current(index));
  }

  void record(void** event, const c10::Stream& s, c10::DeviceIndex index,
              c10::EventFlag /*timing is not supported*/) const override {
    TORCH_CHECK(index == -1 || index == s.device_index(), "Event device index ",
                static_cast<int>(index), " does not match recording stream's device index ",
                static_cast<int>(s.device_index()), ".");
    record_event(event, s);
  }
  void block(void* event, const c10::Stream& s) const override { block_on_event(event, s); }
  bool queryEvent(void* event) const override { return query_event(event); }
  void synchronizeEvent(void* event) const override { synchronize_event(event); }
  void destroyEvent(void* event, c10::DeviceIndex) const noexcept override {
    destroy_event(event);
  }
  double elapsedTime(void*, void*, c10::DeviceIndex) const override {
    TORCH_CHECK(false, "RBLN does not support Event.elapsed_time (event timing is not supported).");
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

void bind_guard(py::module_& m) {
  m.def("current_device", [] { return static_cast<int>(tls_device); });
  m.def("set_device", [](int index) { set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("_set_device_count_source", [](py::object fn) {
    // kept for the whole process: the guard may ask while the interpreter shuts down
    count_source = fn.release().ptr();
  });
  m.def("_commit_device_count", [](int n) { committed_count.store(n, std::memory_order_release); });
  m.def("device_count", [] { return static_cast<int>(device_count()); });
}

}  // namespace torch_rbln
