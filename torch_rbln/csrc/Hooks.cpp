// The PrivateUse1 hooks: what generic PyTorch code asks an accelerator for (availability,
// device count and selection, generators, pinned memory). Without them PyTorch raises
// "You should register PrivateUse1HooksInterface" from torch.Generator(device="rbln"),
// pin_memory(), is_pinned() and DataLoader(pin_memory=True).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <pybind11/pybind11.h>

#include "Generator.h"
#include "Guard.h"
#include "PinnedAllocator.h"

namespace torch_rbln {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  // a device is initialised once the mapping is committed (its first tensor)
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return mapping_committed() && index >= 0 && index < device_count();
  }
  void init() const override {}

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    set_device(index);
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    check_index(index);
    return exchange_device(index);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return index >= 0 && index < device_count() ? exchange_device(index) : current_device();
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return new_generator(index);
  }

  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }

  // rbln memory is the host view PyTorch sees; which device a bare pointer belongs to is not
  // recorded, so a tensor made from one lands on the current device
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }

  void resizePrivateUse1Bytes(const c10::Storage&, size_t) const override {
    TORCH_CHECK(false, "an rbln storage cannot be resized in place (UntypedStorage.resize_); "
                "resize the tensor instead (Tensor.resize_), or make a new storage and copy");
  }
};

}  // namespace

void bind_hooks(pybind11::module_&) {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torch_rbln
