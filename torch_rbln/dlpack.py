"""DLPack export and import of rbln tensors (``Tensor.__dlpack__``, ``__dlpack_device__``,
``torch.from_dlpack``, ``torch.utils.dlpack.to_dlpack`` / ``from_dlpack``).

An rbln tensor's capsule names the NPU: ``kDLExtDev`` (12, the DLPack device type PyTorch gives
PrivateUse1) with the tensor's device index. Its data is the storage's host view, the memory
PyTorch sees as the storage's data pointer: the consumer reads it, and may write it. So an export
first brings the host view up to date (a ``d2h`` when the latest data is on the device; queued
work on the storage finishes first) and leaves the storage host-latest: the next device op that
reads it pushes it again (``h2d``), with whatever the consumer wrote.

A capsule of an rbln tensor imported back into PyTorch gives a tensor on the exporter's own
storage (the same memory without a copy, as on the CPU, and the same residency: a write on
either side is seen by the other, whichever side runs it). ``dl_device`` and ``copy`` requests
are PyTorch's: a copy on the requested device (``.to``), a ``clone`` for ``copy=True``, an error
for ``copy=False`` across devices. NumPy stays where it is: it takes CPU capsules only, as with
CUDA tensors.

PyTorch's own ``__dlpack_device__`` knows PrivateUse1 only by its original name and refuses
``rbln``; the rest of its protocol (the checks, the stream argument) serves rbln tensors as it
is. ``patches.py`` routes rbln tensors and capsules to the functions below.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils.dlpack import DLDeviceType

from .runtime.storage import CPU_KEYSET, state_of

EXT_DEV = int(DLDeviceType.kDLExtDev)

_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_data_address = torch._C._data_address   # a storage's data pointer, without materializing it

# data pointer of an export -> (the exporting storage, its data pointer then). Weak: an entry
# outlives neither the storage nor (the storage being what the capsule holds) its capsule.
_exports: dict[int, tuple[weakref.ref, int]] = {}


def device(t: torch.Tensor) -> tuple:
    """``t.__dlpack_device__()`` of an rbln tensor: the NPU and its index."""
    return (DLDeviceType.kDLExtDev, t.device.index or 0)


def export(orig, tensor: torch.Tensor, dl_device, copy):
    """The capsule of rbln ``tensor`` (``orig``: ``torch._C._to_dlpack`` or
    ``_to_dlpack_versioned``), PyTorch's ``dl_device`` / ``copy`` rules applied first."""
    t = tensor
    if dl_device is not None and (int(dl_device[0]), int(dl_device[1])) != (
            EXT_DEV, t.device.index):
        if int(dl_device[0]) != EXT_DEV or copy is False:
            # another device type (a copy through the copy engine), or PyTorch's error
            return orig(t, dl_device=dl_device, copy=copy)
        t = t.to(torch.device("rbln", int(dl_device[1])))
    elif copy:
        t = t.clone().detach()
    # the consumer reads the host view and may write it: up to date, and host-latest
    state_of(t).host_write(whole=False)
    capsule = orig(t)
    base = _data_address(t)
    ptr = base + t.storage_offset() * t.element_size()
    _exports[ptr] = (weakref.ref(t.untyped_storage(), lambda r, p=ptr: _forget(p, r)), base)
    return capsule


def _forget(ptr: int, ref) -> None:
    entry = _exports.get(ptr)
    if entry is not None and entry[0] is ref:
        del _exports[ptr]


def imported(t: torch.Tensor) -> torch.Tensor:
    """``t`` (PyTorch's import: a storage of its own over the capsule's memory) as the same view
    of the storage that exported that memory, while the storage lives and still has it; else
    ``t`` itself (its storage then becomes an rbln storage of its own, host-latest)."""
    ptr = _data_address(t)
    entry = _exports.get(ptr)
    storage = entry[0]() if entry is not None else None
    if storage is None:
        return t
    base = entry[1]
    offset, rest = divmod(ptr - base, t.element_size())
    if rest:
        return t
    z = torch.empty(0, dtype=t.dtype, device=t.device)
    _set_storage.redispatch(CPU_KEYSET, z, storage, offset, t.size(), t.stride())
    return z if _data_address(z) == base else t
