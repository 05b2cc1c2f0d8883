"""What a compare or record region sees: every aten op below autograd and every module call.

* **Ops.** A dispatch mode, pushed while a region is open, sees each op the dispatcher runs
  below autograd, whatever route its kernel then takes (a device program, a CPU fallback, a
  host op), forward and backward (the autograd engine runs backward ops with the caller's
  modes). Views, factories, random ops and ops that only move values (``OPS_THAT_MOVE``) pass
  straight through. Outside a region nothing is installed, so no op pays anything.
* **Routes.** A passive listener on the event stream (``torch_rbln/events.py``) reads which
  route each op took from the events its kernel recorded while it ran: ``device`` (a
  ``device_program``), ``host (reason)`` (a ``cpu_fallback_reason``), ``host`` (a ``host_op``),
  ``copy`` (a dtype conversion by the copy engine), ``-`` (none: a host tensor's op).
  Passive, it keeps the native warm path serving; it listens to those kinds only
  (:data:`ROUTE_EVENTS`), so the native core hands no other event to Python.
* **Modules.** PyTorch's global forward pre- and post-hooks (``torch.nn.modules.module``),
  registered while the region is open, cover every module called inside it. A module's path
  is its name in the outermost module called (that one is named by its class), and each call
  of a path is counted.
* **Backward ops** are attributed to the module whose forward made their autograd node: at the
  end of each module call with autograd recording, the nodes between its outputs and its
  inputs are marked with it in their metadata (innermost module first), so the mark lives
  and dies with the graph.
* **Call sites** are the innermost user frames (``user_frames.py``), as explain's, captured
  as frames (code and instruction) and named only when a report or a record line is written.

A region (:class:`Region`: ``region.RBLNCompare``, ``record.Recorder``) is the observer's
sink: it gets ``op_before``/``op_after`` and ``module_before``/``module_after`` for each of
them, and ``op_writes`` before an op writes values into memory. A sink that runs torch work in
a module hook does it under :meth:`Observer.pause` (inside ``op_before``/``op_after`` the
dispatch mode is already off). Only one region may be open at a time in the process (the
module hooks are global).
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .. import events
from ..user_frames import is_library, site_frames

DEPTH = 3       # user frames per call site, innermost first
OVERLAP = ("torch.rbln.compare() and record() regions must not overlap (nested or concurrent): "
           "their module hooks are global. Close the open region first.")
# the autograd node's metadata entry naming the module call whose forward made the node
NODE_KEY = "torch_rbln.compare"

# ops that only move or select values (never compute one): nothing to compare
OPS_THAT_MOVE = frozenset({
    "alias", "detach", "clone", "contiguous", "cat", "stack", "index_select", "gather", "index",
    "index_put", "masked_fill", "where", "slice_scatter", "select_scatter", "diagonal_scatter",
    "as_strided_scatter", "repeat", "fill", "zero", "flip", "roll", "tril", "triu",
    "constant_pad_nd", "lift_fresh", "lift_fresh_copy", "set", "resize", "resize_as",
    "_local_scalar_dense", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
    "randn_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
    "scalar_tensor", "_unsafe_view", "_reshape_alias", "unfold", "embedding", "split",
    "split_with_sizes", "unbind", "chunk", "max_pool2d_with_indices", "sort", "topk", "argmax",
    "argmin", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
    "isnan", "isinf", "isfinite", "sign", "_to_copy_meta", "bitwise_and", "bitwise_or",
    "bitwise_not", "any", "all", "nonzero", "masked_select", "_efficientzerotensor",
})
# conversions: compared only when they change the dtype (a rounding, or an overflow)
CONVERSIONS = frozenset({"_to_copy", "copy", "_copy_from", "_copy_from_and_resize", "to"})

# in-place ops that write no value (detach_ only unhooks autograd)
WRITE_NO_VALUE = frozenset({"detach"})

# the events an op's route is read from (the others stay in the native counters)
ROUTE_EVENTS = ("device_program", "cpu_fallback_reason", "host_op")

_PASS, _CHECK, _CONVERT = 0, 1, 2
# a generator's or coroutine's code: its frame's callers change between resumptions
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
# id(OpOverload) -> (the op, *_kind(op), its name): an op's schema is read once per process
# (ops live as long as the process; an OpOverload hashes in Python)
_KINDS: dict = {}


def packet(func) -> str:
    return func._schema.name.split("::", 1)[-1].rstrip("_")


def _kind(func) -> tuple[int, tuple, tuple, bool]:
    """``(kind, positions written, keywords written, writes values)`` of an op."""
    schema = func._schema
    written = [(i, a.name, a.kwarg_only) for i, a in enumerate(schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    name = packet(func)
    writes = (tuple(i for i, _, kw in written if not kw), tuple(n for _, n, kw in written if kw),
              bool(written) and name not in WRITE_NO_VALUE)
    if name in CONVERSIONS:
        return _CONVERT, *writes
    if name in OPS_THAT_MOVE or torch.Tag.nondeterministic_seeded in func.tags:
        return _PASS, *writes
    if not any("Tensor" in str(a.type) for a in schema.arguments):
        return _PASS, *writes       # a factory: nothing to compare it with
    rets = schema.returns
    if not rets or all(r.alias_info is not None and not r.alias_info.is_write for r in rets):
        return _PASS, *writes       # a view (or nothing returned)
    return _CHECK, *writes


def storage_key(t: torch.Tensor) -> int:
    """Which memory a tensor's values live in (its views share it)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):     # no storage (sparse, ...)
        return 0


def _converts(args, kwargs) -> bool:
    """Does this conversion (``_to_copy``, ``copy_``) change the dtype?"""
    src = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
    dst = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if src is not None and dst is not None:
        return src.dtype != dst.dtype
    dtype = kwargs.get("dtype")
    return dst is not None and dtype is not None and dtype != dst.dtype


def _collect_tensors(x, out: list) -> None:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif type(x) in (tuple, list):
        for v in x:
            _collect_tensors(v, out)
    elif type(x) is dict:
        for v in x.values():
            _collect_tensors(v, out)
    elif isinstance(x, (tuple, list, dict)):        # named tuples, model outputs: pytree's
        out.extend(t for t in tree_leaves(x) if isinstance(t, torch.Tensor))


def tensors_of(x) -> list[torch.Tensor]:
    """The tensors among ``x``'s leaves (tuples, lists, dicts; pytree for their subclasses,
    such as model outputs), in order."""
    out: list = []
    _collect_tensors(x, out)
    return out


@dataclass(slots=True)
class Call:
    """One module call."""
    module: torch.nn.Module
    path: str
    cls: str
    call: int
    site: tuple                     # user_frames.site_frames: site_text names it
    first_seq: int = 0              # the seq the first op inside gets
    token: Any = None
    ops: int = 0                    # forward ops seen inside so far
    backward_ops: int = 0
    first_bad: int | None = None    # the first op out of tolerance inside (a sink's mark)


@dataclass(slots=True)
class Op:
    """One op the sink sees."""
    seq: int
    op: str
    phase: str                      # forward | backward
    module: str | None
    module_call: int | None
    index: int                      # its place among the ops of that module call and phase
    site: tuple                     # user_frames.site_frames: site_text names it
    node: str | None = None         # backward: the autograd node that ran it
    route: str = "-"


def _kwargs_of_call(frame) -> dict:
    """The keyword arguments of the module call whose global forward pre-hooks run now: PyTorch
    gives a global pre-hook the positional ones only; the call's frame holds the rest."""
    if frame is not None and frame.f_code.co_name == "inner" and \
            frame.f_code.co_filename == nn_module.__file__:
        kw = frame.f_locals.get("kwargs")
        if isinstance(kw, dict):
            return kw
    return {}


class Observer(TorchDispatchMode):
    """The ops and module calls of one region, handed to ``sink``."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch would wrap __torch_dispatch__ in torch._disable_dynamo: a call through Dynamo's
        # frame switch per op (and its import); a region observes eager code only
        return False

    def __init__(self, sink):
        super().__init__()
        self.sink = sink
        self.stack: list[Call] = []
        self.seq = 0
        # memory (storage_key) -> the number of the last write into it while the region was
        # open (writes are numbered from 1 as they come: ``wrote`` is the last one's)
        self.writes: dict[int, int] = {}
        self.wrote = 0
        self.calls: dict[str, int] = {}
        self._names: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = \
            weakref.WeakKeyDictionary()
        self._route: str | None = None
        # one bound method object: unlisten() finds a listener by identity
        self._listener = self._on_event
        self._hooks: list = []
        self._entered = False
        self._thread = 0
        self.paused = 0                 # > 0 while a sink runs golden work through modules
        # the sink reads a module call's keyword arguments (from the call's frame)
        self._kwargs = getattr(sink, "module_kwargs", True)
        # the innermost user frame of the last op, and its callers' part of the call site:
        # while that frame runs, its callers stay the same (see _site)
        self._site_frame = None
        self._site_outer: tuple = ()

    # lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.get_ident()
        self._hooks = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, with_kwargs=True,
                                                   always_call=True),
        ]
        events.listen(self._listener, passive=True, kinds=ROUTE_EVENTS)
        self.__enter__()
        self._entered = True

    def stop(self) -> None:
        try:
            if self._entered:
                self._entered = False
                self.__exit__(None, None, None)
        finally:
            events.unlisten(self._listener)
            for h in self._hooks:
                h.remove()
                # PyTorch's handle forgets the with_kwargs flag of a global hook: left behind,
                # it makes torch.compile(module) warn of global hooks for the process's life
                nn_module._global_forward_hooks_with_kwargs.pop(h.id, None)
            self._hooks = []
            self.stack.clear()
            self._site_frame = None

    # routes ---------------------------------------------------------------------------------
    def _on_event(self, kind: str, key: str, amount: int) -> None:
        if kind == "device_program":
            if self._route is None:
                self._route = "device"
        elif kind == "cpu_fallback_reason":
            self._route = f"host ({key})"
        elif kind == "host_op":
            if self._route is None:
                self._route = "host"

    # ops ------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        known = _KINDS.get(id(func))
        if known is None or known[0] is not func:
            known = _KINDS[id(func)] = (func, *_kind(func), func.name())
        _, kind, wpos, wkw, values, name = known
        if kwargs is None:
            kwargs = {}
        if wpos or wkw:
            if values:      # what the sink kept of these operands' values is stale now
                self.sink.op_writes()
            self._wrote(args, kwargs, wpos, wkw)
        if kind == _PASS or self.paused or (kind == _CONVERT and not _converts(args, kwargs)):
            return func._op(*args, **kwargs)
        token = self.sink.op_before(func, args, kwargs, wpos, wkw)
        if token is None:
            return func._op(*args, **kwargs)
        info = self._op_info(name)
        self._route = None
        out = func._op(*args, **kwargs)
        info.route = self._route or ("copy" if kind == _CONVERT else "-")
        self.sink.op_after(info, func, args, kwargs, out, token)
        return out

    def _wrote(self, args, kwargs, wpos, wkw) -> None:
        """An op writes these operands: their memory's last write moves (a sink's copies of
        what they held are stale)."""
        n = len(args)
        for v in [args[i] for i in wpos if i < n] + [kwargs.get(k) for k in wkw]:
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(t, torch.Tensor):
                    self.wrote += 1
                    self.writes[storage_key(t)] = self.wrote

    def _site(self, f=None) -> tuple:
        """The call site (``user_frames.site_frames``) from frame ``f`` outwards (default: the
        caller of the op being dispatched). Ops and module calls come in runs from one user
        frame (a forward's lines): its callers' part is taken once per run, as a frame's
        callers do not change while it runs (a generator's may: walked each time)."""
        if f is None:       # _site <- _op_info <- __torch_dispatch__ <- the op's caller
            f = sys._getframe(2).f_back
        while f is not None and is_library(f.f_code.co_filename):
            f = f.f_back
        if f is None:
            return ()
        if f is not self._site_frame:
            outer = site_frames(f.f_back, DEPTH - 1)
            if f.f_code.co_flags & _SUSPENDS:
                return ((f.f_code, f.f_lasti), *outer)
            self._site_frame, self._site_outer = f, outer
        return ((f.f_code, f.f_lasti), *self._site_outer)

    def _op_info(self, name: str) -> Op:
        node = torch._C._current_autograd_node()
        seq = self.seq
        self.seq += 1
        if node is None:
            call = self.stack[-1] if self.stack else None
            index = 0
            if call is not None:
                index = call.ops
                call.ops += 1
            return Op(seq, name, "forward", call.path if call else None,
                      call.call if call else None, index, self._site())
        owner, call = node.metadata.get(NODE_KEY, (None, None))
        if owner is not self:
            call = None
        index = 0
        if call is not None:
            index = call.backward_ops
            call.backward_ops += 1
        return Op(seq, name, "backward", call.path if call else None,
                  call.call if call else None, index,
                  call.site if call else self._site(), node=type(node).__name__)

    # modules --------------------------------------------------------------------------------
    def _path(self, module: torch.nn.Module) -> str:
        cls = type(module).__name__
        if not self.stack:
            return cls
        root = self.stack[0].module
        names = self._names.get(root)
        if names is None:
            names = self._names[root] = {id(m): n for n, m in
                                         root.named_modules(remove_duplicate=False)}
        name = names.get(id(module))
        if name is None:        # not a submodule of the outermost one: under its caller
            return f"{self.stack[-1].path}.<{cls}>"
        return name or cls

    def _pre(self, module, args):
        if self.paused or threading.get_ident() != self._thread:
            return None
        f = sys._getframe(1)
        kwargs = _kwargs_of_call(f) if self._kwargs else None
        path = self._path(module)
        n = self.calls.get(path, 0)
        self.calls[path] = n + 1
        call = Call(module, path, type(module).__name__, n, self._site(f), self.seq)
        call.token = self.sink.module_before(call, args, kwargs, outermost=not self.stack)
        self.stack.append(call)
        return None

    def _post(self, module, args, *rest):
        # (kwargs, output) after a forward; (output,) where the forward raised (PyTorch calls
        # an always-called global hook so then): the call's frame is unwound, nothing compared
        if self.paused or threading.get_ident() != self._thread or not self.stack:
            return None
        kwargs, output = rest if len(rest) == 2 else ({}, None)
        call = self.stack.pop()
        if call.module is not module:       # a call that raised left its frame: unwind to ours
            while self.stack and call.module is not module:
                call = self.stack.pop()
            if call.module is not module:
                return None
        if output is None:
            return None
        if torch.is_grad_enabled():
            self._map_nodes(call, args, kwargs, output)
        self.sink.module_after(call, args, kwargs, output)
        return None

    def _map_nodes(self, call: Call, args, kwargs, output) -> None:
        """Attribute the autograd nodes between the call's outputs and inputs to it (nodes of
        inner calls keep theirs)."""
        todo = [t.grad_fn for t in tensors_of(output) if t.grad_fn is not None]
        if not todo:
            return
        stop = {t.grad_fn for t in tensors_of((args, kwargs)) if t.grad_fn is not None}
        seen = set()
        while todo and len(seen) < 100_000:
            node = todo.pop()
            if node in seen or node in stop:
                continue
            seen.add(node)
            md = node.metadata
            if md.get(NODE_KEY, (None,))[0] is not self:
                md[NODE_KEY] = (self, call)
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    todo.append(nxt)

    def pause(self):
        """A context in which a sink's work inside a module hook (golden runs, summaries) is
        seen neither by the dispatch mode nor by the module hooks."""
        return _Paused(self)


class _Paused:
    """A sink's work inside a hook (golden runs, summaries): neither the dispatch mode (Python
    dispatch is off) nor the module hooks see it."""

    __slots__ = ("obs", "guard")

    def __init__(self, obs: Observer):
        self.obs = obs

    def __enter__(self):
        self.obs.paused += 1
        self.guard = torch._C._DisableTorchDispatch()
        self.guard.__enter__()

    def __exit__(self, *exc):
        try:
            self.guard.__exit__(*exc)
        finally:
            self.obs.paused -= 1
        return False


_guard = threading.Lock()
_active: "Region | None" = None


class Region:
    """A region that observes: ``_open(observer)`` sets it up before the observer starts,
    ``_close()`` after it stopped (also when opening failed)."""

    _obs: Observer | None = None
    module_kwargs = True        # module_before reads the call's keyword arguments

    def op_writes(self) -> None:
        """An op is about to write values into memory (its operands marked ``!``)."""

    def __enter__(self):
        global _active
        with _guard:
            if _active is not None:
                raise RuntimeError(OVERLAP)
            _active = self
        try:
            self._obs = Observer(self)
            self._open(self._obs)
            self._obs.start()
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc) -> bool:
        self._release()
        return False

    def _release(self) -> None:
        global _active
        try:
            if self._obs is not None:
                self._obs.stop()
        finally:
            self._obs = None
            try:
                self._close()
            finally:
                with _guard:
                    if _active is self:
                        _active = None

    def _open(self, observer: Observer) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError
