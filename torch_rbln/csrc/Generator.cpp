#include "Generator.h"

#include <array>
#include <mutex>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>

#include "Guard.h"

namespace py = pybind11;

namespace torch_rbln {
namespace {

constexpr int kMaxDevices = 128;
std::array<at::Generator, kMaxDevices> defaults;   // created on first use
std::mutex defaults_mu;
std::optional<uint64_t> seed_all;   // manual_seed_all also seeds generators created later

at::CPUGeneratorImpl* cpu(const at::Generator& g) { return g.get<at::CPUGeneratorImpl>(); }

}  // namespace

GeneratorImpl::GeneratorImpl(c10::DeviceIndex index, at::Generator host)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      host_(std::move(host)) {}

GeneratorImpl::GeneratorImpl(c10::DeviceIndex index)
    : GeneratorImpl(index, at::detail::createCPUGenerator(c10::default_rng_seed_val)) {}

void GeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(host_.mutex());
  cpu(host_)->set_current_seed(seed);
}

void GeneratorImpl::set_offset(uint64_t) {
  TORCH_CHECK(false, "an rbln generator has no offset (its state is a CPU generator's: use "
              "get_state()/set_state())");
}

uint64_t GeneratorImpl::get_offset() const {
  TORCH_CHECK(false, "an rbln generator has no offset (its state is a CPU generator's: use "
              "get_state()/set_state())");
}

uint64_t GeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(host_).mutex());
  return cpu(host_)->current_seed();
}

uint64_t GeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(host_.mutex());
  return cpu(host_)->seed();
}

void GeneratorImpl::set_state(const c10::TensorImpl& state) {
  std::lock_guard<std::mutex> lock(host_.mutex());
  cpu(host_)->set_state(state);
}

c10::intrusive_ptr<c10::TensorImpl> GeneratorImpl::get_state() const {
  std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(host_).mutex());
  return cpu(host_)->get_state();
}

GeneratorImpl* GeneratorImpl::clone_impl() const {
  std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(host_).mutex());
  return new GeneratorImpl(device().index(), host_.clone());
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = index_or_current(index);
  check_index(index);
  std::lock_guard<std::mutex> lock(defaults_mu);
  at::Generator& g = defaults[index];
  if (!g.defined()) {
    g = at::make_generator<GeneratorImpl>(index);
    if (seed_all) {
      g.set_current_seed(*seed_all);
    }
  }
  return g;
}

at::Generator new_generator(c10::DeviceIndex index) {
  index = index_or_current(index);
  check_index(index);
  return at::make_generator<GeneratorImpl>(index);
}

namespace {

at::Generator unwrap(py::handle obj) {
  TORCH_CHECK_TYPE(THPGenerator_Check(obj.ptr()), "expected a torch.Generator");
  return reinterpret_cast<THPGenerator*>(obj.ptr())->cdata;
}

py::object wrap(const at::Generator& g) {
  return py::reinterpret_steal<py::object>(THPGenerator_Wrap(g));
}

}  // namespace

void bind_generator(py::module_& m) {
  m.def("_default_generator", [](int index) { return wrap(default_generator(index)); });
  // The CPU generator an rbln generator draws from: what the CPU fallback hands a CPU kernel.
  m.def("_host_generator", [](py::handle gen) {
    at::Generator g = unwrap(gen);
    auto* impl = dynamic_cast<GeneratorImpl*>(g.unsafeGetGeneratorImpl());
    TORCH_CHECK_TYPE(impl != nullptr, "expected an rbln generator, got one on ", g.device());
    return wrap(impl->host());
  });
  m.def("_manual_seed_all", [](uint64_t seed) {
    std::lock_guard<std::mutex> lock(defaults_mu);
    seed_all = seed;
    for (at::Generator& g : defaults) {
      if (g.defined()) {
        std::lock_guard<std::mutex> glock(g.mutex());
        g.set_current_seed(seed);
      }
    }
  });
}

}  // namespace torch_rbln
