"""The golden side of a comparison: the same inputs on the host, widened to the golden dtype,
and the same computation there (an op, or a copy of a module).

Widening maps every floating tensor to a host tensor of the golden dtype (complex ones to the
matching complex dtype), every other tensor to a host copy, ``torch.float16``/``bfloat16``
arguments to the golden dtype and non-CPU devices to the CPU. Objects that are not containers
(a Hugging Face KV cache, say) are deep-copied with their tensors widened, so a golden run never
writes what the device run reads. An rbln tensor is read through its host view (a device-latest
one is transferred once: a ``d2h`` on the event stream, as any host read).
"""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict

import torch

from ..dispatch.optable import BY_NAME
from ..runtime import executors
from ..runtime.storage import host_input
from .observe import storage_key

_HALF = (torch.float16, torch.bfloat16)
_ATOMS = (type(None), bool, int, float, complex, str, bytes, slice, type(Ellipsis),
          torch.layout, torch.memory_format, torch.Generator)
_CPU = torch.device("cpu")


class NotCopyable(Exception):
    """An input the golden run would share with the device run (it cannot be copied)."""


def golden_dtype(dtype: torch.dtype, golden: torch.dtype) -> torch.dtype:
    if dtype.is_floating_point:
        return golden
    if dtype.is_complex:
        return torch.complex128 if golden == torch.float64 else torch.complex64
    return dtype


def host(t: torch.Tensor) -> torch.Tensor:
    """A host tensor with ``t``'s values (an alias where ``t`` is rbln or CPU)."""
    t = t.detach()
    if t.device.type == "rbln":
        return host_input(t)
    return t if t.device.type == "cpu" else t.cpu()


def widen(t: torch.Tensor, golden: torch.dtype) -> torch.Tensor:
    """A new host tensor: ``t``'s values in the golden dtype."""
    h = host(t)
    return h.to(golden_dtype(t.dtype, golden), copy=True)


# exact types of the leaves _collect skips at once (isinstance on torch.Generator's metaclass
# is slow, and a module's dozen hook dicts are mostly empty)
_LEAF_TYPES = frozenset((*_ATOMS, torch.dtype, torch.device))


def _collect(obj, out: dict, seen: set, depth: int = 0) -> None:
    """The tensors reachable from ``obj`` through attributes and containers (``id -> t``)."""
    if type(obj) in _LEAF_TYPES or depth > 64 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out[id(obj)] = obj
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, out, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _collect(v, out, seen, depth + 1)
    elif isinstance(obj, _ATOMS) or isinstance(obj, (torch.dtype, torch.device)):
        return
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            _collect(v, out, seen, depth + 1)


def widened_copy(obj, golden: torch.dtype, found: dict | None = None, widen_fn=None):
    """A deep copy of ``obj`` whose tensors are widened (parameters stay parameters);
    ``found`` receives the tensors widened, ``id -> (tensor, widened)``; ``widen_fn(t)``
    widens one (default: a new copy)."""
    tensors: dict = {}
    _collect(obj, tensors, set())
    memo: dict = {}
    for i, t in tensors.items():
        w = widen_fn(t) if widen_fn is not None else widen(t, golden)
        memo[i] = torch.nn.Parameter(w, requires_grad=False) if isinstance(
            t, torch.nn.Parameter) else w
        if found is not None:
            found[i] = (t, memo[i])
    try:
        if isinstance(obj, torch.nn.Module) and _plain_module(obj):
            return _module_copy(obj, memo, dict(memo))
        return copy.deepcopy(obj, memo)
    except Exception as e:      # noqa: BLE001 - whatever deepcopy meets, the check is skipped
        raise NotCopyable(f"{type(obj).__name__}: {e}") from None


def _plain_module(m: torch.nn.Module) -> bool:
    """Do ``m`` and its submodules copy as ``copy.deepcopy`` would by their ``__dict__`` (no
    ``__deepcopy__``, ``__reduce_ex__``, ``__getstate__`` or slots of their own)?"""
    for sub in m.modules():
        cls = type(sub)
        if "__slots__" in cls.__dict__ or any(
                getattr(cls, name, None) is not getattr(torch.nn.Module, name, None)
                for name in ("__deepcopy__", "__reduce_ex__", "__reduce__", "__getstate__",
                             "__setstate__", "__copy__")):
            return False
    return True


def _module_copy(m: torch.nn.Module, widened: dict, memo: dict) -> torch.nn.Module:
    """``m`` copied as ``copy.deepcopy`` would with the memo ``memo`` (``id -> copy``, the
    widened tensors in it), module by module: its parameters, buffers and submodules rebuilt
    here, the rest of its attributes deep-copied. ``copy.deepcopy`` of a whole module reduces
    and rebuilds each of the dozen hook dicts of each module; most are empty."""
    done = memo.get(id(m))
    if done is not None:
        return done
    new = object.__new__(type(m))
    memo[id(m)] = new
    state = {}
    for k, v in m.__dict__.items():
        if k == "_compiled_call_impl":     # Module.__getstate__ leaves it out of a copy
            continue
        if k == "_parameters" or k == "_buffers":
            state[k] = {n: None if t is None else widened[id(t)] for n, t in v.items()}
        elif k == "_modules":
            state[k] = {n: None if sub is None else _module_copy(sub, widened, memo)
                        for n, sub in v.items()}
        elif type(v) in _LEAF_TYPES:
            state[k] = v
        elif type(v) in (dict, set, OrderedDict) and not v:    # the empty hook dicts
            state[k] = type(v)()
        else:
            state[k] = copy.deepcopy(v, memo)
    object.__setattr__(new, "__dict__", state)
    return new


class Widener:
    """Widened copies of the tensors a region met, kept while a tensor lives and nothing wrote
    its memory since (the observer's ``writes``: each memory's last write), so an activation
    that feeds a module, the modules inside it and their first op is read back and widened
    once, and a weight once per region. Copies are shared: what an op writes gets a private
    copy (``tree(fresh=...)``), and a module whose forward wrote its inputs runs its golden
    copy on private ones (``inputs_written``). ``observer``: its ``writes`` (memory -> number
    of its last write) and ``wrote`` (the last write's number)."""

    def __init__(self, golden: torch.dtype, observer):
        self.golden = golden
        self.observer = observer
        self.writes = observer.writes
        self._kept: dict[int, tuple] = {}   # id -> (weakref, memory, its last write, copy)

    def tensor(self, t: torch.Tensor, fresh: bool = False) -> torch.Tensor:
        kept = self._kept.get(id(t))
        key = storage_key(t)
        if kept is not None and not fresh and kept[0]() is t and kept[1] == key \
                and kept[2] == self.writes.get(key, 0):
            return kept[3]
        w = widen(t, self.golden)
        if not fresh:
            self.keep(t, w)
        return w

    def keep(self, t: torch.Tensor, w: torch.Tensor) -> None:
        """``w`` is ``t`` widened (now)."""
        key = storage_key(t)
        i = id(t)
        try:
            ref = weakref.ref(t, lambda _, i=i, kept=self._kept: kept.pop(i, None))
        except TypeError:
            return
        self._kept[i] = (ref, key, self.writes.get(key, 0), w)

    def tree(self, x, fresh: frozenset = frozenset()):
        """``x`` (an op's or a module's arguments) on the host in the golden dtype; the
        positions in ``fresh`` (written by the op) as private copies."""
        if fresh and type(x) in (list, tuple):
            return type(x)(self._tree(v, i in fresh) for i, v in enumerate(x))
        return self._tree(x, False)

    def private(self, x):
        """``x`` widened into new copies (what an op writes)."""
        return self._tree(x, True)

    def _tree(self, x, fresh: bool):
        if isinstance(x, torch.Tensor):
            return self.tensor(x, fresh)
        if isinstance(x, _ATOMS):
            return x
        if isinstance(x, torch.dtype):
            return self.golden if x in _HALF or x == torch.float32 else x
        if isinstance(x, torch.device):
            return _CPU
        if isinstance(x, (list, tuple)):
            items = [self._tree(v, fresh) for v in x]
            if type(x) in (list, tuple):
                return type(x)(items)
            return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        if type(x) is dict:
            return {k: self._tree(v, fresh) for k, v in x.items()}
        return widened_copy(x, self.golden, widen_fn=self.tensor)

    def mark(self) -> int:
        """The number of the last write now (for :meth:`inputs_written`)."""
        return self.observer.wrote

    def inputs_written(self, x, mark: int) -> bool:
        """Did an op write the memory of a tensor of ``x`` (or of objects in it) since
        :meth:`mark` gave ``mark``? (Read only where some op wrote since.)"""
        if self.observer.wrote == mark:
            return False
        found: dict = {}
        _collect(x, found, set())
        return any(self.writes.get(storage_key(t), 0) > mark for t in found.values())


# -- ops -------------------------------------------------------------------------------------

def _custom_bodies() -> dict:
    """Device ops whose program is a custom body (attention, linear_backward): no CPU kernel
    of the op, the body computes it on host tensors."""
    out = {}
    for e in BY_NAME.values():
        body = executors.CUSTOM.get(e.kernel)
        if body is not None:
            for name in (e.name, *e.aliases):
                out["aten::" + name] = body
    return out


_BODIES: dict | None = None


def op_fn(func: torch._ops.OpOverload):
    """What computes ``func`` on host tensors: the op itself, or its device body."""
    global _BODIES
    if _BODIES is None:
        _BODIES = _custom_bodies()
    return _BODIES.get(func.name(), func)


# -- modules ---------------------------------------------------------------------------------

def _version(t: torch.Tensor) -> int:
    """``t``'s version counter (an inference tensor has none: it is never written after)."""
    return -1 if t.is_inference() else t._version


def _structure(module: torch.nn.Module) -> tuple:
    """What a golden copy of ``module`` stands for besides its tensors' values: each of its
    modules, its mode, and which parameters and buffers it holds."""
    return tuple((id(m), m.training, *map(id, m._parameters.values()),
                  *map(id, m._buffers.values())) for m in module.modules())


class Modules:
    """Golden copies of the modules a region calls, one copy per outermost module (its
    submodules' copies are the copy's submodules), refreshed where a weight changed since, and
    made again where a module, a mode or a parameter object changed."""

    def __init__(self, golden: torch.dtype, widener: Widener | None = None):
        self.golden = golden
        self.widener = widener
        self._copy: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = \
            weakref.WeakKeyDictionary()
        # outermost module -> [(its tensor, the copy's tensor, version at copy)]
        self._tensors: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = \
            weakref.WeakKeyDictionary()
        # outermost module -> its _structure when copied
        self._structure: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = \
            weakref.WeakKeyDictionary()
        self.builds = 0

    def rebind(self, widener: Widener | None) -> None:
        """The copies serve another with-block (``widener`` its), or none (None)."""
        self.widener = widener
        if widener is not None:     # the copies' weights serve the ops again
            for rows in self._tensors.values():
                for t, w, _ in rows:
                    if isinstance(t, torch.nn.Parameter):
                        widener.keep(t, w)

    def of(self, module: torch.nn.Module) -> torch.nn.Module:
        g = self._copy.get(module)
        if g is None:
            g = self._build(module)
        return g

    def _build(self, module: torch.nn.Module, structure: tuple | None = None) -> torch.nn.Module:
        found: dict = {}
        structure = _structure(module) if structure is None else structure
        g = widened_copy(module, self.golden, found)
        self.builds += 1
        self._structure[module] = structure
        for m, gm in zip(module.modules(), g.modules()):
            self._copy[m] = gm      # the newest copy: refreshed with its outermost module
        self._tensors[module] = [(t, w, _version(t)) for t, w in found.values()]
        if self.widener is not None:    # ops read the weights too: the copy's serve them
            for t, w in found.values():
                if isinstance(t, torch.nn.Parameter):
                    self.widener.keep(t, w)
        return g

    def prepare(self, module: torch.nn.Module) -> None:
        """Before a call of an outermost module: its copy made, or the weights and buffers
        that changed since it was made (an optimizer step, a running statistic) copied."""
        rows = self._tensors.get(module)
        structure = _structure(module)
        if rows is None or self._structure.get(module) != structure:
            self._build(module, structure)
            return
        for j, (t, g, version) in enumerate(rows):
            if _version(t) != version:
                with torch.no_grad():
                    g.copy_(host(t))
                rows[j] = (t, g, _version(t))
