"""May this op instance run on the device? The one rule set of the pre-dispatch checks.

Eager dispatch (``checks.py``, per call) and graph placement (``graph/placement.py``, per
node) both ask these rules. An op-specific gate (:data:`GATES`, the reference's kernel-level
checks) runs first, then :data:`RULES` in order; the first failure sends the op to the CPU and
its reason code is what explain and the log report. The order, reason codes and skip names are
the table of docs/eager.md ("Pre-dispatch checks"); a test keeps the two equal.

A graph decides only the rules that depend on metadata a trace fixes (``Rule.graph``): thread
state (trace, dispatch mode, reentrancy) means nothing for a compiled graph, and storage
offsets and tensor contents are not known when it compiles.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from .. import _C, config
from .optable import OpEntry

_log = logging.getLogger("torch_rbln")

# ------------------------------------------------------------------------------------------
# the dtype catalog (TORCH_RBLN_DISPATCH_DTYPES / _STRICT are read when the extension loads)

DISPATCH_DTYPES: frozenset = frozenset()
STRICT_DTYPES: frozenset = frozenset()
HALF = (torch.float16, torch.bfloat16)


def configure() -> None:
    global DISPATCH_DTYPES, STRICT_DTYPES
    DISPATCH_DTYPES = frozenset({*HALF, *(getattr(torch, n) for n in
                                           config.latched("TORCH_RBLN_DISPATCH_DTYPES"))})
    STRICT_DTYPES = frozenset(getattr(torch, n) for n in config.latched("TORCH_RBLN_DISPATCH_STRICT"))


# ------------------------------------------------------------------------------------------
# the operands a rule looks at

@dataclass
class Operands:
    """One op instance as the rules see it.

    ``tensors``: the rbln tensors passed directly (TensorList arguments are not operands, which
    also exempts them from the 64-alignment rule); ``dtype_tensors``: the tensors the dtype rule
    sees (the op table's ``skip_dtype`` positions excluded); ``scalars``: wrapped Python scalars
    (CPU 0-dim tensors)."""
    entry: OpEntry
    tensors: list
    dtype_tensors: list
    scalars: list
    args: tuple
    kwargs: dict


def tensor_slots(entry: OpEntry, op: torch._ops.OpOverload) -> tuple:
    """Positions of the tensors the rules see: the entry's ``operands``, else every positional
    ``Tensor`` / ``Tensor?`` argument of ``op``'s schema."""
    return entry.operands or tuple(
        i for i, a in enumerate(op._schema.arguments) if not a.kwarg_only
        and "Tensor" in str(a.type) and "[]" not in str(a.type))


def classify(entry: OpEntry, slots: tuple, args, kwargs) -> Operands:
    """Sort ``args`` into :class:`Operands` (real tensors, or a graph's traced values)."""
    tensors, dtype_tensors, scalars = [], [], []
    for i in slots:
        if i >= len(args):
            break
        a = args[i]
        if not isinstance(a, torch.Tensor):
            continue
        if a.device.type == "rbln":
            tensors.append(a)
        elif a.dim() == 0:
            scalars.append(a)
            continue
        if i not in entry.skip_dtype:
            dtype_tensors.append(a)
    return Operands(entry, tensors, dtype_tensors, scalars, tuple(args), dict(kwargs))


# ------------------------------------------------------------------------------------------
# the rules

@dataclass(frozen=True)
class Rule:
    reason: str                         # the reason code reports show
    fails: Callable[[Operands], bool]
    skip: str = ""      # its name in TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK ("": not skippable)
    graph: bool = False  # decidable from a traced graph


# per-thread count of device programs running (the ``reentrant`` rule), kept by the native core:
# both the Python kernel and the native warm path raise and restore it around each program
_program_depth = _C.program_depth

_len_dispatch_stack = torch._C._len_torch_dispatch_stack
_isfinite = math.isfinite
_aminmax = torch.aminmax
# the dtypes the scan looks at (bool, integer and complex tensors never count)
_SCANNED = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def has_nonfinite(t: torch.Tensor) -> bool:
    """The NaN/Inf scan of one operand: one min/max pass in its own dtype (a NaN propagates to
    both, an infinity is one of them), nothing converted or allocated.

    For an rbln tensor (in the native core, which the warm path calls too) a device-latest
    storage records its physical d2h and becomes host-readable as a host read makes it, but
    the scan reads the device bytes in place: the copy itself waits until the host view is
    read. A storage scanned whole and found finite stays marked until its next write, so
    unchanged weights are scanned once."""
    if t.dtype not in _SCANNED or t.numel() == 0:
        return False
    if t.get_device() < 0:      # not an rbln tensor
        lo, hi = _aminmax(t)
        return not (_isfinite(lo.item()) and _isfinite(hi.item()))
    return _C.has_nonfinite(t)


def nonfinite_scalar(args, scalars) -> bool:
    """A Python float argument or a wrapped scalar is NaN/Inf."""
    for v in args:
        if type(v) is float and not _isfinite(v):
            return True
    for s in scalars:
        if s.is_floating_point() and not _isfinite(s.item()):
            return True
    return False


def reentrant() -> bool:
    if _program_depth():
        _log.warning("Unexpected CPU fallback: reentrant dispatch (already inside RBLN compile op)")
        return True
    return False


def aligned(extent) -> bool:
    """``extent % 64 == 0``. A dynamic extent (a graph compiled with ``dynamic=True``) counts
    as aligned: the rule is a performance rule, and deciding it would specialise the graph."""
    return isinstance(extent, torch.SymInt) or extent % 64 == 0


def _dtype(o: Operands) -> bool:
    ts = o.dtype_tensors
    if not ts:
        return False
    d0 = ts[0].dtype
    return d0 not in DISPATCH_DTYPES or any(t.dtype is not d0 for t in ts)


def _unaligned(o: Operands) -> bool:
    return o.entry.align64 and any(
        t.dim() and not aligned(t.shape[-1]) and t.dtype not in STRICT_DTYPES for t in o.tensors)


def _div_rounding(o: Operands) -> bool:
    return (o.entry.name == "div.out_mode" and o.kwargs.get("rounding_mode") in ("trunc", "floor")
            and any(t.dtype in HALF for t in o.tensors))


RULES: tuple[Rule, ...] = (
    Rule("trace", lambda o: sys.gettrace() is not None, "trace"),
    Rule("dispatch-mode", lambda o: _len_dispatch_stack() > 0, "dispatch_mode"),
    Rule("dtype-not-fp16", _dtype, "dtype", graph=True),
    Rule("all-scalar inputs", lambda o: all(t.dim() == 0 for t in o.tensors), "scalar", graph=True),
    Rule("storage-offset", lambda o: any(t.storage_offset() and t.is_contiguous()
                                         for t in o.tensors), "storage_offset"),
    Rule("nan/inf input", lambda o: not config.live("TORCH_RBLN_DEPLOY") and (
        any(has_nonfinite(t) for t in o.tensors) or nonfinite_scalar(o.args, o.scalars)),
        "nan_inf"),
    Rule("reentrant", lambda o: reentrant(), "reentrant"),
    Rule("last-dim-not-64-aligned", _unaligned, graph=True),
    Rule("div-rounding-fp16", _div_rounding, graph=True),
)
GRAPH_RULES = tuple(r for r in RULES if r.graph)
# what a graph node is checked against: the compiler pads an unaligned last dim at the
# partition's boundary instead of running the op on the host (``compiler_optable.LAST_DIM``)
COMPILER_RULES = tuple(r for r in GRAPH_RULES if r.reason != "last-dim-not-64-aligned")


def first_failure(o: Operands, rules: tuple = RULES, skip: frozenset = frozenset()) -> str | None:
    """The reason code of the first rule ``o`` fails (rules named in ``skip`` are not asked),
    or None: the op may run on the device."""
    for r in rules:
        if r.skip not in skip and r.fails(o):
            return r.reason
    return None


# -------------------------------------------------------------------------------------------
# op-specific gates, evaluated before the rules (the reference's kernel-level checks)

def sdpa_unsupported(q, k, v, attn_bias) -> str | None:
    """Why the device attention kernel cannot take these inputs (``can_use_rbln_sdpa``)."""
    if q.dim() < 3:
        return "dim < 3 not supported"
    if q.dim() > 4:
        return "dim > 4 not supported"
    if q.is_nested:
        return "nested tensors not supported"
    if q.dtype not in HALF:
        return f"dtype {q.dtype} not supported"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return "q/k/v dtypes differ"
    if q.shape[-3] % k.shape[-3] or k.shape[-3] != v.shape[-3]:
        return "GQA head counts not divisible"
    if q.numel() == 0 or k.numel() == 0:
        return "empty input"
    if attn_bias is not None and attn_bias.dim() not in (2, 3, 4):
        return f"mask dim {attn_bias.dim()} not supported"
    if q.shape[-1] % 32:
        return f"head_dim {q.shape[-1]} not aligned to 32"
    if q.shape[-2] % 32:
        return f"query sequence length {q.shape[-2]} not aligned to 32"
    if k.shape[-2] % 32:
        return f"key sequence length {k.shape[-2]} not aligned to 32"
    return None


def _sdpa_gate(args, kwargs):
    q, k, v = args[:3]
    bias = args[3] if len(args) > 3 else kwargs.get("attn_bias")
    why = sdpa_unsupported(q, k, v, bias)
    return None if why is None else f"sdpa: {why}"


def _sdpa_backward_gate(args, kwargs):
    why = sdpa_unsupported(args[1], args[2], args[3], args[4])
    return None if why is None else f"sdpa_backward: {why}"


GATES = {
    "_scaled_dot_product_fused_attention_overrideable": _sdpa_gate,
    "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward_gate,
}


def graph_reason(entry: OpEntry, op: torch._ops.OpOverload, args, kwargs,
                 rules: tuple = COMPILER_RULES) -> str | None:
    """Why a graph node calling ``op`` (an overload served by ``entry``) on the traced values
    ``args``/``kwargs`` cannot run on the device, or None."""
    gate = GATES.get(entry.name)
    reason = gate(args, kwargs) if gate is not None else None
    if reason is None:
        reason = first_failure(classify(entry, tensor_slots(entry, op), args, kwargs), rules)
    return reason
