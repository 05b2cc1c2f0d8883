// The current rbln device (per thread) and the logical device count, shared by the device
// guard, the hooks, streams and generators; runtime/devices.py reads and writes the same value.
#pragma once

#include <c10/core/Device.h>

namespace torch_rbln {

// Current logical device of the calling thread (0 until the thread selects another).
c10::DeviceIndex current_device() noexcept;
void set_device(c10::DeviceIndex index) noexcept;
c10::DeviceIndex exchange_device(c10::DeviceIndex index) noexcept;

// Logical devices as runtime/devices.py plans them: fixed once the mapping is committed,
// asked from Python before. Never throws: 0 when the configuration is malformed.
c10::DeviceIndex device_count() noexcept;
bool mapping_committed() noexcept;

// Raises the runtime's error (index out of range, no device) unless 0 <= index < count.
void check_index(c10::DeviceIndex index);

// `index`, or the current device for -1.
inline c10::DeviceIndex index_or_current(c10::DeviceIndex index) noexcept {
  return index < 0 ? current_device() : index;
}

}  // namespace torch_rbln
