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
from typing import NamedTuple

import torch

from .. import events
from ..dispatch.layout import spans_storage
from ..runtime.storage import (CPU_KEYSET, DEVICE, HOST, SYNCED, deliver_fresh, device_input,
                               device_input_packed, device_input_widened, host_input, state_of,
                               storage_nbytes, wrap_host)
from .placement import NO_KERNEL, Placement

_record_batch = events.record_batch
_record_copy = events.record_copy
_record_program = events.record_program
_span_start = events.span_start
_perf_ns = time.perf_counter_ns
_as_strided = torch.ops.aten.as_strided.default._handle
_Tensor = torch.Tensor


class Forms(NamedTuple):
    """The forms in which a device program takes some of its inputs (``graph/rewrite.py``):
    positions it takes in fp32 (a weight's kept widened form), positions it takes packed (the
    kept packed form), and inputs appended after the graph's own, each the fp32 form of the
    input at that position (its linears choose per call: ``linears_by_rows``)."""
    widened: frozenset = frozenset()
    packed: frozenset = frozenset()
    fp32_of: tuple = ()


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

    def __init__(self, name: str, rbln_out: tuple, index: int, aliases: bool = True):
        self.name = self.__name__ = name
        self.rbln_out = rbln_out     # per result: does the graph expect it on rbln?
        self.index = index           # the NPU (rbln:index) the graph runs on
        # whether a result may be a view of an input (traced values that share a storage):
        # only then are the inputs' memories matched against the results
        self.aliases = aliases
        self._input = device_input if self.device_side else host_input

    widened: frozenset = frozenset()    # positions the program takes in fp32 (rewrite.py)
    packed: frozenset = frozenset()     # ... and as packed weights (rewrite.packed_inputs)
    fp32_of: tuple = ()                 # appended inputs: the fp32 form of these positions

    def _bind(self, args):
        cpu_args = []
        owners = {} if self.aliases else None
        read = self._input          # this side's read (an h2d or d2h where due), then an alias
        widened = self.widened
        packed = self.packed
        for i, a in enumerate(args):
            if widened and i in widened:
                a = self._fp32(a)
            elif type(a) is Staged:
                a = a.read(self.device_side, self.index)
            elif isinstance(a, _Tensor) and a.get_device() >= 0:     # rbln (CPU: -1)
                if packed and i in packed:
                    a = device_input_packed(a)      # the kept packed form of a weight
                else:
                    c = read(a)
                    if owners is not None:
                        owners.setdefault(c.untyped_storage().data_ptr(), a)
                    a = c
            cpu_args.append(a)
        cpu_args.extend(self._fp32(args[i]) for i in self.fp32_of)
        return cpu_args, owners

    def _fp32(self, a):
        """An input in fp32: a weight's kept widened form on rbln, else converted now."""
        if type(a) is Staged:
            return a.read(self.device_side, self.index).float()
        if isinstance(a, _Tensor) and a.get_device() >= 0:
            return device_input_widened(a)
        return a.float()

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

    def __init__(self, name, rbln_out, index, key, compile_fn, aliases: bool = True):
        super().__init__(name, rbln_out, index, aliases)
        self.key = key                  # the program's name in events (`device_program`)
        # () -> (callable on CPU tensors, its inputs' Forms)
        self.compile_fn = compile_fn
        self.fn = None

    def build(self) -> None:
        self.fn, (self.widened, self.packed, self.fp32_of) = self.compile_fn()

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
                 run=None, aliases: bool = True):
        super().__init__(name, rbln_out, index, aliases)
        self.gm = gm
        self.run = run if run is not None else gm
        self.ops = [p for p in ops if p.where == "host"]
        # per op, as eager's fallback records it; each op's time is its share of the run's
        self.events = events.Batch(
            ev for p in self.ops for ev in (
                *((("dispatch", p.op, 0),) if p.reason != NO_KERNEL else ()),
                ("cpu_fallback_reason", p.reason, 0), ("cpu_fallback", p.op, None)))

    def __call__(self, *args):
        cpu_args, owners = self._bind(args)
        t0 = _perf_ns()
        res = self._deliver(self.run(*cpu_args), owners)
        if self.ops:
            _record_batch(self.events, (_perf_ns() - t0) // len(self.ops))
        return res


def materialize(s: Staged, index: int) -> torch.Tensor:
    """A staged value as an rbln tensor on ``rbln:index`` whose storage has the residency
    reached."""
    if s.on_device:
        # as an eager program's fresh output: its memory (copied first unless it spans its own
        # storage) is the device memory and the host view at once
        t = deliver_fresh(s.t, index)
        if s.state == SYNCED:             # the host already read it: both sides hold it
            state_of(t).residency = SYNCED
        return t
    o = s.t if spans_storage(s.t) else s.t.clone(memory_format=torch.contiguous_format)
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
