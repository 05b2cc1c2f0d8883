"""Result delivery: how a computed result becomes the caller's rbln tensor.

A device program's result is already in device memory: it becomes the device buffer of a new
rbln tensor (or of the ``out=`` tensor) without a copy. A result computed on the host (a fast
CPU fallback, a host-side data movement) becomes the host view of a new rbln tensor, or is
written into the ``out=`` tensor's host view.
"""

from __future__ import annotations

import warnings

import torch

from .. import user_frames
from ..runtime.storage import buffer_of, new_device_tensor, wrap_host
from . import factories
from .copy import covers

_Tensor = torch.Tensor


def owned_nbytes(x: torch.Tensor) -> int | None:
    """The size of ``x``'s storage if ``x`` spans exactly all of it (dense, offset 0, so it
    can become a buffer as is), else None."""
    n = x.untyped_storage().nbytes()
    if (x.storage_offset() == 0 and n == x.numel() * x.itemsize
            and (x.is_contiguous() or 0 not in x.stride())):
        return n
    return None


def wrap_result(x, index):
    """A fresh CPU result (host memory) as an rbln tensor, host-latest, no copy."""
    if isinstance(x, _Tensor):
        if owned_nbytes(x) is None:
            x = x.clone(memory_format=torch.contiguous_format)
        return wrap_host(x, index)
    if isinstance(x, (list, tuple)):
        return type(x)(wrap_result(v, index) for v in x)
    return x


def resize_out(out, shape) -> None:
    """Resize an ``out=`` tensor to the result's shape, warning as PyTorch's kernels do."""
    if out.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
            f"This behavior is deprecated, and in a future PyTorch release outputs will not be "
            f"resized unless they have zero elements. You can explicitly reuse an out tensor t "
            f"by resizing it, inplace, to zero elements with t.resize_(0).", UserWarning,
            stacklevel=user_frames.stacklevel())
    factories.resize_(out, shape)


def deliver_host(result, out, index):
    """Make ``result`` (computed on the host) the data of ``out`` or of a new rbln tensor."""
    if out is None:
        return wrap_result(result, index)
    if out.shape != result.shape:
        resize_out(out, result.shape)
    ob = buffer_of(out)
    ob.host_write(whole=covers(out, ob))
    ob.host_alias(out).copy_(result)
    return out


def deliver_device(result, out, index: int):
    """Make ``result`` (computed in device memory) the data of ``out`` or of a new rbln tensor."""
    if out is None:
        if isinstance(result, _Tensor):
            # a fresh kernel output owns its storage (dense, offset 0); anything else is copied
            nbytes = owned_nbytes(result) if result._base is None else None
            if nbytes is None:
                result = result.clone(memory_format=torch.contiguous_format)
                nbytes = result.numel() * result.itemsize
            return new_device_tensor(result, nbytes, index)
        if isinstance(result, (list, tuple)):
            return type(result)(deliver_device(r, None, index) for r in result)
        return result
    if out.shape != result.shape:
        resize_out(out, result.shape)
    ob = buffer_of(out)
    if (result.dtype == out.dtype and result.storage_offset() == 0 and result.is_contiguous()
            and covers(out, ob) and result.untyped_storage().nbytes() == ob.nbytes):
        ob.adopt_device(result)
    else:
        ob.device_write(whole=covers(out, ob))
        ob.device_alias(out).copy_(result)
    return out
