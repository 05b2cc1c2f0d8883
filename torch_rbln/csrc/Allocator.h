// The PrivateUse1 allocator: every rbln storage's memory is a host view with a StorageState as
// its DataPtr context (Storage.h), and the allocation kernels (empty.memory_format,
// empty_strided) that make rbln tensors on any logical device.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace torch_rbln {

c10::Allocator* allocator();

// The logical device of allocations on this thread while alive (the allocation kernels set it,
// so a storage lands on the requested index whatever the current device is). Without one, an
// allocation goes to the thread's current device (the device guard's: PyTorch's own paths,
// such as torch.UntypedStorage(n, device="rbln:1"), select the device through the guard).
class AllocationDevice {
 public:
  explicit AllocationDevice(c10::DeviceIndex index);
  ~AllocationDevice();
  AllocationDevice(const AllocationDevice&) = delete;
  AllocationDevice& operator=(const AllocationDevice&) = delete;

 private:
  c10::DeviceIndex previous_;
};


// Installs the allocator for PrivateUse1 and registers the allocation kernels, record_stream
// and _lazy_clone (once).
void register_allocator_and_kernels();

}  // namespace torch_rbln
