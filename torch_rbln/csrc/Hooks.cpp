// The PrivateUse1 hooks: what generic PyTorch code asks an accelerator for (availability,
// device count and selection, generators, pinned memory). Without them PyTorch raises
// "You should register PrivateUse1HooksInterface" from torch.Generator(device="rbln"),
// pin_memory(), is_pinned() and DataLoader(pin_memory=True).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>

#include "Generator.h"
#include "Guard.h"
#include "PinnedAllocator.h"
#include "Storage.h"

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

  // UntypedStorage.resize_ (FSDP frees and regrows its unsharded parameters this way), as the
  // CPU's resize_bytes does: new memory from the allocator on the storage's device, the kept
  // bytes copied from the latest side (a device-latest storage records its d2h), the old
  // memory and its device block freed; tensors over the storage see the new memory
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = impl->allocator()->allocate(newsize);
    const size_t keep = std::min(impl->nbytes(), newsize);
    if (keep > 0) {
      StorageState* old = state_of(storage);
      old->host_read();
      std::memcpy(fresh.get(), old->host, keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
    // a lazy clone had shared the old memory (its share is given up above): the new is its own
    impl->clear_materializer();
  }
};

}  // namespace

void bind_hooks(pybind11::module_&) {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torch_rbln
