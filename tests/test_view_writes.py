"""Writes through views land in the base as on the CPU.

Property test: a base tensor (complex64, float32 or float16, its data on the device), a random
chain of PyTorch's view kinds (conjugate, negative, ``as_strided``, ``unfold``, ``diagonal``,
``view_as_real``, ``.real`` / ``.imag``, ...), then one write through the last view: an in-place
op (device op, native copy-engine op or CPU fallback), ``copy_`` or ``out=``. The same program
runs on a CPU twin; the base must then read the same, the next device op must see the write,
and where the CPU raises, rbln raises too. Plus the fixed cases named in the docs: conjugate
views, ``out=`` into a non-contiguous view of the right size, and the warnings the CPU gives.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

D = "rbln"
DTYPES = (torch.complex64, torch.float32, torch.float16)


def _src(shape, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.complex64 if dtype.is_complex else torch.float32)
    return t.to(dtype).to(device)


# view kinds: each takes a tensor and the example's integer, and may not apply (raises)
VIEWS = {
    "conj": lambda t, i: t.conj(),
    "neg": lambda t, i: t._neg_view(),
    "conj_imag": lambda t, i: t.conj().imag,            # PyTorch's negative view of a real part
    "real": lambda t, i: t.real,
    "imag": lambda t, i: t.imag,
    "view_as_real": lambda t, i: torch.view_as_real(t),
    "as_strided": lambda t, i: t.as_strided(
        (max(1, t.shape[0] // 2), *t.shape[1:]), (t.stride(0) * 2, *t.stride()[1:]),
        t.storage_offset() + i % 2),
    "unfold": lambda t, i: t.unfold(-1, 2 + i % 2, 2 + i % 2),     # non-overlapping windows
    "unfold_overlapping": lambda t, i: t.unfold(-1, 3, 1),
    "expand": lambda t, i: t.unsqueeze(0).expand(2, *t.shape),
    "diagonal": lambda t, i: t.diagonal(offset=i % 3 - 1, dim1=-2, dim2=-1),
    "transpose": lambda t, i: t.transpose(0, -1),
    "narrow": lambda t, i: t.narrow(-1, i % 3, t.shape[-1] - 2),
    "select": lambda t, i: t.select(0, i % t.shape[0]),
}


def _masked(v, dev):
    return torch.arange(v.numel(), device=dev).reshape(v.shape) % 3 == 0


# writes through a view ``v`` on device ``dev`` (``i``: the example's integer)
WRITES = {
    "mul_": lambda v, dev, i: v.mul_(2),                          # device op (fp16)
    "add_": lambda v, dev, i: v.add_(_src(v.shape, v.dtype, i, dev)),
    "sin_": lambda v, dev, i: v.sin_(),                           # CPU fallback
    "clamp_": lambda v, dev, i: v.clamp_(-0.5, 0.5),
    "fill_": lambda v, dev, i: v.fill_(3),                        # native copy-engine ops
    "zero_": lambda v, dev, i: v.zero_(),
    "copy_rbln": lambda v, dev, i: v.copy_(_src(v.shape, v.dtype, i, dev)),
    "copy_cpu": lambda v, dev, i: v.copy_(_src(v.shape, v.dtype, i, "cpu")),
    "copy_broadcast": lambda v, dev, i: v.copy_(_src(v.shape[-1:], v.dtype, i, dev)),
    "masked_fill_": lambda v, dev, i: v.masked_fill_(_masked(v, dev), -1),
    "setitem": lambda v, dev, i: v.__setitem__(_masked(v, dev), 7),
    "index_put_": lambda v, dev, i: v.index_put_(
        (torch.tensor([0, v.shape[0] - 1], device=dev),), torch.tensor(5, dtype=v.dtype, device=dev)),
    "out_fallback": lambda v, dev, i: torch.sin(_src(v.shape, v.dtype, i, dev), out=v),
    "out_device": lambda v, dev, i: torch.mul(_src(v.shape, v.dtype, i, dev), 3, out=v),
    "out_reduction": lambda v, dev, i: torch.sum(_src((2, *v.shape), v.dtype, i, dev), 0, out=v),
    "out_arange": lambda v, dev, i: torch.arange(0, v.numel(), out=v),
    "out_linspace": lambda v, dev, i: torch.linspace(0, 1, v.numel(), out=v),
}


def _overlaps(v: torch.Tensor) -> bool:
    """Two elements of ``v`` share memory: writing through ``v`` is undefined in PyTorch (the
    CPU raises where it can tell, else the result depends on its iteration order)."""
    span = v.storage_offset() + sum((n - 1) * st for n, st in zip(v.shape, v.stride())) + 1
    idx = torch.arange(max(span, 1)).as_strided(v.shape, v.stride(), v.storage_offset())
    return idx.unique().numel() < v.numel()


def _apply(chain, fn, base, i):
    t = base
    for name in chain:
        t = VIEWS[name](t, i)
    return fn(t), t


def _outcome(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
        except (RuntimeError, ValueError, IndexError, TypeError) as e:
            return e, caught
    return None, caught


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(DTYPES), chain=st.lists(st.sampled_from(sorted(VIEWS)), max_size=3),
       write=st.sampled_from(sorted(WRITES)), i=st.integers(0, 5))
def test_writes_through_views_land_in_the_base_as_on_the_cpu(dtype, chain, write, i):
    shape = (4, 64) if dtype == torch.float16 else (4, 6)
    cpu = _src(shape, dtype, 1000 + i, "cpu")
    # a device op first, so the base's latest data is on the device (device-latest)
    dev = (cpu.to(D) * 1) if dtype == torch.float16 else cpu.to(D)
    views = []
    for name in chain:                      # keep the views the CPU accepts for this tensor
        try:
            _apply(views + [name], lambda v: v, cpu.clone(), i)
        except (RuntimeError, ValueError, IndexError):
            continue
        views.append(name)
    fn = WRITES[write]
    cpu_err, cpu_warn = _outcome(lambda: _apply(views, lambda v: fn(v, "cpu", i), cpu, i))
    dev_err, dev_warn = _outcome(lambda: _apply(views, lambda v: fn(v, D, i), dev, i))
    if cpu_err is not None:
        assert dev_err is not None, f"the CPU raised {cpu_err!r}, rbln did not"
        return
    if _overlaps(_apply(views, lambda v: v, cpu.clone(), i)[0]):
        return              # undefined on the CPU too: no values to compare
    assert dev_err is None, f"rbln raised {dev_err!r}, the CPU did not"
    assert [str(w.message) for w in dev_warn] == [str(w.message) for w in cpu_warn]
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.float16 else dict(atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dev.cpu(), cpu, equal_nan=True, **tol)
    if dtype == torch.float16:
        # the next device op reads what was written (not a stale device buffer)
        torch.testing.assert_close((dev * 2).cpu(), cpu * 2, equal_nan=True, **tol)


def test_conjugate_and_negative_views_write_through():
    a = torch.tensor([1 + 2j, 3 - 1j], device=D)
    a.conj().mul_(2)
    assert torch.equal(a.cpu(), torch.tensor([2 + 4j, 6 - 2j]))
    a.conj().copy_(torch.tensor([5 + 5j, 0j], device=D))
    assert torch.equal(a.cpu(), torch.tensor([5 - 5j, 0j]))
    a.conj().imag.add_(1)                   # a negative view of a's imaginary part
    assert torch.equal(a.cpu(), torch.tensor([5 - 6j, -1j]))
    torch.add(torch.tensor([1j, 1j], device=D), 1, out=a.conj())
    assert torch.equal(a.cpu(), torch.tensor([1 - 1j, 1 - 1j]))
    a.conj().fill_(2j)
    assert torch.equal(a.cpu(), torch.tensor([-2j, -2j]))


def test_out_into_a_non_contiguous_view_fills_exactly_its_elements():
    results = []
    for dev in ("cpu", D):
        x = torch.zeros(2, 3, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.arange(0, 4, out=x.narrow(1, 1, 2))
            first = x.cpu().clone()
            torch.linspace(0, 1, 2, out=x[:, 0])
            torch.sin(torch.ones(2, 2, device=dev), out=x.t()[1:])
        results.append((first, x.cpu()))
    assert torch.equal(results[0][0], torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 3.0]]))
    assert torch.equal(results[1][0], results[0][0])
    assert torch.equal(results[1][1], results[0][1])
    # a mismatched out= holding elements is resized with the CPU's warning, once
    for dev in ("cpu", D):
        y = torch.zeros(2, 3, device=dev)
        with pytest.warns(UserWarning, match="number of elements in the out tensor") as w:
            torch.arange(0, 4, out=y)
        assert len(w) == 1 and y.shape == (4,)
        z = torch.zeros(3, device=dev)
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            torch.sin(torch.ones(2, 2, device=dev), out=z)
        assert z.shape == (2, 2)


def test_no_resize_warning_where_the_cpu_gives_none():
    a, b = torch.randn(4, 64), torch.randn(4, 64)
    for dtype in (torch.float32, torch.float16):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            want = F.mse_loss(a.to(dtype), b.to(dtype))
            got = F.mse_loss(a.to(dtype).to(D), b.to(dtype).to(D))
            F.smooth_l1_loss(a.to(dtype).to(D), b.to(dtype).to(D))
        torch.testing.assert_close(got.cpu(), want, atol=1e-3, rtol=1e-3)


def test_uint8_mask_indexing_warns_once_like_the_cpu():
    t = torch.randn(4)
    m = torch.tensor([1, 0, 1, 0], dtype=torch.uint8)
    counts = []
    for dev in ("cpu", D):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = t.to(dev)[m.to(dev)]
        counts.append(sum("uint8" in str(w.message) for w in caught))
        assert torch.equal(got.cpu(), t[m.bool()])
    assert counts == [1, 1]
