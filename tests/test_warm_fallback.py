"""The native warm path's replay of a warm CPU fallback (csrc/WarmPath.cpp) against the Python
kernel that decided it (dispatch/device_op.py).

A call the Python path sends to the host for a reason its key decides (``device_op.REPLAYED``)
is replayed natively the next time: the same events and amounts (but the timed
``cpu_fallback``), the same result, the same residency. Whatever could change the decision or
needs Python takes the Python path again: a guard scope, the fallback log's listener, the
profiler, a rule skipped by ``TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK``, a NaN operand.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from conftest import event_delta, warm_path
from torch_rbln import _C, events
from torch_rbln.runtime.storage import state_of

D = "rbln"
H = torch.float16
TIMED = {"cpu_fallback", "recompile", "runtime"}     # amounts in ns: differ run to run


def _delta(before, after) -> dict:
    return event_delta(before, after, TIMED)


def _calls():
    """(name, fn(x32, x16u) -> rbln tensor): host runs for the dtype rule and the alignment
    rule, functional, out= and in-place, with host-latest and device-latest operands."""
    def out_mul(x, u):
        out = torch.empty(4, 64, device=D)
        torch.mul(x, x, out=out)
        return out

    def inplace(x, u):
        t = x.clone()
        t.mul_(2)
        return t

    def inplace_add(x, u):          # no host fast path: the in-place call itself decides
        t = x.clone()
        t.add_(x, alpha=0.5)
        return t

    def step_counter(x, u):         # an optimizer's step: 0-dim fp32, a number added
        t = x.sum()
        t.add_(1)
        return t

    return [
        ("fp32 mul", lambda x, u: x * x),
        ("fp32 mean", lambda x, u: x.mean(-1, keepdim=True)),
        ("fp32 pow", lambda x, u: x.pow(2)),
        ("fp32 rsqrt", lambda x, u: (x.abs() + 1).rsqrt()),
        ("fp32 add scalar", lambda x, u: x + 1.5),
        ("fp32 out=", out_mul),
        ("fp32 in-place", inplace),
        ("fp32 in-place add", inplace_add),
        ("fp32 0-dim add number", step_counter),
        ("unaligned fp16 neg", lambda x, u: -u),
        ("unaligned fp16 silu", lambda x, u: F.silu(u)),
        ("unaligned, device-latest operand", lambda x, u: (u * 2) + u),
    ]


def _run(on: bool):
    torch.manual_seed(0)
    x = torch.randn(4, 64).to(D)
    u = torch.randn(4, 48).to(H).to(D)
    results = []
    before = events.snapshot()
    with warm_path(on):
        for _ in range(3):                        # the first call decides, the next replay
            for name, fn in _calls():
                r = fn(x, u)
                results.append((name, r.cpu(), state_of(r).residency))
    return results, _delta(before, events.snapshot())


def test_a_replayed_fallback_matches_the_python_path():
    replayed = _C.warm_path_replayed()
    warm = _run(True)
    took = _C.warm_path_replayed() - replayed
    python = _run(False)
    assert _C.warm_path_replayed() - replayed == took      # forced off: nothing replayed
    assert took >= 2 * len(_calls())                       # every call after the first
    assert warm[1] == python[1]                            # every event, count and byte
    for (name, a, ra), (_, b, rb) in zip(warm[0], python[0]):
        assert torch.equal(a, b), name
        assert ra == rb, name
    reasons = {key for kind, key in warm[1] if kind == "cpu_fallback_reason"}
    assert reasons == {"dtype-not-fp16", "last-dim-not-64-aligned"}


def test_replayed_results_match_the_cpu():
    x = torch.randn(4, 64)
    u = torch.randn(4, 48).to(H)
    xr, ur = x.to(D), u.to(D)
    for _ in range(3):
        for name, fn in _calls():
            r = fn(xr, ur)
            if name.startswith("fp32 out=") or name == "fp32 in-place":
                ref = x * x if "out" in name else x * 2
            else:
                ref = fn(x, u) if "device-latest" not in name else (u * 2) + u
            assert torch.equal(r.cpu(), ref), name


@pytest.mark.parametrize("name", ["fp32 in-place add", "fp32 0-dim add number"])
def test_an_in_place_host_run_is_replayed(name):
    """``t.add_(y)`` reaches ``add.out`` with ``out=t``: computed as the functional op and
    written into ``t`` (what the out= kernel gives when the result fits), it is replayed."""
    fn = dict(_calls())[name]
    x = torch.randn(4, 64).to(D)
    fn(x, None)
    n = _C.warm_path_replayed()
    fn(x, None)
    assert _C.warm_path_replayed() == n + 1


def test_an_in_place_operand_sharing_the_output_is_not_replayed():
    """The key holds shapes and strides, not storages: an in-place call whose other operand
    shares the written memory takes the Python path, where PyTorch's overlap rule applies as on
    the CPU, though a call with the same key was replayed."""
    a, b = torch.randn(8, 8).to(D), torch.randn(8, 8).to(D)
    for _ in range(2):
        a.add_(b.t())
    n = _C.warm_path_replayed()
    a.add_(b.t())
    assert _C.warm_path_replayed() == n + 1
    with pytest.raises(RuntimeError, match="single memory location"):
        c = torch.randn(8, 8)           # the CPU's own outcome
        c.add_(c.t())
    with pytest.raises(RuntimeError, match="single memory location"):
        a.add_(a.t())
    assert _C.warm_path_replayed() == n + 1


def _warmed():
    """An fp32 op whose host run is already cached by the warm path."""
    x = torch.randn(4, 64).to(D)
    x * x
    n = _C.warm_path_replayed()
    x * x
    assert _C.warm_path_replayed() == n + 1
    return x


def test_a_guard_scope_takes_the_python_path():
    x = _warmed()
    n = _C.warm_path_replayed()
    with pytest.raises(torch.rbln.GuardError, match="dtype-not-fp16"):
        with torch.rbln.guard(fallback="disallow"):
            x * x
    assert _C.warm_path_replayed() == n


def test_a_listener_sees_every_event_of_a_cached_fallback():
    x = _warmed()
    seen = []

    def listener(*e):
        seen.append(e[:2])

    events.listen(listener)
    try:
        n = _C.warm_path_replayed()
        x * x
        assert _C.warm_path_replayed() == n
    finally:
        events.unlisten(listener)
    assert ("cpu_fallback_reason", "dtype-not-fp16") in seen
    assert ("cpu_fallback", "aten::mul.out") in seen


def test_a_passive_listener_keeps_the_native_paths_and_sees_the_same_events():
    # explain's call-site capture only reads events: the native paths keep serving it (warm
    # device ops, replayed fallbacks, cat, device copies) and hand it the events the Python
    # kernels give an active listener, in the same order
    x = _warmed()
    h = torch.full((4, 64), 0.5, dtype=H, device=D)
    h + h
    torch.cat([h, h])

    def calls():
        x * x                            # a replayed fallback
        y = h + h                        # a warm device op
        torch.cat([y, h]).to(torch.float32)   # native cat, a device copy
        return y

    streams = {}
    for passive in (False, True):
        seen = []

        def listener(kind, key, amount):
            seen.append((kind, key, amount if kind not in TIMED else None))

        n = _C.warm_path_replayed()
        events.listen(listener, passive=passive)
        try:
            calls()
            replayed = _C.warm_path_replayed() - n
        finally:
            events.unlisten(listener)
        streams[passive] = seen
        assert replayed == (1 if passive else 0)
    assert streams[True] == streams[False]
    assert ("cpu_fallback", "aten::mul.out", None) in streams[True]
    assert ("warm_hit", "aten::add.out", 0) in streams[True]


def test_a_skipped_rule_takes_the_python_path(monkeypatch):
    """With the dtype rule skipped the Python path runs the op on the device instead."""
    x = _warmed()
    monkeypatch.setenv("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK", "dtype")
    n = _C.warm_path_replayed()
    before = events.snapshot()
    with pytest.warns(UserWarning) if not _dev_warned() else contextlib.nullcontext():
        r = x * x
    d = _delta(before, events.snapshot())
    assert _C.warm_path_replayed() == n
    assert ("cpu_fallback", "aten::mul.out") not in d
    assert ("device_program", "aten::mul.out") in d
    assert torch.equal(r.cpu(), x.cpu() * x.cpu())
    # the rule back on: the program compiled meanwhile never serves this key, the host run does
    monkeypatch.delenv("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK")
    for _ in range(2):
        before = events.snapshot()
        x * x
        d = _delta(before, events.snapshot())
        assert d[("cpu_fallback_reason", "dtype-not-fp16")][0] == 1
        assert ("device_program", "aten::mul.out") not in d


def _dev_warned() -> bool:
    from torch_rbln.dispatch import checks
    return checks._warned_dev


def test_a_nan_operand_is_reported_by_the_python_path():
    """The alignment rule comes after the NaN/Inf scan: a NaN operand changes the reason."""
    u = torch.randn(4, 48).to(H).to(D)
    -u
    -u                                               # replayed
    bad = u.clone()
    bad[0, 0] = float("nan")
    n = _C.warm_path_replayed()
    before = events.snapshot()
    r = -bad
    d = _delta(before, events.snapshot())
    assert _C.warm_path_replayed() == n
    assert ("cpu_fallback_reason", "nan/inf input") in d
    assert ("cpu_fallback_reason", "last-dim-not-64-aligned") not in d
    assert torch.equal(r.cpu().isnan(), (-bad.cpu()).isnan())


def test_the_profiler_sees_the_host_run_named():
    """A profile does not push a cached fallback off the native path: the replay itself opens
    the `rbln::cpu_fallback(<reason>)` range, so the trace matches what an unprofiled run does."""
    x = _warmed()
    n = _C.warm_path_replayed()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    with torch.profiler.profile(activities=acts) as p:
        x * x
    assert _C.warm_path_replayed() == n + 1
    assert any(e.name == "rbln::cpu_fallback(dtype-not-fp16)" for e in p.events())


def _out_and_in_place_cases():
    def cast_refused(d):            # float result into a long out=: PyTorch refuses
        a = torch.arange(64.0, device=d).reshape(1, 64)
        return torch.mul(a, a, out=torch.zeros(1, 64, dtype=torch.long, device=d))

    def cast_allowed(d):            # long result into a float out=
        a = torch.arange(64, device=d).reshape(1, 64)
        return torch.mul(a, a, out=torch.zeros(1, 64, device=d))

    def in_place_cast_refused(d):
        return torch.arange(64, device=d).mul_(0.5)

    def in_place_promoted(d):       # fp32 += fp64: computed in fp64, written as fp32
        x = torch.arange(64.0, device=d)
        return x.add_(torch.full((64,), 0.1, dtype=torch.float64, device=d))

    def in_place_broadcast_refused(d):
        return torch.zeros(1, 64, device=d).add_(torch.ones(3, 64, device=d))

    return [cast_refused, cast_allowed, in_place_cast_refused, in_place_promoted,
            in_place_broadcast_refused]


@pytest.mark.parametrize("case", _out_and_in_place_cases(), ids=lambda f: f.__name__)
def test_out_and_in_place_host_runs_keep_pytorchs_rules(case):
    """Host runs of out= and in-place calls, first and warm (replayed): PyTorch's casting,
    broadcasting and overlap rules apply as on the CPU, errors and values alike."""
    def outcome(d):
        try:
            return case(d).cpu()
        except RuntimeError as e:
            return type(e)
    ref = outcome("cpu")
    for _ in range(3):
        got = outcome(D)
        if isinstance(ref, torch.Tensor):
            assert torch.equal(got, ref)
        else:
            assert got is ref
