"""Ops that CUDA runs and a CPU-only path would refuse, on rbln against the CPU reference."""

from __future__ import annotations

import pytest
import torch

_C32 = torch.complex32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("dim,keepdim", [(-1, False), (0, True), (1, False)])
def test_mode_matches_the_cpu_functional_and_out(dtype, dim, keepdim):
    x = torch.randint(0, 4, (5, 7)).to(dtype)
    want = torch.mode(x, dim, keepdim)
    got = torch.mode(x.to("rbln"), dim, keepdim)
    # the out= form checks the device type before any backend kernel runs
    v = torch.empty(0, dtype=dtype, device="rbln")
    i = torch.empty(0, dtype=torch.int64, device="rbln")
    out = torch.mode(x.to("rbln"), dim, keepdim, out=(v, i))
    assert out.values is v and out.indices is i
    for res in (got, out):
        assert torch.equal(res.values.cpu(), want.values)
        assert torch.equal(res.indices.cpu(), want.indices)


def _chalf(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dtype=torch.complex64, generator=g).to(_C32)


def _half(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g).mul(4).sub(2).to(torch.float16)


def _widened(t):
    return t.to(torch.complex64) if t.dtype == _C32 else t.float()


# (name, fn, operands): each computes in complex32 as CUDA does (complex<float> inside)
_CASES = [
    ("chalf ** int", lambda a: a ** 2, [_chalf(64, 0)]),
    ("chalf ** float", lambda a: torch.pow(a, 2.5), [_chalf(64, 1)]),
    ("chalf ** complex", lambda a: torch.pow(a, 1 - 0.5j), [_chalf(64, 2)]),
    ("chalf ** chalf", torch.pow, [_chalf(64, 3), _chalf(64, 4)]),
    ("complex ** half", lambda h: torch.pow(2.2 - 1.6j, h), [_half(64, 5)]),
    ("half ** complex", lambda h: torch.pow(h, 0.5j), [_half(64, 6)]),
    ("half / complex", lambda h: h / (1 + 1j), [_half(64, 7)]),
    ("chalf.pow_", lambda a: a.clone().pow_(3), [_chalf(64, 8)]),
]


@pytest.mark.parametrize("fn,operands", [pytest.param(f, o, id=n) for n, f, o in _CASES])
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex32_pow_equals_the_cpu_on_the_widened_dtype(fn, operands):
    got = fn(*(t.to("rbln") for t in operands))
    assert got.dtype == _C32
    want = fn(*(_widened(t) for t in operands)).to(_C32)
    # complex32 has no isclose: compare the parts; bit for bit (both compute in complex64)
    assert torch.equal(torch.view_as_real(got.cpu()), torch.view_as_real(want))
