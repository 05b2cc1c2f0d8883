"""Where each node of an aten graph runs: the RBLN compiler's op table, then the eager rules.

A node's op is looked up in the compiler's table (``dispatch/compiler_optable.py``, the vendor's
"Supported OPs - PyTorch"):

* a row marked *accelerated* (under its own condition: cumsum's input last dim a multiple of 64)
  puts the node on the device;
* a row marked *supported* only keeps the node inside the compiled program, on its host side
  ("in-program"): it joins the device partition around it, so it adds no partition and no
  transfer, and reports say where it ran;
* an op without a row (the rows after ``torch.full_like`` were not retrieved) keeps the eager
  placement: on the device when it has an entry in the eager device table
  (``dispatch/optable.py``), else on the host with the reason ``no-device-kernel``.

Either way a device node must pass the eager checks a graph can decide (``dispatch/rules.py``:
the op's gate and ``COMPILER_RULES``: the dtype catalog, which the compiler table says nothing
about, all-scalar operands, ...), but not the 64-alignment rule: the compiler pads an unaligned
last dim at the partition's boundary (``runners.py`` counts it once per launch).

An operator of another library that registers its own kernel for the rbln device (a custom
op such as vLLM's attention, which a model keeps opaque to the compiler) runs *eagerly*: called
with the rbln tensors, it executes its own kernel (whose ops go through eager dispatch), between
the graph's partitions. Mutating custom ops appear in a functional graph as
``auto_functionalized(op, ...)``, placed the same way.

Everything else runs on the host and carries the reason eager would report. Metadata ops
(views), copies, dtype conversions and factories are *free*: they follow their neighbours and
are never reported, as in eager where they are not device-table ops either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
from torch._higher_order_ops.auto_functionalize import (auto_functionalized,
                                                        auto_functionalized_v2)

from ..dispatch import rules
from ..dispatch.attention_dropout import attention_dropout_p
from ..dispatch import compiler_optable
from ..dispatch.optable import DEVICE_OPS, NATIVE_OPS, OpEntry, overload
from ..runtime import executors

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
    where: str              # "device", "in-program" (the program's host side), "host", "eager"
                            # (an op with its own rbln kernel), "free", or "cpu" (CPU tensors
                            # only: not ours)
    op: str = ""            # the name reports use (the eager kernel's, e.g. ``aten::mul.out``)
    reason: str = ""        # why a host node is not on the device
    kernel: str = ""        # a custom program body (``runtime/executors.py``), on either side
    row: str = ""           # the compiler table's row that decided it ("": no row)

    @property
    def why(self) -> str:
        """What reports print: the reason, and the compiler row or the eager table."""
        source = self.row or ("eager device table" if self.where == "device" else "")
        return " | ".join(p for p in (self.reason, source) if p)


FREE = Placement("free")


def _entries_by_fn() -> dict:
    """traced overload -> op-table entry: the functional form and the aliases of each entry,
    preferring the entry registered under the overload's own name."""
    table: dict = {}
    for e in DEVICE_OPS:
        for name in (e.fn, *e.aliases):
            fn = overload(name)
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
_NATIVE = frozenset(overload(n).overloadpacket for n in NATIVE_OPS)


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def _tensor_args(node: torch.fx.Node):
    """The traced values of the tensors passed directly as positional arguments."""
    for a in node.args:
        v = _val(a)
        if isinstance(v, torch.Tensor):
            yield v


def _is_factory(op: torch._ops.OpOverload) -> bool:
    return not any(isinstance(a.type, torch.TensorType) or "Tensor" in str(a.type)
                   for a in op._schema.arguments)


def _check(entry: OpEntry, node: torch.fx.Node) -> str | None:
    """The eager rules a compiled graph keeps (``rules.COMPILER_RULES``); the reason or None."""
    args = torch.fx.node.map_aggregate(node.args, _val)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, _val)
    reason = rules.graph_reason(entry, node.target, args, kwargs)
    if reason is None and attention_dropout_p(entry.name, args, kwargs):
        # a fused program would draw its dropout mask once, when it is compiled
        return "sdpa: dropout in a graph"
    return reason


def _touches_rbln(node: torch.fx.Node) -> bool:
    vals = list(_tensor_args(node))
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
    row = compiler_optable.row_of(target)
    if entry is None and row is None:
        return Placement("host", target.name(), NO_KERNEL)
    if entry is None:          # a compiler row only: the rules see the traced op itself
        entry = OpEntry(target.name().removeprefix("aten::"), str(target), out="functional")
    op = "aten::" + entry.name
    kernel = entry.kernel if entry.kernel in executors.CUSTOM else ""
    row_text = compiler_optable.describe(row) if row is not None else ""
    if row is not None and not _accelerated(row, node):
        # the compiler keeps it on its host side, inside the program, whatever the dtype
        return Placement("in-program", op, "", kernel, row_text)
    reason = _check(entry, node)
    if reason is not None:
        return Placement("host", op, reason, kernel, row_text)
    return Placement("device", op, "", kernel, row_text)


def _accelerated(row: compiler_optable.Row, node: torch.fx.Node) -> bool:
    if row.condition == "last-dim-64":
        v = _val(node.args[0])
        return isinstance(v, torch.Tensor) and v.dim() > 0 and rules.aligned(v.shape[-1])
    return row.accelerated


def place_graph(gm: torch.fx.GraphModule) -> dict:
    """node -> Placement for every ``call_function`` node."""
    return {n: place(n) for n in gm.graph.nodes if n.op == "call_function"}

