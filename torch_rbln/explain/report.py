"""Render a region's dump as the explain report (header, context, table, details, footer)."""

from __future__ import annotations

from . import fmt, measure, remedies

MAX_OPS = 8
CHECKED = "  checked: host_bounce, v2v_slow, cpu_fallback, recompile -- none fired"
CLEAN_NOTE = '  note: clean = no hidden host overhead, not "fast"'
FOOTER = "  (detail: p.help(signal) | raw: p.dump())"
WHERE_HINT = "  where? -> rerun with explain(with_stack=True)"


def render(d: dict) -> str:
    n = measure.kinds_fired(d)
    marker = "[clean]" if n == 0 else f"[overhead: {n} signal{'s' if n != 1 else ''}]"
    mem = d.get("device_memory")
    mem_part = f" | device mem {fmt.nbytes(mem['peak_bytes'])} peak, reserved" if mem else ""
    label = f"{d['label']} | " if d.get("label") else ""
    lines = [f"{marker}  RBLN EXPLAIN   ({label}region wall {fmt.duration(d['wall_ns'])}{mem_part})"]
    ctx = _context(d)
    if ctx:
        lines += ["", *ctx]
    if n == 0:
        lines += [CHECKED, CLEAN_NOTE]
        return "\n".join(lines)

    rows, byte_rows = _rows(d)
    lines += ["", *fmt.table(["Signal", "Count", "Bytes", "Note"], rows, right={1, 2}), ""]
    lines += _details(d)
    rr = d["runtime_residency"]
    if byte_rows:
        d2h = rr["real_host_sync_d2h"]
        if d2h["count"]:
            tail = " (see runtime/v2v_slow)" if rr["total_count"] else ""
            lines.append(f"  >> physical d2h (real transfer): {fmt.count(d2h['count'])} copies, "
                         f"{fmt.nbytes(d2h['bytes'])} -- real device crossing{tail}")
        else:
            lines.append("  >> physical d2h (real transfer): 0 -- everything above served on host, "
                         "no crossing")
        lines.append("")
    if (d["cpu_fallback_by_op"] or d["recompile_by_op"]) and not d["trace_by_op"]:
        lines.append(WHERE_HINT)
    lines.append(FOOTER)
    return "\n".join(lines)


def _context(d: dict) -> list[str]:
    out = []
    ht = d["host_threads"]
    if ht["oversubscribed"]:
        out += [f"  ! host oversubscription: {ht['intended_threads']} threads / {ht['cores']} cores "
                "-> host latency may be inflated",
                "    (tune affinity / OMP_NUM_THREADS)"]
    rt = d.get("rebel_runtime")
    if rt and rt["total_ns"] > 0:
        out.append(f"  rebel runtime: {fmt.duration(rt['total_ns'])} in the NPU runtime "
                   f"({100 * rt['wall_fraction']:.1f}% of region wall)")
        prims = list(rt["by_primitive"].items())
        parts = [f"{k} {fmt.short_duration(v['ns'])}/{v['calls']}" for k, v in prims[:4]]
        if len(prims) > 4:
            parts.append(f"+{len(prims) - 4} more")
        out.append("    " + "  ".join(parts))
    rr = d["runtime_residency"]
    h2d, d2h = rr["real_host_sync_h2d"], rr["real_host_sync_d2h"]
    if h2d["count"]:
        out.append(f"  host->device push (runtime): {fmt.count(h2d['count'])} pushes, {fmt.nbytes(h2d['bytes'])}")
    if d2h["count"]:
        out.append(f"  device->host pull (runtime): {fmt.count(d2h['count'])} copies, {fmt.nbytes(d2h['bytes'])}")
    out += _graph(d.get("graph"))
    for where, c in d.get("collectives", {}).items():
        ops = ", ".join(f"{op} {fmt.count(n)}" for op, n in c["by_op"].items())
        side = "on device" if where == "device" else "via host (gloo)"
        out.append(f"  collectives {side}: {fmt.count(c['count'])}, {fmt.nbytes(c['bytes'])} ({ops})")
    return out


_WHERE_LABEL = {"device": "device", "in-program": "in program", "host": "host",
                "eager": "eager call"}


def _n(n: int, what: str) -> str:
    return f"{fmt.count(n)} {what}{'' if n == 1 else 's'}"


def _graph(g: dict | None) -> list[str]:
    """Graph mode: where the nodes of the compiled graphs ran, and why (the compiler table's row,
    or the reason a node is on the host)."""
    if not g:
        return []
    w = g["by_where"]
    head = (f"  graph mode: {_n(w['device'], 'device node')}, {fmt.count(w['in-program'])} "
            f"in program (host side), {_n(w['host'], 'host node')}")
    if w["eager"]:
        head += f", {_n(w['eager'], 'eager call')}"
    out = [head]
    rows = g["nodes"]
    shown = rows[:MAX_OPS]
    where_w = max(len(_WHERE_LABEL[r["where"]]) for r in shown)
    op_w = max(len(r["op"]) for r in shown)
    count_w = max(len(fmt.count(r["count"])) for r in shown)
    for r in shown:
        out.append(f"    {_WHERE_LABEL[r['where']].ljust(where_w)}  {r['op'].ljust(op_w)}  "
                   f"{fmt.count(r['count']).rjust(count_w)}  {r['why']}".rstrip())
    if len(rows) > MAX_OPS:
        out.append(f"    +{len(rows) - MAX_OPS} more (p.dump()['graph'])")
    pad = g["padding"]
    if pad["count"]:
        out.append(f"    last dim padded to 64 at partition boundaries: {fmt.count(pad['count'])}x, "
                   f"{fmt.nbytes(pad['bytes'])} (layout work on the device, no host op)")
    return out


def _rows(d: dict) -> tuple[list[list[str]], int]:
    """The table rows, and how many of them carry bytes (bounces and v2v_slow)."""
    sites = [(s, c) for s, c in d["hidden_host_bounce"]["by_site"].items() if c["count"]]
    rr = d["runtime_residency"]
    slow = rr["total_count"]
    byte_rows = len(sites) + (1 if slow else 0)
    w = rr["real_host_sync_d2h"]["count"]
    if w == 0:
        cost = "no DMA (low cost)"
    elif byte_rows == 1:
        cost = "real d2h DMA (costly)"
    else:
        cost = "see physical d2h below"
    rows = [[remedies.BOUNCE_LABEL[s], fmt.count(c["count"]), fmt.nbytes(c["bytes"]),
             f"{cost} | try: {remedies.SHORT_FIX[s]}"] for s, c in sites]
    if slow:
        slow_bytes = sum(c["bytes"] for c in rr["by_reason"].values())
        rows.append(["runtime/v2v_slow", fmt.count(slow), fmt.nbytes(slow_bytes), cost])
    disp = d["dispatch"]
    if disp["cpu_fallback"]:
        rows.append(["dispatch/cpu_fallback", fmt.count(disp["cpu_fallback"]), "--",
                     f"try: {remedies.fallback_fix(d)[0]}"])
    if disp["recompile_miss"]:
        rows.append(["dispatch/recompile", fmt.count(disp["recompile_miss"]), "--",
                     f"try: {remedies.recompile_fix(d)[0]}"])
    return rows, byte_rows


def _details(d: dict) -> list[str]:
    out = []
    trace = d["trace_by_op"]
    for site, c in d["hidden_host_bounce"]["by_site"].items():
        if c["count"] and site in trace:
            out += [f"  {remedies.BOUNCE_LABEL[site]}:", f"    at {fmt.short_stack(trace[site])}", ""]
    rr = d["runtime_residency"]
    if rr["total_count"]:
        out.append("  runtime/v2v_slow:")
        state = [f"{k} {fmt.count(c['count'])}" for k, c in rr["by_reason"].items() if c["count"]]
        out.append("    state:  " + "  ".join(state))
        rej = rr["reject"]
        parts = [f"{k} {fmt.count(c['count'])} -> {remedies.REJECT_FIX[k]}"
                 for k, c in rej["user_actionable"].items()]
        if parts:
            out.append("    reject: " + " | ".join(parts))
        out.append("")
    disp = d["dispatch"]
    if d["cpu_fallback_by_op"]:
        ns = disp["cpu_fallback_ns"]
        out.append("  dispatch/cpu_fallback:" + (f"  (sum {fmt.duration(ns)} wall)" if ns > 0 else ""))
        out += _op_lines(d["cpu_fallback_by_op"], trace)
        why = d["cpu_fallback_reasons"]
        if why:
            out.append("    why: " + ", ".join(f"{r} {fmt.count(n)}" for r, n in why.items()))
        cands = [op.split("::", 1)[-1] for op in d.get("cpu_fallback_unaccelerated", [])]
        if cands:
            more = f", +{len(cands) - MAX_OPS} more" if len(cands) > MAX_OPS else ""
            out.append("    candidates (no fast-path handler): " + ", ".join(cands[:MAX_OPS]) + more)
        out.append("")
    if d["recompile_by_op"]:
        out.append("  dispatch/recompile:")
        out += _op_lines(d["recompile_by_op"], trace)
        out += _cause_lines(d.get("recompile_causes", []), d.get("recompile_buckets", []))
        out.append("")
    return out


def _took(g: dict) -> str:
    vals = g["values"]
    if len(g["changes"]) == 1:
        before, after = g["changes"][0]
        return f"{before} -> {after}"
    if all(isinstance(v, (int, float)) for v in vals):
        return f"took {len(vals)} values in {min(vals)}..{max(vals)}"
    shown = ", ".join(map(str, vals[:4])) + (f", +{len(vals) - 4} more" if len(vals) > 4 else "")
    return f"took {len(vals)} values: {shown}"


def _cause_lines(rows: list[dict], bucket_rows: list[dict]) -> list[str]:
    if not rows:
        return []
    groups = measure.cause_groups(rows)
    buckets = {(b["op"], tuple(b["arguments"]), b["part"]): b for b in bucket_rows}
    out = ["    why (what differs from the op's closest earlier program):"]
    for g in groups[:MAX_OPS]:
        args = ", ".join(g["arguments"])
        times = f"{fmt.count(g['count'])} recompile{'s' if g['count'] != 1 else ''}"
        line = f"      {g['op']}  {args} {g['part']}: {_took(g)} ({times})"
        if g["at"]:
            line += f"  at {fmt.short_stack(g['at'])}"
        out.append(line)
        out.append(f"        fix: {remedies.recompile_cause_fix(g['part'])}")
        b = buckets.get((g["op"], tuple(g["arguments"]), g["part"]))
        if b is not None:
            out.append(f"        suggest: {b['line']}")
    if len(groups) > MAX_OPS:
        out.append(f"      +{len(groups) - MAX_OPS} more")
    return out


def _op_lines(by_op: dict[str, int], trace: dict[str, str]) -> list[str]:
    items = list(by_op.items())
    shown = items[:MAX_OPS]
    name_w = max(len(op) for op, _ in shown)
    count_w = max(len(fmt.count(n)) for _, n in shown)
    lines = []
    for op, n in shown:
        line = f"    {op.ljust(name_w)}  {fmt.count(n).rjust(count_w)}"
        if op in trace:
            line += f"  at {fmt.short_stack(trace[op])}"
        lines.append(line.rstrip())
    if len(items) > MAX_OPS:
        lines.append(f"    +{len(items) - MAX_OPS} more")
    return lines
