"""Partition runners: one launch on device buffers, or a host run reported like eager fallbacks.

Residency follows eager's rules (docs/tensors-and-memory.md ("Device tensors and memory")) at every crossing:

* graph inputs are rbln tensors: a device partition reads them on the device (``device_read``:
  an ``h2d`` push only if the host holds the latest data), a host partition on the host
  (``host_read``: a physical ``d2h`` only if the device holds the latest data);
* values passed between partitions of one call are :class:`Staged`: the same three states and
  the same ``h2d``/``d2h`` events, kept without an rbln storage (they are never visible to the
  user and never written, so both sides may share one memory: the per-crossing cost is a
  state check instead of an allocation and a copy);
* graph results become rbln tensors (:class:`Results`) whose storage takes the state reached.
"""

from __future__ import annotations

import time

import torch

from .. import events
from ..dispatch.layout import spans_storage
from ..runtime.storage import (CPU_KEYSET, DEVICE, HOST, SYNCED, device_input_widened,
                               new_tensor, state_of, storage_nbytes, wrap_host)
from .placement import NO_KERNEL, Placement

_record = events.record
_record_copy = events.record_copy
_record_program = events.record_program
_span_start = events.span_start
_perf_ns = time.perf_counter_ns
_as_strided = torch.ops.aten.as_strided.default._handle


class Staged:
    """A value between two partitions of one graph call, with its residency state."""

    __slots__ = ("t", "state", "on_device")

    def __init__(self, t: torch.Tensor, on_device: bool):
        self.t = t                    # CPU tensor over the value's memory
        self.on_device = on_device    # made by a device program (else by the host)
        self.state = DEVICE if on_device else HOST

    def read(self, device_side: bool, index: int) -> torch.Tensor:
        if self.state != SYNCED and (self.state == HOST) == device_side:
            t = self.t
            # both sides share one memory: the transfer is counted, its bytes do not move
            _record_copy("h2d" if device_side else "d2h",
                         storage_nbytes(t.size(), t.stride(), t.element_size()), index, 0)
            self.state = SYNCED
        return self.t


class _Partition:
    """Common part: bind inputs to CPU tensors on this side, run, stage the results. The outer
    graph calls it as a function (``__name__``: the partition's name in its code)."""

    device_side: bool

    def __init__(self, name: str, rbln_out: tuple, index: int):
        self.name = self.__name__ = name
        self.rbln_out = rbln_out     # per result: does the graph expect it on rbln?
        self.index = index           # the NPU (rbln:index) the graph runs on

    widened: frozenset = frozenset()    # positions the program takes in fp32 (rewrite.py)

    def _bind(self, args):
        cpu_args, owners = [], {}
        device_side = self.device_side
        widened = self.widened
        for i, a in enumerate(args):
            if widened and i in widened:
                # the kept widened form of a weight (converted here for anything else)
                if isinstance(a, torch.Tensor) and a.device.type == "rbln":
                    a = device_input_widened(a)
                else:
                    a = (a.read(True, self.index) if type(a) is Staged else a).float()
            elif type(a) is Staged:
                a = a.read(device_side, self.index)
            elif isinstance(a, torch.Tensor) and a.device.type == "rbln":
                b = state_of(a)
                if device_side:
                    b.device_read()
                    c = b.device_alias(a)
                else:
                    b.host_read()
                    c = b.host_alias(a)
                owners.setdefault(c.untyped_storage().data_ptr(), a)
                a = c
            cpu_args.append(a)
        return cpu_args, owners

    def _deliver(self, outs, owners):
        res = []
        for o, on_rbln in zip(outs, self.rbln_out):
            if isinstance(o, torch.Tensor) and on_rbln:
                owner = owners.get(o.untyped_storage().data_ptr()) if owners else None
                if owner is not None:
                    # a view of a graph input: the same view of the rbln input
                    o = _as_strided.redispatch_boxed(CPU_KEYSET, owner, o.size(), o.stride(),
                                                     o.storage_offset())
                else:
                    o = Staged(o, self.device_side)
            res.append(o)
        return tuple(res)


class DevicePartition(_Partition):
    """A device program: the partition compiled to fused code, run as one launch."""

    device_side = True

    def __init__(self, name, rbln_out, index, key, compile_fn):
        super().__init__(name, rbln_out, index)
        self.key = key                  # the program's name in events (`device_program`)
        self.compile_fn = compile_fn    # () -> (callable on CPU tensors, widened positions)
        self.fn = None

    def build(self) -> None:
        self.fn, self.widened = self.compile_fn()

    def drop(self) -> None:
        self.fn = None

    def __call__(self, *args):
        cpu_args, owners = self._bind(args)
        t0 = _span_start()
        outs = self.fn(*cpu_args)
        _record_program(self.key, self.index, t0)
        return self._deliver(outs, owners)


class HostPartition(_Partition):
    """Nodes the NPU does not take, run on the host views: as fused host code (``run``, compiled
    by Inductor like a device partition) where that computes the same, else op by op. Each op
    is reported as a CPU fallback with its reason, exactly as in eager."""

    device_side = False

    def __init__(self, name, rbln_out, index, gm: torch.fx.GraphModule, ops: list[Placement],
                 run=None):
        super().__init__(name, rbln_out, index)
        self.gm = gm
        self.run = run if run is not None else gm
        self.ops = [p for p in ops if p.where == "host"]

    def __call__(self, *args):
        cpu_args, owners = self._bind(args)
        t0 = _perf_ns()
        res = self._deliver(self.run(*cpu_args), owners)
        if self.ops:
            share = (_perf_ns() - t0) // len(self.ops)
            for p in self.ops:
                if p.reason != NO_KERNEL:
                    _record("dispatch", p.op)
                _record("cpu_fallback_reason", p.reason)
                _record("cpu_fallback", p.op, share)
        return res


def materialize(s: Staged, index: int) -> torch.Tensor:
    """A staged value as an rbln tensor on ``rbln:index`` whose storage has the residency
    reached."""
    o = s.t if spans_storage(s.t) else s.t.clone(memory_format=torch.contiguous_format)
    if s.on_device:
        t = new_tensor(tuple(o.size()), tuple(o.stride()), o.dtype, index)
        b = state_of(t)
        b.adopt_device(o)
        if s.state == SYNCED:             # the host already holds a copy too
            b.host_alias(t).copy_(o)
    else:
        t = wrap_host(o, index)
        b = state_of(t)
        if s.state == SYNCED:             # the device already holds a copy too
            b.adopt_device(o.clone())
    b.residency = s.state
    return t


class Results:
    """The graph's results as rbln tensors; each storage takes the state its value reached."""

    __name__ = "results"

    def __init__(self, index: int):
        self.index = index

    def __call__(self, *values):
        done: dict = {}
        out = []
        for v in values:
            if type(v) is Staged:
                t = done.get(id(v))
                if t is None:
                    t = done[id(v)] = materialize(v, self.index)
                v = t
            out.append(v)
        return tuple(out)


class EagerCall:
    """An operator with its own rbln kernel, called on rbln tensors between partitions (staged
    values become rbln tensors first); its kernel's ops are dispatched, and reported, as eager."""

    def __init__(self, target, index: int):
        self.target = target
        self.index = index
        self.__name__ = getattr(target, "__name__", "eager_call")

    def __call__(self, *args, **kwargs):
        done: dict = {}

        def rbln(v):
            if type(v) is Staged:
                t = done.get(id(v))
                if t is None:
                    t = done[id(v)] = materialize(v, self.index)
                return t
            return v

        args = torch.fx.node.map_aggregate(args, rbln)
        kwargs = torch.fx.node.map_aggregate(kwargs, rbln)
        return self.target(*args, **kwargs)
