"""``cat``'s native kernel (csrc/DataMovement.cpp) against the Python kernel it stands in for
(dispatch/data_movement.py): the same results, residency and events (the timed ``runtime``
amount aside), on the device when a source's latest data is there, else on the host views."""

from __future__ import annotations

import contextlib

import torch

from torch_rbln import _C, events
from torch_rbln.runtime.storage import state_of

D = "rbln"
H = torch.float16


@contextlib.contextmanager
def warm_path(on: bool):
    before = _C.warm_path_enabled()
    _C.set_warm_path(on)
    try:
        yield
    finally:
        _C.set_warm_path(before)


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
        d = {}
        for kind, table in after.items():
            for key, (n, amount) in table.items():
                n0, a0 = before[kind].get(key, [0, 0])
                if n != n0:
                    d[(kind, key)] = (n - n0, None if kind == "runtime" else amount - a0)
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

