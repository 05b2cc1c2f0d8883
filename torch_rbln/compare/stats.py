"""How far a result is from its reference: the error statistics of one comparison, and the
device-neutral summary of one tensor that a record keeps.

Errors (:func:`errors`) are computed in the reference's dtype on the host, over the elements
both sides hold as finite numbers:

* ``max_abs``  the largest ``|actual - reference|``
* ``max_rel``  the largest ``|actual - reference| / max(|reference|, atol)``: elements near zero
  count by their absolute error, so a tiny reference does not make a huge ratio
* ``cosine``   the cosine similarity of the two (1.0 when both are all zeros)
* ``outside``  elements outside the tolerance (``|a - r| > atol + rtol * |r|``), NaN/Inf on one
  side only included; ``worst`` the largest ``|a - r| / (atol + rtol * |r|)`` (over 1: outside)
* ``nonfinite_actual`` / ``nonfinite_reference``  NaN or Inf on that side only (or a different
  NaN/Inf on both sides, counted on the actual's)
* ``ref_max``  the largest finite ``|reference|`` (an overflow's telltale: beyond the actual
  dtype's range)

A float32 or float64 pair whose values are all finite (the common case) is read in one pass by
the native core (``csrc/Numerics.cpp``: the same element operations, so the same maxima and
count; the dot products summed in double); the NumPy form below defines the numbers and takes
every other pair.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from .. import _C

SAMPLE = 64     # elements a record keeps of each tensor without it, at fixed positions


def _host_tensor(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t``'s values in ``dtype`` as a host tensor in ``t``'s layout."""
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t if t.dtype == dtype else t.to(dtype)


def _host(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``t``'s values in ``dtype`` as a host array in ``t``'s layout (complex as real and
    imaginary parts)."""
    t = _host_tensor(t, dtype)
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.numpy()


def _flat_pair(actual: list[torch.Tensor], reference: list[torch.Tensor],
               dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' values in ``dtype`` as flat host arrays, element by element paired. A pair
    of one layout (a transpose on both sides) is read in memory order without a copy: the
    statistics do not depend on the order, only on the pairing."""
    a_out, r_out = [], []
    for a, r in zip(actual, reference):
        a, r = _host(a, dtype), _host(r, dtype)
        order = "K" if a.strides == r.strides and a.shape == r.shape else "C"
        a_out.append(a.ravel(order))
        r_out.append(r.ravel(order))
    if len(a_out) == 1:
        return a_out[0], r_out[0]
    return np.concatenate(a_out), np.concatenate(r_out)


_max = np.maximum.reduce     # NaN propagates (the array method adds a Python call)
_ZERO = {"max_abs": 0.0, "max_rel": 0.0, "worst": 0.0, "outside": 0, "ref_max": 0.0,
         "cosine": 1.0}


CHUNK = 1 << 15     # elements per block of the error passes: their temporaries stay in cache
_scratch = threading.local()


def _blocks(dtype: np.dtype, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three scratch blocks of ``min(n, CHUNK)`` elements of ``dtype`` (this thread's, reused:
    no allocation per comparison)."""
    key = dtype.str
    have = getattr(_scratch, key, None)
    if have is None or have[0].size < min(n, CHUNK):
        have = tuple(np.empty(min(max(n, 4096), CHUNK), dtype) for _ in range(3))
        setattr(_scratch, key, have)
    return have


def _block(ab: np.ndarray, rb: np.ndarray, atol: float, rtol: float, scratch) -> tuple:
    """One block's ``(max |a - r|, max |r|, max ratio to the tolerance's bound (over rtol),
    max |a - r| / max(|r|, atol), elements outside, a.r, a.a, r.r)``; the maxima as NumPy
    scalars (a NaN stays one). Each pass reads what the last one left in cache, into scratch
    blocks; the tolerance's ratio is taken over ``atol / rtol + |r|`` (a pass less than
    ``atol + rtol * |r|``)."""
    k = ab.size
    diff_b, ref_b, tmp_b = scratch
    diff = np.subtract(ab, rb, out=diff_b[:k])
    np.abs(diff, out=diff)
    max_abs = _max(diff)
    if max_abs == 0:        # equal (an exact op: a conversion up, a negation): no error
        return max_abs, _max(np.abs(rb, out=ref_b[:k])), 0.0, 0.0, 0, None, None, None
    ref = np.abs(rb, out=ref_b[:k])
    ref_max = _max(ref)
    if rtol > 0:    # |a - r| / (atol + rtol * |r|) = |a - r| / (atol / rtol + |r|) / rtol
        ratio = np.add(ref, atol / rtol, out=tmp_b[:k])
        ratio_max = _max(np.divide(diff, ratio, out=ratio))
        near = ratio_max / rtol > 0.999
    else:
        ratio_max = 0.0
        near = max_abs > 0.999 * atol
    outside = 0
    if near:        # elements may lie outside: counted as the tolerance reads
        bound = np.multiply(ref, rtol, out=tmp_b[:k])
        bound += atol
        outside = int(np.count_nonzero(diff > bound))
    np.maximum(ref, atol, out=ref)      # |a - r| over max(|r|, atol)
    max_rel = _max(np.divide(diff, ref, out=ref))
    return (max_abs, ref_max, ratio_max, max_rel, outside, np.dot(ab, rb), np.dot(ab, ab),
            np.dot(rb, rb))


def _finite_errors(a: np.ndarray, r: np.ndarray, atol: float, rtol: float) -> dict:
    """The errors of ``a`` against ``r`` where every value of both is finite (a NaN or Inf on
    either side shows in ``max_abs`` or ``ref_max``), computed a block of :data:`CHUNK`
    elements at a time (:func:`_block`), so a large result is read from memory about once
    instead of a dozen times."""
    n = a.size
    if not n:
        return dict(_ZERO)
    scratch = _blocks(a.dtype, n)
    with np.errstate(all="ignore"):
        rows = [_block(a[i:i + CHUNK], r[i:i + CHUNK], atol, rtol, scratch)
                for i in range(0, n, CHUNK)]
        if len(rows) == 1:
            max_abs, ref_max, ratio_max, max_rel = (float(v) for v in rows[0][:4])
        else:
            max_abs, ref_max, ratio_max, max_rel = (
                float(v) for v in _max(np.array([row[:4] for row in rows], a.dtype), axis=0))
        if max_abs == 0:
            return {**_ZERO, "ref_max": ref_max}
        if rtol > 0:
            worst = ratio_max / rtol
        else:
            worst = max_abs / atol if atol > 0 else math.inf
        dot = aa = rr = 0.0
        for i, row in zip(range(0, n, CHUNK), rows):
            if row[5] is None:      # an equal block (others differ): its dot products now
                ab, rb = a[i:i + CHUNK], r[i:i + CHUNK]
                row = (*row[:5], np.dot(ab, rb), np.dot(ab, ab), np.dot(rb, rb))
            dot, aa, rr = dot + float(row[5]), aa + float(row[6]), rr + float(row[7])
        if not math.isfinite(aa * rr):          # squares beyond the dtype's range
            a64, r64 = a.astype(np.float64), r.astype(np.float64)
            dot, aa, rr = float(np.dot(a64, r64)), float(np.dot(a64, a64)), \
                float(np.dot(r64, r64))
    cosine = 1.0 if aa == 0 and rr == 0 else (
        min(dot / math.sqrt(aa * rr), 1.0) if aa and rr else 0.0)
    return {"max_abs": max_abs, "max_rel": max_rel, "worst": worst,
            "outside": sum(row[4] for row in rows), "ref_max": ref_max, "cosine": cosine}


# the reference dtypes the statistics are taken in as they are (the others are promoted)
_WIDE = frozenset({torch.float32, torch.float64, torch.complex64, torch.complex128})
# ... and those the native core's pass takes (csrc/Numerics.cpp)
_NATIVE = frozenset({torch.float32, torch.float64})


_native = _C.compare_errors


def _from_sums(max_abs, ref_max, ratio_max, max_rel, outside, dot, aa, rr, atol, rtol,
               numel) -> dict:
    """:func:`errors`' dict from the native pass's maxima, count and sums (every value
    finite), read as :func:`_finite_errors` reads its blocks'."""
    e = {**_ZERO, "ref_max": ref_max}
    if max_abs != 0:
        if rtol > 0:
            worst = ratio_max / rtol
        else:
            worst = max_abs / atol if atol > 0 else math.inf
        cosine = 1.0 if aa == 0 and rr == 0 else (
            min(dot / math.sqrt(aa * rr), 1.0) if aa and rr else 0.0)
        e.update(max_abs=max_abs, max_rel=max_rel, worst=worst, outside=outside, cosine=cosine)
    e.update(numel=numel, nonfinite_actual=0, nonfinite_reference=0)
    return e


def errors(actual: list[torch.Tensor], reference: list[torch.Tensor], atol: float,
           rtol: float) -> dict:
    """The error statistics of ``actual`` against ``reference`` (host tensors, paired, equal
    numel), taken together."""
    dtype = reference[0].dtype
    if dtype not in _WIDE:
        dtype = torch.promote_types(dtype, torch.float32)
    if dtype in _NATIVE:
        # the native core's one pass (float and double, every value finite: the common case)
        got = _native([_host_tensor(t, dtype) for t in actual],
                      [_host_tensor(t, dtype) for t in reference], atol, rtol)
        if got is not None:
            return _from_sums(*got, atol, rtol, sum(t.numel() for t in actual))
    a, r = _flat_pair(actual, reference, dtype)
    e = _finite_errors(a, r, atol, rtol)
    only_a = only_r = 0
    if not (math.isfinite(e["max_abs"]) and math.isfinite(e["ref_max"])):
        # a NaN or an Inf on either side: compared where both are finite, counted where not
        fa, fr = np.isfinite(a), np.isfinite(r)
        same = (a == r) | (np.isnan(a) & np.isnan(r))       # equal Inf, or NaN on both
        only_a = int(np.count_nonzero(~fa & (fr | ~same)))
        only_r = int(np.count_nonzero(fa & ~fr))
        finite_r = r[fr]        # the reference's reach, where the actual overflowed too
        keep = fa & fr
        e = _finite_errors(a[keep], r[keep], atol, rtol)
        if finite_r.size:
            e["ref_max"] = max(e["ref_max"], float(np.abs(finite_r).max()))
        if only_a or only_r:
            e["worst"] = math.inf
    e["numel"] = sum(t.numel() for t in actual)
    e["outside"] += only_a + only_r
    e["nonfinite_actual"], e["nonfinite_reference"] = only_a, only_r
    return e


def diverged(e: dict) -> bool:
    """Out of tolerance: an element outside it, or a NaN/Inf on one side only."""
    return e["outside"] > 0 or e["nonfinite_actual"] > 0 or e["nonfinite_reference"] > 0


# -- records ---------------------------------------------------------------------------------

_positions: dict[tuple, torch.Tensor] = {}


def positions(numel: int, device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """The fixed element positions a record samples of a tensor of ``numel`` elements (the same
    on every device and run): :data:`SAMPLE` of them spread evenly, or all of a small one."""
    key = (numel, device)
    p = _positions.get(key)
    if p is None:
        p = torch.arange(numel) if numel <= SAMPLE else \
            torch.linspace(0, numel - 1, SAMPLE, dtype=torch.float64).round().long()
        p = _positions[key] = p.to(device)
    return p


# (shape, strides, device) -> where the positions lie in memory order, or None: not dense
_orders: dict[tuple, torch.Tensor | None] = {}


def _dense(shape, strides) -> bool:
    """Do these strides lay the elements out without gaps or overlaps, in some order?"""
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(shape, strides) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _in_memory_order(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x``'s elements as a 1-d tensor, and where :func:`positions` of ``x`` lie in it. Min and
    max do not depend on the order: a dense tensor in any layout (a transpose, a permuted
    view) is read where it lies, without a copy into row-major order."""
    n = x.numel()
    if x.is_contiguous():
        return x.view(-1), positions(n, x.device)
    key = (tuple(x.shape), x.stride(), x.device)
    if key not in _orders:
        if len(_orders) > 4096:
            _orders.clear()
        at = None
        if _dense(*key[:2]):
            p, at = positions(n, x.device), 0
            for size, stride in zip(reversed(key[0]), reversed(key[1])):
                at = at + (p % size) * stride
                p = p // size
        _orders[key] = at
    at = _orders[key]
    if at is None:
        return x.reshape(-1), positions(n, x.device)
    return x.as_strided((n,), (1,)), at     # from its storage offset: where its elements start


# the dtypes the native core summarizes (csrc/Numerics.cpp: record_summary)
_SUMMARIZED = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def reduce(t: torch.Tensor) -> tuple[dict, torch.Tensor | bytes | None]:
    """What a record keeps of ``t`` without ``t``: its finite min and max and its NaN/Inf count,
    read now, and the elements at :func:`positions`, a small tensor in ``t``'s dtype for
    :func:`read_samples` to read later with others. One pass over ``t`` in its own dtype where
    every value is finite (the common case: NaN or Inf show in the min or max; only then a
    second look), right after it was made (still in cache)."""
    n = t.numel()
    if n == 0:
        return {"numel": 0, "min": 0.0, "max": 0.0, "nonfinite": 0}, None
    if t.device.type == "cpu" and t.dtype in _SUMMARIZED:
        # the native core's one pass; the samples come back as float32 bytes already
        lo, hi, bad, samples = _C.record_summary(t.detach(), positions(n))
        return {"numel": n, "min": lo, "max": hi, "nonfinite": bad}, samples
    x, at = _in_memory_order(t.detach())
    lo, hi = torch.aminmax(x)
    s = {"numel": n, "min": lo.item(), "max": hi.item(), "nonfinite": 0}
    if not (math.isfinite(s["min"]) and math.isfinite(s["max"])):
        s.update(_finite_range(x))
    return s, x.index_select(0, at)


def read_samples(samples: list) -> list[bytes]:
    """:func:`reduce`'s samples (None: an empty tensor's; bytes: read already) as float32
    bytes, read back at once (joined per device and dtype: joining mixed dtypes takes a slow
    path)."""
    out = [b""] * len(samples)
    groups: dict = {}
    for i, x in enumerate(samples):
        if type(x) is bytes:
            out[i] = x
        elif x is not None:
            groups.setdefault((x.device, x.dtype), []).append(i)
    for idx in groups.values():
        buf = torch.cat([samples[i] for i in idx]).float().cpu().numpy()
        at = 0
        for i in idx:
            k = samples[i].numel()
            out[i] = buf[at:at + k].tobytes()
            at += k
    return out


def _finite_range(x: torch.Tensor) -> dict:
    """The min and max of ``x``'s finite values and its NaN/Inf count."""
    fin = torch.isfinite(x)
    xs = x[fin]
    lo, hi = torch.stack([xs.min(), xs.max()]).tolist() if xs.numel() else (0.0, 0.0)
    return {"min": lo, "max": hi, "nonfinite": x.numel() - xs.numel()}


def sampled_errors(a: dict, r: dict, sample_a: torch.Tensor, sample_r: torch.Tensor,
                   atol: float, rtol: float) -> dict:
    """Errors of two record summaries: over their samples (same positions; ``outside`` counts
    sampled elements), with the NaN/Inf counts of the whole tensors."""
    e = errors([sample_a], [sample_r], atol, rtol)
    e["nonfinite_actual"] = max(e["nonfinite_actual"], a["nonfinite"] - r["nonfinite"])
    e["nonfinite_reference"] = max(e["nonfinite_reference"], r["nonfinite"] - a["nonfinite"])
    if e["nonfinite_actual"] or e["nonfinite_reference"]:
        e["worst"] = math.inf
    e["ref_max"] = max(e["ref_max"], abs(r["min"]), abs(r["max"]))
    e["numel"] = a["numel"]
    e["sampled"] = sample_a.numel()
    return e
