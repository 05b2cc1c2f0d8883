"""Storage-metadata kernels: resize_, set_.

The allocation kernels (``empty.memory_format``, ``empty_strided``) are native
(``csrc/Allocator.cpp``): every rbln storage, whichever PyTorch path makes it, comes from the
PrivateUse1 allocator, and its first tensor on a device commits the device mapping."""

from __future__ import annotations

import torch

from ..runtime.storage import CPU_KEYSET, fill_resized, new_tensor, state_of, storage_nbytes


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
    grown_from = None
    if need > st.nbytes():
        old = state_of(self)
        grown = new_tensor((need,), (1,), torch.uint8, old.index)
        if old.nbytes:
            old.host_read()
            state_of(grown).host_bytes()[: old.nbytes].copy_(old.host_bytes())
        st = grown.untyped_storage()
        grown_from = old.nbytes
    _set_storage.redispatch(CPU_KEYSET, self, st, self.storage_offset(), size, stride)
    if grown_from is not None:
        fill_resized(self, grown_from)   # deterministic mode: the new part filled, as on the CPU
    return self


def resize_like(self, result):
    """Resize an out= tensor to ``result``'s shape as PyTorch resizes an output (TensorIterator,
    structured kernels): a resized output takes the computed result's strides where they are
    dense (``torch.add(x.permute(0, 2, 1), 1, out=torch.empty(0))`` keeps the permuted layout)."""
    resize_(self, result.shape)
    if self.stride() != result.stride() and torch._debug_has_internal_overlap(result) == 0:
        _set_storage.redispatch(CPU_KEYSET, self, self.untyped_storage(), self.storage_offset(),
                                result.shape, result.stride())
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
    "resize_": resize_,
    "set_.source_Storage": set_source_storage,
    "set_.source_Tensor": set_source_tensor,
    "set_": set_empty,
}
