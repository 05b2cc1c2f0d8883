"""Pre-dispatch checks: may this op instance run on the NPU? First failure wins.

Order (the reference's), each with the reason code that explain and the log report:

==  ===================  ============================  =========================================
#   check (DEV name)     reason code                   condition
==  ===================  ============================  =========================================
0   trace                ``trace``                     a Python trace function is active
1   dispatch_mode        ``dispatch-mode``             a TorchDispatchMode is active
2   dtype                ``dtype-not-fp16``            an operand dtype outside the catalog
                                                       ({float16, bfloat16}), or mixed dtypes
3   scalar               ``all-scalar inputs``         every tensor operand is 0-dim
4   storage_offset       ``storage-offset``            a contiguous operand starts at offset != 0
5   nan_inf              ``nan/inf input``             an operand holds NaN/Inf (host scan;
                                                       skipped with TORCH_RBLN_DEPLOY=ON)
6   reentrant            ``reentrant``                 already inside a device program
7   (performance)        ``last-dim-not-64-aligned``   a directly passed tensor has
                                                       ``shape[-1] % 64 != 0`` (TensorLists exempt)
8   (performance)        ``div-rounding-fp16``         fp16/bf16 ``div`` with trunc/floor rounding
==  ===================  ============================  =========================================

Checks 0-6 can be skipped with ``TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK`` (read on every
dispatch, warns once); 7-8 cannot (``TORCH_RBLN_DISPATCH_STRICT`` exempts dtypes from 7).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import warnings

import torch

from .. import config
from ..runtime.storage import buffer_of
from . import rules
from .copy import covers

_log = logging.getLogger("torch_rbln")

# per-thread count of device programs running (drives the ``reentrant`` check); the kernel
# in device_op.py raises and restores it around each program
_tls = threading.local()


_warned_dev = False
_len_dispatch_stack = torch._C._len_torch_dispatch_stack
_isfinite = math.isfinite
# the scan sums in a dtype wide enough that finite inputs never overflow: any NaN/Inf in the
# input, and only that, makes the sum non-finite (one host kernel instead of isfinite + all)
_SCAN_ACC = {torch.float16: torch.float32, torch.bfloat16: torch.float64,
             torch.float32: torch.float64, torch.float64: torch.float64}


def _disabled() -> frozenset:
    global _warned_dev
    d = config.live("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK")
    if d and not _warned_dev:
        _warned_dev = True
        warnings.warn("Enabling `TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK` may lead to unexpected "
                      "behavior. Do NOT use in production.", UserWarning, stacklevel=4)
    return d


def has_nonfinite(t: torch.Tensor) -> bool:
    """The host NaN/Inf scan of one operand: a physical d2h first if its data is on device.

    A storage scanned whole and found finite stays marked until its next write (the mark is
    cleared by every residency write transition), so unchanged weights are scanned once."""
    acc = _SCAN_ACC.get(t.dtype)
    if acc is None:
        return False            # bool and integer tensors never count
    if t.get_device() < 0:      # not an rbln tensor
        return not _isfinite(t.sum(dtype=acc).item())
    buf = buffer_of(t)
    if buf.scanned is t.dtype:
        return False
    buf.host_read()
    whole = covers(t, buf)
    h = buf._flat(buf.host, buf._hflat, t.dtype)[: buf.nbytes // t.itemsize] if whole \
        else buf.host_alias(t)
    bad = not _isfinite(h.sum(dtype=acc).item())
    if whole and not bad:
        buf.scanned = t.dtype
    return bad


def _nonfinite_scalar(op_args, scalars) -> bool:
    for v in op_args:
        if type(v) is float and not _isfinite(v):
            return True
    for s in scalars:
        if s.is_floating_point() and not _isfinite(s.item()):
            return True
    return False


# Both live variables are read on every dispatch; while a variable is unset (the common case)
# that costs one lookup in the environment's own mapping.
_ENV = getattr(os.environ, "_data", None)
_DEV_KEY, _DEPLOY_KEY = b"TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK", b"TORCH_RBLN_DEPLOY"


def _deploy() -> bool:
    if _ENV is not None and _DEPLOY_KEY not in _ENV:
        return False
    return config.live("TORCH_RBLN_DEPLOY")


def check(entry, tensors: list, dtype_tensors: list, scalars: list, op_args, kwargs) -> str | None:
    """The reason this op instance cannot run on the NPU, or None.

    ``tensors``: the rbln tensor operands, passed directly (TensorLists are not operands here,
    which also exempts them from the 64-alignment rule); ``dtype_tensors``: the operands the
    dtype check sees; ``scalars``: wrapped Python scalars (CPU 0-dim tensors)."""
    if _ENV is None or _DEV_KEY in _ENV:
        off = _disabled()
        if off:
            return _check_slow(entry, tensors, dtype_tensors, scalars, op_args, kwargs, off)
    if sys.gettrace() is not None:
        return "trace"
    if _len_dispatch_stack():
        return "dispatch-mode"
    if dtype_tensors:
        d0 = dtype_tensors[0].dtype
        if d0 not in rules.DISPATCH_DTYPES:
            return "dtype-not-fp16"
        for t in dtype_tensors:
            if t.dtype is not d0:
                return "dtype-not-fp16"
    # one pass gathers what the scalar, offset and 64-alignment rules need (reported in order)
    scalar_only, offset, unaligned = True, False, False
    align = entry.align64
    for t in tensors:
        if t.dim():
            scalar_only = False
            if align and t.size(-1) % 64 and t.dtype not in rules.STRICT_DTYPES:
                unaligned = True
        if t.storage_offset() and t.is_contiguous():
            offset = True
    if scalar_only:
        return "all-scalar inputs"
    if offset:
        return "storage-offset"
    if not _deploy():
        for t in tensors:
            # a storage already scanned whole and found finite (see has_nonfinite) skips the call
            buf = getattr(t.untyped_storage(), "_rbln", None)
            if (buf is None or buf.scanned is not t.dtype) and has_nonfinite(t):
                return "nan/inf input"
        if _nonfinite_scalar(op_args, scalars):
            return "nan/inf input"
    if getattr(_tls, "depth", 0):
        _log.warning("Unexpected CPU fallback: reentrant dispatch (already inside RBLN compile op)")
        return "reentrant"
    if unaligned:
        return "last-dim-not-64-aligned"
    return _div_rule(entry, tensors, kwargs)


def _check_slow(entry, tensors, dtype_tensors, scalars, op_args, kwargs, off) -> str | None:
    if "trace" not in off and sys.gettrace() is not None:
        return "trace"
    if "dispatch_mode" not in off and _len_dispatch_stack():
        return "dispatch-mode"
    if "dtype" not in off and dtype_tensors:
        d0 = dtype_tensors[0].dtype
        if d0 not in rules.DISPATCH_DTYPES or any(t.dtype is not d0 for t in dtype_tensors):
            return "dtype-not-fp16"
    if "scalar" not in off and all(t.dim() == 0 for t in tensors):
        return "all-scalar inputs"
    if "storage_offset" not in off and any(t.storage_offset() and t.is_contiguous() for t in tensors):
        return "storage-offset"
    if "nan_inf" not in off and not _deploy():
        if any(has_nonfinite(t) for t in tensors) or _nonfinite_scalar(op_args, scalars):
            return "nan/inf input"
    if "reentrant" not in off and getattr(_tls, "depth", 0):
        _log.warning("Unexpected CPU fallback: reentrant dispatch (already inside RBLN compile op)")
        return "reentrant"
    return _perf_rules(entry, tensors, op_args, kwargs)


def _perf_rules(entry, direct, op_args, kwargs) -> str | None:
    if entry.align64:
        for t in direct:
            if t.dim() and t.shape[-1] % 64 and t.dtype not in rules.STRICT_DTYPES:
                return "last-dim-not-64-aligned"
    return _div_rule(entry, direct, kwargs)


def _div_rule(entry, direct, kwargs) -> str | None:
    if entry.name == "div.out_mode":
        mode = kwargs.get("rounding_mode")
        if mode in ("trunc", "floor") and any(t.dtype in (torch.float16, torch.bfloat16) for t in direct):
            return "div-rounding-fp16"
    return None
