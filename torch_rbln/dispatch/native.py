"""Native data-movement kernels: the device's copy engine, no compiler involved.

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
"""

from __future__ import annotations

import logging
import time

import torch

from .. import config, events
from ..runtime import devices
from ..runtime.storage import DEVICE, HOST, buffer_of
from . import device_op, factories, fallback
from .copy import covers

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
        if _rbln(t) and t.numel() and buffer_of(t).state != HOST:
            return True
    return False


def _dev(t):
    if not _rbln(t):
        return t
    b = buffer_of(t)
    b.device_read()
    return b.device_input(t)


def _host(t):
    if not _rbln(t):
        return t
    b = buffer_of(t)
    b.host_read()
    return b.host_alias(t)


def _run(name, compute, sources, out, index, primitive="v2v_multi"):
    """``compute(view)`` on the side the sources' data is, delivered into ``out`` (or new)."""
    for t in sources:
        if _rbln(t) and t.device.index != index:
            raise devices.mixed_devices(index, t.device.index)
    if _on_device(sources):
        t0 = _perf_ns()
        res = compute(_dev)
        res = device_op._deliver_device(res, out, index)
        _record("runtime", primitive, _perf_ns() - t0)
        return res
    return device_op._deliver_host(compute(_host), out, index)


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
    return _run("cat", lambda v: torch.cat([v(t) for t in ts], dim), srcs, out,
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
    return _run("index_select", lambda v: torch.index_select(v(self), dim, v(index)),
                [self], out, self.device.index)


def index_select(self, dim, index):
    return _run("index_select", lambda v: torch.index_select(v(self), dim, v(index)),
                [self], None, self.device.index)


def index_copy_out(self, dim, index, source, *, out):
    if not (_rbln(self) and _rbln(source)) or source.dtype != self.dtype:
        return _strided_fallback(torch.ops.aten.index_copy.out, (self, dim, index, source),
                                 {"out": out}, "source dtype differs from self", _nbytes([source]))
    return _run("index_copy", lambda v: torch.index_copy(v(self), dim, v(index), v(source)),
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
    b = buffer_of(self)
    if _on_device([self, source]):
        t0 = _perf_ns()
        src, ix = _dev(source), _dev(index)
        b.device_write()                  # a host-latest self is pushed first (partial write)
        b.device_alias(self).index_copy_(dim, ix, src)
        _record("runtime", "v2v_multi", _perf_ns() - t0)
    else:
        src, ix = _host(source), _host(index)
        b.host_write()
        b.host_alias(self).index_copy_(dim, ix, src)
    return self


def repeat_interleave_tensor(repeats, *, output_size=None):
    return _run("repeat_interleave",
                lambda v: torch.repeat_interleave(v(repeats), output_size=output_size),
                [repeats], None, repeats.device.index)


def arange_start_out(start, end, step=1, *, out):
    return _run("arange", lambda v: torch.arange(start, end, step, dtype=out.dtype),
                [out], out, out.device.index, primitive="v2v")


def clone(self, *, memory_format=None):
    mf = torch.preserve_format if memory_format is None else memory_format
    if self.numel() == 0:
        return factories.empty_strided(self.shape, self.stride(), dtype=self.dtype,
                                       device=self.device)
    return _run("clone", lambda v: v(self).clone(memory_format=mf), [self], None,
                self.device.index, primitive="v2v")


def _fill(self, value):
    """Set every element of ``self`` on the side its storage's latest data is."""
    if self.numel() == 0:
        return self
    buf = buffer_of(self)
    whole = covers(self, buf)
    if buf.state == DEVICE:
        buf.device_write(whole=whole)
        buf.device_alias(self).fill_(value)
    else:                   # host-latest or synced: the host copy is current, write it there
        buf.host_write(whole=whole)
        buf.host_alias(self).fill_(value)
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


KERNELS = {
    "cat.out": cat_out,
    "cat": cat,
    "index_select.out": index_select_out,
    "index_select": index_select,
    "index_copy.out": index_copy_out,
    "index_copy_": index_copy_,
    "repeat_interleave.Tensor": repeat_interleave_tensor,
    "arange.start_out": arange_start_out,
    "clone": clone,
    "fill_.Scalar": fill_scalar,
    "fill_.Tensor": fill_tensor,
    "zero_": zero_,
}
