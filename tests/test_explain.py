"""torch.rbln.explain: every signal fired by a scenario built for it, the dump/verdict schemas,
the region rules and call-site attribution. Each test opens its own region; counters are
process-wide deltas, so only what the test does inside the region is counted."""

from __future__ import annotations

import itertools
import sys
import threading

import pytest
import torch

from torch_rbln import events
from torch_rbln.explain.fmt import short_stack

FP16 = torch.float16
_shapes = itertools.count(1)

DUMP_KEYS = {"hidden_host_bounce", "dispatch", "wall_ns", "cpu_fallback_by_op", "recompile_by_op",
             "device_programs_by_op", "cpu_fallback_reasons", "trace_by_op", "runtime_residency",
             "device_memory", "host_threads", "notes"}
VERDICT_KEYS = {"clean", "hidden_host_bounces", "hidden_host_bounce_bytes", "runtime_hidden_d2h",
                "runtime_hidden_by_reason", "cpu_fallbacks", "recompiles", "reasons", "notes"}
SITES = ["copy_d2d_host_bounce", "copy_h2d_staging", "copy_h2d_noncontig_dst",
         "strided_v2v_cpu_fallback"]
CLEAN_REASON = "no hidden host bounce, no CPU fallback, no recompile"


def fresh_shape() -> tuple[int, int]:
    """A shape no other test compiled (the program cache is keyed by op and shape)."""
    return (next(_shapes) + 40, 64)


def dev(*shape, dtype=FP16):
    return torch.ones(*shape, dtype=dtype, device="rbln")


def device_latest(shape=(4, 64)):
    """A tensor whose latest bytes are on the device (the output of a device op)."""
    a, b = dev(*shape), dev(*shape)
    return a + b


def check_schema(p) -> tuple[dict, dict]:
    d, v = p.dump(), p.verdict()
    assert set(d) - {"cpu_fallback_unaccelerated", "rebel_runtime", "recompile_causes",
                      "recompile_buckets"} == DUMP_KEYS
    assert list(d["hidden_host_bounce"]["by_site"]) == SITES
    for c in d["hidden_host_bounce"]["by_site"].values():
        assert set(c) == {"count", "bytes"}
    assert set(d["dispatch"]) == {"total", "cpu_fallback", "cpu_fallback_ns", "warm_hit", "recompile_miss"}
    rr = d["runtime_residency"]
    assert list(rr["by_reason"]) == ["src_not_on_device", "src_device_only_real_d2h", "src_synced_host_served"]
    assert rr["total_count"] == sum(c["count"] for c in rr["by_reason"].values())
    assert set(rr["real_host_sync_d2h"]) == set(rr["real_host_sync_h2d"]) == {"count", "bytes"}
    assert set(d["device_memory"]) == {"current_bytes", "peak_bytes"}
    assert d["device_memory"]["peak_bytes"] >= d["device_memory"]["current_bytes"]
    ht = d["host_threads"]
    assert ht["intended_threads"] == max(ht["omp_threads"], ht["torch_threads"], ht["proc_threads"])
    assert ht["oversubscribed"] == (ht["cores"] > 0 and ht["intended_threads"] > ht["cores"])
    assert all(set(n) == {"signal", "fix"} for n in d["notes"])
    assert set(v) == VERDICT_KEYS and list(v)[:2] == ["clean", "reasons"]
    assert v["clean"] == (v["reasons"] == [CLEAN_REASON])
    assert v["notes"] == d["notes"]
    assert v["hidden_host_bounces"] == d["hidden_host_bounce"]["total_count"]
    assert v["cpu_fallbacks"] == d["dispatch"]["cpu_fallback"]
    assert v["recompiles"] == d["dispatch"]["recompile_miss"]
    return d, v


def table_row(report: str, label: str) -> list[str]:
    rows = [line.split("  ") for line in report.splitlines() if line.startswith(label + " ")]
    assert len(rows) == 1, report
    return [c.strip() for c in rows[0] if c.strip()]


# ---------------------------------------------------------------------------------------------
# signals, one scenario each

def test_cpu_fallback_fp32_add():
    a, b = dev(64, dtype=torch.float32), dev(64, dtype=torch.float32)
    with torch.rbln.explain() as p:
        c = a + b
    assert c.device.type == "rbln"
    d, v = check_schema(p)
    assert d["dispatch"]["cpu_fallback"] == 1 and d["dispatch"]["cpu_fallback_ns"] > 0
    assert d["cpu_fallback_by_op"] == {"aten::add.out": 1}
    assert d["cpu_fallback_reasons"] == {"dtype-not-fp16": 1}
    assert d["cpu_fallback_unaccelerated"] == ["aten::add.out"]   # add.out has no fast path
    assert v["reasons"] == ["cpu_fallback: 1x (ran on CPU)"] and not v["clean"]
    assert [n["signal"] for n in d["notes"]] == ["dispatch/cpu_fallback"]
    r = p.report()
    assert r.startswith("[overhead: 1 signal]  RBLN EXPLAIN   (region wall ")
    assert "dispatch/cpu_fallback      1     --  try: graph mode, or a supported dtype" in r
    assert "    why: dtype-not-fp16 1" in r
    assert "    candidates (no fast-path handler): add.out" in r
    assert "  where? -> rerun with explain(with_stack=True)" in r
    assert r.endswith("  (detail: p.help(signal) | raw: p.dump())")


def test_fallback_with_fast_path_is_no_candidate():
    a = dev(64, dtype=torch.float32)
    with torch.rbln.explain() as p:
        a * 2.0
    d = p.dump()
    assert d["cpu_fallback_by_op"] == {"aten::mul.out": 1}
    assert "cpu_fallback_unaccelerated" not in d
    assert "candidates" not in p.report()


def test_recompile_on_new_shape_then_warm():
    shape = fresh_shape()
    a, b = dev(*shape), dev(*shape)
    with torch.rbln.explain() as cold:
        a + b
    with torch.rbln.explain() as warm:
        a + b
    d, v = check_schema(cold)
    assert d["recompile_by_op"] == {"aten::add.out": 1}
    assert d["dispatch"]["recompile_miss"] == 1 and d["dispatch"]["total"] == 1
    assert "recompile/cold-compile: 1x" in v["reasons"]
    assert table_row(cold.report(), "dispatch/recompile") == [
        "dispatch/recompile", "1", "--", "try: stabilize shapes, or graph mode"]
    dw, vw = check_schema(warm)
    assert dw["dispatch"]["warm_hit"] == 1 and dw["recompile_by_op"] == {}
    assert vw["clean"] and vw["reasons"] == [CLEAN_REASON]


def test_d2d_copy_from_dtype_conversion():
    x = dev(4, 64)
    x + x   # x is now in sync on both sides: the conversion reads it on the host, no transfer
    with torch.rbln.explain() as p:
        y = x.float()
    assert y.dtype == torch.float32 and y.device.type == "rbln"
    d, v = check_schema(p)
    assert d["hidden_host_bounce"]["by_site"]["copy_d2d_host_bounce"] == {"count": 1, "bytes": 512}
    assert d["hidden_host_bounce"]["total_count"] == 1
    assert d["runtime_residency"]["real_host_sync_d2h"]["count"] == 0
    assert v["reasons"] == ["hidden host bounce (torch-side): 1x, 512 B"]
    r = p.report()
    assert table_row(r, "host_bounce/d2d_copy") == [
        "host_bounce/d2d_copy", "1", "512 B", "no DMA (low cost) | try: make contiguous, or v2v engine"]
    assert "  >> physical d2h (real transfer): 0 -- everything above served on host, no crossing" in r


def test_d2d_copy_of_device_latest_source_is_a_real_transfer():
    x = device_latest()
    with torch.rbln.explain() as p:
        x.float()
    d, _ = check_schema(p)
    assert d["runtime_residency"]["real_host_sync_d2h"] == {"count": 1, "bytes": 512}
    r = p.report()
    assert table_row(r, "host_bounce/d2d_copy")[3].startswith("real d2h DMA (costly) | try:")
    assert "  >> physical d2h (real transfer): 1 copies, 512 B -- real device crossing" in r


def test_h2d_staging_from_dtype_changing_upload():
    dst = torch.empty(64, dtype=FP16, device="rbln")
    src = torch.ones(64, dtype=torch.float32)
    with torch.rbln.explain() as p:
        dst.copy_(src)
    d, v = check_schema(p)
    assert d["hidden_host_bounce"]["by_site"]["copy_h2d_staging"] == {"count": 1, "bytes": 256}
    assert v["reasons"] == ["hidden host bounce (torch-side): 1x, 256 B"]
    assert "host_bounce/h2d_staging" in p.report()
    assert "host_bounce/copy_h2d_staging" in p.help()


def test_h2d_staging_from_noncontiguous_source():
    dst = torch.empty(64, 64, dtype=FP16, device="rbln")
    src = torch.ones(64, 64, dtype=FP16).t()
    with torch.rbln.explain() as p:
        dst.copy_(src)
    by_site = p.dump()["hidden_host_bounce"]["by_site"]
    assert by_site["copy_h2d_staging"]["count"] == 1
    assert by_site["copy_h2d_noncontig_dst"]["count"] == 0


def test_h2d_noncontig_dst_from_write_into_transposed_view():
    dst = torch.empty(64, 64, dtype=FP16, device="rbln").t()
    src = torch.ones(64, 64, dtype=FP16)
    with torch.rbln.explain() as p:
        dst.copy_(src)
    d, _ = check_schema(p)
    by_site = d["hidden_host_bounce"]["by_site"]
    assert by_site["copy_h2d_noncontig_dst"] == {"count": 1, "bytes": 64 * 64 * 2}
    assert by_site["copy_h2d_staging"]["count"] == 0
    row = table_row(p.report(), "host_bounce/h2d_noncontig_dst")
    assert row[:3] == ["host_bounce/h2d_noncontig_dst", "1", "8.00 KB"]
    assert row[3].endswith("try: contiguous staging, then h2d")


def test_v2v_slow_from_host_latest_source():
    src, dst = dev(64), torch.empty(64, dtype=FP16, device="rbln")
    with torch.rbln.explain() as p:
        dst.copy_(src)
    d, v = check_schema(p)
    rr = d["runtime_residency"]
    assert rr["by_reason"]["src_not_on_device"] == {"count": 1, "bytes": 128}
    assert rr["reject"]["user_actionable"] == {"src_not_on_device": {"count": 1, "bytes": 128}}
    assert d["hidden_host_bounce"]["total_count"] == 0
    assert v["runtime_hidden_d2h"] == 1 and not v["clean"]
    assert v["reasons"][0].startswith("runtime hidden d2h [src_not_on_device]: 1x - ")
    r = p.report()
    assert r.startswith("[overhead: 1 signal]")
    assert table_row(r, "runtime/v2v_slow") == ["runtime/v2v_slow", "1", "128 B", "no DMA (low cost)"]
    assert "    state:  src_not_on_device 1" in r
    assert "    reject: src_not_on_device 1 -> establish device residency before the copy" in r
    assert [n["signal"] for n in d["notes"]] == ["runtime/v2v_slow:src_not_on_device",
                                               "runtime/v2v_reject:src_not_on_device"]


def test_v2v_slow_from_synced_source():
    src, dst = dev(64), torch.empty(64, dtype=FP16, device="rbln")
    src + src   # uploads src: now in sync on host and device
    with torch.rbln.explain() as p:
        dst.copy_(src)
    rr = p.dump()["runtime_residency"]
    assert rr["by_reason"]["src_synced_host_served"] == {"count": 1, "bytes": 128}
    assert rr["reject"]["user_actionable"] == {}
    assert "    state:  src_synced_host_served 1" in p.report()


def test_device_resident_copy_is_clean_and_timed():
    src, dst = device_latest((64,)), torch.empty(64, dtype=FP16, device="rbln")
    with torch.rbln.explain() as p:
        dst.copy_(src)
    d, v = check_schema(p)
    assert v["clean"]
    copies = {k: v for k, v in d["rebel_runtime"]["by_primitive"].items() if k.startswith("v2v")}
    assert sum(v["calls"] for v in copies.values()) == 1
    line = next(x for x in p.report().splitlines() if x.startswith("  rebel runtime: "))
    assert line.endswith("% of region wall)")


def test_host_oversubscription_context_line(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "512")
    with torch.rbln.explain() as p:
        pass
    ht = p.dump()["host_threads"]
    assert ht["omp_threads"] == ht["intended_threads"] == 512 and ht["oversubscribed"]
    assert (f"  ! host oversubscription: 512 threads / {ht['cores']} cores -> host latency may be "
            "inflated\n    (tune affinity / OMP_NUM_THREADS)") in p.report()


def test_physical_d2h_from_cpu_read_of_device_result():
    c = device_latest((64,))
    with torch.rbln.explain() as p:
        c.cpu()
    d, v = check_schema(p)
    assert d["runtime_residency"]["real_host_sync_d2h"] == {"count": 1, "bytes": 128}
    assert v["clean"]   # a transfer the user asked for is context, not hidden overhead
    r = p.report()
    assert r.startswith("[clean]")
    assert "  device->host pull (runtime): 1 copies, 128 B" in r
    assert "  checked: host_bounce, v2v_slow, cpu_fallback, recompile -- none fired" in r
    assert '  note: clean = no hidden host overhead, not "fast"' in r


def test_h2d_push_on_first_device_use():
    shape = (3, 64)
    dev(*shape) + dev(*shape)          # compile outside the region
    a, b = dev(*shape), dev(*shape)    # fresh, host-latest
    with torch.rbln.explain() as p:
        a + b
    d, v = check_schema(p)
    assert d["runtime_residency"]["real_host_sync_h2d"] == {"count": 2, "bytes": 2 * 3 * 64 * 2}
    assert v["clean"]
    assert "  host->device push (runtime): 2 pushes, 768 B" in p.report()


def test_several_byte_rows_point_at_the_d2h_line():
    x = device_latest()
    dst = torch.empty(64, 64, dtype=FP16, device="rbln").t()
    with torch.rbln.explain() as p:
        x.float()
        dst.copy_(torch.ones(64, 64, dtype=FP16))
    r = p.report()
    for label in ("host_bounce/d2d_copy", "host_bounce/h2d_noncontig_dst"):
        assert table_row(r, label)[3].startswith("see physical d2h below | try: ")
    assert p.verdict()["reasons"][0] == "hidden host bounce (torch-side): 2x, 8.50 KB"


def test_counters_are_process_wide():
    a = dev(64, dtype=torch.float32)
    with torch.rbln.explain() as p:
        t = threading.Thread(target=lambda: a + a)
        t.start()
        t.join()
    assert p.dump()["cpu_fallback_by_op"] == {"aten::add.out": 1}


def test_device_memory_is_the_process_wide_level():
    from torch_rbln.runtime.arena import reserved_totals
    device_latest()   # some device memory is in use before the region
    with torch.rbln.explain() as p:
        pass
    peak = reserved_totals()[1]
    assert peak >= torch.rbln.max_memory_reserved()
    d = p.dump()
    assert d["device_memory"]["peak_bytes"] == peak > 0
    assert "device mem " in p.report() and " peak, reserved)" in p.report().splitlines()[0]


# ---------------------------------------------------------------------------------------------
# region rules

def test_nested_region_raises_and_outer_survives():
    a = dev(64, dtype=torch.float32)
    with torch.rbln.explain() as outer:
        with pytest.raises(RuntimeError, match=r"^torch\.rbln\.explain\(\) regions must not overlap"):
            torch.rbln.explain().start()
        a + a
    assert outer.dump()["dispatch"]["cpu_fallback"] == 1
    with torch.rbln.explain():   # the guard was released
        pass


def test_region_from_another_thread_raises():
    errors = []

    def other():
        try:
            with torch.rbln.explain():
                pass
        except RuntimeError as e:
            errors.append(str(e))

    with torch.rbln.explain():
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(errors) == 1 and "(nested or concurrent)" in errors[0]


def test_reading_an_open_region_raises():
    p = torch.rbln.explain(with_stack=True).start()
    try:
        assert repr(p) == "<RBLNExplain active (trace=True); read the report after the region closes>"
        for read in (p.dump, p.report, p.verdict, p.help):
            with pytest.raises(RuntimeError, match="region is still open"):
                read()
        other = torch.rbln.RBLNExplain()
        with pytest.raises(RuntimeError, match="region 'a'"):
            p.diff(other)
    finally:
        p.stop()
    assert repr(p) == p.report() == str(p)


def test_exception_inside_region_closes_it():
    with pytest.raises(ValueError):
        with torch.rbln.explain() as p:
            raise ValueError("boom")
    assert p.verdict()["clean"]
    with torch.rbln.explain():
        pass


def test_aliases_and_trace_keyword():
    assert torch.rbln.profile is torch.rbln.explain
    assert torch.rbln.RBLNProfile is torch.rbln.RBLNExplain
    assert torch.rbln.explain(trace=True).with_stack is True
    assert torch.rbln.explain(True, trace=False).with_stack is False


# ---------------------------------------------------------------------------------------------
# with_stack

def _fallback_here(a):
    return a + a   # the line attributed below


def test_with_stack_attributes_the_users_line():
    a = dev(64, dtype=torch.float32)
    x = dev(4, 64)
    with torch.rbln.explain(with_stack=True) as p:
        _fallback_here(a)
        x.float(); line = sys._getframe().f_lineno  # noqa: E702
    trace = p.dump()["trace_by_op"]
    fn_line = _fallback_here.__code__.co_firstlineno + 1
    first, second = trace["aten::add.out"].split(" <- ")[:2]
    assert first == f"{__file__}:{fn_line}(_fallback_here)"
    assert second.startswith(f"{__file__}:") and second.endswith("(test_with_stack_attributes_the_users_line)")
    assert trace["copy_d2d_host_bounce"].split(" <- ")[0] == \
        f"{__file__}:{line}(test_with_stack_attributes_the_users_line)"
    r = p.report()
    assert f"test_explain.py:{fn_line}(_fallback_here)" in r
    assert "  host_bounce/d2d_copy:\n    at " in r
    assert "where?" not in r


def test_with_stack_records_recompile_site_and_is_off_by_default():
    shape = fresh_shape()
    a = dev(*shape)
    listeners = events._listeners
    with torch.rbln.explain() as plain:
        assert events._listeners == listeners   # nothing attached to the stream
        a + a
    assert plain.dump()["trace_by_op"] == {}
    b = dev(shape[0] + 1000, 64)
    with torch.rbln.explain(with_stack=True) as p:
        b + b
    assert events._listeners == listeners
    assert p.dump()["trace_by_op"]["aten::add.out"].startswith(f"{__file__}:")


# ---------------------------------------------------------------------------------------------
# help, diff, explain_steady

def test_help_resolves_signals_and_names():
    a = dev(64, dtype=torch.float32)
    with torch.rbln.explain() as p:
        a + a
    fix = p.help("dispatch/cpu_fallback")
    assert fix == p.help("cpu_fallback") and "torch.compile" in fix and "float16" in fix
    assert p.help() == f"dispatch/cpu_fallback: {fix}"
    assert "pad or bucket" in p.help("recompile")
    assert "contiguous" in p.help("host_bounce/copy_d2d_host_bounce")
    assert "device-resident" in p.help("runtime/v2v_slow:src_not_on_device")
    assert p.help("dtype_mismatch") == "align the src/dst dtype"
    assert p.help("d2d_copy") == "no remedy for 'd2d_copy'"   # display labels are not keys
    with torch.rbln.explain() as clean:
        pass
    assert clean.help() == "no hidden overhead"


def test_diff_rows_and_marks():
    shape = fresh_shape()
    a, b = dev(*shape), dev(*shape)
    f32 = dev(64, dtype=torch.float32)
    with torch.rbln.explain(with_stack=True) as first:
        a + b
        f32 + f32
    with torch.rbln.explain(with_stack=True) as second:
        a + b
        f32 + f32
    df = first.diff(second)
    d = df.dump()
    assert d["signals"]["recompile"] == {"a": 1, "b": 0}
    assert d["signals"]["cpu_fallback"] == {"a": 1, "b": 1}
    assert d["signals"]["runtime/h2d_push"] == {"a": 2, "b": 0, "a_bytes": 2 * shape[0] * 128, "b_bytes": 0}
    assert "recompile" in d["gone"] and "runtime/h2d_push" in d["gone"]
    assert d["persists"] == ["cpu_fallback"] and d["appeared"] == []
    entry, = d["persists_by_op"]
    assert entry["signal"] == "cpu_fallback" and entry["op"] == "aten::add.out" and entry["count"] == 1
    assert entry["at"].startswith(f"{__file__}:")
    r = df.report()
    assert r.startswith("RBLN EXPLAIN DIFF   (A -> B; you placed both points)")
    assert [c for c in r.split("\n") if c.startswith("recompile")][0].split() == ["recompile", "1", "0", "--", "--", "gone", "in", "B"]
    assert [c for c in r.split("\n") if c.startswith("cpu_fallback")][0].endswith(">> persists")
    assert "  >> persists across your two points -> recurring overhead, act on these:" in r
    assert f"    cpu_fallback: aten::add.out 1  @ {short_stack(entry['at'])}" in r


def test_diff_nothing_persisted():
    shape = fresh_shape()
    a = dev(*shape)
    with torch.rbln.explain() as first:
        a + a
    with torch.rbln.explain() as second:
        pass
    r = first.diff(second).report()
    assert r.endswith("  nothing persisted into B (no recurring overhead across your two points)")


def test_explain_steady_separates_cold_compile():
    shape = fresh_shape()
    a = dev(*shape)
    calls = []

    def step():
        calls.append(1)
        return a * a

    cold, warm = torch.rbln.explain_steady(step, warmup=3, return_cold=True)
    assert len(calls) == 5
    assert cold.verdict()["reasons"] == ["recompile/cold-compile: 1x"]
    assert warm.verdict()["clean"]
    assert isinstance(torch.rbln.explain_steady(step, warmup=0), torch.rbln.RBLNExplain)
    df = torch.rbln.explain_steady(step, warmup=0, as_diff=True, return_cold=True)
    assert isinstance(df, torch.rbln.RBLNDiff)


def test_explain_steady_closes_regions_when_fn_raises():
    def bad():
        raise KeyError("x")

    with pytest.raises(KeyError):
        torch.rbln.explain_steady(bad)
    with torch.rbln.explain():
        pass
