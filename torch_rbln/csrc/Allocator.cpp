#include "Allocator.h"

#include <ATen/EmptyTensor.h>
#include <torch/library.h>

#include <atomic>
#include <memory>

#include "Guard.h"
#include "Storage.h"

namespace torch_rbln {

namespace {

thread_local c10::DeviceIndex allocation_device = -1;

class HostViewAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = allocation_device >= 0 ? allocation_device : current_device();
    return new_host_view(static_cast<int64_t>(nbytes), index);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

HostViewAllocator the_allocator;

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  return device.has_value() && device->has_index() ? device->index() : current_device();
}

// Both fill the new tensor in deterministic mode, as PyTorch's empty kernels of the CPU and
// CUDA do (a device fill: Storage.h, fill_uninitialized); otherwise its memory stays as it is.
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  AllocationDevice on(index_of(device));
  at::Tensor t = at::detail::empty_generic(size, &the_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype), memory_format);
  if (C10_UNLIKELY(fill_uninitialized_memory())) {
    fill_uninitialized(t, /*fresh=*/true);
  }
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  AllocationDevice on(index_of(device));
  at::Tensor t = at::detail::empty_strided_generic(
      size, stride, &the_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype));
  if (C10_UNLIKELY(fill_uninitialized_memory())) {
    fill_uninitialized(t, /*fresh=*/true);
  }
  return t;
}

}  // namespace

c10::Allocator* allocator() {
  return &the_allocator;
}

AllocationDevice::AllocationDevice(c10::DeviceIndex index) : previous_(allocation_device) {
  allocation_device = index;
}

AllocationDevice::~AllocationDevice() {
  allocation_device = previous_;
}

void register_allocator_and_kernels() {
  static bool done = false;
  if (done) {
    return;
  }
  done = true;
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &the_allocator);
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  lib->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  lib->impl("empty_strided", TORCH_FN(empty_strided));
  // Tensor.record_stream: defers the reuse of the storage's memory (Storage.h)
  lib->impl("record_stream", TORCH_FN(record_stream));
  // Tensor._lazy_clone: a copy-on-write clone sharing the storage's state (LazyClone.cpp)
  lib->impl("_lazy_clone", TORCH_FN(lazy_clone));
}

}  // namespace torch_rbln
