"""The compare report: the first divergence, the worst ops and modules, in explain's style.

:func:`build` makes the dump (the live region's and the offline comparison's share it);
:func:`render` the text. Dump schema::

    reference     what the results were compared with ("golden float32 on the host", a record)
    op_error      what an op's error measures (its own, or accumulated)
    tolerances    {dtype: {"atol", "rtol"}} of the result dtypes met
    ops           [{seq, op, phase, route, module, module_call, index, node, at, dtype, shape,
                    numel, max_abs, max_rel, cosine, outside, worst, nonfinite_actual,
                    nonfinite_reference, ref_max, diverged, hint}]   (checked ops, in order)
    modules       [{seq, path, class, call, at, dtype, shape, ..., first_op, diverged, hint}]
                  (module calls in the order they returned)
    skipped       {"ops": {why: n}, "modules": {why: n}}
    counts        {ops, ops_diverged, modules, modules_diverged}
    first_divergence  {"op": entry or None, "module": entry or None}, or None
    wall_ns       the region's wall time (0 offline)
"""

from __future__ import annotations

import math

from ..explain import fmt

MAX_ROWS = 8
OWN_ERROR = "own error: the op on the host from the same inputs, widened"
MODULE_ERROR = "accumulated error: a golden copy of the module from the same inputs, widened"
FOOTER = "  (raw: c.dump() | first: c.first_divergence())"


def _rank(e: dict) -> tuple:
    return (-e["worst"], -e["max_abs"], e["seq"])


def build(*, reference: str, tolerances: dict, ops: list, modules: list, skipped: dict,
          wall_ns: int, op_error: str = OWN_ERROR, module_error: str = MODULE_ERROR) -> dict:
    bad_ops = [e for e in ops if e["diverged"]]
    bad_mods = [e for e in modules if e["diverged"]]
    first = None
    if bad_ops or bad_mods:
        first = {"op": min(bad_ops, key=lambda e: e["seq"]) if bad_ops else None,
                 "module": bad_mods[0] if bad_mods else None}
    return {"reference": reference, "op_error": op_error, "module_error": module_error,
            "tolerances": tolerances, "ops": ops, "modules": modules, "skipped": skipped,
            "counts": {"ops": len(ops), "ops_diverged": len(bad_ops), "modules": len(modules),
                       "modules_diverged": len(bad_mods)},
            "first_divergence": first, "wall_ns": wall_ns}


# -- formatting ------------------------------------------------------------------------------

def _g(x: float) -> str:
    if math.isinf(x):
        return "inf"
    if math.isnan(x):
        return "nan"
    return f"{x:.3g}"


def _ratio(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2f}"


def _outside(e: dict) -> str:
    if e.get("sampled"):
        return f"{fmt.count(e['outside'])}/{fmt.count(e['sampled'])} sampled"
    return f"{fmt.count(e['outside'])}/{fmt.count(e['numel'])}"


def module_label(path: str | None, call: int | None) -> str:
    if path is None:
        return "-"
    return path if not call else f"{path}#{call}"


def _op_name(e: dict) -> str:
    return e["op"] + (" (bw)" if e["phase"] == "backward" else "")


def _summary(e: dict) -> str:
    parts = [f"{_outside(e)} elements out of tolerance".replace(" sampled elements", " sampled"),
             f"max abs {_g(e['max_abs'])}",
             f"max rel {_g(e['max_rel'])}", f"cosine {e['cosine']:.6f}"]
    if e["nonfinite_actual"]:
        parts.append(f"NaN/Inf only here: {fmt.count(e['nonfinite_actual'])}")
    if e["nonfinite_reference"]:
        parts.append(f"NaN/Inf only in the reference: {fmt.count(e['nonfinite_reference'])}")
    return ", ".join(parts)


def _site(e: dict) -> list[str]:
    return [f"            at {fmt.short_stack(e['at'])}"] if e.get("at") else []


def _first(d: dict) -> list[str]:
    f = d["first_divergence"]
    out = ["  first divergence (in execution order):"]
    m = f["module"]
    if m is not None:
        out.append(f"    module  {module_label(m['path'], m['call'])} ({m['class']}) "
                   f"{m['dtype']}: {_summary(m)}")
        out += _site(m)
        if m.get("first_op") is not None:
            op = next((e for e in d["ops"] if e["seq"] == m["first_op"]), None)
            if op is not None:
                out.append(f"            first op out of tolerance inside: #{op['seq']} "
                           f"{_op_name(op)}")
        if m.get("hint"):
            out.append(f"            hint: {m['hint']}")
    else:
        out.append("    module  none")
    o = f["op"]
    if o is not None:
        where = f" in {module_label(o['module'], o['module_call'])}" if o["module"] else ""
        node = f", backward of {o['node']}" if o.get("node") else ""
        out.append(f"    op      #{o['seq']} {o['op']} ({o['route']}{node}){where} {o['dtype']}: "
                   f"{_summary(o)}")
        out += _site(o)
        if o.get("hint"):
            out.append(f"            hint: {o['hint']}")
    else:
        out.append("    op      none")
    return out


def _op_rows(ops: list) -> list[list[str]]:
    rows = []
    for e in sorted(ops, key=_rank)[:MAX_ROWS]:
        rows.append([f"#{e['seq']}", _op_name(e), e["route"],
                     module_label(e["module"], e["module_call"]), e["dtype"], _g(e["max_abs"]),
                     _g(e["max_rel"]), f"{e['cosine']:.6f}", _outside(e), _ratio(e["worst"])])
    return rows


def _module_rows(mods: list) -> list[list[str]]:
    rows = []
    for e in sorted(mods, key=_rank)[:MAX_ROWS]:
        rows.append([module_label(e["path"], e["call"]), e["class"], e["dtype"],
                     _g(e["max_abs"]), _g(e["max_rel"]), f"{e['cosine']:.6f}", _outside(e),
                     _ratio(e["worst"])])
    return rows


def render(d: dict, footer: str = FOOTER) -> str:
    c = d["counts"]
    if d["first_divergence"] is None:
        marker = "[within tolerance]"
    else:
        marker = (f"[diverged: {fmt.count(c['ops_diverged'])} op"
                  f"{'' if c['ops_diverged'] == 1 else 's'}, {fmt.count(c['modules_diverged'])} "
                  f"module call{'' if c['modules_diverged'] == 1 else 's'}]")
    wall = f" | region wall {fmt.duration(d['wall_ns'])}" if d["wall_ns"] else ""
    lines = [f"{marker}  RBLN COMPARE   ({d['reference']}{wall})",
             f"  checked: {fmt.count(c['ops'])} ops, {fmt.count(c['modules'])} module calls"]
    tol = ", ".join(f"{k} atol {v['atol']:g} rtol {v['rtol']:g}"
                    for k, v in d["tolerances"].items())
    if tol:
        lines.append(f"  tolerance: {tol}")
    lines.append("")
    if d["first_divergence"] is not None:
        lines += [*_first(d), ""]
    else:
        lines += ["  first divergence: none (every checked result within tolerance)", ""]
    if d["ops"]:
        lines.append(f"  worst ops ({d['op_error']}):")
        lines += ["  " + r for r in fmt.table(
            ["#", "op", "route", "module", "dtype", "max abs", "max rel", "cosine", "outside",
             "x tol"], _op_rows(d["ops"]), right={0, 5, 6, 7, 8, 9})]
        lines.append("")
    if d["modules"]:
        lines.append(f"  worst modules ({d['module_error']}):")
        lines += ["  " + r for r in fmt.table(
            ["module", "class", "dtype", "max abs", "max rel", "cosine", "outside", "x tol"],
            _module_rows(d["modules"]), right={3, 4, 5, 6, 7})]
        lines.append("")
    skipped = [f"{what} {why} {fmt.count(n)}" for what in ("ops", "modules")
               for why, n in d["skipped"].get(what, {}).items()]
    if skipped:
        lines.append("  not compared: " + ", ".join(skipped))
    lines.append("  x tol: the worst element's error over its tolerance (atol + rtol*|ref|); "
                 "above 1 is out")
    lines.append(footer)
    return "\n".join(lines)
