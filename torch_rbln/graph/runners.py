"""Partition runners: one launch on device buffers, or a host run reported like eager fallbacks.

Values between partitions are rbln tensors, so every crossing goes through the residency rules
of ``runtime/storage.py``: a device partition reads its inputs on the device (an ``h2d`` push
only if the host holds the latest data) and its results become device-latest buffers; a host
partition reads its inputs on the host (a physical ``d2h`` only if the device holds the latest
data) and its results are host-latest.
"""

from __future__ import annotations

import time

import torch
import torch.fx

from .. import events
from ..runtime.storage import CPU_KEYSET, buffer_of, new_tensor, storage_nbytes, wrap_host
from .placement import NO_KERNEL, Placement

_record = events.record
_perf_ns = time.perf_counter_ns
_as_strided = torch.ops.aten.as_strided.default._handle
_CPU = torch.device("cpu")


def to_cpu_devices(gm: torch.fx.GraphModule) -> None:
    """Rewrite ``device=rbln`` constants to the CPU: partitions compute on CPU tensors over the
    device buffers (or the host views)."""
    def fix(v):
        if isinstance(v, torch.device) and v.type == "rbln":
            return _CPU
        return v

    for n in gm.graph.nodes:
        n.args = torch.fx.node.map_aggregate(n.args, fix)
        n.kwargs = torch.fx.node.map_aggregate(n.kwargs, fix)
    gm.recompile()


_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                      torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default})
_HALF = (torch.float16, torch.bfloat16)


def fp32_matmuls(gm: torch.fx.GraphModule) -> None:
    """Give half-precision matmuls the NPU's numerics explicitly: operands widened to fp32,
    fp32 accumulation, the result rounded once. The host CPU has no half-precision GEMM (it
    runs ~7x slower than fp32 here), so this is also what makes device programs fast."""
    g = gm.graph
    for n in list(g.nodes):
        v = n.meta.get("val")
        if n.op != "call_function" or n.target not in _MATMULS or getattr(v, "dtype", None) not in _HALF:
            continue
        with g.inserting_before(n):
            n.args = tuple(g.call_function(torch.ops.aten._to_copy.default, (a,), {"dtype": torch.float32})
                           if isinstance(a, torch.fx.Node) else a for a in n.args)
        with g.inserting_after(n):
            back = g.call_function(torch.ops.aten._to_copy.default, (n,), {"dtype": v.dtype})
        n.replace_all_uses_with(back, delete_user_cb=lambda u: u is not back)
    gm.recompile()


def _owns_storage(t: torch.Tensor) -> bool:
    return (t.storage_offset() == 0 and t.untyped_storage().nbytes()
            == storage_nbytes(t.size(), t.stride(), t.element_size()))


class _Partition(torch.nn.Module):
    """Common part: bind rbln inputs to CPU aliases, run, turn results into rbln tensors."""

    device_side: bool

    def __init__(self, name: str, rbln_out: tuple, index: int):
        super().__init__()
        self.name = name
        self.rbln_out = rbln_out     # per result: does the graph expect it on rbln?
        self.index = index

    def _bind(self, args):
        cpu_args, owners, index = [], {}, None
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == "rbln":
                b = buffer_of(a)
                if self.device_side:
                    b.device_read()
                    c = b.device_alias(a)
                else:
                    b.host_read()
                    c = b.host_alias(a)
                owners.setdefault(c.untyped_storage().data_ptr(), a)
                if index is None:
                    index = b.index
                a = c
            cpu_args.append(a)
        return cpu_args, owners, self.index if index is None else index

    def _deliver(self, outs, owners, index):
        res = []
        for o, on_rbln in zip(outs, self.rbln_out):
            if isinstance(o, torch.Tensor) and on_rbln:
                owner = owners.get(o.untyped_storage().data_ptr())
                if owner is not None:
                    # a view of an input: the same view of the rbln input
                    o = _as_strided.redispatch_boxed(CPU_KEYSET, owner, o.size(), o.stride(),
                                                     o.storage_offset())
                else:
                    if not _owns_storage(o):
                        o = o.clone(memory_format=torch.contiguous_format)
                    o = self._adopt(o, index)
            res.append(o)
        return tuple(res)


class DevicePartition(_Partition):
    """A device program: the partition compiled to fused code, run as one launch."""

    device_side = True

    def __init__(self, name, rbln_out, index, compile_fn):
        super().__init__(name, rbln_out, index)
        self.compile_fn = compile_fn    # () -> callable on CPU tensors
        self.fn = None

    def build(self) -> None:
        self.fn = self.compile_fn()

    def drop(self) -> None:
        self.fn = None

    @staticmethod
    def _adopt(o, index):
        t = new_tensor(tuple(o.size()), tuple(o.stride()), o.dtype, index)
        buffer_of(t).adopt_device(o)
        return t

    def forward(self, *args):
        cpu_args, owners, index = self._bind(args)
        return self._deliver(self.fn(*cpu_args), owners, index)


class HostPartition(_Partition):
    """Nodes the NPU does not take, run op by op on the host views; each op is reported as a
    CPU fallback with its reason, exactly as in eager."""

    device_side = False

    def __init__(self, name, rbln_out, index, gm: torch.fx.GraphModule, ops: list[Placement]):
        super().__init__(name, rbln_out, index)
        self.gm = gm
        self.ops = [p for p in ops if p.where == "host"]

    @staticmethod
    def _adopt(o, index):
        return wrap_host(o, index)

    def forward(self, *args):
        cpu_args, owners, index = self._bind(args)
        t0 = _perf_ns()
        outs = self.gm(*cpu_args)
        res = self._deliver(outs, owners, index)
        if self.ops:
            share = (_perf_ns() - t0) // len(self.ops)
            for p in self.ops:
                if p.reason != NO_KERNEL:
                    _record("dispatch", p.op)
                _record("cpu_fallback_reason", p.reason)
                _record("cpu_fallback", p.op, share)
        return res
