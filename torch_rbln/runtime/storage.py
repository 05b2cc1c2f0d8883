"""rbln storages: a host view PyTorch sees, a device block the NPU uses, and residency.

The state of each rbln storage lives in the native core (``csrc/Storage.*``) as the context of
the storage's data pointer, made by the PrivateUse1 allocator (``csrc/Allocator.*``); this
module is its Python face. ``state_of(t)`` gives the :class:`StorageState` of ``t``'s storage:

* ``host``  the storage's own memory (its data pointer, the "virtual address" PyTorch sees),
  from a size-bucketed host pool;
* the device block, a block of the device's arena, booked at the first device use (or at
  creation with ``TORCH_RBLN_EAGER_MALLOC=1``). Its memory is the host view itself
  (``shares_host_view``: one physical copy) except while a program's output is the device
  memory, until the next transfer; transfers and statistics are recorded as for two copies;
* ``residency``: which side holds the latest data, ``HOST``, ``DEVICE`` or ``SYNCED`` (both);
* ``finite_dtype``: the dtype as which the NaN/Inf scan found the whole storage finite (cleared
  by every write), so unchanged weights are scanned once;
* the widened (fp32) forms of its views that widening programs read again and again (a weight
  on a host without half-precision GEMMs), also dropped by every write. While one covers the
  whole storage and the scan found it finite, the host view's pages are released
  (``host_released`` bytes; ``released_host_bytes()`` over all storages) and narrowed back
  from it, bit for bit, before anything reads or partly writes them.

The transitions between the states, and the transfers they record, are the residency
table of docs/tensors-and-memory.md. A tensor and its lazy clones (``Tensor._lazy_clone()``)
share one state until a write gives the written storage memory of its own (``csrc/LazyClone.cpp``).

The state lives exactly as long as the storage: the data pointer's deleter returns the device
block to the arena and the host memory to the pool.
"""

from __future__ import annotations

import torch

from .. import _C, config, events
from . import devices

HOST, DEVICE, SYNCED = 0, 1, 2

CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

StorageState = _C.StorageState

# the state of a tensor's storage (a storage made outside the allocator is adopted: its memory
# becomes the host view)
state_of = _C.state_of

# One step per operand: the transition a read or write needs, then the CPU tensor to use.
host_input = _C.host_input        # host read, then an alias of ``t`` over the host view
device_input = _C.device_input    # device read, then the program-operand alias (read only)
# device_input in fp32 for a widening program: kept per view from its second widening since the
# storage's last write (a weight), dropped by the next write; outside the device's accounting
device_input_widened = _C.device_input_widened
# device_input of a 2-D half-precision weight in the host GEMM library's blocked layout, for a
# linear program: kept from its first such read until the storage's next write
device_input_packed = _C.device_input_packed
host_output = _C.host_output      # host write (whole if ``t`` covers its storage), host alias
device_output = _C.device_output  # device write (whole if ``t`` covers its storage), device alias
# before a write into ``t`` that takes its alias first (the CPU fallback's in-place arguments): a
# lazy clone's storage gets memory of its own (every write transition above does it too); any
# other tensor (a CPU one) is left as it is
make_writable = _C.make_writable
shared_states = _C.shared_states  # states lazy clones share now (0: make_writable has nothing to do)

# the NaN/Inf scan found ``t``'s whole storage finite as ``t``'s dtype, and nothing wrote it since
known_finite = _C.known_finite

new_tensor = _C.new_tensor                 # (size, stride, dtype, index): host view from the pool
new_device_tensor = _C.new_device_tensor   # (memory, nbytes, index): memory is the device block
deliver_fresh = _C.deliver_fresh           # (result, index): a program's result as a new tensor
wrap_host = _C.wrap_host                   # (cpu, index): cpu's storage is the host view
storage_nbytes = _C.storage_nbytes         # (size, stride, itemsize)
# (t, old_nbytes): deterministic mode's fill of what resize_ added to t's storage (else nothing)
fill_resized = _C.fill_resized
clear_host_pool = _C.host_pool_clear
live_storage_states = _C.live_storage_states   # states alive now (a leak check reads it)
released_host_bytes = _C.released_host_bytes   # host-view pages released now (a diagnostic)


def _commit() -> list[int]:
    """The capacity of each logical device, once the mapping is committed (first real use)."""
    p = devices.commit()
    return [p.memory_per_npu * len(g) for g in p.groups]


def _eager_malloc() -> bool:
    return config.live("TORCH_RBLN_EAGER_MALLOC")


_C.init_runtime(_commit, devices.claim, _eager_malloc, events.record)
events.connect_native(_C.drain_events, _C.set_event_listening, _C.set_wanted_event_kinds)
events.connect_tap(_C.tap_activity, _C.set_tap_switch)
