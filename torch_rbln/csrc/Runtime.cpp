// The Python face of the runtime core (storage states, arenas, allocator, event counters), and
// the few things the core asks Python: the device mapping, TORCH_RBLN_EAGER_MALLOC when set,
// and the event stream while a listener is attached. Everything else runs without Python.
#include <torch/csrc/utils/pybind.h>

#include "Allocator.h"
#include "Arena.h"
#include "Events.h"
#include "Storage.h"

namespace py = pybind11;

namespace torch_rbln {

// WarmPath.cpp: results.deliver_device of a fresh result (copied first unless it spans its own
// storage and is no view)
at::Tensor new_device_result(at::Tensor result, c10::DeviceIndex index);

namespace {

// Python callables the core calls back; kept for the life of the process.
struct Bridges {
  py::object commit, index_error, eager_malloc, forward_event;
};
Bridges* bridges = nullptr;

std::vector<int64_t> commit_from_python() {
  py::gil_scoped_acquire gil;
  return bridges->commit().cast<std::vector<int64_t>>();
}

void index_error_from_python(c10::DeviceIndex index) {
  py::gil_scoped_acquire gil;
  bridges->index_error(static_cast<int>(index));  // raises the detailed error
}

bool eager_malloc_from_python(const char* /*raw*/) {
  py::gil_scoped_acquire gil;
  return bridges->eager_malloc().cast<bool>();
}

void forward_to_python(const events::Counter& c, int64_t amount) {
  py::gil_scoped_acquire gil;
  bridges->forward_event(c.kind, c.key, amount);
}

// A Python handle on a storage's state; it holds the storage, so the state outlives it. The state
// is looked up at each use: a write through any handle may give a lazy clone's storage memory of
// its own (state_for_write), and every handle on that storage then sees the new state.
struct StateHandle {
  explicit StateHandle(const at::Tensor& t) : storage(t.storage()) { torch_rbln::state_of(storage); }
  c10::Storage storage;
  StorageState* state() const { return torch_rbln::state_of(storage); }
  // the state for a write into the storage (a lazy clone's storage gets memory of its own)
  StorageState* for_write() const {
    if (C10_UNLIKELY(storage.unsafeGetStorageImpl()->has_materializer())) {
      storage.unsafeGetStorageImpl()->mutable_data();
    }
    return torch_rbln::state_of(storage);
  }
};

py::dict stats_dict(const ArenaStats& s) {
  py::dict out;
  const std::pair<const char*, const Stat*> stats[] = {
      {"allocated", &s.allocated}, {"reserved", &s.reserved}, {"active", &s.active}};
  for (const auto& [name, st] : stats) {
    const std::string k(name);
    out[py::str(k + ".current")] = st->current;
    out[py::str(k + ".peak")] = st->peak;
    if (k != "active") {
      out[py::str(k + ".total_allocated")] = st->allocated;
      out[py::str(k + ".total_freed")] = st->freed;
    }
  }
  out["cached.current"] = s.cached;
  out["num_alloc_retries"] = s.num_alloc_retries;
  out["num_ooms"] = s.num_ooms;
  out["num_device_alloc"] = s.num_device_alloc;
  out["num_device_free"] = s.num_device_free;
  return out;
}

PyObject* out_of_memory_error = nullptr;  // torch.OutOfMemoryError

// c10 errors raised by the core surface as the Python exceptions PyTorch raises for them
void translate_errors(std::exception_ptr p) {
  try {
    if (p) {
      std::rethrow_exception(p);
    }
  } catch (const c10::OutOfMemoryError& e) {
    PyErr_SetString(out_of_memory_error, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

void bind_runtime(py::module_& m) {
  out_of_memory_error = py::object(py::module_::import("torch").attr("OutOfMemoryError")).release().ptr();
  py::register_local_exception_translator(&translate_errors);

  m.def("init_runtime",
        [](py::object commit, py::object index_error, py::object eager_malloc,
           py::object forward_event) {
          if (bridges == nullptr) {
            bridges = new Bridges();  // never freed: the core may call back until exit
          }
          bridges->commit = std::move(commit);
          bridges->index_error = std::move(index_error);
          bridges->eager_malloc = std::move(eager_malloc);
          bridges->forward_event = std::move(forward_event);
          set_mapping_source({&commit_from_python, &index_error_from_python});
          set_eager_malloc_parser(&eager_malloc_from_python);
          events::set_forward(&forward_to_python);
          register_allocator_and_kernels();
        },
        "Connect the runtime core to Python's device mapping, environment and event stream, "
        "and install the PrivateUse1 allocator and allocation kernels.");

  // storage states ---------------------------------------------------------------------------
  py::class_<StateHandle>(m, "StorageState",
                          "The runtime's state of one rbln storage: host view, device block, "
                          "residency.")
      .def_property_readonly("index", [](const StateHandle& h) { return int(h.state()->index); })
      .def_property_readonly("nbytes", [](const StateHandle& h) { return h.state()->nbytes; })
      .def_property("residency",
                    [](const StateHandle& h) {
                      h.state()->settle();   // a queued copy into it has finished
                      return int(h.state()->residency);
                    },
                    [](StateHandle& h, int r) {
                      TORCH_CHECK_VALUE(r >= 0 && r <= 2, "residency must be HOST, DEVICE or SYNCED");
                      StorageState* s = h.for_write();
                      s->settle();
                      s->residency = static_cast<Residency>(r);
                    })
      .def_property("finite_dtype",
                    [](const StateHandle& h) { return h.state()->finite_dtype; },
                    [](StateHandle& h, std::optional<c10::ScalarType> d) { h.state()->finite_dtype = d; },
                    "The dtype as which the NaN/Inf scan found the whole storage finite (None "
                    "after any write).")
      .def_property_readonly("has_device_memory",
                             [](const StateHandle& h) { return h.state()->has_device_memory(); })
      .def_property_readonly("shares_host_view",
                             [](const StateHandle& h) { return h.state()->shares_host_view(); },
                             "The device block's memory is the host view: one physical copy.")
      .def_property_readonly("host_released",
                             [](const StateHandle& h) { return h.state()->host_released(); },
                             "Bytes of the host view's pages released while the kept fp32 form "
                             "stands for them (narrowed back before any read).")
      .def_property_readonly("adopted", [](const StateHandle& h) { return h.state()->adopted; },
                             "Made outside the allocator: its memory became the host view.")
      .def("__eq__", [](const StateHandle& a, const StateHandle& b) { return a.state() == b.state(); })
      .def("__hash__", [](const StateHandle& h) { return std::hash<const void*>()(h.state()); })
      .def("host_read", [](StateHandle& h) { h.state()->host_read(); })
      .def("host_write", [](StateHandle& h, bool whole) { h.for_write()->host_write(whole); },
           py::arg("whole") = false)
      .def("device_read", [](StateHandle& h) { h.state()->device_read(); })
      .def("device_write", [](StateHandle& h, bool whole) { h.for_write()->device_write(whole); },
           py::arg("whole") = false)
      .def("adopt_device", [](StateHandle& h, at::Tensor mem) { h.for_write()->adopt_device(std::move(mem)); })
      .def("ensure_device_memory", [](StateHandle& h) { h.state()->ensure_device_memory(); })
      .def("host_alias", [](StateHandle& h, const at::Tensor& t) { return h.state()->host_alias(t); })
      .def("device_alias", [](StateHandle& h, const at::Tensor& t) { return h.state()->device_alias(t); })
      .def("device_input_alias",
           [](StateHandle& h, const at::Tensor& t) { return h.state()->device_input_alias(t); })
      .def("host_flat", [](StateHandle& h, c10::ScalarType d) { return h.state()->host_flat(d); })
      .def("host_bytes", [](StateHandle& h) { return h.state()->host_bytes(); })
      .def_property_readonly("widened_bytes",
                             [](const StateHandle& h) { return h.state()->widened_bytes(); },
                             "bytes of the widened (fp32) forms kept for this storage's views")
      .def_property_readonly("packed_bytes",
                             [](const StateHandle& h) { return h.state()->packed_bytes(); },
                             "bytes of the packed (GEMM-layout) forms kept for its weights")
      .def("device_bytes", [](StateHandle& h) { return h.state()->device_bytes(); });

  m.def("state_of", [](const at::Tensor& t) { return StateHandle(t); });
  m.def("host_input", [](const at::Tensor& t) {
    auto* s = state_of(t);
    s->host_read();
    return s->host_alias(t);
  });
  m.def("device_input", [](const at::Tensor& t) {
    auto* s = state_of(t);
    s->device_read();
    return s->device_input_alias(t);
  });
  m.def("device_input_widened", [](const at::Tensor& t) {
    auto* s = state_of(t);
    s->device_read();
    return s->device_input_widened(t);
  });
  m.def("device_input_packed", [](const at::Tensor& t) {
    auto* s = state_of(t);
    s->device_read();
    return s->device_input_packed(t);
  });
  m.def("host_output", [](const at::Tensor& t) {
    auto* s = state_for_write(t);
    s->host_write(covers(t, *s));
    return s->host_alias(t);
  });
  m.def("device_output", [](const at::Tensor& t) {
    auto* s = state_for_write(t);
    s->device_write(covers(t, *s));
    return s->device_alias(t);
  });
  m.def("make_writable", [](const at::Tensor& t) {
    if (t.is_privateuseone()) {
      state_for_write(t);
    }
  }, "Before a write into rbln tensor t's storage: a lazy clone's storage that shares its memory "
     "gets memory of its own (copy-on-write). Other tensors are left as they are.");
  m.def("shared_states", &shared_states,
        "States lazy clones share now (0: no storage shares its memory copy-on-write).");
  m.def("fill_resized", [](const at::Tensor& t, int64_t old_nbytes) {
    // PyTorch's fill_resize_deterministic_: the elements past the old storage's end
    if (!fill_uninitialized_memory()) {
      return;
    }
    const auto item = static_cast<int64_t>(t.itemsize());
    const int64_t first = old_nbytes / item;
    const int64_t end = static_cast<int64_t>(t.storage().nbytes()) / item;
    if (end <= first) {
      return;
    }
    auto tail = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(t.storage()), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t.dtype());
    const int64_t size = end - first, stride = 1;
    tail.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(size), c10::IntArrayRef(stride),
                                                      first);
    fill_uninitialized(tail, /*fresh=*/old_nbytes == 0);
  }, "Deterministic mode: fill what resize_ added to t's storage (whose old size was "
     "old_nbytes) as PyTorch fills uninitialized memory; nothing otherwise.");
  m.def("known_finite", [](const at::Tensor& t) {
    const auto& d = state_of(t)->finite_dtype;
    return d.has_value() && *d == t.scalar_type();
  }, "The NaN/Inf scan found t's whole storage finite as t's dtype, and nothing wrote it since.");
  m.def("new_tensor", [](std::vector<int64_t> size, std::vector<int64_t> stride, c10::ScalarType dtype,
                         int index) { return new_tensor(size, stride, dtype, index); });
  m.def("new_device_tensor", [](const at::Tensor& mem, int64_t nbytes, int index) {
    return new_device_tensor(mem, nbytes, index);
  });
  m.def("deliver_fresh", [](at::Tensor result, int index) {
    return new_device_result(std::move(result), static_cast<c10::DeviceIndex>(index));
  }, "results.deliver_device for a program result and no out=: a fresh tensor that spans its "
     "own storage becomes the device memory as it is; anything else is copied first.");
  m.def("wrap_host", [](const at::Tensor& cpu, int index) { return wrap_host(cpu, index); });
  m.def("storage_nbytes", [](std::vector<int64_t> size, std::vector<int64_t> stride, int64_t itemsize) {
    return storage_nbytes(size, stride, itemsize);
  });
  m.def("host_pool_clear", &host_pool_clear);
  m.def("live_storage_states", &live_storage_states);

  // arenas -----------------------------------------------------------------------------------
  m.def("round_block", &round_block);
  m.def("arena_stats", [](int index) { return stats_dict(claim(index).stats()); });
  m.def("arena_capacity", [](int index) { return claim(index).capacity(); });
  m.def("arena_reserved", [](int index) { return claim(index).stats().reserved.current; });
  m.def("released_host_bytes", &released_host_bytes,
        "Bytes of host-view pages released now, over all storages (a diagnostic).");
  m.def("arena_held", [](int index) {
    const ArenaStats s = claim(index).stats();
    return s.reserved.current - s.borrowed;
  }, "Bytes of reserved blocks with memory of their own (the device memory physically held).");
  m.def("arena_reset_peak", [](int index) { claim(index).reset_peak(); });
  m.def("arena_reset_accumulated", [](int index) { claim(index).reset_accumulated(); });
  m.def("arena_empty_cache", [](int index) { claim(index).empty_cache(); });
  m.def("committed_devices", []() {
    std::vector<int> out;
    for (Arena* a : committed_arenas()) {
      out.push_back(a->index());
    }
    return out;
  });
  m.def("reserved_totals", []() {
    int64_t now = 0, peak = 0;
    for (Arena* a : committed_arenas()) {
      auto s = a->stats();
      now += s.reserved.current;
      peak += s.reserved_peak_ever;
    }
    return std::make_pair(now, peak);
  }, "(reserved now, process-wide reserved peak) summed over the arenas: explain's gauge.");

  // event counters ---------------------------------------------------------------------------
  m.def("drain_events", []() {
    py::list out;
    for (const auto& d : events::drain()) {
      out.append(py::make_tuple(d.counter->kind, d.counter->key, d.count, d.amount));
    }
    return out;
  });
  m.def("set_event_listening", &events::set_listening);
  m.def("set_wanted_event_kinds", &events::set_wanted_kinds,
        "The kinds of event the Python listeners want (empty: every kind).");
}

}  // namespace torch_rbln
