"""The native warm path (csrc/WarmPath.cpp) against the Python kernel it stands in for.

A random program of eager ops (cache hits and misses, out= and in-place forms, scalar operands,
non-contiguous views, host-latest and device-latest operands, reads back to the host, NaN
inputs, failed checks, deploy mode switched on and off) runs twice from an empty program cache:
with the warm path on, and with it forced off (every call through the Python kernel). Results,
every event and count (and every byte amount), and the arena's statistics must be equal.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
import torch
import torch.nn.functional as F

from conftest import event_delta, run_script, warm_path
from torch_rbln import _C, events

D = "rbln"
H = torch.float16
TIMED = {"recompile", "cpu_fallback", "runtime"}    # amounts in ns: differ run to run


def _ops(rng: random.Random):
    """(name, fn(pool) -> tensor or None) steps; ``pool`` holds rbln tensors of shape (8, 64)."""
    def pick(pool):
        return pool[rng.randrange(len(pool))]

    def out_add(pool):
        out = torch.empty(8, 64, dtype=H, device=D)
        torch.add(pick(pool), pick(pool), out=out)
        return out

    def inplace_fill(pool):
        t = pick(pool).clone()
        t.masked_fill_(pick(pool) > 0, 0.5)
        return t

    def deploy(pool):
        if os.environ.get("TORCH_RBLN_DEPLOY"):
            del os.environ["TORCH_RBLN_DEPLOY"]
        else:
            os.environ["TORCH_RBLN_DEPLOY"] = "ON"

    def nan_input(pool):
        t = pick(pool).clone()
        t[0, 0] = float("nan")
        return t + pick(pool)

    def nan_scalar(pool):
        pick(pool) * float("nan")          # in deploy mode: compiled on every call (NaN != NaN)

    w = torch.randn(64, 64).to(H).to(D)
    b = torch.randn(64).to(H).to(D)
    return [
        ("add", lambda p: pick(p) + pick(p)),
        ("same operand", lambda p: (lambda x: x * x)(pick(p))),
        ("sub alpha", lambda p: torch.sub(pick(p), pick(p), alpha=2)),
        ("mul scalar", lambda p: pick(p) * rng.choice([0.5, 2.0, 3])),
        ("div", lambda p: pick(p) / (pick(p).abs() + 1)),
        ("neg", lambda p: -pick(p)),
        ("silu", lambda p: F.silu(pick(p))),
        ("sigmoid", lambda p: torch.sigmoid(pick(p))),
        ("maximum", lambda p: torch.maximum(pick(p), pick(p))),
        ("compare", lambda p: (pick(p) > pick(p)).to(H)),
        ("where", lambda p: torch.where(pick(p) > 0, pick(p), pick(p))),
        ("clamp", lambda p: pick(p).clamp(-1, 1)),
        ("pow", lambda p: pick(p).pow(2)),
        ("mean", lambda p: pick(p).mean(-1, keepdim=True).expand(8, 64).contiguous()),
        ("softmax", lambda p: torch.softmax(pick(p), -1)),
        ("mm", lambda p: torch.mm(pick(p), w)),
        ("addmm", lambda p: torch.addmm(b, pick(p), w)),
        ("linear", lambda p: F.linear(pick(p), w, b)),
        ("bmm", lambda p: torch.bmm(pick(p).view(2, 4, 64), w.expand(2, 64, 64)).view(8, 64)),
        ("transposed", lambda p: (pick(p).view(8, 64).t() + pick(p).view(64, 8)).t()),
        ("out=", out_add),
        ("in-place", inplace_fill),
        ("host read", lambda p: pick(p).cpu().to(D)),
        ("host write", lambda p: torch.randn(8, 64).to(H).to(D)),
        ("offset (fallback)", lambda p: (pick(p).view(-1)[64:] + 1).view(7, 64).repeat(2, 1)[:8]),
        ("fp32 (fallback)", lambda p: (pick(p).float() + 1).to(H)),
        ("unaligned (fallback)", lambda p: torch.cat([pick(p)[:, :48] * 2, pick(p)[:, 48:]], 1)),
        ("nan input (fallback)", nan_input),
        ("nan scalar", nan_scalar),
        ("deploy on/off", deploy),
    ]


def _run(seed: int, steps: int, on: bool):
    """The program of ``seed`` from an empty program cache; returns (results, event deltas,
    arena statistics deltas)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    torch.rbln.empty_cache()        # no programs, no cached device blocks
    os.environ.pop("TORCH_RBLN_DEPLOY", None)
    pool = [torch.randn(8, 64).to(H).to(D) for _ in range(4)]
    ops = _ops(rng)
    results = []
    gc.collect()                    # garbage of earlier tests is freed before, not during, the run
    torch.rbln.synchronize()
    mem0 = torch.rbln.memory_stats()
    ev0 = events.snapshot()
    try:
        with warm_path(on):
            for _ in range(steps):
                name, fn = ops[rng.randrange(len(ops))]
                r = fn(pool)
                if r is not None:
                    assert r.shape == (8, 64), name
                    pool[rng.randrange(len(pool))] = r
                    results.append((name, r))
    finally:
        os.environ.pop("TORCH_RBLN_DEPLOY", None)
    ev1 = events.snapshot()
    gc.collect()                    # only what the run itself still holds stays allocated
    torch.rbln.synchronize()
    mem1 = torch.rbln.memory_stats()
    delta = event_delta(ev0, ev1, TIMED)
    mem = {k: mem1[k] - mem0.get(k, 0) for k in mem1 if not k.endswith(".peak")}
    return [(name, r.cpu()) for name, r in results], delta, mem


def agree(seed: int) -> None:
    served = _C.warm_path_served()
    warm = _run(seed, 120, on=True)
    took = _C.warm_path_served() - served
    python = _run(seed, 120, on=False)
    assert _C.warm_path_served() - served == took      # forced off: it served nothing
    assert took > 20                                     # the warm path did run the hits
    assert warm[1] == python[1]                          # every event, count and byte
    assert warm[2] == python[2]                          # the arena's statistics
    assert [n for n, _ in warm[0]] == [n for n, _ in python[0]]
    for (name, a), (_, b) in zip(warm[0], python[0]):
        assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(
            a.nan_to_num(), b.nan_to_num()), name
    kinds = {k for k, _ in warm[1]}
    assert {"dispatch", "warm_hit", "recompile", "h2d", "d2h", "cpu_fallback"} <= kinds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warm_path_and_python_path_agree_on_every_event(seed):
    # in a fresh process: the arena's statistics are process-wide, and an earlier test's object
    # freed by another thread (or a collector pass) during one of the two runs would move them
    r = run_script(__file__, str(seed))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.split() == ["agree", str(seed)]


def test_a_listener_sees_the_same_events_as_the_counters():
    """While a listener is attached every call takes the Python path: each event reaches it."""
    seen = []
    a = torch.randn(4, 64).to(H).to(D)
    a + a                                                 # compiled: the next call is a hit
    before = events.snapshot()
    def listener(kind, key, amount):
        seen.append((kind, key))

    events.listen(listener)
    try:
        served = _C.warm_path_served()
        a + a
        assert _C.warm_path_served() == served
    finally:
        events.unlisten(listener)
    after = events.snapshot()
    counted = sorted((k, key) for k, t in after.items() for key, (n, _) in t.items()
                     for _ in range(n - before[k].get(key, [0, 0])[0]))
    assert sorted(seen) == counted
    assert ("warm_hit", "aten::add.out") in seen


def test_dropping_the_program_cache_drops_the_warm_path_keys():
    a = torch.randn(4, 64).to(H).to(D)
    a - a
    a - a
    n = events.total("recompile")[0]
    torch.rbln.empty_cache()
    a - a                                                 # compiled again, as in the Python path
    assert events.total("recompile")[0] == n + 1


def test_a_device_op_inside_a_program_is_reentrant():
    """The depth both paths raise is one counter: a device op called while a program runs on
    this thread falls back with the ``reentrant`` reason."""
    a = torch.randn(4, 64).to(H).to(D)
    a + a
    depth = _C.enter_program()
    try:
        before = events.snapshot()["cpu_fallback_reason"].get("reentrant", [0, 0])[0]
        r = a + a
    finally:
        _C.leave_program(depth)
    assert events.snapshot()["cpu_fallback_reason"]["reentrant"][0] == before + 1
    assert torch.equal(r.cpu(), a.cpu() + a.cpu())


def test_the_scans_deferred_copy_keeps_every_read_and_write_right():
    """The NaN/Inf scan of a device-latest operand records its d2h and leaves the storage
    host-readable (Synced) as before; the copy itself waits for a host reader. Reads, partial
    host writes and device writes after it all see the right bytes, and nothing more is
    recorded."""
    from torch_rbln.runtime.storage import SYNCED, state_of
    a = torch.randn(4, 64).to(H).to(D)
    ref = a.cpu() * 2
    for _ in range(2):
        x = a * 2                                      # device-latest
        d2h = events.total("d2h")
        y = x + 1                                      # the scan reads x: one d2h recorded
        assert events.total("d2h") == (d2h[0] + 1, d2h[1] + x.numel() * 2)
        assert state_of(x).residency == SYNCED
        assert torch.equal(x.cpu(), ref)               # the host view is right, nothing new
        assert events.total("d2h") == (d2h[0] + 1, d2h[1] + x.numel() * 2)
        assert torch.equal(y.cpu(), ref + 1)
    z = a * 2
    z + 1                                              # scanned, host copy deferred
    z[0, :3] = 7.0                                     # a partial host write keeps the rest
    expect = ref.clone()
    expect[0, :3] = 7.0
    assert torch.equal(z.cpu(), expect)
    w = a * 2
    w + 1
    torch.mul(w, 0, out=w)                             # a device write after the scan
    assert torch.equal(w.cpu(), torch.zeros(4, 64, dtype=H))


if __name__ == "__main__":            # one seed of the agreement test, in its own process
    import sys

    agree(int(sys.argv[1]))
    print("agree", sys.argv[1])


def _warm_calls(on: bool, make):
    """The calls ``make(dtype)`` gives (with a function that rewrites their first call's first
    operand on the host), warm, from an empty program cache: three rounds per dtype, then the
    first call once more (its operand host-latest again: pushed at the next read). Returns each
    call's results on the CPU, the events and how many calls the warm path served."""
    torch.manual_seed(0)
    torch.rbln.empty_cache()
    out = []
    gc.collect()
    ev0 = events.snapshot()
    served = _C.warm_path_served()
    with warm_path(on):
        for dtype in (torch.float16, torch.bfloat16):
            calls, rewrite = make(dtype)
            for _ in range(3):
                for c in calls:
                    out.append(c())
            rewrite()
            out.append(calls[0]())
    took = _C.warm_path_served() - served
    delta = event_delta(ev0, events.snapshot(), TIMED)
    return [[t.cpu() if isinstance(t, torch.Tensor) else t for t in r] for r in out], delta, took


def _attention_calls(dtype):
    """Attention's device op: GQA and not, causal and not, a given scale, a non-contiguous value,
    and the calls it leaves to the Python program (a mask, dropout)."""
    ov = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    q = torch.randn(2, 4, 64, 32).to(dtype).to(D)
    k = torch.randn(2, 2, 64, 32).to(dtype).to(D)
    v = torch.randn(2, 64, 2, 32).to(dtype).to(D).transpose(1, 2)     # a view
    k4 = torch.randn(2, 4, 32, 32).to(dtype).to(D)
    mask = torch.randn(64, 64).to(dtype).to(D)
    return ([lambda: ov(q, k, v, None, 0.0, True, False),
             lambda: ov(q, k4, k4, None, 0.0, False, False, scale=0.3),
             lambda: ov(q, k, v, mask, 0.0, False, False),
             lambda: ov(q, k, v, None, 0.5, True, False)],
            lambda: q.copy_(torch.randn(2, 4, 64, 32)))


def test_warm_attention_is_served_natively_with_the_python_programs_results_and_events():
    warm, warm_events, took = _warm_calls(True, _attention_calls)
    python, python_events, none = _warm_calls(False, _attention_calls)
    assert none == 0 and took == 2 * (2 * 2 + 1)     # the plain calls after their first, per dtype
    assert warm_events == python_events
    for a, b in zip(warm, python, strict=True):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if i in (6, 7):     # the philox seed and offset without dropout: uninitialised
                assert x.shape == y.shape
            elif isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and x.stride() == y.stride() and torch.equal(x, y)
            else:
                assert x == y


def _linear_backward_calls(dtype):
    """aten::linear_backward: every output mask, a 3-D input, a weight read again (its kept
    widened form), a non-contiguous gradient, and a call the rules send to the host (unaligned)."""
    lb = torch.ops.aten.linear_backward.default
    x = torch.randn(2, 64, 128).to(dtype).to(D)
    w = torch.randn(192, 128).to(dtype).to(D)
    gy = torch.randn(2, 64, 192).to(dtype).to(D)
    gt = torch.randn(2, 192, 64).to(dtype).to(D).transpose(1, 2)     # a view
    xu, wu = torch.randn(64, 96).to(dtype).to(D), torch.randn(64, 96).to(dtype).to(D)
    gu = torch.randn(64, 64).to(dtype).to(D)
    return ([lambda: lb(x, gy, w, [True, True, True]),
             lambda: lb(x, gy, w, [True, False, False]),
             lambda: lb(x, gy, w, [False, True, True]),
             lambda: lb(x, gt, w, [True, True, False]),
             lambda: lb(xu, gu, wu, [True, True, False])],
            lambda: x.copy_(torch.randn(2, 64, 128)))


def test_warm_linear_backward_is_served_natively_with_the_python_programs_results_and_events():
    warm, warm_events, took = _warm_calls(True, _linear_backward_calls)
    python, python_events, none = _warm_calls(False, _linear_backward_calls)
    assert none == 0 and took == 2 * (4 * 2 + 1)     # the device calls after their first
    assert warm_events == python_events
    for a, b in zip(warm, python, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
