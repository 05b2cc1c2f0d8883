"""Property test: random programs of {create, view, write through a view, copy across devices
and dtypes, host read, device op, delete} run on rbln and on a CPU twin side by side.

Every host read equals the twin bit for bit, device memory returns to its baseline after the
deletes, and each read moves exactly the bytes the residency rules say (a physical d2h only
when the storage's latest data is on the device)."""

from __future__ import annotations

import gc

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from torch_rbln import events
from torch_rbln.runtime.storage import DEVICE, state_of

D = "rbln"
SHAPES = [(64,), (4, 64), (2, 3, 64), (8, 8)]
DTYPES = [torch.float16, torch.float32]

VIEWS = [
    lambda t: t,
    lambda t: t.transpose(0, -1) if t.dim() > 1 else t[1:],
    lambda t: t[..., 1:7],
    lambda t: t.reshape(-1)[3:40:2],
    lambda t: t.unsqueeze(0),
    lambda t: t.narrow(-1, 0, 8),
]

step = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(range(len(SHAPES))), st.sampled_from(range(2)),
              st.integers(0, 2**16)),
    st.tuples(st.just("view"), st.integers(0, 99), st.sampled_from(range(len(VIEWS)))),
    st.tuples(st.just("write"), st.integers(0, 99), st.sampled_from(["fill", "add", "mul", "zero"]),
              st.integers(-3, 3)),
    st.tuples(st.just("copy"), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("convert"), st.integers(0, 99), st.sampled_from(range(2))),
    st.tuples(st.just("roundtrip"), st.integers(0, 99)),
    st.tuples(st.just("read"), st.integers(0, 99)),
    st.tuples(st.just("op"), st.integers(0, 99), st.integers(0, 99), st.sampled_from(["add", "mul", "neg"])),
    st.tuples(st.just("delete"), st.integers(0, 99)),
)


def _read_checked(r: torch.Tensor, c: torch.Tensor):
    st = state_of(r)
    state = st.residency
    n0, b0 = events.total("d2h")
    got = r.cpu()
    n1, b1 = events.total("d2h")
    if state == DEVICE:
        assert (n1 - n0, b1 - b0) == (1, st.nbytes), "a device-latest read is one physical d2h"
    else:
        assert n1 == n0, "reading a synced or host-latest storage moves nothing"
    assert got.dtype == c.dtype and got.shape == c.shape
    torch.testing.assert_close(got, c, rtol=0, atol=0, equal_nan=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=25))
def test_random_programs_match_cpu_twin(program):
    gc.collect()
    base = torch.rbln.memory_allocated()
    _run(program)        # in its own frame, so no local keeps a tensor alive afterwards
    gc.collect()
    assert torch.rbln.memory_allocated() == base


def _run(program):
    pool: list[tuple[torch.Tensor, torch.Tensor]] = []

    def pick(i):
        return pool[i % len(pool)] if pool else None

    for s in program:
        kind = s[0]
        if kind == "create":
            shape, dt = SHAPES[s[1]], DTYPES[s[2]]
            g = torch.Generator().manual_seed(s[3])
            c = torch.randn(shape, generator=g).to(dt)
            pool.append((c.to(D), c.clone()))
            continue
        if not pool:
            continue
        if kind == "view":
            r, c = pick(s[1])
            try:
                cv = VIEWS[s[2]](c)
            except (RuntimeError, IndexError):
                continue
            pool.append((VIEWS[s[2]](r), cv))
        elif kind == "write":
            r, c = pick(s[1])
            for t in (r, c):
                if s[2] == "fill":
                    t.fill_(s[3])
                elif s[2] == "add":
                    t.add_(s[3])
                elif s[2] == "mul":
                    t.mul_(s[3])
                else:
                    t.zero_()
        elif kind == "copy":
            (rd, cd), (rs, cs) = pick(s[1]), pick(s[2])
            if cd.shape != cs.shape:
                continue
            if rd.untyped_storage().data_ptr() == rs.untyped_storage().data_ptr():
                continue
            rd.copy_(rs)
            cd.copy_(cs)
        elif kind == "convert":
            r, c = pick(s[1])
            pool.append((r.to(DTYPES[s[2]]), c.to(DTYPES[s[2]])))
        elif kind == "roundtrip":
            r, c = pick(s[1])
            pool.append((r.cpu().to(D), c.clone()))
        elif kind == "read":
            _read_checked(*pick(s[1]))
        elif kind == "op":
            (ra, ca), (rb, cb) = pick(s[1]), pick(s[2])
            if s[3] == "neg":
                pool.append((-ra, -ca))
            elif ca.shape == cb.shape and ca.dtype == cb.dtype:
                pool.append(((ra + rb, ca + cb) if s[3] == "add" else (ra * rb, ca * cb)))
            else:
                pool.append(((ra * 2.0, ca * 2.0) if s[3] == "mul" else (ra + 1, ca + 1)))
        elif kind == "delete":
            pool.pop(s[1] % len(pool))
    while pool:
        _read_checked(*pool.pop())
