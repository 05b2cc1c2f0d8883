"""torch.profiler on rbln (docs/profiling.md ("Profiling")): device time per op, the NPU's row in the trace
with one slice per program run and per copy, flow arrows from the launching op, rbln memory
events, the tensorboard handler, and one event stream shared with explain."""

from __future__ import annotations

import copy
import glob
import json
from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from conftest import run_code
from torch_rbln import _C, events

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
FP16 = torch.float16
PRIVATEUSE1 = 20      # c10::DeviceType::PrivateUse1, as the trace's memory events name it


@pytest.fixture(scope="module")
def models():
    """fp16 Linear layers: the CPU reference and its rbln copy, compiled once (warm)."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 64)).half()
    dev = copy.deepcopy(cpu).to("rbln")
    dev(torch.randn(16, 64, dtype=FP16).to("rbln"))
    return cpu, dev


def trace_events(p, tmp_path) -> list[dict]:
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_device_time_per_op_and_none_for_a_cpu_fallback(models):
    cpu, dev = models
    x = torch.randn(16, 64, dtype=FP16)
    a = torch.ones(64, dtype=torch.float32, device="rbln")     # fp32: the add falls back
    with profile(activities=ACTIVITIES) as p:
        y = dev(x.to("rbln"))
        b = a + a
        s = torch.sin(a)                                        # no device kernel: a host op
    torch.testing.assert_close(y.cpu(), cpu(x), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(b.cpu(), torch.full((64,), 2.0))
    torch.testing.assert_close(s.cpu(), torch.sin(torch.ones(64)))
    rows = {e.key: e for e in p.key_averages()}
    linear = rows["aten::linear"]
    assert linear.self_device_time_total > 0
    assert linear.device_time_total >= linear.self_device_time_total
    add = rows["aten::add"]
    assert add.self_device_time_total == 0 and add.device_time_total == 0
    assert "rbln::cpu_fallback(dtype-not-fp16)" in rows     # the host run, named with its reason
    assert "rbln::cpu_fallback(no-device-kernel)" in rows
    assert rows["aten::sin"].device_time_total == 0
    table = p.key_averages().table(sort_by="self_device_time_total", row_limit=10)
    assert "Self RBLN" in table
    # ranked by device time: the device programs come first, the fallback add has no place there
    ranked = sorted(rows.values(), key=lambda e: -e.self_device_time_total)
    assert ranked[0].self_device_time_total > 0 and "linear" in ranked[0].key


def test_a_replayed_cpu_fallback_stays_native_under_the_profiler():
    """A warm CPU fallback the native core replays is not sent back to Python by a profile: the
    profile sees the same run (its range, named with the reason, and the host op inside it)
    that an unprofiled call makes."""
    a = torch.ones(64, dtype=torch.float32, device="rbln")
    for _ in range(3):
        a + a                                   # the decision is replayed from now on
    replayed = _C.warm_path_replayed()
    with profile(activities=ACTIVITIES) as p:
        b = a + a
    assert _C.warm_path_replayed() == replayed + 1
    torch.testing.assert_close(b.cpu(), torch.full((64,), 2.0))
    rows = {e.key: e for e in p.key_averages()}
    assert rows["rbln::cpu_fallback(dtype-not-fp16)"].count == 1
    assert rows["aten::add"].device_time_total == 0


def test_chrome_trace_has_the_npu_row_slices_flows_and_memory(models, tmp_path):
    _, dev = models
    x = torch.randn(16, 64, dtype=FP16)
    before = events.snapshot()
    with profile(activities=ACTIVITIES, profile_memory=True) as p:
        y = dev(x.to("rbln"))          # the input's h2d push, two programs
        h = y.cpu()                    # the result's d2h pull
    runs = events.counters["device_program"]["aten::linear"][0] - \
        before["device_program"].get("aten::linear", [0, 0])[0]
    ev = trace_events(p, tmp_path)

    rows = {e["pid"]: e["args"]["name"] for e in ev
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    npu = [pid for pid, name in rows.items() if name == "rbln:0"]
    assert len(npu) == 1
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    copies = [e for e in ev if e.get("cat") == "gpu_memcpy"]
    assert runs == 2
    assert [e["name"] for e in kernels] == ["program: aten::linear"] * runs
    assert all(e["pid"] == npu[0] for e in kernels + copies)
    assert all(e["dur"] > 0 for e in kernels)
    nbytes = x.numel() * x.element_size()
    moved = {(e["name"], int(e["args"]["bytes"])) for e in copies}
    assert ("Memcpy HtoD (rbln)", nbytes) in moved
    assert ("Memcpy DtoH (rbln)", h.numel() * h.element_size()) in moved

    # every device slice is linked to the aten op that launched it, and lies inside it
    ops = {e["args"]["External id"]: e for e in ev
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    for e in kernels:
        op = ops[e["args"]["External id"]]
        assert op["name"] == "aten::linear"
        assert op["ts"] <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + 1
    # flow arrows (ac2g): a start on the host thread, a finish on the NPU row, per slice
    starts = {e["id"]: e for e in ev if e.get("cat") == "ac2g" and e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e.get("cat") == "ac2g" and e["ph"] == "f"}
    assert set(starts) == set(ends) and len(ends) == len(kernels) + len(copies)
    assert all(e["pid"] == npu[0] for e in ends.values())
    assert all(s["pid"] != npu[0] for s in starts.values())

    # the allocator reports rbln storages to the profiler: allocations and frees on rbln:0
    mem = [e["args"] for e in ev if e.get("name") == "[memory]"
           and e["args"].get("Device Type") == PRIVATEUSE1]
    assert mem and all(m["Device Id"] == 0 for m in mem)
    assert any(m["Bytes"] == nbytes for m in mem)          # the input's storage
    assert any(m["Bytes"] < 0 for m in mem)                 # and a free


def test_memory_timeline_exports_rbln_memory(models, tmp_path):
    _, dev = models
    with profile(activities=ACTIVITIES, profile_memory=True, record_shapes=True,
                 with_stack=True) as p:
        y = dev(torch.randn(16, 64, dtype=FP16).to("rbln"))
        del y
    path = tmp_path / "memory.json"
    p.export_memory_timeline(str(path), device="rbln:0")
    times, sizes = json.loads(path.read_text())
    assert len(times) == len(sizes) > 0
    assert max(sum(s) for s in sizes) > 0


def test_scheduled_profile_writes_its_tensorboard_trace(models, tmp_path):
    _, dev = models
    x = torch.randn(16, 64, dtype=FP16).to("rbln")
    with profile(activities=ACTIVITIES, schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as p:
        for _ in range(5):
            dev(x)
            p.step()
    files = glob.glob(str(tmp_path / "*.pt.trace.json"))
    assert len(files) == 1
    ev = json.loads(open(files[0]).read())["traceEvents"]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert len(kernels) == 2 * 2          # two active steps, two programs each
    assert not events._tap_on             # the tap closed with the last active step


def test_a_cpu_only_profile_leaves_the_tap_off(models):
    _, dev = models
    x = torch.randn(16, 64, dtype=FP16).to("rbln")
    with profile(activities=[ProfilerActivity.CPU]) as p:
        on = events._tap_on
        dev(x)
    assert not on
    assert all(e.self_device_time_total == 0 for e in p.key_averages())


def test_profiler_and_explain_read_one_stream(models, tmp_path):
    """In one region: the profiler's device activities per program equal explain's device
    program runs, and its copy bytes equal explain's transfer bytes (eager warm path, the
    Python path of a cold compile, a graph's partition, h2d/d2h/v2v copies)."""
    _, dev = models
    fn = torch.compile(lambda t: torch.nn.functional.silu(t) * 2, backend="rbln")
    x = torch.randn(16, 64, dtype=FP16)
    fn(x.to("rbln"))
    served = _C.warm_path_served()
    with profile(activities=ACTIVITIES) as p, torch.rbln.explain() as ex:
        y = dev(x.to("rbln"))                       # h2d, warm programs
        z = torch.randn(24, 64, dtype=FP16).to("rbln") * 3.0    # a new shape: a cold compile
        g = fn(x.to("rbln"))                        # a graph's device partition
        d = torch.empty_like(y)
        d.copy_(y)                                  # v2v: y's latest bytes are on the device
        h = d.cpu()                                 # d2h
    assert _C.warm_path_served() > served
    torch.testing.assert_close(h, y.cpu())
    torch.testing.assert_close(z.cpu(), z.cpu().float().half())
    del g
    dump = ex.dump()
    ev = trace_events(p, tmp_path)
    programs = Counter(e["name"].removeprefix("program: ") for e in ev if e.get("cat") == "kernel")
    assert programs == Counter(dump["device_programs_by_op"])
    assert "aten::mul.out" in programs and any(k.startswith("graph ") for k in programs)
    copied = Counter()
    for e in ev:
        if e.get("cat") == "gpu_memcpy":
            copied[e["name"]] += int(e["args"]["bytes"])
    rr = dump["runtime_residency"]
    assert copied == Counter({"Memcpy HtoD (rbln)": rr["real_host_sync_h2d"]["bytes"],
                              "Memcpy DtoH (rbln)": rr["real_host_sync_d2h"]["bytes"],
                              "Memcpy DtoD (rbln)": rr["device_v2v"]["bytes"]})
    assert rr["device_v2v"]["bytes"] == y.numel() * y.element_size()


ROWS_PER_NPU = """
import json, sys, torch
from torch.profiler import profile, ProfilerActivity
a = torch.randn(32, 64, dtype=torch.float16).to("rbln:1")
a + a
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
    a + a
    torch.randn(32, 64, dtype=torch.float16).to("rbln:0") * 2
p.export_chrome_trace(sys.argv[1])
"""


def test_each_npu_has_its_own_row(tmp_path):
    path = tmp_path / "trace.json"
    r = run_code(ROWS_PER_NPU.replace("sys.argv[1]", repr(str(path))),
                 env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr
    ev = json.loads(path.read_text())["traceEvents"]
    rows = {e["args"]["name"]: e["pid"] for e in ev
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    slices = {(e["name"], e["pid"]) for e in ev if e.get("cat") == "kernel"}
    assert slices == {("program: aten::add.out", rows["rbln:1"]),
                      ("program: aten::mul.out", rows["rbln:0"])}
