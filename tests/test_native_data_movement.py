"""The native kernels of ``cat`` and of device-to-device ``_copy_from`` (csrc/DataMovement.cpp)
against the Python kernels they stand in for (dispatch/data_movement.py, dispatch/copy.py): the
same results, residency and events (the timed ``runtime`` amounts aside). ``cat`` runs on the
device when a source's latest data is there, else on the host views; a copy follows the copy
table's device-to-device rows."""

from __future__ import annotations

import pytest
import torch

from conftest import event_delta, warm_path
from torch_rbln import events
from torch_rbln.runtime.storage import state_of

D = "rbln"
H = torch.float16


def _delta(before, after) -> dict:
    """Counters that moved between two snapshots (runtime amounts are times: not compared)."""
    return event_delta(before, after, {"runtime"})


def _cases():
    torch.manual_seed(0)
    a = torch.randn(2, 3, 64).to(H)
    b = torch.randn(2, 5, 64).to(H)
    return [
        ("host-latest", lambda: [a.to(D), b.to(D)], 1),
        ("device-latest", lambda: [a.to(D) * 1, b.to(D) * 1], 1),
        ("mixed residency", lambda: [a.to(D), b.to(D) * 1], -2),
        ("an empty source", lambda: [a.to(D) * 1, torch.empty(0, dtype=H, device=D)], 1),
        ("non-contiguous", lambda: [a.to(D).transpose(0, 1), a.to(D).transpose(0, 1) * 1], 0),
        ("fp32 rotary halves", lambda: [a.float().to(D), a.float().to(D)], -1),
        ("mixed dtypes (Python)", lambda: [a.to(D), b.float().to(D)], 1),
        ("a CPU source (Python)", lambda: [a.to(D), b], 1),
    ]


def _run(on: bool):
    out, deltas = [], []
    for name, make, dim in _cases():
        ts = make()
        before = events.snapshot()
        with warm_path(on):
            r = torch.cat(ts, dim)
        after = events.snapshot()
        d = _delta(before, after)
        out.append((name, r.device.type, r.cpu(), state_of(r).residency))
        deltas.append((name, d))
    return out, deltas


def test_native_cat_matches_the_python_kernel_and_the_cpu():
    native, python = _run(True), _run(False)
    assert native[1] == python[1]                      # every event, count and byte
    for (name, dev, a, ra), (_, _, b, rb), (_, make, dim) in zip(native[0], python[0], _cases()):
        assert dev == "rbln", name
        assert torch.equal(a, b) and ra == rb, name
        assert torch.equal(a, torch.cat([t.cpu() for t in make()], dim)), name
    kinds = {k for _, d in native[1] for k in d}
    assert ("runtime", "v2v_multi") in kinds           # some ran on the device



def _copies():
    """(name, make() -> (src, dst)): the device-to-device rows of the copy table."""
    torch.manual_seed(1)
    a = torch.randn(4, 64).to(H)

    def one_storage():
        x = a.to(D) * 1
        return x[:2], x[2:]

    return [
        ("direct, device-latest", lambda: (a.to(D) * 1, torch.empty(4, 64, dtype=H, device=D))),
        ("direct, host-latest", lambda: (a.to(D), torch.empty(4, 64, dtype=H, device=D))),
        ("direct, synced", lambda: (_synced(a.to(D) * 1), torch.empty(4, 64, dtype=H, device=D))),
        ("direct into device-latest", lambda: (a.to(D) * 1, a.to(D) * 2)),
        ("dtype conversion", lambda: (a.to(D) * 1, torch.empty(4, 64, device=D))),
        ("broadcast", lambda: (a[:1].to(D), torch.empty(4, 64, dtype=H, device=D))),
        ("strided destination", lambda: (a.t().to(D) * 1, torch.empty(4, 64, dtype=H,
                                                                       device=D).t())),
        ("one storage", one_storage),
        ("partial destination", lambda: (a[:2].to(D) * 1, (a.to(D) * 3)[1:3])),
        ("empty", lambda: (torch.empty(0, dtype=H, device=D), torch.empty(0, dtype=H, device=D))),
        ("from the host (Python)", lambda: (a, torch.empty(4, 64, dtype=H, device=D))),
        ("to the host (Python)", lambda: (a.to(D) * 1, torch.empty(4, 64, dtype=H))),
    ]


def _synced(t):
    t.cpu()                       # a host read: both sides hold the latest bytes
    return t


def _run_copies(on: bool):
    out, deltas = [], []
    for name, make in _copies():
        src, dst = make()
        before = events.snapshot()
        with warm_path(on):
            dst.copy_(src)
        after = events.snapshot()
        d = _delta(before, after)
        base = dst._base if dst._base is not None else dst
        out.append((name, dst.cpu(), base.cpu(),
                    state_of(dst).residency if dst.device.type == D else None))
        deltas.append((name, d))
    return out, deltas


def test_native_copy_matches_the_python_kernel():
    native, python = _run_copies(True), _run_copies(False)
    assert native[1] == python[1]                      # every event, count and byte
    for (name, a, ba, ra), (_, b, bb, rb) in zip(native[0], python[0]):
        assert torch.equal(a, b) and torch.equal(ba, bb) and ra == rb, name
    kinds = {k for _, d in native[1] for k in d}
    assert {("v2v", ""), ("bounce", "copy_d2d_host_bounce"),
            ("v2v_slow", "src_not_on_device"), ("v2v_slow", "src_synced_host_served")} <= kinds


def test_native_copies_match_the_cpu():
    for name, make in _copies():
        src, dst = make()
        ref = dst.cpu().copy_(src.cpu()) if dst.numel() else dst.cpu()
        dst.copy_(src)
        assert torch.equal(dst.cpu(), ref), name


@pytest.mark.parametrize("on", [True, False])
def test_partly_overlapping_copy_raises_as_the_cpu(on):
    x = torch.randn(4, 64).to(H)
    with pytest.raises(RuntimeError) as cpu:
        x[1:].copy_(x[:-1])
    r = x.to(D) * 1
    before = r.cpu()
    with warm_path(on), pytest.raises(RuntimeError) as dev:
        r[1:].copy_(r[:-1])
    assert str(dev.value) == str(cpu.value)
    assert torch.equal(r.cpu(), before)          # nothing written
