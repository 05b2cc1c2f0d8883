"""Where each node of an aten graph runs: the same decision rules as eager ops.

A node is placed on the device when eager would run it there: its op has an entry in the device
op table (``dispatch/optable.py``) and it passes the pre-dispatch checks that depend on what a
graph knows at compile time (dtype catalog, all-scalar operands, the 64-alignment and
div-rounding rules). The data-dependent checks (NaN/Inf scan, storage offset) and the
thread-state checks (trace, dispatch mode, reentrancy) have no meaning for a compiled graph and
are not applied. The alignment rule applies to static extents only (a dynamic extent would
otherwise specialise the graph).

An operator of another library that registers its own kernel for the rbln device (a custom
op such as vLLM's attention, which a model keeps opaque to the compiler) runs *eagerly*: called
with the rbln tensors, it executes its own kernel (whose ops go through eager dispatch), between
the graph's partitions. Mutating custom ops appear in a functional graph as
``auto_functionalized(op, ...)``, placed the same way.

Everything else runs on the host and carries the reason eager would report; an op without a
device kernel has the reason ``no-device-kernel``. Metadata ops (views), copies, dtype
conversions and factories are *free*: they follow their neighbours and are never reported,
as in eager where they are not device-table ops either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
from torch._higher_order_ops.auto_functionalize import (auto_functionalized,
                                                        auto_functionalized_v2)

from ..dispatch import checks
from ..dispatch.device_op import GATES
from ..dispatch.optable import DEVICE_OPS, NATIVE_OPS, OpEntry
from ..runtime import lowering

NO_KERNEL = "no-device-kernel"

aten = torch.ops.aten
# data movement and allocation: the device and the host both do it without an op-table kernel
_FREE_OPS = frozenset({
    aten._unsafe_view.default, aten.clone.default, aten._to_copy.default, aten.copy.default,
    aten.detach.default, aten.lift_fresh_copy.default, aten.empty_like.default, aten.zeros_like.default,
    aten.ones_like.default, aten.full_like.default, aten.new_empty.default,
    aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.fill.Scalar,
})


@dataclass(frozen=True)
class Placement:
    where: str              # "device", "host", "eager" (an op with its own rbln kernel), "free",
                            # or "cpu" (CPU tensors only: not ours)
    op: str = ""            # the name reports use (the eager kernel's, e.g. ``aten::mul.out``)
    reason: str = ""        # why a host node is not on the device
    kernel: str = ""        # a custom program body (``runtime/lowering.py``), on either side


FREE = Placement("free")


def _overload(name: str):
    packet, _, ov = name.partition(".")
    return getattr(getattr(aten, packet), ov or "default")


def _entries_by_fn() -> dict:
    """traced overload -> op-table entry: the functional form and the aliases of each entry,
    preferring the entry registered under the overload's own name."""
    table: dict = {}
    for e in DEVICE_OPS:
        for name in (e.fn, *e.aliases):
            fn = _overload(name)
            if fn not in table or e.name == name:
                table[fn] = e
        packet, _, ov = e.fn.partition(".")
        if ov == "Tensor" and hasattr(getattr(aten, packet), "Scalar"):
            # traced graphs keep Python scalars as `.Scalar` overloads; eager wraps them into
            # 0-dim tensors and reaches the same kernel
            table.setdefault(getattr(aten, packet).Scalar, e)
    return table


_BY_FN = _entries_by_fn()
# data movement the device's copy engine runs natively, any dtype, no checks
_NATIVE = frozenset(_overload(n).overloadpacket for n in NATIVE_OPS)


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def _tensor_args(node: torch.fx.Node, operands: tuple = ()):
    """(position, fake value) of the tensors passed directly as positional arguments (only
    those at ``operands`` when given)."""
    for i, a in enumerate(node.args):
        if operands and i not in operands:
            continue
        v = _val(a)
        if isinstance(v, torch.Tensor):
            yield i, v


def _is_factory(op: torch._ops.OpOverload) -> bool:
    return not any(isinstance(a.type, torch.TensorType) or "Tensor" in str(a.type)
                   for a in op._schema.arguments)


def _check(entry: OpEntry, node: torch.fx.Node) -> str | None:
    """The eager pre-dispatch checks a graph can decide; the reason code or None."""
    gate = GATES.get(entry.name)
    if gate is not None:
        args = torch.fx.node.map_aggregate(node.args, _val)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, _val)
        reason = gate(args, kwargs)
        if reason is not None:
            return reason
    tensors, dtype_tensors = [], []
    for i, v in _tensor_args(node, entry.operands):
        if v.device.type != "rbln" and v.dim() == 0:
            continue                      # a CPU 0-dim tensor is a scalar operand
        tensors.append(v)
        if i not in entry.skip_dtype:
            dtype_tensors.append(v)
    if dtype_tensors:
        d0 = dtype_tensors[0].dtype
        if d0 not in checks.DISPATCH_DTYPES or any(t.dtype is not d0 for t in dtype_tensors):
            return "dtype-not-fp16"
    if tensors and all(t.dim() == 0 for t in tensors):
        return "all-scalar inputs"
    if entry.align64:
        for t in tensors:
            if t.dim() and not _aligned(t.shape[-1]) and t.dtype not in checks.STRICT_DTYPES:
                return "last-dim-not-64-aligned"
    if entry.name == "div.out_mode" and node.kwargs.get("rounding_mode") in ("trunc", "floor"):
        if any(t.dtype in (torch.float16, torch.bfloat16) for t in tensors):
            return "div-rounding-fp16"
    return None


def _aligned(extent) -> bool:
    # A dynamic extent (dynamic=True) is served by the device program whatever it becomes: the
    # rule is a performance rule, and deciding it would specialise the graph on the extent.
    if isinstance(extent, torch.SymInt):
        return True
    return extent % 64 == 0


def _touches_rbln(node: torch.fx.Node) -> bool:
    vals = [v for _, v in _tensor_args(node)]
    out = node.meta.get("val")
    vals.extend(out if isinstance(out, (tuple, list)) else (out,))
    return any(isinstance(v, torch.Tensor) and v.device.type == "rbln" for v in vals)


def _own_rbln_kernel(op) -> bool:
    """A non-aten operator with a kernel registered for the rbln (PrivateUse1) key."""
    return (isinstance(op, torch._ops.OpOverload) and op.namespace != "aten"
            and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"))


def _touches_rbln_anywhere(node: torch.fx.Node) -> bool:
    found = []
    torch.fx.node.map_aggregate((node.args, node.kwargs, node.meta.get("val")), lambda a: found.append(
        isinstance(v := _val(a), torch.Tensor) and v.device.type == "rbln"))
    return any(found)


def place(node: torch.fx.Node) -> Placement:
    """Where ``node`` (a ``call_function`` node of an aten graph) runs."""
    target = node.target
    wrapped = node.args[0] if target in (auto_functionalized, auto_functionalized_v2) else target
    if _own_rbln_kernel(wrapped) and _touches_rbln_anywhere(node):
        return Placement("eager", wrapped.name())
    if not isinstance(target, torch._ops.OpOverload):
        return FREE                       # getitem, SymInt arithmetic
    if not isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)):
        return FREE                       # sizes of dynamic shapes (sym_size ...)
    if (target.is_view or target in _FREE_OPS or target.overloadpacket in _NATIVE
            or _is_factory(target)):
        return FREE
    if not _touches_rbln(node):
        return Placement("cpu", target.name())
    entry = _BY_FN.get(target)
    if entry is None:
        return Placement("host", target.name(), NO_KERNEL)
    op = "aten::" + entry.name
    kernel = entry.kernel if entry.kernel in lowering.CUSTOM else ""
    reason = _check(entry, node)
    if reason is not None:
        return Placement("host", op, reason, kernel)
    return Placement("device", op, "", kernel)


def place_graph(gm: torch.fx.GraphModule) -> dict:
    """node -> Placement for every ``call_function`` node."""
    return {n: place(n) for n in gm.graph.nodes if n.op == "call_function"}

