"""``RBLNExplain`` regions, ``explain()`` and ``explain_steady()``.

A region reads the event stream at ``start()`` and ``stop()`` and keeps the difference. The
counters are process-global, so only one region may be open at a time in the whole process;
with ``with_stack=True`` a call-site recorder listens to the stream while the region is open.
The regions the tools open around a whole run or a pytest test are not exclusive
(``exclusive=False``): a user's region nests inside them.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable

from .. import events
from . import measure, remedies, report
from . import trace as callsites
from .diff import RBLNDiff

OVERLAP = ("torch.rbln.explain() regions must not overlap (nested or concurrent): the (B) timer, "
           "trace and counters are process-global. Close the open region first.")
STILL_OPEN = "region is still open -- exit the with-block or call stop() before dump()/report()"

_guard = threading.Lock()
_active: "RBLNExplain | None" = None


class RBLNExplain:
    """One measured region of hidden host overhead. Use as a context manager, or call
    ``start()`` and ``stop()``; read ``report()``, ``verdict()``, ``dump()`` after it closed."""

    def __init__(self, with_stack: bool = False, *, trace: bool | None = None,
                 exclusive: bool = True, label: str | None = None):
        # ``trace=`` is the deprecated spelling of ``with_stack``; when given it wins
        self.with_stack = bool(with_stack if trace is None else trace)
        # a tool's enclosing region (a whole run, a pytest test) is not exclusive: the user's
        # own regions open inside it as if it were not there
        self.exclusive = exclusive
        self.label = label      # shown in the report's header (e.g. ``rank 1/2``)
        self._state = "new"        # new -> open -> closed (a closed region may be started again)
        self._dump: dict | None = None
        self._ended: tuple | None = None    # (before, after, wall, sites, memory) at stop()
        self._recorder: callsites.Recorder | None = None
        self._before: dict = {}
        self._t0 = 0

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    # lifecycle ----------------------------------------------------------------------------
    def start(self) -> "RBLNExplain":
        global _active
        if self.exclusive:
            with _guard:
                if _active is not None:
                    raise RuntimeError(OVERLAP)
                _active = self
        try:
            self._dump = self._ended = None
            if self.with_stack:
                self._recorder = callsites.Recorder()
                events.listen(self._recorder, passive=True)   # reads only
            self._state = "open"
            self._before = events.snapshot()
            self._t0 = time.perf_counter_ns()
        except BaseException:
            self._release()
            raise
        return self

    def stop(self) -> "RBLNExplain":
        wall = time.perf_counter_ns() - self._t0   # first, so reading the counters is not timed
        if self._state != "open":
            raise RuntimeError("region is not open -- call start() (or enter the with-block) first")
        try:
            # what only the end can tell is read now; the dump is worked out from it when first
            # read (a region in a loop that nobody reads costs two snapshots)
            after = events.snapshot()
            sites = dict(self._recorder.sites) if self._recorder is not None else {}
            self._ended = (self._before, after, wall, sites, measure.device_memory())
            self._dump = None
        finally:
            self._release()
            self._state = "closed"
        return self

    def _release(self) -> None:
        global _active
        if self._recorder is not None:
            events.unlisten(self._recorder)
            self._recorder = None
        with _guard:
            if _active is self:
                _active = None
        if self._state == "open":
            self._state = "closed"

    def __enter__(self) -> "RBLNExplain":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    # reading ------------------------------------------------------------------------------
    def _closed_dump(self) -> dict:
        if self._state == "open":
            raise RuntimeError(STILL_OPEN)
        if self._dump is None:
            if self._ended is None:
                raise RuntimeError(
                    "region was never run -- use it as a with-block or call start()/stop()")
            self._dump = measure.build_dump(*self._ended)
            if self.label:
                self._dump["label"] = self.label
        return self._dump

    def dump(self) -> dict:
        """Every counter of the region as raw numbers (schema: torch_rbln/explain/measure.py)."""
        return copy.deepcopy(self._closed_dump())

    def verdict(self) -> dict:
        """``{'clean': bool, 'reasons': [...], ...}``: a fact for CI checks, not a grade."""
        return measure.verdict(self._closed_dump())

    def report(self) -> str:
        return report.render(self._closed_dump())

    def help(self, signal: str | None = None) -> str:
        """The remedy for one signal, or one ``signal: fix`` line per fired signal."""
        d = self._closed_dump()
        if signal is None:
            return "\n".join(f"{n['signal']}: {n['fix']}" for n in d["notes"]) or "no hidden overhead"
        return remedies.lookup(signal, d["notes"])

    def diff(self, other: "RBLNExplain") -> RBLNDiff:
        """Compare this region (A) with a later one (B)."""
        return RBLNDiff(self, other)

    def __repr__(self) -> str:
        if self._state == "open":
            return (f"<RBLNExplain active (trace={self.with_stack}); "
                    "read the report after the region closes>")
        if self._ended is None:
            return f"<RBLNExplain not started (trace={self.with_stack})>"
        return self.report()

    __str__ = __repr__


def explain(with_stack: bool = False, *, trace: bool | None = None) -> RBLNExplain:
    """A region to use as ``with torch.rbln.explain() as p: ...``; then ``print(p.report())``."""
    return RBLNExplain(with_stack, trace=trace)


def explain_steady(fn: Callable[[], Any], *, warmup: int = 2, return_cold: bool = False,
                   as_diff: bool = False, with_stack: bool = False, trace: bool | None = None):
    """Separate one-time cost from recurring overhead: a "cold" region around the first
    ``fn()``, ``warmup`` unmeasured calls, then a "warm" region around one more call.

    Returns ``warm``; ``(cold, warm)`` with ``return_cold``; ``cold.diff(warm)`` with ``as_diff``.
    Meaningful only when ``fn`` has not run before and does the same work on every call."""
    cold = RBLNExplain(with_stack, trace=trace)
    with cold:
        fn()
    for _ in range(max(0, warmup)):
        fn()
    warm = RBLNExplain(with_stack, trace=trace)
    with warm:
        fn()
    if as_diff:
        return cold.diff(warm)
    return (cold, warm) if return_cold else warm
