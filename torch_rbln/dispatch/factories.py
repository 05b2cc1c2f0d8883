"""Allocation and storage-metadata kernels: empty, empty_strided, resize_, set_."""

from __future__ import annotations

import torch

from ..runtime import devices
from ..runtime.storage import CPU_KEYSET, buffer_of, new_tensor, storage_nbytes


def device_index(device) -> int:
    """The logical index a new rbln tensor goes to. Creating a tensor is the first real use of a
    device: it commits the device mapping (``devices.claim``)."""
    if device is None:
        return devices.claim(devices.current())
    idx = device.index if isinstance(device, torch.device) else torch.device(device).index
    return devices.claim(devices.current() if idx is None else idx)


def contiguous_strides(size) -> tuple:
    stride, acc = [], 1
    for s in reversed(size):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def _strides_for(size, memory_format) -> tuple:
    if memory_format is torch.channels_last and len(size) == 4:
        n, c, h, w = size
        return (h * w * c, 1, w * c, c)
    if memory_format is torch.channels_last_3d and len(size) == 5:
        n, c, d, h, w = size
        return (d * h * w * c, 1, h * w * c, w * c, c)
    return contiguous_strides(size)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None):
    size = tuple(size)
    return new_tensor(size, _strides_for(size, memory_format),
                      dtype or torch.get_default_dtype(), device_index(device))


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return new_tensor(tuple(size), tuple(stride), dtype or torch.get_default_dtype(),
                      device_index(device))


_set_storage = torch.ops.aten.set_.source_Storage_storage_offset


def resize_(self, size, memory_format=None):
    """Resize in place; a larger storage is a new rbln storage holding the old bytes."""
    size = tuple(size)
    stride = _strides_for(size, memory_format) if memory_format not in (None, torch.preserve_format) \
        else contiguous_strides(size)
    if self.size() == size and (memory_format is None or self.is_contiguous(memory_format=memory_format)):
        return self
    need = storage_nbytes(size, stride, self.element_size()) + self.storage_offset() * self.element_size()
    st = self.untyped_storage()
    if need > st.nbytes():
        old = buffer_of(self)
        grown = new_tensor((need,), (1,), torch.uint8, old.index)
        new_buf = buffer_of(grown)
        if old.nbytes:
            old.host_read()
            new_buf._hbytes()[: old.nbytes].copy_(old._hbytes())
        st = grown.untyped_storage()
    _set_storage.redispatch(CPU_KEYSET, self, st, self.storage_offset(), size, stride)
    return self


def set_source_storage(self, source):
    return _set_storage.redispatch(CPU_KEYSET, self, source, 0, (source.nbytes() // self.element_size(),), (1,))


def set_source_tensor(self, source):
    return _set_storage.redispatch(CPU_KEYSET, self, source.untyped_storage(), source.storage_offset(),
                                   source.size(), source.stride())


def set_empty(self):
    empty = new_tensor((0,), (1,), self.dtype, self.device.index or 0)
    return _set_storage.redispatch(CPU_KEYSET, self, empty.untyped_storage(), 0, (0,), (1,))


KERNELS = {
    "empty.memory_format": empty_memory_format,
    "empty_strided": empty_strided,
    "resize_": resize_,
    "set_.source_Storage": set_source_storage,
    "set_.source_Tensor": set_source_tensor,
    "set_": set_empty,
}
