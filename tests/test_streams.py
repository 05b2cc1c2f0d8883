"""torch.rbln streams (docs/torch-rbln.md ("Streams and events")), run in a fresh process with two devices.

Device programs finish when launched, so the ordering checks queue host callables on streams
(``torch_rbln._C._enqueue``, the entry point queued copies use) to have work that is still
pending when the test looks."""

from __future__ import annotations

import pytest

from conftest import run_json

PRELUDE = """
    import threading, time
    import torch_rbln._C as C

    def blocker(stream, log, name, gate):
        # queued work that finishes only when `gate` is set
        C._enqueue(stream.stream_id, stream.device_index, lambda: (gate.wait(30), log.append(name)))

    def later(stream, log, name):
        C._enqueue(stream.stream_id, stream.device_index, lambda: log.append(name))
"""


@pytest.fixture(scope="module")
def out():
    return run_json(PRELUDE + """
    res = {}
    s = torch.rbln.Stream()
    res["type"] = [isinstance(s, torch.Stream), type(s).__name__, repr(s)]
    res["pool"] = [torch.rbln.Stream().stream_id for _ in range(40)]
    res["priority"] = [torch.rbln.Stream(priority=-1).priority, torch.rbln.Stream.priority_range()]
    res["start"] = [torch.rbln.current_stream().stream_id, torch.rbln.default_stream().stream_id,
                    torch.rbln.current_stream() == torch.rbln.default_stream()]
    res["accelerator_matches"] = torch.accelerator.current_stream() == torch.rbln.current_stream()

    # stream(s): current inside, previous after; ops inside compute as usual
    x = torch.arange(64, dtype=torch.float16)
    with torch.rbln.stream(s):
        inside = torch.rbln.current_stream().stream_id
        y = (x.to("rbln") * 2 + 1).cpu()
    res["ctx"] = [s.stream_id, inside, torch.rbln.current_stream().stream_id,
                  torch.equal(y, x * 2 + 1)]
    torch.rbln.set_stream(s)
    res["set_stream"] = [torch.rbln.current_stream() == s,
                         torch.accelerator.current_stream() == s]
    torch.rbln.set_stream(None)
    res["set_none_noop"] = torch.rbln.current_stream() == s
    torch.rbln.set_stream(torch.rbln.default_stream())

    # a stream of another device: that device is current inside, both restored after
    s1 = torch.rbln.Stream("rbln:1")
    with torch.rbln.stream(s1):
        res["cross_inside"] = [torch.rbln.current_device(), torch.rbln.current_stream() == s1]
    res["cross_after"] = [torch.rbln.current_device(), torch.rbln.current_stream(1).stream_id]
    torch.rbln.set_stream(s1)
    res["set_stream_selects_device"] = torch.rbln.current_device()
    torch.rbln.set_device(0)

    # the current stream is per thread
    box = {}
    def other():
        box["id"] = torch.rbln.current_stream().stream_id
    with torch.rbln.stream(s):
        t = threading.Thread(target=other); t.start(); t.join()
    res["per_thread"] = box["id"]

    # torch.Stream(device="rbln") goes through the device guard
    ts = torch.Stream(device="rbln")
    res["torch_stream"] = [ts.device.type, ts.query(), ts.synchronize() is None]

    # queued work runs in order; query/synchronize see it
    log, gate = [], threading.Event()
    blocker(s, log, "a", gate); later(s, log, "b")
    res["pending"] = [s.query(), list(log)]
    gate.set(); s.synchronize()
    res["done"] = [s.query(), list(log)]

    # wait_stream: work queued on s2 afterwards waits for s's work
    s2 = torch.rbln.Stream()
    log, gate = [], threading.Event()
    blocker(s, log, "first", gate)
    s2.wait_stream(s)
    later(s2, log, "second")
    time.sleep(0.2)
    res["wait_stream_pending"] = [list(log), s2.query()]
    gate.set(); s2.synchronize()
    res["wait_stream_done"] = list(log)

    # torch.rbln.synchronize() waits for every stream of the device
    log, gate = [], threading.Event()
    blocker(s2, log, "x", gate)
    threading.Timer(0.2, gate.set).start()
    torch.rbln.synchronize()
    res["device_sync"] = list(log)

    # a failure in queued work is raised by the next synchronize, once
    C._enqueue(s.stream_id, 0, lambda: 1 / 0)
    try:
        s.synchronize(); res["failure"] = None
    except RuntimeError as e:
        res["failure"] = str(e)
    s.synchronize()

    errors = []
    for f in (lambda: torch.rbln.Stream("rbln:5"), lambda: torch.rbln.current_stream(7),
              lambda: torch.rbln.Stream("cpu")):
        try:
            f(); errors.append(None)
        except (ValueError, RuntimeError) as e:
            errors.append(str(e))
    res["errors"] = errors
    print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})


def test_stream_is_a_torch_stream_with_the_reference_repr(out):
    is_stream, name, text = out["type"]
    assert is_stream and name == "Stream"
    assert text.startswith("torch.rbln.Stream(device=rbln:0, stream_id=") and text.endswith(")")


def test_streams_come_from_a_fixed_pool(out):
    ids = out["pool"]
    assert 0 not in ids and len(set(ids)) == 32            # 32 pool streams, then reused
    assert ids[32:] == ids[:8]


def test_priority_is_accepted_and_ignored(out):
    assert out["priority"] == [0, [0, 0]]


def test_current_and_default_stream(out):
    assert out["start"] == [0, 0, True]
    assert out["accelerator_matches"]
    assert out["set_stream"] == [True, True] and out["set_none_noop"]


def test_stream_context_selects_and_restores(out):
    sid, inside, after, values_ok = out["ctx"]
    assert inside == sid and after == 0 and values_ok
    assert out["cross_inside"] == [1, True]
    assert out["cross_after"] == [0, 0]
    assert out["set_stream_selects_device"] == 1
    assert out["per_thread"] == 0


def test_torch_stream_on_rbln(out):
    assert out["torch_stream"] == ["rbln", True, True]


def test_queued_work_runs_in_order_and_synchronize_waits(out):
    assert out["pending"] == [False, []]
    assert out["done"] == [True, ["a", "b"]]
    assert out["wait_stream_pending"] == [[], False]
    assert out["wait_stream_done"] == ["first", "second"]
    assert out["device_sync"] == ["x"]


def test_failed_queued_work_is_raised_by_synchronize(out):
    assert "asynchronous work on rbln:0 stream" in out["failure"]
    assert "division by zero" in out["failure"]


def test_invalid_streams_raise(out):
    bad_index, bad_current, cpu = out["errors"]
    assert "rbln device index 5 is out of range [0, 2)" in bad_index
    assert "rbln device index 7 is out of range [0, 2)" in bad_current
    assert "Expected rbln device, but got cpu" in cpu


def test_record_stream_defers_reuse_until_the_stream_work_is_done():
    """CUDA's caching rule: memory freed while a stream recorded with ``record_stream`` may
    still use it is reused only after the work queued on that stream at the free is done."""
    out = run_json(PRELUDE + """
    N = 1 << 16
    s = torch.rbln.Stream()
    res = {}

    def on_device():
        # one storage, with a device block (the in-place device op books it)
        return torch.empty(N, device="rbln", dtype=torch.float16).fill_(1).mul_(2)

    def gate_on(stream):
        log, gate = [], threading.Event()
        blocker(stream, log, "done", gate)
        return gate

    # without record_stream the freed memory is the next allocation's
    t = on_device(); ptr = t.data_ptr(); del t
    u = on_device(); res["plain"] = u.data_ptr() == ptr; del u

    # recorded on s while s has pending work: neither the host view nor the block is reused
    t = on_device(); ptr = t.data_ptr()
    gate = gate_on(s)
    t.record_stream(s)
    before = torch.rbln.memory_stats()
    del t
    after = torch.rbln.memory_stats()
    res["freed_stats"] = [before["allocated.current"] - after["allocated.current"],
                          before["active.current"] - after["active.current"]]
    u = on_device()
    res["while_pending"] = u.data_ptr() == ptr
    res["while_pending_values"] = torch.equal(u.cpu(), torch.full((N,), 2.0, dtype=torch.float16))
    del u
    gate.set(); s.synchronize()
    v = on_device(); res["after_done"] = v.data_ptr() == ptr; del v
    res["active_after"] = torch.rbln.memory_stats()["active.current"]

    # a stream with nothing pending at the free defers nothing
    t = on_device(); ptr = t.data_ptr(); t.record_stream(s); del t
    w = on_device(); res["idle_stream"] = w.data_ptr() == ptr; del w

    # empty_cache waits for the recorded streams' work, then releases the block
    t = on_device(); gate = gate_on(s); t.record_stream(s); del t
    threading.Timer(0.2, gate.set).start()
    torch.rbln.empty_cache()
    res["empty_cache"] = [s.query(), torch.rbln.memory_stats()["reserved.current"]]

    errors = []
    for f in (lambda: torch.ones(2, device="rbln").record_stream(torch.rbln.Stream("rbln:1")),
              lambda: torch.ones(2).record_stream(s)):
        try:
            f(); errors.append(None)
        except RuntimeError as e:
            errors.append(str(e).splitlines()[0])
    res["errors"] = errors
    print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert out["plain"]
    assert out["freed_stats"] == [1 << 17, 0]      # no longer allocated, still active (as CUDA)
    assert out["while_pending"] is False and out["while_pending_values"]
    assert out["after_done"] and out["active_after"] == 0
    assert out["idle_stream"]
    assert out["empty_cache"] == [True, 0]
    assert "the stream is on rbln:1, the tensor on rbln:0" in out["errors"][0]
    assert out["errors"][1] is not None                 # a CPU tensor: PyTorch's own error


def test_an_allocation_that_only_fits_in_recorded_memory_waits_for_the_stream():
    """As CUDA's caching allocator: before an out-of-memory error, the work of the streams
    that freed blocks were recorded on is waited for, and those blocks are used."""
    out = run_json(PRELUDE + """
    s = torch.rbln.Stream()
    N = 3 << 18                       # 1.5 MiB of fp16 in a 2 MiB device
    t = torch.empty(N, device="rbln", dtype=torch.float16).fill_(1).mul_(2)
    log, gate = [], threading.Event()
    blocker(s, log, "done", gate)
    t.record_stream(s)
    del t                             # its block waits for s
    threading.Timer(0.3, gate.set).start()
    u = torch.empty(N, device="rbln", dtype=torch.float16).fill_(3).mul_(1)
    ok = torch.equal(u.cpu(), torch.full((N,), 3.0, dtype=torch.float16))
    stats = torch.rbln.memory_stats()
    print(json.dumps({"log": log, "ok": ok, "ooms": stats["num_ooms"]}))
    """, {"TORCH_RBLN_DEVICE_MEMORY": "2MiB"})
    assert out == {"log": ["done"], "ok": True, "ooms": 0}
