"""The one stream of hidden events.

Every layer records what it did that the user did not ask for (a CPU run, a compile, a host
bounce, a physical transfer) here, once, where it happens. Counters are process-wide and
cumulative; tools (explain, the fallback log, diagnose) read them or listen to the stream and
never keep bookkeeping of their own.

Recording is one dict update; listeners cost nothing while none is attached. The native core
counts its own events (``h2d`` / ``d2h`` of residency transitions) in C++ counters without the
GIL; every read of the stream (``snapshot``, ``total``, ``counters``) folds them in first, and
while a listener is attached the core hands each event to :func:`record` instead, so listeners
see every event in order, from the thread and Python call site that caused it.

Device programs and physical copies are recorded through :func:`record_program` /
:func:`record_copy` (in C++: ``events::record_program`` / ``record_copy``): while a
``torch.profiler`` session with ``ProfilerActivity.PrivateUse1`` records, the same call also
hands the event to the profiler as a device activity (``csrc/Profiler.cpp``), so the profiler
and explain read one stream. docs/profiling.md ("Profiling").

Kinds and their keys (each counter is ``[count, amount]``; amount is bytes or nanoseconds):

========================  =========================  ===============================================
kind                      key                        meaning
========================  =========================  ===============================================
``dispatch``              op                         a device-table op entered the dispatcher
``warm_hit``              op                         a compiled program was reused (amount: ns)
``recompile``             op                         a program was compiled (amount: ns)
``recompile_cause``       op, argument, part,        what differs from the op's closest earlier
                          before, after (tab-joined) program (``dispatch/recompile_causes.py``)
``cpu_fallback``          op                         a device-table op ran on the CPU (amount: ns)
``cpu_fallback_reason``   reason code                why it did (``dtype-not-fp16`` ...)
``host_op``               op                         an op without a device kernel ran on the CPU
``bounce``                site                       a torch-side copy went through the host (bytes)
``v2v_slow``              cause                      a device copy fell to the host path (bytes)
``v2v_reject``            reason                     why the fast copy plan was rejected (bytes)
``d2h``                   ``""``                     physical device->host transfer (bytes)
``h2d``                   ``""``                     host->device push (bytes)
``v2v``                   ``""``                     device->device copy on the NPU (bytes)
``device_program``        op or graph partition      a device program ran (amount: its ns, timed
                                                     only while torch.profiler records, else 0)
``runtime``               primitive                  time spent in a runtime primitive (ns)
``collective``            ``op@where``               a torch.distributed collective on rbln tensors
                                                     (bytes: its message size); where is ``device``
                                                     (the NPU moves device memory) or ``host``
                                                     (staged through host memory for gloo)
``graph_node``            ``where\top\twhy``          nodes of a compiled graph that ran (amount:
                                                     how many); where is ``device``,
                                                     ``in-program`` (the program's host side),
                                                     ``host`` or ``eager``
``graph_pad``             graph partition            a device partition's unaligned last dims
                                                     padded at its boundary (bytes of padding)
========================  =========================  ===============================================
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["record", "record_batch", "Batch", "record_program", "record_copy", "span_start",
           "snapshot", "listen", "unlisten", "counters", "total", "KINDS"]

KINDS = (
    "dispatch", "warm_hit", "recompile", "recompile_cause", "cpu_fallback", "cpu_fallback_reason",
    "host_op", "bounce", "v2v_slow", "v2v_reject", "d2h", "h2d", "v2v", "device_program",
    "runtime", "collective", "graph_node", "graph_pad",
)

# kind -> key -> [count, amount]; read as ``counters`` (module __getattr__), which folds in the
# native counts first
_counters: dict[str, dict[str, list[int]]] = {k: {} for k in KINDS}
_lock = threading.Lock()

# the native core's counters: drain() -> [(kind, key, count, amount)], its listening switch and
# the kinds it hands to Python while listening
_native_drain: Callable[[], list] | None = None
_native_listening: Callable[[bool], None] | None = None
_native_kinds: Callable[[list], None] | None = None

# Listeners are called as fn(kind, key, amount) after the counter moved. The tuple is
# replaced, never mutated, so record() can iterate it without a lock.
_listeners: tuple[Callable[[str, str, int], None], ...] = ()
# the passive ones among them: they only read events (explain's call-site capture), so the
# native paths keep serving while only they listen and hand them their events
_passive: tuple[Callable[[str, str, int], None], ...] = ()
# (listener, the kinds it wants or None for every kind), replaced with _listeners
_routes: tuple[tuple[Callable[[str, str, int], None], frozenset | None], ...] = ()


def record(kind: str, key: str = "", amount: int = 0) -> None:
    """Count one event of ``kind`` under ``key`` carrying ``amount`` bytes or ns."""
    table = _counters[kind]
    c = table.get(key)
    if c is None:
        with _lock:
            c = table.setdefault(key, [0, 0])
    c[0] += 1
    c[1] += amount
    if _routes:
        for fn, kinds in _routes:
            if kinds is None or kind in kinds:
                fn(kind, key, amount)


class Batch:
    """Events recorded together, the same ones on every call (a compiled graph's per-call
    events): ``(kind, key, amount)`` each, ``amount`` None where :func:`record_batch` gives it
    per call (a measured time). Recorded without listeners, a batch is one counter update per
    distinct (kind, key); listeners see each event, in order, as :func:`record` would give it."""

    __slots__ = ("events", "_folded")

    def __init__(self, events):
        self.events = tuple(events)
        self._folded = None

    def _fold(self) -> tuple:
        groups: dict = {}
        for kind, key, amount in self.events:
            g = groups.setdefault((kind, key), [0, 0, 0])
            g[0] += 1
            if amount is None:
                g[2] += 1
            else:
                g[1] += amount
        with _lock:     # the counters are never replaced: their lists can be held
            self._folded = tuple((_counters[kind].setdefault(key, [0, 0]), n, fixed, timed)
                                 for (kind, key), (n, fixed, timed) in groups.items())
        return self._folded


def record_batch(batch: Batch, timed: int = 0) -> None:
    """Record every event of ``batch``; ``timed`` is the amount of those whose amount is None."""
    if _listeners:
        for kind, key, amount in batch.events:
            record(kind, key, timed if amount is None else amount)
        return
    for c, n, fixed, t in batch._folded or batch._fold():
        c[0] += n
        c[1] += fixed + t * timed


# the profiler's tap: on while a profiling session records device activity (set by the native
# core as sessions start and stop); activity(kind, key, device, start_ns, end_ns, bytes)
_tap_on = False
_tap_activity: Callable[[str, str, int, int, int, int], None] | None = None
_now = time.time_ns     # the profiler's clock (ns since the epoch), as the native tap's


def span_start() -> int:
    """Where a timed event starts: now while the profiler records, else 0 (nothing is timed)."""
    return _now() if _tap_on else 0


def record_program(key: str, device: int, start_ns: int) -> None:
    """A device program ran on NPU ``device`` since ``start_ns`` (:func:`span_start`)."""
    if not _tap_on:
        record("device_program", key, 0)
        return
    end = _now()
    start = start_ns or end
    record("device_program", key, end - start)
    _tap_activity("device_program", key, device, start, end, 0)


def record_copy(kind: str, nbytes: int, device: int, start_ns: int) -> None:
    """A physical copy (``h2d``, ``d2h``, ``v2v``) of ``nbytes`` on NPU ``device`` since
    ``start_ns`` (0: an instant)."""
    record(kind, "", nbytes)
    if _tap_on:
        end = _now()
        _tap_activity(kind, "", device, start_ns or end, end, nbytes)


def _set_tap(on: bool) -> None:
    global _tap_on
    _tap_on = bool(on)


def connect_tap(activity: Callable, set_switch: Callable[[Callable[[bool], None]], None]) -> None:
    """Called once by the runtime when the native core loads: the profiler's tap."""
    global _tap_activity
    _tap_activity = activity
    set_switch(_set_tap)


def _fold() -> None:
    """Move what the native core counted since the last read into the Python counters."""
    if _native_drain is None:
        return
    deltas = _native_drain()
    if not deltas:
        return
    with _lock:
        for kind, key, n, amount in deltas:
            table = _counters[kind]
            c = table.get(key)
            if c is None:
                c = table[key] = [0, 0]
            c[0] += n
            c[1] += amount


def connect_native(drain: Callable[[], list], set_listening: Callable[[bool, bool], None],
                   set_kinds: Callable[[list], None]) -> None:
    """Called once by the runtime when the native core loads: ``set_listening(listening,
    python_path)`` tells it whether events go to Python and whether a listener needs every
    decision made by the Python kernels; ``set_kinds(kinds)`` which kinds go (empty: all)."""
    global _native_drain, _native_listening, _native_kinds
    _native_drain, _native_listening, _native_kinds = drain, set_listening, set_kinds
    _tell_native()


def _tell_native() -> None:
    if _native_listening is not None:
        wanted = [k for _, kinds in _routes for k in (kinds or ())]
        _native_kinds(sorted(set(wanted)) if all(k is not None for _, k in _routes) else [])
        _native_listening(bool(_listeners), any(f not in _passive for f in _listeners))


def __getattr__(name: str):
    if name == "counters":
        _fold()
        return _counters
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def snapshot() -> dict[str, dict[str, list[int]]]:
    """A copy of every counter, for tools that compute deltas between two points (the counters
    are ``[count, amount]`` pairs of ints: one list copy each, not a generic deep copy, whose
    cost grew with every op name a long run had seen)."""
    _fold()
    with _lock:
        return {kind: {key: c[:] for key, c in table.items()} for kind, table in _counters.items()}


def listen(fn: Callable[[str, str, int], None], passive: bool = False,
           kinds=None) -> None:
    """Call ``fn(kind, key, amount)`` for every event from now on (of ``kinds`` only, where
    given: the native core keeps the other kinds in its counters), on the recording thread.

    A listener may act on an event (the fallback log writes, a guard raises): then every op
    takes its Python kernel, where each decision is made and recorded in order. A ``passive``
    one only reads the events and must not raise: the native paths keep serving while only
    passive listeners are attached, handing them the same events in the same order."""
    global _listeners, _passive, _routes
    with _lock:
        _listeners = _listeners + (fn,)
        if passive:
            _passive = _passive + (fn,)
        _routes = _routes + ((fn, None if kinds is None else frozenset(kinds)),)
        _tell_native()


def unlisten(fn: Callable[[str, str, int], None]) -> None:
    global _listeners, _passive, _routes
    with _lock:
        _listeners = tuple(f for f in _listeners if f is not fn)
        _passive = tuple(f for f in _passive if f is not fn)
        _routes = tuple(r for r in _routes if r[0] is not fn)
        _tell_native()


def total(kind: str) -> tuple[int, int]:
    """(count, amount) summed over every key of ``kind``."""
    _fold()
    n = a = 0
    for c, x in list(_counters[kind].values()):
        n += c
        a += x
    return n, a
