"""Data-movement kernels (the op table's ``NATIVE_OPS``): the device's copy engine, no compiler.

``cat``, ``index_select``, ``index_copy``, ``repeat_interleave``, ``arange``, ``clone``,
``fill_`` and ``zero_`` move or set bytes; they work for any dtype, skip the pre-dispatch
checks, never compile, and run *where their data is*: if any source holds its latest data on
the device (device-latest or synced) the op runs on the device (host-latest sources are pushed
first) and the result is device-latest; if every source is host-latest (a tensor just created
or filled from the host) the op runs on the host views and nothing crosses. ``fill_`` and
``zero_`` read nothing: they write on the device only into device-latest storage. Device-side batched
copies are accounted as the runtime's ``v2v_multi`` / ``v2v`` primitives.

A batched copy the runtime cannot plan (sources of different dtypes, or a CPU tensor among
rbln ones) falls back to a CPU op: ``bounce strided_v2v_cpu_fallback``, a WARNING, and with
``TORCH_RBLN_DISABLE_FALLBACK=strided_copy_error`` (read at each check) the error instead.
docs/eager.md ("Eager execution") (the routes table).
"""

from __future__ import annotations

import logging
import time
import warnings

import torch

from .. import config, events
from .. import user_frames
from ..runtime import devices
from ..runtime.storage import DEVICE, HOST, device_input, host_input, state_of
from . import factories, fallback, results
from .layout import spans_storage

_record = events.record
_perf_ns = time.perf_counter_ns
_log = logging.getLogger("torch_rbln")
_Tensor = torch.Tensor


class StridedCopyError(RuntimeError):
    """The runtime rejected a batched strided copy."""


def _rbln(t) -> bool:
    return isinstance(t, _Tensor) and t.device.type == "rbln"


def _on_device(tensors) -> bool:
    """Run on the device iff some source's latest data already is there."""
    for t in tensors:
        if _rbln(t) and t.numel() and state_of(t).residency != HOST:
            return True
    return False


def _dev(t):
    """``t`` as a CPU tensor over its device buffer (pushed first if host-latest)."""
    return device_input(t) if _rbln(t) else t


def _host(t):
    """``t`` as a CPU tensor over its host view (pulled first if device-latest)."""
    return host_input(t) if _rbln(t) else t


def _run(compute, sources, out, index, primitive="v2v_multi"):
    """``compute(view)`` on the side the sources' data is, delivered into ``out`` (or new)."""
    for t in sources:
        if _rbln(t) and t.device.index != index:
            raise devices.mixed_devices(index, t.device.index)
    if _on_device(sources):
        t0 = _perf_ns()
        res = compute(_dev)
        res = results.deliver_device(res, out, index)
        _record("runtime", primitive, _perf_ns() - t0)
        return res
    return results.deliver_host(compute(_host), out, index)


def _strided_fallback(op, args, kwargs, why: str, nbytes: int):
    # named after the out= overload the copy engine registers, as reports name device ops
    name = op.name() if op.name().endswith(".out") else op.name() + ".out"
    if "strided_copy_error" in config.live("TORCH_RBLN_DISABLE_FALLBACK"):
        raise StridedCopyError(f"{name}: batched strided copy failed: {why}")
    _record("v2v_reject", "dtype_mismatch" if "dtype" in why else "src_not_on_device", nbytes)
    _record("bounce", "strided_v2v_cpu_fallback", nbytes)
    _log.warning("%s: batched strided copy failed — falling back to CPU op. Underlying error: %s",
                 name, why)
    return fallback.run_on_cpu(op, args, kwargs)


def _index(ts, out=None) -> int:
    for t in ts:
        if _rbln(t):
            return t.device.index
    return out.device.index if out is not None else 0


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, _Tensor))


# ------------------------------------------------------------------------------------------
# kernels

def _cat(ts, dim, out, dtype):
    """``cat`` into ``out`` (or a new tensor when ``out`` is None) of ``dtype``."""
    srcs = [t for t in ts if t.numel()]
    if any(not _rbln(t) for t in ts) or any(t.dtype != dtype for t in srcs):
        why = ("source dtypes differ from the output dtype" if all(_rbln(t) for t in ts)
               else "a source is not an rbln tensor")
        op = torch.ops.aten.cat.out if out is not None else torch.ops.aten.cat.default
        return _strided_fallback(op, (ts, dim), {"out": out} if out is not None else {}, why,
                                 _nbytes(ts))
    return _run(lambda v: torch.cat([v(t) for t in ts], dim), srcs, out,
                _index(ts, out))


def cat_out(tensors, dim=0, *, out):
    return _cat(list(tensors), dim, out, out.dtype)


def cat(tensors, dim=0):
    ts = list(tensors)
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return _cat(ts, dim, None, dtype)


def index_select_out(self, dim, index, *, out):
    if not _rbln(self):
        return fallback.run_on_cpu(torch.ops.aten.index_select.out, (self, dim, index),
                                   {"out": out})
    return _run(lambda v: torch.index_select(v(self), dim, v(index)),
                [self], out, self.device.index)


def index_select(self, dim, index):
    return _run(lambda v: torch.index_select(v(self), dim, v(index)),
                [self], None, self.device.index)


def index_copy_out(self, dim, index, source, *, out):
    if not (_rbln(self) and _rbln(source)) or source.dtype != self.dtype:
        return _strided_fallback(torch.ops.aten.index_copy.out, (self, dim, index, source),
                                 {"out": out}, "source dtype differs from self", _nbytes([source]))
    return _run(lambda v: torch.index_copy(v(self), dim, v(index), v(source)),
                [self, source], out, self.device.index)


def index_copy_(self, dim, index, source):
    """In place: only the indexed slices move. (Through ``index_copy.out`` the whole of ``self``
    would be copied and delivered back: a paged KV cache for a few new tokens.)"""
    if not (_rbln(self) and _rbln(source)) or source.dtype != self.dtype:
        return _strided_fallback(torch.ops.aten.index_copy_.default, (self, dim, index, source),
                                 {}, "source dtype differs from self", _nbytes([source]))
    for t in (source, index):
        if _rbln(t) and t.device.index != self.device.index:
            raise devices.mixed_devices(self.device.index, t.device.index)
    b = state_of(self)
    if _on_device([self, source]):
        t0 = _perf_ns()
        src, ix = _dev(source), _dev(index)
        b.device_write(False)             # a host-latest self is pushed first (partial write)
        b.device_alias(self).index_copy_(dim, ix, src)
        _record("runtime", "v2v_multi", _perf_ns() - t0)
    else:
        src, ix = _host(source), _host(index)
        b.host_write(False)
        b.host_alias(self).index_copy_(dim, ix, src)
    return self


def repeat_interleave_tensor(repeats, *, output_size=None):
    return _run(lambda v: torch.repeat_interleave(v(repeats), output_size=output_size),
                [repeats], None, repeats.device.index)


def arange(*bounds, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.arange(..., device="rbln")`` (``end``, ``start, end`` or ``start, end, step``):
    the values made on the host, as the out= form below makes them into a fresh tensor,
    without its resize and copy."""
    index = device.index if device is not None and device.index is not None \
        else devices.current()
    return results.wrap_result(torch.arange(*bounds, dtype=dtype), index)


def arange_start_out(start, end, step=1, *, out):
    res = torch.arange(start, end, step, dtype=out.dtype)
    if res.numel() == out.numel():
        # as the CPU kernel: an out= of the right size keeps its shape (and its view's strides)
        res = res.view(out.shape)
    else:
        if out.numel():
            warnings.warn(
                f"The number of elements in the out tensor of shape {list(out.shape)} is "
                f"{out.numel()} which does not match the computed number of elements "
                f"{res.numel()}. Note that this may occur as a result of rounding error. The out "
                f"tensor will be resized to a tensor of shape ({res.numel()},).", UserWarning,
                stacklevel=user_frames.stacklevel())
        factories.resize_(out, res.shape)
    return _run(lambda v: res, [out], out, out.device.index, primitive="v2v")


def clone(self, *, memory_format=None):
    mf = torch.preserve_format if memory_format is None else memory_format
    if self.numel() == 0:
        return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype,
                                   device=self.device)
    return _run(lambda v: v(self).clone(memory_format=mf), [self], None,
                self.device.index, primitive="v2v")


def _fill(self, value):
    """Set every element of ``self`` on the side its storage's latest data is."""
    if self.numel() == 0:
        return self
    state = state_of(self)
    whole = spans_storage(self, state.nbytes)
    if state.residency == DEVICE:
        state.device_write(whole=whole)
        state.device_alias(self).fill_(value)
    else:                   # host-latest or synced: the host copy is current, write it there
        state.host_write(whole=whole)
        state.host_alias(self).fill_(value)
    return self


def fill_scalar(self, value):
    return _fill(self, value)


def fill_tensor(self, value):
    if value.dim() != 0:
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                           f"{value.dim()} dimensions.")
    return _fill(self, _host(value).item())


def zero_(self):
    return _fill(self, 0)


# served natively in their common case (csrc/DataMovement.cpp: every source an rbln tensor of
# one device and dtype, no listener); their kernels here take every other call, on PrivateUse2
NATIVE = ("cat",)


def register_native() -> set:
    """Put the native kernels in front of :data:`NATIVE`; returns the names whose Python kernel
    the caller registers on PrivateUse2."""
    from .. import _C
    _C.register_native_cat()
    return set(NATIVE)


KERNELS = {
    "cat.out": cat_out,
    "cat": cat,
    "index_select.out": index_select_out,
    "index_select": index_select,
    "index_copy.out": index_copy_out,
    "index_copy_": index_copy_,
    "repeat_interleave.Tensor": repeat_interleave_tensor,
    "arange.start_out": arange_start_out,
    "arange": arange,
    "arange.start": arange,
    "arange.start_step": arange,
    "clone": clone,
    "fill_.Scalar": fill_scalar,
    "fill_.Tensor": fill_tensor,
    "zero_": zero_,
}
