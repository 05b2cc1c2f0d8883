"""``torch.rbln.compare()``: each op and each module call of a region against a golden run on
the host, live.

* An op's **own** error: the op's result against the same op on the host, on the same inputs
  widened to the golden dtype (``golden.py``), so it is isolated from what came before.
* A module's **accumulated** error: the module's output against a golden copy of the module
  run on the host from the same inputs, widened.

Both are judged against the tolerance of the result's dtype (``torch_rbln/tolerances.py``,
overridable per region). Only one region may be open at a time (module hooks are global).
docs/numerics.md ("Numerics").
"""

from __future__ import annotations

import copy
import time

import torch

from .. import tolerances
from ..user_frames import site_text
from . import golden as gold
from . import hints, report, stats
from .observe import Observer, Region, tensors_of

STILL_OPEN = "region is still open -- exit the with-block before reading the report"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Tolerances:
    """The tolerance of each result dtype: the table's, or the region's overrides (one number
    for every dtype, or a dict per dtype)."""

    def __init__(self, atol=None, rtol=None):
        self.atol, self.rtol = atol, rtol
        self._cache: dict = {}

    @staticmethod
    def _pick(v, dtype):
        if isinstance(v, dict):
            for k in (dtype, dtype_name(dtype), str(dtype)):
                if k in v:
                    return v[k]
            return None
        return v

    def of(self, dtype: torch.dtype) -> tuple[float, float]:
        t = self._cache.get(dtype)
        if t is None:
            real = dtype.to_real() if dtype.is_complex else dtype
            atol, rtol = tolerances.for_dtype(real if real in tolerances.BY_DTYPE
                                              else torch.float32)
            a, r = self._pick(self.atol, dtype), self._pick(self.rtol, dtype)
            t = self._cache[dtype] = (atol if a is None else float(a),
                                      rtol if r is None else float(r))
        return t

    def table(self, dtypes) -> dict:
        return {dtype_name(d): dict(zip(("atol", "rtol"), self.of(d))) for d in dtypes}


def _pairs(actual, golden_out):
    """Floating result tensors and their golden counterparts, by position."""
    a, g = tensors_of(actual), tensors_of(golden_out)
    if len(a) != len(g):
        return None
    return [(x, y) for x, y in zip(a, g)
            if (x.is_floating_point() or x.is_complex()) and x.numel() == y.numel()]


class Skips:
    def __init__(self):
        self.ops: dict[str, int] = {}
        self.modules: dict[str, int] = {}

    def op(self, why: str) -> None:
        self.ops[why] = self.ops.get(why, 0) + 1

    def module(self, why: str) -> None:
        self.modules[why] = self.modules.get(why, 0) + 1


def _random(module: torch.nn.Module) -> bool:
    """A module in training mode with dropout: its golden run draws other numbers."""
    return module.training and any(
        isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


class RBLNCompare(Region):
    """A region that checks every device op and module call against a golden run on the host.
    Use as ``with torch.rbln.compare(golden="float32") as c:``; read ``c.report()``,
    ``c.dump()``, ``c.first_divergence()`` after it closed."""

    def __init__(self, golden="float32", *, rtol=None, atol=None, modules: bool = True,
                 ops: bool = True, keep_golden: bool = False):
        g = getattr(torch, golden, None) if isinstance(golden, str) else golden
        if g not in (torch.float32, torch.float64):
            raise ValueError(f"golden={golden!r}: the golden dtype is float32 or float64")
        self.golden = g
        self.keep_golden = bool(keep_golden)
        self.tol = Tolerances(atol, rtol)
        self.check_modules, self.check_ops = modules, ops
        self._state = "new"
        self._ops: list[dict] = []
        self._modules: list[dict] = []
        self._skips = Skips()
        self._bad_hints: dict[int, str] = {}    # op seq -> its hint: its modules' too
        # (seq, ids of its results, errors, first result) of the last op checked
        self._last_op = None
        self._dtypes: set = set()
        self._gold: gold.Modules | None = None
        self._widener: gold.Widener | None = None
        self._wall = self._t0 = 0
        self._golden_ns = 0         # time in the golden runs (ops on the host, module copies)
        self._dump: dict | None = None

    # lifecycle ------------------------------------------------------------------------------
    def _open(self, observer: Observer) -> None:
        self._ops, self._modules, self._skips, self._dtypes = [], [], Skips(), set()
        self._bad_hints, self._last_op, self._dump, self._golden_ns = {}, None, None, 0
        self._state = "open"
        self._widener = gold.Widener(self.golden, observer)
        if self._gold is None:
            self._gold = gold.Modules(self.golden, self._widener)
        else:       # keep_golden: this object's copies from its last with-block serve again
            self._gold.rebind(self._widener)
        self._t0 = time.perf_counter_ns()

    def _close(self) -> None:
        self._wall = time.perf_counter_ns() - self._t0
        if self.keep_golden and self._gold is not None:
            self._gold.rebind(None)
        else:
            self._gold = None
        self._widener = None
        self._state = "closed"

    # the sink: ops --------------------------------------------------------------------------
    def _as_golden(self, t: torch.Tensor) -> bool:
        """A host tensor the golden run would take as it is."""
        return t.device.type == "cpu" and (
            t.dtype == self.golden or not (t.is_floating_point() or t.is_complex()))

    def op_before(self, func, args, kwargs, wpos, wkw):
        if not self.check_ops:
            return None
        tensors = tensors_of((args, kwargs))
        if not tensors or all(self._as_golden(t) for t in tensors):
            return None     # host work in the golden dtype: the golden would be the same
        w = self._widener
        try:        # what the op writes, the golden writes too: private copies of those
            return (w.tree(args, frozenset(wpos)),
                    {k: w.private(v) if k in wkw else w.tree(v) for k, v in kwargs.items()})
        except gold.NotCopyable:
            self._skips.op("inputs not copyable")
            return None

    def op_after(self, info, func, args, kwargs, out, token) -> None:
        checked = self._check(self._skips.op, gold.op_fn(func), *token, out)
        if checked is None:
            return
        e, pairs = checked
        dtype = pairs[0][0].dtype
        self._dtypes.add(dtype)
        reduced = _reduced(token[0], pairs)
        entry = {"seq": info.seq, "op": info.op, "phase": info.phase, "route": info.route,
                 "module": info.module, "module_call": info.module_call, "index": info.index,
                 "node": info.node, "at": info.site, "dtype": dtype_name(dtype),
                 "shape": list(pairs[0][0].shape), **e}
        entry["diverged"] = stats.diverged(e)
        entry["hint"] = hints.for_op(info.op, entry["dtype"], e, reduced) \
            if entry["diverged"] else None
        self._ops.append(entry)
        self._last_op = (info.seq, [id(t) for t in tensors_of(out)], e, pairs[0][0])
        if entry["hint"]:
            self._bad_hints[info.seq] = entry["hint"]
        if entry["diverged"] and info.phase == "forward" and self._obs is not None:
            for call in self._obs.stack:
                if call.first_bad is None:
                    call.first_bad = info.seq

    # the sink: modules ----------------------------------------------------------------------
    def module_before(self, call, args, kwargs, outermost: bool):
        if not self.check_modules:
            return None
        with self._obs.pause():
            return self._module_before(call, args, kwargs, outermost)

    def _module_before(self, call, args, kwargs, outermost: bool):
        if _random(call.module):
            self._skips.module("random (dropout in training mode)")
            return None
        try:
            if outermost:       # its copy holds the copies of every module it calls
                self._gold.prepare(call.module)
            w = self._widener
            return w.tree(args), w.tree(kwargs), w.mark()
        except gold.NotCopyable:
            self._skips.module("inputs not copyable")
            return None

    def module_after(self, call, args, kwargs, output) -> None:
        if call.token is None:
            return
        with self._obs.pause():
            self._module_after(call, args, kwargs, output)

    def _module_after(self, call, args, kwargs, output) -> None:
        last = self._last_op
        if last is not None and last[0] == call.first_seq == self._obs.seq - 1 and \
                [id(t) for t in tensors_of(output)] == last[1]:
            # the module is one op whose result it returns (a Linear, an activation): its
            # golden copy would compute that op again on the same inputs
            self._module_entry(call, last[2], last[3])
            return
        g_args, g_kwargs, mark = call.token
        if self._widener.inputs_written((args, kwargs), mark):
            # the forward wrote its inputs: its golden copy will write the widened ones, which
            # other checks share -- it gets its own
            g_args, g_kwargs = copy.deepcopy((g_args, g_kwargs))
        try:
            g = self._gold.of(call.module)
        except gold.NotCopyable:
            self._skips.module("module not copyable")
            return
        checked = self._check(self._skips.module, g, g_args, g_kwargs, output)
        if checked is not None:
            self._module_entry(call, checked[0], checked[1][0][0])

    def _module_entry(self, call, e: dict, first: torch.Tensor) -> None:
        dtype = first.dtype
        self._dtypes.add(dtype)
        entry = {"seq": len(self._modules), "path": call.path, "class": call.cls,
                 "call": call.call, "at": call.site, "dtype": dtype_name(dtype),
                 "shape": list(first.shape), **e, "first_op": call.first_bad}
        entry["diverged"] = stats.diverged(e)
        entry["hint"] = (hints.for_module(call.cls, entry["dtype"], e)
                         or self._bad_hints.get(call.first_bad)) if entry["diverged"] else None
        self._modules.append(entry)

    def _check(self, skip, fn, args, kwargs, actual):
        """``(errors, pairs)`` of ``actual`` against ``fn`` run on the golden inputs (timed as
        the golden work), or None where there is nothing to compare: the golden run failed (no
        host kernel, a module that does not run on the host; counted under the error's type)
        or no result is floating. The widened results are kept for the ops that read them next
        (a module's output is mostly its last op's result, widened already)."""
        t0 = time.perf_counter_ns()
        try:
            with torch.no_grad():
                want = fn(*args, **kwargs)
        except Exception as e:   # noqa: BLE001 - whatever the golden side meets, it is reported
            skip(f"no host run ({type(e).__name__})")
            return None
        finally:
            self._golden_ns += time.perf_counter_ns() - t0
        pairs = _pairs(actual, want)
        if not pairs:
            skip("no floating result")
            return None
        atol, rtol = self.tol.of(pairs[0][0].dtype)
        w = self._widener
        got = [w.tensor(a) for a, _ in pairs]
        return stats.errors(got, [g for _, g in pairs], atol, rtol), pairs

    # reading --------------------------------------------------------------------------------
    def _closed(self) -> dict:
        if self._state == "open":
            raise RuntimeError(STILL_OPEN)
        if self._state == "new":
            raise RuntimeError("region was never run -- use it as a with-block")
        if self._dump is None:
            for e in (*self._ops, *self._modules):      # call sites are named when read
                e["at"] = site_text(e["at"])
            self._dump = report.build(
                reference=f"golden {dtype_name(self.golden)} on the host",
                tolerances=self.tol.table(sorted(self._dtypes, key=str)),
                ops=self._ops, modules=self._modules,
                skipped={"ops": dict(self._skips.ops), "modules": dict(self._skips.modules)},
                wall_ns=self._wall)
            self._dump["golden_ns"] = self._golden_ns
        return self._dump

    def dump(self) -> dict:
        """Every checked op and module call with its errors (schema: ``report.build``)."""
        return copy.deepcopy(self._closed())

    def first_divergence(self) -> dict | None:
        """``{"op": ..., "module": ...}``: the first op and the first module call (in execution
        order) out of tolerance, each None if none is; None when nothing diverged."""
        return copy.deepcopy(self._closed()["first_divergence"])

    def report(self) -> str:
        return report.render(self._closed())

    def __repr__(self) -> str:
        if self._state == "closed":
            return self.report()
        return f"<RBLNCompare {self._state} (golden {dtype_name(self.golden)})>"

    __str__ = __repr__


def _reduced(args, pairs) -> int | None:
    """Elements per result of a reduction: the input's over the result's."""
    ins = [t for t in tensors_of(args) if t.is_floating_point()]
    if not ins:
        return None
    n_out = pairs[0][0].numel()
    return ins[0].numel() // n_out if n_out and ins[0].numel() > n_out else None


def compare(golden="float32", *, rtol=None, atol=None, modules: bool = True,
            ops: bool = True, keep_golden: bool = False) -> RBLNCompare:
    """A region to use as ``with torch.rbln.compare(golden="float32") as c:``; then
    ``print(c)``. ``rtol``/``atol``: one number for every dtype, or a dict per dtype
    (``{torch.float16: 2e-2}``); unset, each dtype's row of ``torch_rbln.tolerances``.
    ``keep_golden=True``: the object keeps its golden copies of the modules between its
    with-blocks (each block's report is its own), for a loop that enters it again and again;
    a weight changed in place since is copied again, a module, a mode or a parameter object
    changed makes the copy again; the copies live as long as the object."""
    return RBLNCompare(golden, rtol=rtol, atol=atol, modules=modules, ops=ops,
                       keep_golden=keep_golden)
