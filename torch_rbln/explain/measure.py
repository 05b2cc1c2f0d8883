"""Turn two snapshots of the event stream into the region's ``dump()`` and ``verdict()``.

Every flow number is ``after - before`` of the process-wide counters, so it includes the work of
every thread during the region. Device memory is a level read at the end, not a delta.
"""

from __future__ import annotations

import os

import torch

from . import buckets, fmt, remedies

Snapshot = dict  # kind -> key -> [count, amount], as events.snapshot() returns it


def _delta(before: Snapshot, after: Snapshot, kind: str) -> dict[str, tuple[int, int]]:
    """key -> (count, amount) for the keys of ``kind`` that moved during the region."""
    b = before.get(kind, {})
    out = {}
    for key, (n, amount) in after.get(kind, {}).items():
        n0, a0 = b.get(key, (0, 0))
        if n > n0:
            out[key] = (n - n0, amount - a0)
    return out


def _sum(d: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(c for c, _ in d.values()), sum(a for _, a in d.values())


def _count_bytes(c: tuple[int, int]) -> dict:
    return {"count": c[0], "bytes": c[1]}


def _by_count(d: dict[str, tuple[int, int]]) -> dict[str, int]:
    return {k: c for k, (c, _) in sorted(d.items(), key=lambda kv: (-kv[1][0], kv[0]))}


def _reasons(d: dict[str, tuple[int, int]]) -> dict[str, int]:
    first = [r for r in remedies.REASON_ORDER if r in d]
    rest = sorted((r for r in d if r not in remedies.REASON_ORDER), key=lambda r: (-d[r][0], r))
    return {r: d[r][0] for r in first + rest}


def device_memory() -> dict:
    """Reserved device memory, summed over the arenas in use: now and the process-wide peak."""
    from ..runtime.arena import reserved_totals
    current, peak = reserved_totals()
    return {"current_bytes": current, "peak_bytes": peak}


def _proc_threads() -> int:
    # one entry per thread (a quarter of the cost of parsing /proc/self/status)
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def host_threads() -> dict:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    try:
        omp = int(os.environ.get("OMP_NUM_THREADS", "0"))
    except ValueError:
        omp = 0
    torch_threads = torch.get_num_threads()
    proc = _proc_threads()
    intended = max(omp, torch_threads, proc)
    return {"cores": cores, "torch_threads": torch_threads, "omp_threads": omp,
            "proc_threads": proc, "intended_threads": intended,
            "oversubscribed": cores > 0 and intended > cores}


def _unaccelerated(ops) -> list[str]:
    """Fallback ops the host runs without a fast-path handler (optimization candidates)."""
    from ..dispatch.optable import BY_NAME
    out = []
    for op in ops:
        entry = BY_NAME.get(op.split("::", 1)[-1])
        if entry is None or not entry.fast_path:
            out.append(op)
    return out


def _collectives(moved: dict[str, tuple[int, int]]) -> dict:
    """torch.distributed collectives on rbln tensors, by where their bytes moved:
    ``{"device"|"host": {"count", "bytes", "by_op": {op: count}}}``."""
    out: dict[str, dict] = {}
    for key, (n, b) in sorted(moved.items(), key=lambda kv: (-kv[1][0], kv[0])):
        op, _, where = key.rpartition("@")
        w = out.setdefault(where, {"count": 0, "bytes": 0, "by_op": {}})
        w["count"] += n
        w["bytes"] += b
        w["by_op"][op] = w["by_op"].get(op, 0) + n
    return out


# the order graph nodes are listed in: what the user can act on first
_WHERE_ORDER = ("host", "in-program", "eager", "device")


def _graph(before: Snapshot, after: Snapshot) -> dict | None:
    """Where the nodes of compiled graphs ran during the region, and why (the compiler table's
    row or the eager reason), from the ``graph_node`` and ``graph_pad`` events; None outside
    graph mode."""
    moved = _delta(before, after, "graph_node")
    if not moved:
        return None
    nodes = []
    for key, (_, n) in moved.items():
        where, op, why = key.split("\t", 2)
        nodes.append({"where": where, "op": op, "why": why, "count": n})
    nodes.sort(key=lambda r: (_WHERE_ORDER.index(r["where"]), -r["count"], r["op"]))
    by_where = {w: sum(r["count"] for r in nodes if r["where"] == w) for w in _WHERE_ORDER}
    from ..dispatch import compiler_optable as table
    return {"nodes": nodes, "by_where": by_where,
            "padding": _count_bytes(_sum(_delta(before, after, "graph_pad"))),
            # what the compiler table leaves open, and what graph placement does then
            "rules": {"dtype": table.DTYPE_RULE, "last_dim": table.LAST_DIM,
                      "rows_retrieved_through": table.RETRIEVED_THROUGH}}


def _value(text: str):
    """A recorded before/after value as data: an int or float when it is one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _recompile_causes(moved: dict[str, tuple[int, int]], order: dict[str, int],
                      trace: dict[str, str]) -> list[dict]:
    """One row per (op, argument, part, before, after) that made an op compile again, the ops in
    ``order`` (the per-op recompile counts), then by count; ``at`` with a call site."""
    from ..dispatch.recompile_causes import parse
    rows = []
    for key, (n, _) in moved.items():
        op, argument, part, before, after = parse(key)
        row = {"op": op, "argument": argument, "part": part, "before": _value(before),
               "after": _value(after), "count": n}
        if key in trace:
            row["at"] = trace[key]
        rows.append(row)
    rank = {op: i for i, op in enumerate(order)}
    rows.sort(key=lambda r: (rank.get(r["op"], len(rank)), r["op"], r["argument"], r["part"]))
    return rows


def cause_groups(rows: list[dict]) -> list[dict]:
    """The recompile causes grouped per op and varying part: the values the part took, how many
    recompiles it caused and its first call site; arguments that varied alike share a group."""
    by_arg: dict[tuple, dict] = {}
    for r in rows:
        g = by_arg.setdefault((r["op"], r["argument"], r["part"]),
                              {"op": r["op"], "arguments": [r["argument"]], "part": r["part"],
                               "values": [], "count": 0, "at": None, "changes": []})
        for v in (r["before"], r["after"]):
            if v not in g["values"]:
                g["values"].append(v)
        g["count"] += r["count"]
        g["changes"].append((r["before"], r["after"]))
        g["at"] = g["at"] or r.get("at")
    merged: dict[tuple, dict] = {}
    for g in by_arg.values():
        same = (g["op"], g["part"], tuple(sorted(map(str, g["values"]))), g["count"])
        if same in merged:
            merged[same]["arguments"] += g["arguments"]
        else:
            merged[same] = g
    return sorted(merged.values(), key=lambda g: -g["count"])


def _buckets(rows: list[dict]) -> list[dict]:
    """For each dim that kept changing (a cause group of part ``dim N`` with sizes), the bucket
    sizes that cap its compiles at ``buckets.BUDGET`` with the least padding."""
    out = []
    for g in cause_groups(rows):
        if not g["part"].startswith("dim ") or not all(
                isinstance(v, int) and v >= 0 for v in g["values"]) or len(g["values"]) < 2:
            continue
        b = buckets.suggest(g["values"])
        if b.sizes == tuple(sorted(set(g["values"]))):
            continue        # the sizes seen are already the best buckets: nothing to change
        out.append({"op": g["op"], "arguments": g["arguments"], "part": g["part"],
                    **b.as_dict(), "line": b.line(g["part"])})
    return out


def build_dump(before: Snapshot, after: Snapshot, wall_ns: int, trace: dict[str, str],
               memory: dict | None = None) -> dict:
    """The region's dump from the counters at its start and end; ``memory``: the
    :func:`device_memory` level read when it closed (read now when None). The host's threads
    are read when the dump is built (a region's first read): a process's thread setup outlives
    its regions, and listing its threads costs more the more it has (Inductor's workers)."""
    if memory is None:
        memory = device_memory()
    bounce = _delta(before, after, "bounce")
    by_site = {s: _count_bytes(bounce.get(s, (0, 0))) for s in remedies.BOUNCE_SITES}
    counted = [bounce.get(s, (0, 0)) for s in remedies.BOUNCE_SITES]

    fallback = _delta(before, after, "cpu_fallback")
    recompile = _delta(before, after, "recompile")
    causes = _delta(before, after, "recompile_cause")
    dispatch = {
        "total": _sum(_delta(before, after, "dispatch"))[0],
        "cpu_fallback": _sum(fallback)[0],
        "cpu_fallback_ns": _sum(fallback)[1],
        "warm_hit": _sum(_delta(before, after, "warm_hit"))[0],
        "recompile_miss": _sum(recompile)[0],
    }

    slow = _delta(before, after, "v2v_slow")
    rejects = _delta(before, after, "v2v_reject")
    user = {k: _count_bytes(v) for k, v in rejects.items() if k in remedies.USER_REJECTS}
    residency = {
        "total_count": _sum(slow)[0],
        "by_reason": {c: _count_bytes(slow.get(c, (0, 0))) for c in remedies.V2V_CAUSES},
        "real_host_sync_d2h": _count_bytes(_sum(_delta(before, after, "d2h"))),
        "real_host_sync_h2d": _count_bytes(_sum(_delta(before, after, "h2d"))),
        "device_v2v": _count_bytes(_sum(_delta(before, after, "v2v"))),
        "reject": {"user_actionable": user},
        "debug": {"reject_raw_by_label": {k: _count_bytes(v) for k, v in rejects.items()}},
    }

    d = {
        "hidden_host_bounce": {"by_site": by_site,
                               "total_count": sum(c for c, _ in counted),
                               "total_bytes": sum(b for _, b in counted)},
        "dispatch": dispatch,
        "wall_ns": wall_ns,
        "cpu_fallback_by_op": _by_count(fallback),
        "recompile_by_op": _by_count(recompile),
        "device_programs_by_op": _by_count(_delta(before, after, "device_program")),
        "cpu_fallback_reasons": _reasons(_delta(before, after, "cpu_fallback_reason")),
        "trace_by_op": {k: v for k, v in trace.items() if k not in causes},
        "runtime_residency": residency,
        "device_memory": memory,
        "host_threads": host_threads(),
    }
    graph = _graph(before, after)
    if graph:
        d["graph"] = graph
    if causes:
        d["recompile_causes"] = _recompile_causes(causes, d["recompile_by_op"], trace)
        suggested = _buckets(d["recompile_causes"])
        if suggested:
            d["recompile_buckets"] = suggested
    collectives = _collectives(_delta(before, after, "collective"))
    if collectives:
        d["collectives"] = collectives
    unaccelerated = _unaccelerated(d["cpu_fallback_by_op"])
    if unaccelerated:
        d["cpu_fallback_unaccelerated"] = unaccelerated
    runtime = _delta(before, after, "runtime")
    if runtime:
        total_ns = _sum(runtime)[1]
        d["rebel_runtime"] = {
            "total_ns": total_ns,
            "wall_fraction": total_ns / wall_ns if wall_ns else 0.0,
            "by_primitive": {k: {"ns": a, "calls": c}
                             for k, (c, a) in sorted(runtime.items(), key=lambda kv: -kv[1][1])},
        }
    d["notes"] = remedies.notes(d)
    return d


def verdict(d: dict) -> dict:
    """Whether the region is clean, and the reasons that fired, in a fixed order."""
    hb = d["hidden_host_bounce"]
    rr = d["runtime_residency"]
    hidden = rr["total_count"]
    d2h = rr["real_host_sync_d2h"]
    reasons = []
    if hb["total_count"]:
        reasons.append(f"hidden host bounce (torch-side): {hb['total_count']}x, {fmt.nbytes(hb['total_bytes'])}")
    if hidden and d2h["count"]:
        reasons.append(f"runtime-side physical d2h: {d2h['count']}x, {fmt.nbytes(d2h['bytes'])}")
    for cause, c in rr["by_reason"].items():
        if c["count"]:
            reasons.append(f"runtime hidden d2h [{cause}]: {c['count']}x - {remedies.CAUSE_FIX[cause]}")
    disp = d["dispatch"]
    if disp["recompile_miss"]:
        reasons.append(f"recompile/cold-compile: {disp['recompile_miss']}x")
    if disp["cpu_fallback"]:
        reasons.append(f"cpu_fallback: {disp['cpu_fallback']}x (ran on CPU)")
    clean = not reasons
    return {
        "clean": clean,
        "reasons": reasons or ["no hidden host bounce, no CPU fallback, no recompile"],
        "hidden_host_bounces": hb["total_count"],
        "hidden_host_bounce_bytes": hb["total_bytes"],
        "runtime_hidden_d2h": hidden,
        "runtime_hidden_by_reason": {k: dict(v) for k, v in rr["by_reason"].items()},
        "cpu_fallbacks": disp["cpu_fallback"],
        "recompiles": disp["recompile_miss"],
        "notes": [dict(n) for n in d["notes"]],
    }


def kinds_fired(d: dict) -> int:
    """How many kinds of hidden overhead fired (the ``[overhead: N]`` marker)."""
    return sum((bool(d["hidden_host_bounce"]["total_count"]),
                bool(d["runtime_residency"]["total_count"]),
                bool(d["dispatch"]["cpu_fallback"]),
                bool(d["dispatch"]["recompile_miss"])))
