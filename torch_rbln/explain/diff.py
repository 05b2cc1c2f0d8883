"""``RBLNDiff``: two closed regions side by side, signal by signal.

explain never decides what is one-time and what recurs; the user places both points (say, the
first call and a later one) and the diff shows what went away and what persisted.
"""

from __future__ import annotations

import copy

from . import fmt

MAX_PERSIST = 8


def _signals(a: dict, b: dict) -> dict[str, dict]:
    def row(get, get_bytes=None) -> dict:
        r = {"a": get(a), "b": get(b)}
        if get_bytes is not None:
            r["a_bytes"], r["b_bytes"] = get_bytes(a), get_bytes(b)
        return r

    rr = lambda d: d["runtime_residency"]  # noqa: E731
    d2h = lambda d: rr(d)["real_host_sync_d2h"]  # noqa: E731
    h2d = lambda d: rr(d)["real_host_sync_h2d"]  # noqa: E731

    def slow_bytes(d):
        # what the slow copies cost: the physical transfer if one happened, else the host path
        if d2h(d)["count"]:
            return d2h(d)["bytes"]
        return sum(c["bytes"] for c in rr(d)["by_reason"].values())

    out = {"host_bounce": row(lambda d: d["hidden_host_bounce"]["total_count"],
                              lambda d: d["hidden_host_bounce"]["total_bytes"])}
    out["runtime/v2v_slow"] = row(lambda d: rr(d)["total_count"], slow_bytes)
    if d2h(a)["count"] or d2h(b)["count"]:
        out["runtime/physical_d2h"] = row(lambda d: d2h(d)["count"], lambda d: d2h(d)["bytes"])
    if h2d(a)["count"] or h2d(b)["count"]:
        out["runtime/h2d_push"] = row(lambda d: h2d(d)["count"], lambda d: h2d(d)["bytes"])
    out["cpu_fallback"] = row(lambda d: d["dispatch"]["cpu_fallback"])
    out["recompile"] = row(lambda d: d["dispatch"]["recompile_miss"])
    return out


def compare(a: dict, b: dict) -> dict:
    """The diff's dump from the two regions' dumps (A = first point, B = second)."""
    sig = _signals(a, b)
    persists_by_op = [
        {"signal": signal, "op": op, "count": n, "at": b["trace_by_op"].get(op)}
        for signal, key in (("cpu_fallback", "cpu_fallback_by_op"), ("recompile", "recompile_by_op"))
        for op, n in b[key].items()
    ]
    out = {
        "signals": sig,
        "persists": [k for k, r in sig.items() if r["b"] > 0],
        "gone": [k for k, r in sig.items() if r["a"] > 0 and r["b"] == 0],
        "appeared": [k for k, r in sig.items() if r["a"] == 0 and r["b"] > 0],
        "persists_by_op": persists_by_op,
    }
    if "device_memory" in a and "device_memory" in b:
        out["device_memory"] = {"a_peak_bytes": a["device_memory"]["peak_bytes"],
                                "b_peak_bytes": b["device_memory"]["peak_bytes"]}
    return out


def render(d: dict) -> str:
    lines = ["RBLN EXPLAIN DIFF   (A -> B; you placed both points)",
             "  explain does not know your run structure; this compares ONLY your two regions.",
             ""]
    rows = []
    for name, r in d["signals"].items():
        mark = ">> persists" if r["b"] > 0 else "gone in B" if r["a"] > 0 else ""
        rows.append([name, fmt.count(r["a"]), fmt.count(r["b"]),
                     fmt.nbytes(r["a_bytes"]) if r.get("a_bytes") else "--",
                     fmt.nbytes(r["b_bytes"]) if r.get("b_bytes") else "--", mark])
    lines += fmt.table(["Signal", "A", "B", "A bytes", "B bytes", ""], rows, right={1, 2, 3, 4})
    if d["persists_by_op"]:
        lines += ["", "  >> persists across your two points -> recurring overhead, act on these:"]
        for e in d["persists_by_op"][:MAX_PERSIST]:
            at = f"  @ {fmt.short_stack(e['at'])}" if e["at"] else ""
            lines.append(f"    {e['signal']}: {e['op']} {fmt.count(e['count'])}{at}")
    elif not d["persists"]:
        lines += ["", "  nothing persisted into B (no recurring overhead across your two points)"]
    return "\n".join(lines)


class RBLNDiff:
    """A -> B comparison of two closed regions (snapshotted when made)."""

    def __init__(self, a, b):
        for name, region in (("a", a), ("b", b)):
            if region.is_open:
                raise RuntimeError(f"region '{name}' is still open -- close both regions before diff()")
        self._dump = compare(a.dump(), b.dump())

    def dump(self) -> dict:
        return copy.deepcopy(self._dump)

    def report(self) -> str:
        return render(self._dump)

    def __repr__(self) -> str:
        return self.report()

    __str__ = __repr__
