"""Bucket sizes for a dim that keeps changing: the compiles capped at a budget, the least padding.

An op compiles once per distinct size of a dim; padding each size up to one of a few bucket
sizes caps the compiles at the number of buckets. Buckets are multiples of 64 (the NPU's
alignment). :func:`suggest` solves it exactly: among the sets of at most ``budget`` bucket
sizes that hold every observed value (the largest bucket at least the largest value), the one
with the fewest padded elements over the observed values (each value padded to the smallest
bucket that holds it, weighted by how often it was seen), and of those the one with the fewest
buckets.

Only the observed values rounded up to 64 can be optimal buckets (a bucket between two of them
can be lowered to the one below without losing a value), so a dynamic program over those
candidates, sorted, finds it: ``best[k][j]`` is the least padding of the values up to candidate
``j`` with ``k`` buckets, the largest being candidate ``j``; a bucket at ``j`` whose previous
bucket is ``i`` pads the values between them to candidate ``j``. O(budget * candidates^2).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

ALIGN = 64      # the NPU's alignment of a last dim: buckets are its multiples
BUDGET = 8      # compiles per varying dim the suggestion allows


@dataclass(frozen=True)
class Buckets:
    sizes: tuple[int, ...]      # bucket sizes, ascending
    padding: int                # padded elements over the observed values (weighted)
    total: int                  # the observed values' sum (weighted)
    values: int                 # distinct values observed
    low: int
    high: int

    @property
    def padding_percent(self) -> float:
        """The padding's share of the padded work (padding over padded total), in percent."""
        padded = self.total + self.padding
        return 100.0 * self.padding / padded if padded else 0.0

    def line(self, part: str) -> str:
        """``dim 1: 37 values in 16..509 -> buckets [64, 128, 256, 512]: 4 compiles, 23%
        padding`` (as the report prints it after ``suggest:``)."""
        n = len(self.sizes)
        return (f"{part}: {self.values} value{'s' if self.values != 1 else ''} in "
                f"{self.low}..{self.high} -> buckets {list(self.sizes)}: {n} "
                f"compile{'s' if n != 1 else ''}, {self.padding_percent:.0f}% padding")

    def as_dict(self) -> dict:
        return {"buckets": list(self.sizes), "compiles": len(self.sizes),
                "padding": self.padding, "padding_percent": round(self.padding_percent, 1),
                "values": self.values, "low": self.low, "high": self.high}


def _round_up(v: int, align: int) -> int:
    return max(-(-v // align) * align, align)


def suggest(values: Mapping[int, int] | Iterable[int], budget: int = BUDGET,
            align: int = ALIGN) -> Buckets:
    """The optimal buckets for ``values`` (sizes seen, or ``{size: times seen}``)."""
    hist = Counter(values) if not isinstance(values, Mapping) else Counter(dict(values))
    hist = Counter({int(v): int(n) for v, n in hist.items() if n > 0})
    if not hist or min(hist) < 0:
        raise ValueError("bucket suggestions need at least one non-negative size")
    if budget < 1:
        raise ValueError("the budget is at least one bucket")
    cands = sorted({_round_up(v, align) for v in hist})
    m = len(cands)
    # per candidate: how many values round up to it, and their sum; then prefix sums
    count = [0] * m
    total = [0] * m
    at = {c: i for i, c in enumerate(cands)}
    for v, n in hist.items():
        i = at[_round_up(v, align)]
        count[i] += n
        total[i] += v * n
    pc, ps = [0], [0]
    for i in range(m):
        pc.append(pc[-1] + count[i])
        ps.append(ps[-1] + total[i])

    def cost(i: int, j: int) -> int:        # candidates i..j padded to candidate j
        return cands[j] * (pc[j + 1] - pc[i]) - (ps[j + 1] - ps[i])

    inf = float("inf")
    k_max = min(budget, m)
    best = [[inf] * m for _ in range(k_max + 1)]
    prev = [[-1] * m for _ in range(k_max + 1)]
    for j in range(m):
        best[1][j] = cost(0, j)
    for k in range(2, k_max + 1):
        for j in range(k - 1, m):
            b, arg = inf, -1
            for i in range(k - 2, j):       # the previous bucket is candidate i
                c = best[k - 1][i] + cost(i + 1, j)
                if c < b:
                    b, arg = c, i
            best[k][j], prev[k][j] = b, arg
    least = min(best[k][m - 1] for k in range(1, k_max + 1))
    k = next(k for k in range(1, k_max + 1) if best[k][m - 1] == least)
    sizes, j = [], m - 1
    while k >= 1 and j >= 0:
        sizes.append(cands[j])
        j = prev[k][j]
        k -= 1
    return Buckets(tuple(reversed(sizes)), int(least), sum(v * n for v, n in hist.items()),
                   len(hist), min(hist), max(hist))
