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
"""

from __future__ import annotations

import math

import torch

SAMPLE = 64     # elements a record keeps of each tensor without it, at fixed positions


def _flat(ts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    ts = [t.reshape(-1).to(dtype) for t in ts]
    return ts[0] if len(ts) == 1 else torch.cat(ts)


_scalars: dict = {}


def _scalar(v: float, like: torch.Tensor) -> torch.Tensor:
    t = _scalars.get((v, like.dtype))
    if t is None:
        t = _scalars[(v, like.dtype)] = torch.tensor(v, dtype=like.dtype)
    return t


def _finite_errors(a: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> dict:
    """The errors of ``a`` against ``r`` where every value of both is finite."""
    if not a.numel():
        return {"max_abs": 0.0, "max_rel": 0.0, "worst": 0.0, "outside": 0, "ref_max": 0.0,
                "cosine": 1.0}
    diff = torch.sub(a, r).abs_()
    ref = r.abs()
    ref_max = ref.max()
    ratio = diff / torch.add(_scalar(atol, ref), ref, alpha=rtol)     # over atol + rtol * |r|
    rel = diff / ref.clamp_min_(atol)
    max_abs, max_rel, worst, ref_max, dot, aa, rr = torch.stack(
        [diff.max(), rel.max(), ratio.max(), ref_max, torch.dot(a, r), torch.dot(a, a),
         torch.dot(r, r)]).tolist()
    if not math.isfinite(aa * rr):          # squares beyond the dtype's range
        a64, r64 = a.double(), r.double()
        dot, aa, rr = torch.stack([torch.dot(a64, r64), torch.dot(a64, a64),
                                   torch.dot(r64, r64)]).tolist()
    outside = int((ratio > 1).sum()) if worst > 1 else 0
    cosine = 1.0 if aa == 0 and rr == 0 else (
        min(dot / math.sqrt(aa * rr), 1.0) if aa and rr else 0.0)
    return {"max_abs": max_abs, "max_rel": max_rel, "worst": worst, "outside": outside,
            "ref_max": ref_max, "cosine": cosine}


def errors(actual: list[torch.Tensor], reference: list[torch.Tensor], atol: float,
           rtol: float) -> dict:
    """The error statistics of ``actual`` against ``reference`` (host tensors, paired, equal
    numel), taken together."""
    dtype = torch.promote_types(reference[0].dtype, torch.float32)
    a, r = _flat(actual, dtype), _flat(reference, dtype)
    n = a.numel()
    e = _finite_errors(a, r, atol, rtol)
    only_a = only_r = 0
    if not (math.isfinite(e["max_abs"]) and math.isfinite(e["ref_max"])):
        # a NaN or an Inf on either side: compared where both are finite, counted where not
        fa, fr = torch.isfinite(a), torch.isfinite(r)
        same = (a == r) | (torch.isnan(a) & torch.isnan(r))     # equal Inf, or NaN on both
        only_a = int((~fa & (fr | ~same)).sum())
        only_r = int((fa & ~fr).sum())
        finite_r = r[fr]        # the reference's reach, where the actual overflowed too
        keep = fa & fr
        e = _finite_errors(a[keep], r[keep], atol, rtol)
        if finite_r.numel():
            e["ref_max"] = max(e["ref_max"], finite_r.abs().max().item())
        if only_a or only_r:
            e["worst"] = math.inf
    e.update(numel=n, outside=e["outside"] + only_a + only_r, nonfinite_actual=only_a,
             nonfinite_reference=only_r)
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


def summary(t: torch.Tensor) -> tuple[dict, bytes]:
    """What a record keeps of a tensor without the tensor: its finite min and max, its NaN/Inf
    count, and the elements at :func:`positions` (as float32 bytes). One pass over the tensor
    in its own dtype where every value is finite (the common case), read back once."""
    x = t.detach().reshape(-1)
    n = x.numel()
    if n == 0:
        return {"numel": 0, "min": 0.0, "max": 0.0, "nonfinite": 0}, b""
    lo, hi = torch.aminmax(x)       # NaN or Inf show in min or max
    buf = torch.cat([torch.stack([lo, hi]).float(),
                     torch.index_select(x, 0, positions(n, x.device)).float()]).cpu().numpy()
    lo, hi = buf[:2].tolist()
    nonfinite = 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        fin = torch.isfinite(x)
        nonfinite = n - int(fin.sum())
        xs = x[fin]
        lo, hi = torch.stack([xs.min(), xs.max()]).tolist() if xs.numel() else (0.0, 0.0)
    return {"numel": n, "min": lo, "max": hi, "nonfinite": nonfinite}, buf[2:].tobytes()


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
