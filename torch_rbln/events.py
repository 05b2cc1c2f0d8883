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
``runtime``               primitive                  time spent in a runtime primitive (ns)
``collective``            ``op@where``               a torch.distributed collective on rbln tensors
                                                     (bytes: its message size); where is ``device``
                                                     (the NPU moves device memory) or ``host``
                                                     (staged through host memory for gloo)
========================  =========================  ===============================================
"""

from __future__ import annotations

import copy
import threading
from typing import Callable

__all__ = ["record", "snapshot", "listen", "unlisten", "counters", "total", "KINDS"]

KINDS = (
    "dispatch", "warm_hit", "recompile", "recompile_cause", "cpu_fallback", "cpu_fallback_reason", "host_op",
    "bounce", "v2v_slow", "v2v_reject", "d2h", "h2d", "runtime", "collective",
)

# kind -> key -> [count, amount]; read as ``counters`` (module __getattr__), which folds in the
# native counts first
_counters: dict[str, dict[str, list[int]]] = {k: {} for k in KINDS}
_lock = threading.Lock()

# the native core's counters: drain() -> [(kind, key, count, amount)], and its listening switch
_native_drain: Callable[[], list] | None = None
_native_listening: Callable[[bool], None] | None = None

# Listeners are called as fn(kind, key, amount) after the counter moved. The tuple is
# replaced, never mutated, so record() can iterate it without a lock.
_listeners: tuple[Callable[[str, str, int], None], ...] = ()


def record(kind: str, key: str = "", amount: int = 0) -> None:
    """Count one event of ``kind`` under ``key`` carrying ``amount`` bytes or ns."""
    table = _counters[kind]
    c = table.get(key)
    if c is None:
        with _lock:
            c = table.setdefault(key, [0, 0])
    c[0] += 1
    c[1] += amount
    if _listeners:
        for fn in _listeners:
            fn(kind, key, amount)


def _fold() -> None:
    """Move what the native core counted since the last read into the Python counters."""
    if _native_drain is None:
        return
    deltas = _native_drain()
    if not deltas:
        return
    with _lock:
        for kind, key, n, amount in deltas:
            c = _counters[kind].setdefault(key, [0, 0])
            c[0] += n
            c[1] += amount


def connect_native(drain: Callable[[], list], set_listening: Callable[[bool], None]) -> None:
    """Called once by the runtime when the native core loads."""
    global _native_drain, _native_listening
    _native_drain, _native_listening = drain, set_listening
    set_listening(bool(_listeners))


def __getattr__(name: str):
    if name == "counters":
        _fold()
        return _counters
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def snapshot() -> dict[str, dict[str, list[int]]]:
    """A deep copy of every counter, for tools that compute deltas between two points."""
    _fold()
    with _lock:
        return copy.deepcopy(_counters)


def _set_listeners(fns: tuple) -> None:
    global _listeners
    _listeners = fns
    if _native_listening is not None:
        _native_listening(bool(fns))


def listen(fn: Callable[[str, str, int], None]) -> None:
    with _lock:
        _set_listeners(_listeners + (fn,))


def unlisten(fn: Callable[[str, str, int], None]) -> None:
    with _lock:
        _set_listeners(tuple(f for f in _listeners if f is not fn))


def total(kind: str) -> tuple[int, int]:
    """(count, amount) summed over every key of ``kind``."""
    _fold()
    n = a = 0
    for c, x in list(_counters[kind].values()):
        n += c
        a += x
    return n, a
