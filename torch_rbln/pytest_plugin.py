"""The pytest plugin (the ``pytest11`` entry point): hidden NPU overhead per test.

* ``--rbln-explain``: a terminal section with one line per test that had hidden overhead
  (CPU fallbacks, compiles, device->host transfers, host bounces).
* ``@pytest.mark.rbln(max_fallbacks=0, max_recompiles=N, max_bounces=N, max_d2h=N,
  allow_d2h=False)``: a test over its budget fails with the explain lines that broke it.
* ``--rbln-strict``: ``max_fallbacks=0`` for every test that uses rbln (a marker's own budget wins).

Each measured test runs its body (the call phase; fixtures are not counted, so a fixture is the
place to warm programs up) inside a non-exclusive explain region, so the test's own
``torch.rbln.explain()`` regions still open. Without these options and markers the plugin does
nothing: it opens no region and imports nothing beyond pytest. docs/debugging.md ("pytest plugin").
"""

from __future__ import annotations

import pytest

# budget keyword -> (what it counts, the report section that shows it)
BUDGETS = {
    "max_fallbacks": ("cpu_fallback", "  dispatch/cpu_fallback:"),
    "max_recompiles": ("recompile", "  dispatch/recompile:"),
    "max_bounces": ("host_bounce", "host_bounce/"),
    "max_d2h": ("d2h", "  device->host pull (runtime):"),
}
MARKER = ("rbln(max_fallbacks=None, max_recompiles=None, max_bounces=None, max_d2h=None, "
          "allow_d2h=True): fail the test when its body exceeds this budget of hidden NPU "
          "overhead (CPU fallbacks, compiles, host bounces, device->host transfers)")

_LINES = pytest.StashKey[list]()


def pytest_addoption(parser):
    group = parser.getgroup("rbln", "torch-rbln hidden NPU overhead")
    group.addoption("--rbln-explain", action="store_true", default=False,
                    help="list every test that had hidden NPU overhead (fallbacks, compiles, "
                         "d2h, host bounces) in a terminal section")
    group.addoption("--rbln-strict", action="store_true", default=False,
                    help="fail every test that uses rbln and falls back to the CPU "
                         "(max_fallbacks=0 unless its rbln marker says otherwise)")


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)
    config.stash[_LINES] = []


def _budget(marker) -> dict[str, int]:
    if marker is None:
        return {}
    if marker.args:
        raise pytest.UsageError(f"@pytest.mark.rbln takes keywords only, got {marker.args!r}")
    out = {}
    for k, v in marker.kwargs.items():
        if k == "allow_d2h":
            if not v:
                out["max_d2h"] = 0
        elif k in BUDGETS:
            out[k] = int(v)
        else:
            raise pytest.UsageError(f"@pytest.mark.rbln: unknown budget {k!r} "
                                    f"(known: {', '.join([*BUDGETS, 'allow_d2h'])})")
    return out


def counts(d: dict) -> dict[str, tuple[int, int]]:
    """(count, bytes) of each kind of hidden overhead in a region's dump."""
    rr = d["runtime_residency"]
    hb = d["hidden_host_bounce"]
    slow = sum(c["bytes"] for c in rr["by_reason"].values())
    return {"cpu_fallback": (d["dispatch"]["cpu_fallback"], 0),
            "recompile": (d["dispatch"]["recompile_miss"], 0),
            "d2h": (rr["real_host_sync_d2h"]["count"], rr["real_host_sync_d2h"]["bytes"]),
            "host_bounce": (hb["total_count"] + rr["total_count"], hb["total_bytes"] + slow)}


def _touches_rbln(d: dict) -> bool:
    rr = d["runtime_residency"]
    return bool(d["dispatch"]["total"] or rr["real_host_sync_h2d"]["count"]
                or rr["real_host_sync_d2h"]["count"] or d["hidden_host_bounce"]["total_count"])


def summary(d: dict) -> str:
    """One line of a test's hidden overhead, e.g. ``cpu_fallback 2 (aten::mul.out 2), d2h 1
    (128 B)``; empty when it had none."""
    from .explain import fmt
    parts = []
    for kind, (n, nbytes) in counts(d).items():
        if not n:
            continue
        if kind == "cpu_fallback":
            detail = ", ".join(f"{op} {c}" for op, c in list(d["cpu_fallback_by_op"].items())[:3])
        elif kind == "recompile":
            detail = ", ".join(f"{op} {c}" for op, c in list(d["recompile_by_op"].items())[:3])
        else:
            detail = fmt.nbytes(nbytes)
        parts.append(f"{kind} {n} ({detail})")
    return ", ".join(parts)


def _section(report_lines: list[str], start: str) -> list[str]:
    """The report's lines of one signal: its block of details when ``start`` is a block's title
    (up to the blank line that ends it), else the lines that start with ``start``."""
    out = []
    for i, line in enumerate(report_lines):
        if line.startswith(start) or line.lstrip().startswith(start):
            if start.endswith(":"):
                block = report_lines[i:]
                end = next((j for j, x in enumerate(block) if not x.strip()), len(block))
                return block[:end]
            out.append(line)
    return out


def _trim_sites(d: dict) -> dict:
    """Call sites cut at pytest's own frames (they call every test; the test's line is news)."""
    def trim(stack: str) -> str:
        frames = stack.split(" <- ")
        keep = next((i for i, f in enumerate(frames) if "/_pytest/" in f or "/pluggy/" in f),
                    len(frames))
        return " <- ".join(frames[:max(keep, 1)])
    d["trace_by_op"] = {k: trim(v) for k, v in d["trace_by_op"].items()}
    for row in d.get("recompile_causes", []):
        if "at" in row:
            row["at"] = trim(row["at"])
    return d


def _over_budget(d: dict, report: str, budget: dict[str, int], where: str) -> str | None:
    have = counts(d)
    broken, lines = [], report.splitlines()
    shown = []
    for key, limit in budget.items():
        kind, start = BUDGETS[key]
        n = have[kind][0]
        if n > limit:
            broken.append(f"{kind} {n} > {key}={limit}")
            shown += _section(lines, start)
    if not broken:
        return None
    head = f"rbln budget exceeded ({where}): " + "; ".join(broken)
    return "\n".join([head, *shown])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    config = item.config
    marker = item.get_closest_marker("rbln")
    strict = config.getoption("rbln_strict")
    listing = config.getoption("rbln_explain")
    if marker is None and not strict and not listing:
        return (yield)
    from .explain.region import RBLNExplain
    budget = _budget(marker)
    # call sites cost a listener on the stream: only where a failure has to name the line
    region = RBLNExplain(with_stack=bool(budget) or strict, exclusive=False,
                         label=item.nodeid).start()
    try:
        result = yield
    finally:
        region.stop()
    d = _trim_sites(region.dump())
    if listing:
        line = summary(d)
        if line:
            config.stash[_LINES].append(f"{item.nodeid}: {line}")
    if strict and _touches_rbln(d):
        budget.setdefault("max_fallbacks", 0)
        where = "--rbln-strict" if marker is None else "--rbln-strict and @pytest.mark.rbln"
    else:
        where = "@pytest.mark.rbln"
    if budget:
        from .explain import report
        msg = _over_budget(d, report.render(d), budget, where)
        if msg:
            pytest.fail(msg, pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("rbln_explain"):
        return
    lines = config.stash[_LINES]
    terminalreporter.section("rbln explain: hidden NPU overhead per test")
    for line in lines:
        terminalreporter.write_line(line)
    if not lines:
        terminalreporter.write_line("no test had hidden NPU overhead")
