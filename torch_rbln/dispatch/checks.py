"""The pre-dispatch checks of an eager device op: :data:`rules.RULES` in the form that runs on
every call.

:func:`check` asks the same rules in the same order as :func:`rules.first_failure`, inlined
into one pass over the operands (a test holds the two equal on random inputs). With
``TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK`` set (read on every dispatch, warns once) the rules it
names are skipped and the rule set runs as it is written. The rules and their reason codes:
docs/eager.md ("Pre-dispatch checks").
"""

from __future__ import annotations

import sys
import warnings

import torch

from .. import config
from ..runtime.storage import known_finite
from . import rules
from .rules import Operands, first_failure, has_nonfinite, nonfinite_scalar, reentrant

_warned_dev = False
_len_dispatch_stack = torch._C._len_torch_dispatch_stack
_live = config.live


def _disabled() -> frozenset:
    global _warned_dev
    d = _live("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK")
    if d and not _warned_dev:
        _warned_dev = True
        warnings.warn("Enabling `TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK` may lead to unexpected "
                      "behavior. Do NOT use in production.", UserWarning, stacklevel=4)
    return d


def check(entry, tensors: list, dtype_tensors: list, scalars: list, op_args, kwargs) -> str | None:
    """The reason this op instance cannot run on the NPU, or None (the operands as
    :class:`rules.Operands` holds them)."""
    off = _disabled()
    if off:
        return first_failure(Operands(entry, tensors, dtype_tensors, scalars, op_args, kwargs),
                             skip=off)
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
    if not _live("TORCH_RBLN_DEPLOY"):
        for t in tensors:
            # a storage already scanned whole and found finite (see has_nonfinite) skips the call
            if not known_finite(t) and has_nonfinite(t):
                return "nan/inf input"
        if nonfinite_scalar(op_args, scalars):
            return "nan/inf input"
    if reentrant():
        return "reentrant"
    if unaligned:
        return "last-dim-not-64-aligned"
    if entry.name == "div.out_mode" and kwargs.get("rounding_mode") in ("trunc", "floor"):
        for t in tensors:
            if t.dtype in rules.HALF:
                return "div-rounding-fp16"
    return None
