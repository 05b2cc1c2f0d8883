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
from ..runtime.storage import deliver_fresh as _deliver_fresh, state_of, wrap_host
from . import factories
from .layout import spans_storage

_Tensor = torch.Tensor


def wrap_result(x, index):
    """A fresh CPU result (host memory) as an rbln tensor, host-latest, no copy."""
    if isinstance(x, _Tensor):
        if not spans_storage(x):
            x = x.clone(memory_format=torch.contiguous_format)
        return wrap_host(x, index)
    if isinstance(x, (list, tuple)):
        return type(x)(wrap_result(v, index) for v in x)
    return x


def resize_out(out, result) -> None:
    """Resize an ``out=`` tensor to ``result``'s shape (and dense layout), warning as PyTorch's
    kernels do."""
    shape = result.shape
    if out.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
            f"This behavior is deprecated, and in a future PyTorch release outputs will not be "
            f"resized unless they have zero elements. You can explicitly reuse an out tensor t "
            f"by resizing it, inplace, to zero elements with t.resize_(0).", UserWarning,
            stacklevel=user_frames.stacklevel())
    factories.resize_like(out, result)


def deliver_host(result, out, index):
    """Make ``result`` (computed on the host) the data of ``out`` or of a new rbln tensor."""
    if out is None:
        return wrap_result(result, index)
    if out.shape != result.shape:
        resize_out(out, result)
    ob = state_of(out)
    ob.host_write(whole=spans_storage(out, ob.nbytes))
    ob.host_alias(out).copy_(result)
    return out


def deliver_device(result, out, index: int):
    """Make ``result`` (computed in device memory) the data of ``out`` or of a new rbln tensor."""
    if out is None:
        # a fresh kernel output (not a view) that spans its storage becomes the device memory
        # as it is; anything else is copied (natively: a multi-output program, attention's
        # nine, pays this per output)
        if isinstance(result, _Tensor):
            return _deliver_fresh(result, index)
        if isinstance(result, (list, tuple)):
            return type(result)([_deliver_fresh(r, index) if isinstance(r, _Tensor)
                                 else deliver_device(r, None, index) for r in result])
        return result
    if out.shape != result.shape:
        resize_out(out, result)
    ob = state_of(out)
    whole = spans_storage(out, ob.nbytes)
    if (whole and result.dtype == out.dtype and result.stride() == out.stride()
            and spans_storage(result)):
        ob.adopt_device(result)      # the result's memory is laid out as out's storage
    else:
        ob.device_write(whole=whole)
        ob.device_alias(out).copy_(result)
    return out
