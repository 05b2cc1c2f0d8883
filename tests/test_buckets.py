"""Bucket suggestions for a varying dim (torch_rbln/explain/buckets.py): optimal against brute
force, and shown by explain's recompile causes."""

from __future__ import annotations

import itertools
import random

import pytest
from conftest import run_json

from torch_rbln.explain.buckets import ALIGN, suggest


def _brute(hist: dict, budget: int) -> tuple[int, int]:
    """(least padding, fewest buckets reaching it) over every set of multiples of 64."""
    top = -(-max(hist) // ALIGN) * ALIGN
    cands = range(ALIGN, top, ALIGN)
    best = None
    for k in range(0, budget):
        for rest in itertools.combinations(cands, k):
            sizes = (*rest, top)
            pad = sum((min(b for b in sizes if b >= v) - v) * n for v, n in hist.items())
            if best is None or pad < best[0]:
                best = (pad, len(sizes))
    return best


def test_suggestions_are_optimal_against_brute_force():
    rng = random.Random(0)
    for _ in range(150):
        hist = {rng.randint(1, 600): rng.randint(1, 6) for _ in range(rng.randint(1, 9))}
        budget = rng.randint(1, 4)
        b = suggest(hist, budget)
        assert (b.padding, len(b.sizes)) == _brute(hist, budget), (hist, budget, b)
        assert all(s % ALIGN == 0 for s in b.sizes) and b.sizes[-1] >= max(hist)
        assert b.padding == sum((min(s for s in b.sizes if s >= v) - v) * n
                                for v, n in hist.items())


def test_a_known_histogram():
    b = suggest({17: 40, 33: 25, 100: 10, 130: 3, 300: 2, 509: 1}, budget=3)
    assert b.sizes == (64, 192, 512)
    assert b.padding == 40 * 47 + 25 * 31 + 10 * 92 + 3 * 62 + 2 * 212 + 3
    assert b.line("dim 1") == "dim 1: 6 values in 17..509 -> buckets [64, 192, 512]: 3 compiles, " \
                              "51% padding"
    # enough budget: every value in its own multiple of 64, no fewer buckets than that needs
    assert suggest([64, 128, 130], budget=8).sizes == (64, 128, 192)
    assert suggest([1, 2, 3], budget=8).sizes == (64,)
    with pytest.raises(ValueError):
        suggest([], budget=8)


def test_explain_suggests_buckets_for_a_dim_that_keeps_changing():
    # a fresh process: a recompile's cause is its key against the closest one compiled before,
    # in this process, so earlier tests' programs would add causes of their own
    out = run_json("""
    with torch.rbln.explain() as p:
        for n in (16, 40, 70, 100, 130, 200):
            torch.ones(1, n, 64, dtype=torch.float16, device="rbln") * 2
        for n in (64, 512):     # sizes that are already the best buckets: no suggestion
            torch.ones(3, n, dtype=torch.float16, device="rbln") + 1
    print(json.dumps({"rows": p.dump()["recompile_buckets"], "report": p.report()}))
    """)
    (row,) = out["rows"]
    assert (row["op"], row["part"], row["buckets"]) == ("aten::mul.out", "dim 1",
                                                         [64, 128, 192, 256])
    assert row["compiles"] == 4 and row["values"] == 6
    assert "        suggest: dim 1: 6 values in 16..200 -> buckets [64, 128, 192, 256]: " \
           "4 compiles" in out["report"]
