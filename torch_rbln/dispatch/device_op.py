"""The kernel every device-table op runs: checks -> program cache -> execute, or CPU fallback.

Hot path per call: one ``dispatch`` event, the pre-dispatch checks, a cache key built from the
arguments' metadata, a dict lookup, the program on device buffers, and the residency update of
the output (the program's result becomes the output's device buffer when it covers it).
"""

from __future__ import annotations

import time

import torch

from .. import config, events
from ..runtime import compiler
from ..runtime.storage import DEVICE, buffer_of, new_tensor
from . import checks, fallback
from .copy import covers
from .optable import OpEntry

_record = events.record
_perf_ns = time.perf_counter_ns


def _sig(v, ids: dict):
    """Cache-key signature of one argument: tensor metadata, typed scalars, alias pattern."""
    if isinstance(v, torch.Tensor):
        first = ids.setdefault(id(v), len(ids))
        return (v.shape, v.dtype, v.is_contiguous(), v.device.type == "rbln", first)
    if isinstance(v, (bool, int, float)):
        return (type(v), v)
    if isinstance(v, (list, tuple)):
        return tuple(_sig(x, ids) for x in v)
    return v if v is None or isinstance(v, (str, torch.dtype)) else repr(v)


def _host_fast_path(fn, args, kwargs, out, index):
    """The host fast path of a fallback: compute on the host views directly."""
    host_args = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "rbln":
            b = buffer_of(a)
            b.host_read()
            a = b.host_alias(a)
        host_args.append(a)
    result = fn(*host_args, **kwargs)
    return _deliver_host(result, out, index)


def _deliver_host(result, out, index):
    if out is None:
        from ..runtime.storage import wrap_host
        if not result.is_contiguous() or result.storage_offset():
            result = result.contiguous().clone() if result.storage_offset() else result.contiguous()
        return wrap_host(result, index)
    if out.shape != result.shape:
        from .factories import resize_
        resize_(out, result.shape)
    ob = buffer_of(out)
    ob.host_write(whole=covers(out, ob))
    ob.host_alias(out).copy_(result)
    return out


def make_kernel(entry: OpEntry):
    op_name = "aten::" + entry.name
    packet, _, ov = entry.name.partition(".")
    registered = getattr(getattr(torch.ops.aten, packet), ov or "default")
    fpacket, _, fov = entry.fn.partition(".")
    fn = getattr(getattr(torch.ops.aten, fpacket), fov or "default")
    mode = entry.out
    # name of the kwarg-only output (`out`, or `grad_input` for backward kernels)
    out_name = next((a.name for a in registered._schema.arguments if a.kwarg_only and a.alias_info
                     and a.alias_info.is_write), "out")
    skip = entry.skip_dtype
    fast = entry.fast_path

    def run_fallback(reason, args, kwargs, out, index):
        _record("cpu_fallback_reason", reason)
        t0 = _perf_ns()
        try:
            if fast:
                res = _host_fast_path(fn, args, kwargs, out, index)
            else:
                full = dict(kwargs)
                if out is not None and mode == "out":
                    full[out_name] = out
                res = fallback.run_on_cpu(registered, args, full)
        finally:
            _record("cpu_fallback", op_name, _perf_ns() - t0)
        return res

    def kernel(*args, **kwargs):
        _record("dispatch", op_name)
        out = kwargs.pop(out_name, None) if mode == "out" else None
        if mode == "inplace":
            out = args[0]
        tensors, dtype_tensors, index = [], [], None
        empty = False
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type == "rbln":
                    tensors.append(a)
                    if index is None:
                        index = a.device.index
                elif a.dim() == 0:
                    continue          # a CPU 0-dim tensor is a scalar operand
                if i not in skip:
                    dtype_tensors.append(a)
                if a.numel() == 0:
                    empty = True
        if index is None:
            index = out.device.index if out is not None else 0
        if empty:
            # empty tensors are handled on the host; nothing reaches the device
            full = dict(kwargs)
            if out is not None and mode == "out":
                full[out_name] = out
            return fallback.run_on_cpu(registered, args, full)
        reason = checks.check(entry, tensors, dtype_tensors, tensors, args, kwargs)
        if reason is not None:
            return run_fallback(reason, args, kwargs, out, index)

        ids: dict = {}
        key = (op_name, index, tuple(_sig(a, ids) for a in args),
               tuple((k, _sig(v, ids)) for k, v in kwargs.items()) if kwargs else ())
        prog = compiler.lookup(key)
        if prog is None:
            try:
                prog = compiler.compile_op(op_name, fn, key, args, kwargs, lambda: fn)
            except compiler.CompileError:
                if "compile_error" in config.live("TORCH_RBLN_DISABLE_FALLBACK"):
                    raise
                return run_fallback("compile-error", args, kwargs, out, index)
        else:
            _record("warm_hit", op_name)

        dev_args = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == "rbln":
                b = buffer_of(a)
                b.device_read()
                a = b.device_alias(a)
            dev_args.append(a)
        with checks.inside_program():
            result = prog.run(*dev_args, **kwargs)
        return _deliver_device(result, out, index)

    kernel.__name__ = f"rbln_{packet}_{ov or 'default'}"
    return kernel


def _deliver_device(result: torch.Tensor, out, index: int):
    """Make ``result`` (computed in device memory) the data of ``out`` or of a new rbln tensor."""
    if not isinstance(result, torch.Tensor):
        return result
    if out is None:
        t = new_tensor(tuple(result.shape), _contig(result.shape), result.dtype, index)
        buf = buffer_of(t)
        if not result.is_contiguous() or result.storage_offset():
            result = result.contiguous().clone()
        buf.adopt_device(result)
        return t
    if out.shape != result.shape:
        from .factories import resize_
        resize_(out, result.shape)
    ob = buffer_of(out)
    if (result.dtype == out.dtype and result.is_contiguous() and result.storage_offset() == 0
            and covers(out, ob)):
        ob.adopt_device(result)
    else:
        ob.device_write(whole=covers(out, ob))
        ob.device_alias(out).copy_(result)
    return out


def _contig(shape) -> tuple:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def kernels() -> dict:
    from .optable import DEVICE_OPS
    return {e.name: make_kernel(e) for e in DEVICE_OPS}
