"""The one stream of hidden events.

Every layer records what it did that the user did not ask for (a CPU run, a compile, a host
bounce, a physical transfer) here, once, where it happens. Counters are process-wide and
cumulative; tools (explain, the fallback log, diagnose) read them or listen to the stream and
never keep bookkeeping of their own.

Recording is one dict update; listeners cost nothing while none is attached.

Kinds and their keys (each counter is ``[count, amount]``; amount is bytes or nanoseconds):

========================  =========================  ===============================================
kind                      key                        meaning
========================  =========================  ===============================================
``dispatch``              op                         a device-table op entered the dispatcher
``warm_hit``              op                         a compiled program was reused (amount: ns)
``recompile``             op                         a program was compiled (amount: ns)
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

__all__ = ["record", "snapshot", "listen", "unlisten", "counters", "KINDS"]

KINDS = (
    "dispatch", "warm_hit", "recompile", "cpu_fallback", "cpu_fallback_reason", "host_op",
    "bounce", "v2v_slow", "v2v_reject", "d2h", "h2d", "runtime", "collective",
)

# kind -> key -> [count, amount]
counters: dict[str, dict[str, list[int]]] = {k: {} for k in KINDS}
_lock = threading.Lock()

# Listeners are called as fn(kind, key, amount) after the counter moved. The tuple is
# replaced, never mutated, so record() can iterate it without a lock.
_listeners: tuple[Callable[[str, str, int], None], ...] = ()


def record(kind: str, key: str = "", amount: int = 0) -> None:
    """Count one event of ``kind`` under ``key`` carrying ``amount`` bytes or ns."""
    table = counters[kind]
    c = table.get(key)
    if c is None:
        with _lock:
            c = table.setdefault(key, [0, 0])
    c[0] += 1
    c[1] += amount
    if _listeners:
        for fn in _listeners:
            fn(kind, key, amount)


def snapshot() -> dict[str, dict[str, list[int]]]:
    """A deep copy of every counter, for tools that compute deltas between two points."""
    with _lock:
        return copy.deepcopy(counters)


def listen(fn: Callable[[str, str, int], None]) -> None:
    global _listeners
    with _lock:
        _listeners = _listeners + (fn,)


def unlisten(fn: Callable[[str, str, int], None]) -> None:
    global _listeners
    with _lock:
        _listeners = tuple(f for f in _listeners if f is not fn)


def total(kind: str) -> tuple[int, int]:
    """(count, amount) summed over every key of ``kind``."""
    n = a = 0
    for c, x in list(counters[kind].values()):
        n += c
        a += x
    return n, a
