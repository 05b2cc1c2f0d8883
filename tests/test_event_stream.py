"""The one event stream: counts the native core records (residency transfers) fold into the
Python counters on every read, and a listener sees each of them in order, on the thread and
from the Python call site that caused it."""

from __future__ import annotations

import sys
import threading

import torch

from torch_rbln import events

D = "rbln"


def test_native_counts_fold_into_every_read():
    a = torch.ones(4096, dtype=torch.float16, device=D)
    n0, b0 = events.total("h2d")
    snap0 = events.snapshot()["h2d"].get("", [0, 0])
    c = a + a                                        # the push happens in the native core
    assert events.total("h2d") == (n0 + 1, b0 + 8192)
    assert events.counters["h2d"][""] == [snap0[0] + 1, snap0[1] + 8192]
    assert events.snapshot()["h2d"][""] == [snap0[0] + 1, snap0[1] + 8192]
    d0 = events.total("d2h")
    c.cpu()
    assert events.total("d2h") == (d0[0] + 1, d0[1] + 8192)


def _user_line() -> int:
    return sys._getframe(1).f_lineno


def test_listener_sees_native_events_in_order_with_their_call_site():
    seen = []

    def listener(kind, key, amount):
        if kind in ("dispatch", "h2d", "d2h", "recompile", "warm_hit"):
            # the innermost frame of this test file on the stack: the user's call site
            f = sys._getframe(1)
            while f is not None and f.f_code.co_filename != __file__:
                f = f.f_back
            seen.append((kind, amount, threading.get_ident(), f.f_lineno if f else None))

    a = torch.full((64,), 2.0, dtype=torch.float16, device=D)
    b = torch.full((64,), 3.0, dtype=torch.float16, device=D)
    counted = events.total("h2d")
    events.listen(listener)
    try:
        line = _user_line() + 1
        c = a * b
        c.cpu()
    finally:
        events.unlisten(listener)
    me = threading.get_ident()
    kinds = [(k, amount) for k, amount, _, _ in seen]
    assert kinds[0] == ("dispatch", 0)
    assert kinds[1][0] in ("recompile", "warm_hit")
    assert kinds[2:] == [("h2d", 128), ("h2d", 128), ("d2h", 128)]
    assert all(tid == me for _, _, tid, _ in seen)
    assert [ln for k, _, _, ln in seen if k == "h2d"] == [line, line]
    assert [ln for k, _, _, ln in seen if k == "d2h"] == [line + 1]
    # forwarded events are counted once, by the stream itself
    assert events.total("h2d") == (counted[0] + 2, counted[1] + 256)
    # without a listener the native core counts on its own again
    e = torch.ones(64, dtype=torch.float16, device=D)
    e + e
    assert events.total("h2d") == (counted[0] + 3, counted[1] + 384)


def test_a_batch_counts_as_its_events_recorded_one_by_one():
    # a compiled graph's per-call events: folded into one update per (kind, key) without a
    # listener, each event in order (timed amounts filled in) with one
    batch = events.Batch([("dispatch", "batch-op", 0), ("cpu_fallback_reason", "batch-why", 0),
                          ("cpu_fallback", "batch-op", None), ("dispatch", "batch-op", 0),
                          ("graph_node", "batch-node", 3)])

    def counts():
        c = events.counters
        return (c["dispatch"].get("batch-op"), c["cpu_fallback_reason"].get("batch-why"),
                c["cpu_fallback"].get("batch-op"), c["graph_node"].get("batch-node"))

    events.record_batch(batch, 7)
    events.record_batch(batch, 5)
    assert counts() == ([4, 0], [2, 0], [2, 12], [2, 6])
    seen = []

    def listener(kind, key, amount):
        seen.append((kind, key, amount))

    events.listen(listener)
    try:
        events.record_batch(batch, 11)
    finally:
        events.unlisten(listener)
    assert seen == [("dispatch", "batch-op", 0), ("cpu_fallback_reason", "batch-why", 0),
                    ("cpu_fallback", "batch-op", 11), ("dispatch", "batch-op", 0),
                    ("graph_node", "batch-node", 3)]
    assert counts() == ([6, 0], [3, 0], [3, 23], [3, 9])


def test_a_listener_of_some_kinds_hears_only_those_and_the_rest_is_still_counted():
    # a compare region listens to the route kinds only: the native core keeps the others in
    # its counters, and a listener of every kind beside it still hears every event
    a = torch.full((64,), 2.0, dtype=torch.float16, device=D)
    b = torch.full((64,), 3.0, dtype=torch.float16, device=D)
    (a * b).cpu()                                   # warm: the same events again below
    some, every = [], []

    def hear_some(kind, key, amount):
        some.append(kind)

    def hear_every(kind, key, amount):
        every.append(kind)

    def run():
        n = events.total("dispatch")[0]
        (a * b).cpu()
        return events.total("dispatch")[0] - n

    events.listen(hear_some, passive=True, kinds=("device_program", "d2h"))
    try:
        pushed = run()          # a dispatch event: counted, not heard
        assert set(some) == {"device_program", "d2h"} and pushed == 1
        events.listen(hear_every, passive=True)
        try:
            some.clear()
            assert run() == 1
        finally:
            events.unlisten(hear_every)
    finally:
        events.unlisten(hear_some)
    assert set(some) == {"device_program", "d2h"}
    assert {"dispatch", "device_program", "d2h"} <= set(every)
