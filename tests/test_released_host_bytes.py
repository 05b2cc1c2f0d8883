"""Released half-precision bytes: while a weight's kept fp32 form covers its whole storage and the
scan found it finite, the host view's pages are released (narrowing the fp32 form gives the very
bits back) and narrowed back before any route reads or partly writes them
(docs/tensors-and-memory.md, "Physical memory"). Each route must read the weight back bit for bit
as the CPU holds it; a weight with a NaN or an infinity keeps its bytes.

One fresh process forces the widening form (``TORCH_RBLN_MATMUL_PRECISION=widen``) so fp16 and
bf16 weights are both widened on every host. ``StorageState.host_released`` is the diagnostic."""

from __future__ import annotations

import pytest

from conftest import run_json

ROUTES = ("matmul", "cpu", "host_fallback_op", "embedding", "index_select", "slice_write",
          "copy_from", "d2d_clone", "pinned_non_blocking", "empty_cache", "whole_write")

_SCRIPT = """
import torch
from torch_rbln import events
from torch_rbln.runtime.storage import released_host_bytes, state_of

D = "rbln"


def every_finite(dtype):
    # every finite bit pattern of the dtype (-0.0, subnormals, the largest values), as a weight
    # of 64 columns and a multiple of 64 rows (device ops take dimensions of 64s), padded with 0
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    v = bits[torch.isfinite(bits)]
    pad = (-v.numel()) % (64 * 64)
    return torch.cat([v, torch.zeros(pad, dtype=dtype)]).reshape(-1, 64)


def same_bits(a, b):
    return a.dtype == b.dtype and torch.equal(a.cpu().view(torch.int16), b.view(torch.int16))


def fallbacks():
    return sum(n for n, _ in events.snapshot()["cpu_fallback_reason"].values())


def released(w, x_d):
    wd = w.to(D)
    for _ in range(3):          # read again and again: the widened form is kept, the bytes go
        torch.mm(x_d, wd)
    return wd, state_of(wd).host_released


out = {}
for dtype in (torch.float16, torch.bfloat16):
    w = every_finite(dtype)
    x = (torch.randn(128, w.shape[0]) * 1e-6).to(dtype)
    x_d = x.to(D)
    want_mm = (x.float() @ w.float()).to(dtype)
    idx = torch.tensor([0, 7, 31, w.shape[0] - 1])
    for route in ROUTES:
        wd, rel = released(w, x_d)
        s = state_of(wd)
        events0 = (events.total("h2d"), events.total("d2h"), fallbacks())
        expect = w
        if route == "matmul":        # served by the fp32 form: the bytes stay released
            got = torch.mm(x_d, wd).cpu()
            ok = torch.equal(got, want_mm) and s.host_released == rel
            got = wd.cpu()
        elif route == "cpu":
            got = wd.cpu()
            ok = True
        elif route == "host_fallback_op":   # runs on the host (a last dimension of 48s)
            f0 = fallbacks()
            got = (wd[:, :48] * 2).cpu()
            ok = fallbacks() > f0 and torch.equal(got, w[:, :48] * 2)
            got = wd.cpu()
        elif route == "embedding":          # a device op on the half-precision bytes
            got = torch.nn.functional.embedding(idx.to(D), wd).cpu()
            expect = torch.nn.functional.embedding(idx, w)
            ok = True
        elif route == "index_select":
            got = wd.index_select(0, idx.to(D)).cpu()
            expect = w.index_select(0, idx)
            ok = True
        elif route == "slice_write":        # a partial write keeps every other byte
            wd[3:5].fill_(1.5)
            expect = w.clone()
            expect[3:5].fill_(1.5)
            got = wd.cpu()
            ok = True
        elif route == "copy_from":
            dst = torch.empty_like(wd)
            dst.copy_(wd)
            got = dst.cpu()
            ok = True
        elif route == "d2d_clone":
            got = wd.clone().cpu()
            ok = True
        elif route == "pinned_non_blocking":
            got = torch.empty(w.shape, dtype=dtype).pin_memory()
            got.copy_(wd, non_blocking=True)
            torch.rbln.synchronize()
            ok = True
        elif route == "empty_cache":
            torch.rbln.empty_cache()
            ok = torch.equal(torch.mm(x_d, wd).cpu(), want_mm)
            got = wd.cpu()
        elif route == "whole_write":        # nothing to narrow back: the write replaces it all
            wd.copy_(torch.ones_like(w))
            ok = s.host_released == 0
            expect = torch.ones_like(w)
            got = wd.cpu()
        out[f"{dtype}-{route}"] = {"released": rel, "ok": ok, "exact": same_bits(got, expect),
                                   "after": s.host_released,
                                   "nbytes": w.nbytes}
    for bad in ("nan", "inf"):
        wb = w.clone()
        wb[5, 3] = float(bad)
        _, rel = released(wb, x_d)
        out[f"{dtype}-{bad}"] = {"released": rel}
del x_d, wd, s
out["total_after"] = released_host_bytes()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results():
    return run_json(f"ROUTES = {ROUTES!r}\n" + _SCRIPT,
                    env={"TORCH_RBLN_MATMUL_PRECISION": "widen"})


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_released_weight_reads_back_bit_exact(results, dtype, route):
    r = results[f"{dtype}-{route}"]
    # the whole pages of the weight's host view were released (all but at most two pages)
    assert r["nbytes"] - 8192 <= r["released"] <= r["nbytes"], r
    assert r["ok"] and r["exact"], r
    if route != "matmul":
        assert r["after"] == 0, r        # read or written: narrowed back (or forgotten)


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_weight_that_is_not_finite_keeps_its_bytes(results, dtype, bad):
    assert results[f"{dtype}-{bad}"]["released"] == 0


def test_the_native_counter_follows_the_storages(results):
    # every released weight above was read back or freed
    assert results["total_after"] == 0
