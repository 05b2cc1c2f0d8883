"""torch.rbln.Event and torch.Event(device="rbln") (docs/torch-rbln.md ("Streams and events")), run in a fresh
process with two devices. Pending work is made by queuing host callables on a stream
(``torch_rbln._C._enqueue``), as in test_streams.py."""

from __future__ import annotations

import pytest

from conftest import run_json
from test_streams import PRELUDE


@pytest.fixture(scope="module")
def out():
    return run_json(PRELUDE + """
    res = {}
    # the row of the issue table: a plain torch.Event on rbln
    e = torch.Event(device="rbln")
    e.synchronize()
    e.record()
    e.synchronize()
    res["torch_event"] = [e.query(), e.device.type]

    ev = torch.rbln.Event(enable_timing=True, blocking=True, interprocess=True)
    res["type"] = [isinstance(ev, torch.Event), repr(ev)]
    res["unrecorded"] = [ev.query(), ev.synchronize() is None]
    s = torch.rbln.Stream()
    rec = s.record_event()
    res["record_event"] = [type(rec).__name__, rec.query()]

    # an event marks the work queued before it: query/synchronize follow that work only
    log, gate = [], threading.Event()
    blocker(s, log, "before", gate)
    ev.record(s)
    later(s, log, "after")
    res["pending"] = ev.query()
    gate.set()
    ev.synchronize()
    res["after_sync"] = [ev.query(), log[:1]]
    s.synchronize()

    # wait_event on the same device: a device-side fence, the host does not wait
    s2 = torch.rbln.Stream()
    log, gate = [], threading.Event()
    blocker(s, log, "producer", gate)
    e2 = s.record_event()
    t0 = time.monotonic()
    s2.wait_event(e2)
    res["fence_returned_at_once"] = time.monotonic() - t0 < 5
    later(s2, log, "consumer")
    time.sleep(0.2)
    res["fence_holds"] = [list(log), s2.query()]
    gate.set()
    s2.synchronize()
    res["fence_order"] = list(log)

    # Event.wait(stream) is the same fence
    log, gate = [], threading.Event()
    blocker(s, log, "p", gate)
    e3 = s.record_event()
    e3.wait(s2)
    later(s2, log, "c")
    gate.set(); s2.synchronize()
    res["event_wait"] = list(log)

    # across devices the host waits
    s1 = torch.rbln.Stream("rbln:1")
    log, gate = [], threading.Event()
    blocker(s1, log, "dev1", gate)
    e4 = s1.record_event()
    threading.Timer(0.2, gate.set).start()
    s2.wait_event(e4)
    res["cross_device_host_wait"] = [e4.query(), list(log)]

    t1, t2 = torch.Event(device="rbln", enable_timing=True), torch.Event(device="rbln", enable_timing=True)
    t1.record(); t2.record()
    errors = []
    for f in (lambda: ev.elapsed_time(rec), lambda: t1.elapsed_time(t2), lambda: ev.ipc_handle(),
              lambda: torch.rbln.Event.from_ipc_handle(0, b"")):
        try:
            f(); errors.append(None)
        except (RuntimeError, NotImplementedError) as x:
            errors.append([type(x).__name__, str(x)])
    res["errors"] = errors
    print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})


def test_torch_event_synchronize_on_rbln(out):
    assert out["torch_event"] == [True, "rbln"]


def test_rbln_event_accepts_flags(out):
    is_event, text = out["type"]
    assert is_event and text.startswith("torch.rbln.Event(device=rbln")
    assert out["unrecorded"] == [True, True]
    assert out["record_event"] == ["Event", True]


def test_event_marks_the_work_queued_before_it(out):
    assert out["pending"] is False
    assert out["after_sync"] == [True, ["before"]]


def test_wait_event_is_a_device_side_fence(out):
    assert out["fence_returned_at_once"]
    assert out["fence_holds"] == [[], False]
    assert out["fence_order"] == ["producer", "consumer"]
    assert out["event_wait"] == ["p", "c"]


def test_wait_event_across_devices_waits_on_the_host(out):
    assert out["cross_device_host_wait"] == [True, ["dev1"]]


def test_timing_and_ipc_raise_the_reference_errors(out):
    timing = ["RuntimeError",
              "RBLN does not support Event.elapsed_time (event timing is not supported)."]
    ipc = ["NotImplementedError", "torch.Event ipc is not supported yet"]
    rbln_timing, torch_timing, handle, from_handle = out["errors"]
    assert rbln_timing == timing
    assert torch_timing[0] == "RuntimeError" and timing[1] in torch_timing[1]
    assert handle == ipc and from_handle == ipc
