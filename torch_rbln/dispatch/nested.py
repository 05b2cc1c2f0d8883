"""Nested tensors (``torch.nested``, the strided layout) on rbln.

A nested rbln tensor is PyTorch's ``NestedTensorImpl`` over an rbln storage, as on CUDA: its
buffer (every component's elements, one storage) is rbln memory with the usual residency, its
metadata (nested sizes, strides, storage offsets) small CPU tensors. Ops on it dispatch to the
``NestedTensorPrivateUse1`` key, where two routes serve them:

* :data:`ON_RBLN` (metadata, views, ``empty_like``, ``clone``, ``copy_``, ``_to_copy``):
  PyTorch's own nested kernel runs on the rbln tensor itself (a redispatch to
  ``NestedTensorCPU``, as the dense views do). It touches only metadata and does its work on the
  buffer with dense ops (a view, an allocation, ``clone``, a copy through the copy engine), which
  the dense rbln kernels serve with their usual events: ``nt.cpu()`` is a ``d2h`` as ``t.cpu()``.
* every other op (arithmetic, ``linear``, ``bmm``, softmax, ``to_padded_tensor``, the
  transformer fast path's fused ops): the CPU nested kernel, run by the boxed CPU fallback
  (``fallback.py``) on a CPU nested tensor over the buffer's host view (:func:`host_view`); its
  results come back as rbln nested tensors (:func:`to_rbln`). A ``host_op`` in the fallback log
  and for ``torch.rbln.guard``, with the reads, writes and transfers of any other host op.
"""

from __future__ import annotations

import torch

from ..runtime.storage import CPU_KEYSET
from .results import wrap_result

NESTED_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.NestedTensorCPU)

_aten = torch.ops.aten
_sizes = _aten._nested_tensor_size.default._handle
_strides = _aten._nested_tensor_strides.default._handle
_offsets = _aten._nested_tensor_storage_offsets.default._handle
_values = _aten.values.default._handle
_from_buffer = _aten._nested_view_from_buffer.default._handle
_as_strided = _aten.as_strided.default._handle
_empty_like = _aten.empty_like.default._handle

# overloads whose nested kernel only rewrites metadata, or works on the buffer through dense ops
# (which reach rbln's dense kernels); each runs on the rbln tensor itself
ON_RBLN = (
    "_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets",
    "values", "alias", "detach", "view", "transpose.int", "unsqueeze", "squeeze",
    "squeeze.dim", "squeeze.dims", "select.int", "narrow", "unbind.int", "chunk",
    "split_with_sizes", "is_same_size", "is_pinned", "empty_like", "clone", "copy_",
    "_to_copy",
)

# overloads with a CompositeImplicitAutograd kernel beside their nested one: that kernel would
# serve NestedTensorPrivateUse1 before the catch-all does (and fail on the nested tensor's
# sizes), so they are registered on the key to take the CPU fallback like every other op
ON_HOST = ("linear", "matmul", "matmul.out", "silu_backward", "value_selecting_reduction_backward")


def _metadata(t: torch.Tensor) -> tuple:
    """(nested sizes, nested strides, storage offsets) of a nested tensor on either side."""
    return (_sizes.redispatch_boxed(NESTED_CPU_KEYSET, t),
            _strides.redispatch_boxed(NESTED_CPU_KEYSET, t),
            _offsets.redispatch_boxed(NESTED_CPU_KEYSET, t))


def storage_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of nested ``t`` as a flat dense tensor on ``t``'s device (a view)."""
    return _values.redispatch_boxed(NESTED_CPU_KEYSET, t)


def _view_over(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A nested tensor with ``like``'s metadata over flat ``buffer``'s storage (the storage
    offsets count from the storage's start)."""
    meta = _metadata(like)
    if meta[0].dim() != 2:
        # no components (``nested_tensor([])``: 0-dim sizes, which the view constructor refuses):
        # nothing to share, an empty one on the buffer's side does
        return _empty_like.redispatch_boxed(NESTED_CPU_KEYSET, like, device=buffer.device)
    return _from_buffer.redispatch_boxed(CPU_KEYSET, buffer, *meta)


def host_view(t: torch.Tensor, state) -> torch.Tensor:
    """A CPU nested tensor over the host view of rbln nested ``t``'s storage (``state``: its
    StorageState, which the caller has read on the host)."""
    return _view_over(state.host_flat(t.dtype), t)


def view_of(x: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """CPU result ``x``, a view of rbln ``owner``'s host memory (one of the two nested), as the
    same view of ``owner``'s rbln storage."""
    if owner.is_nested:
        base = storage_tensor(owner)
    else:
        base = _as_strided.redispatch_boxed(
            CPU_KEYSET, owner, (owner.untyped_storage().nbytes() // owner.element_size(),), (1,), 0)
    if x.is_nested:
        return _view_over(base, x)
    return _as_strided.redispatch_boxed(CPU_KEYSET, base, x.size(), x.stride(), x.storage_offset())


def to_rbln(x: torch.Tensor, index: int) -> torch.Tensor:
    """A fresh CPU nested result as an rbln nested tensor: its storage becomes the host view of
    a new rbln storage (host-latest, no copy), its metadata is kept."""
    return _view_over(wrap_result(storage_tensor(x), index), x)


def kernels(host_op) -> dict:
    """The kernels registered on ``NestedTensorPrivateUse1``: :data:`ON_RBLN` redispatched to
    the nested kernel, :data:`ON_HOST` handed to ``host_op(op, *args, **kwargs)`` (the CPU
    fallback, which serves every other op as the key's catch-all)."""
    from .optable import overload

    def on_rbln(handle):
        return lambda *a, **k: handle.redispatch_boxed(NESTED_CPU_KEYSET, *a, **k)

    def on_host(op):
        return lambda *a, **k: host_op(op, *a, **k)

    out = {name: on_rbln(overload(name)._handle) for name in ON_RBLN}
    out.update({name: on_host(overload(name)) for name in ON_HOST})
    return out
