"""Number and table formatting shared by the region report and the diff report."""

from __future__ import annotations

import os


def count(n: int) -> str:
    return f"{n:,}"


def nbytes(n: int) -> str:
    """``512 B`` below 1 KiB, else ``4.00 KB`` / ``MB`` / ``GB`` (1024-based, GB at most)."""
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KB", "MB", "GB"):
        x /= 1024.0
        if x < 1024.0 or unit == "GB":
            return f"{x:.2f} {unit}"
    raise AssertionError("unreachable")


def duration(ns: int) -> str:
    """Headline times: ``989.001us``, ``5.500ms``, ``2.000s``."""
    if ns < 1_000_000:
        return f"{ns / 1e3:.3f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.3f}ms"
    return f"{ns / 1e9:.3f}s"


def short_duration(ns: int) -> str:
    """Per-primitive times: ``1.2ms`` or ``900us``."""
    return f"{ns / 1e6:.1f}ms" if ns >= 1_000_000 else f"{ns / 1e3:.0f}us"


def short_path(path: str) -> str:
    """A call-site path as the report shows it (dump() keeps the raw path): relative to the
    working directory when it lies below it, else cut to ``.../<parent>/<file>`` once it has
    three or more components (a leading ``/`` is kept)."""
    if path.startswith("/"):
        cwd = os.getcwd() + os.sep
        if path.startswith(cwd):
            path = path[len(cwd):]
    lead = "/" if path.startswith("/") else ""
    parts = [p for p in path.split("/") if p]
    if len(parts) < 3:
        return path
    return f"{lead}.../{parts[-2]}/{parts[-1]}"


def short_stack(stack: str) -> str:
    """Apply :func:`short_path` to each ``file:line(func)`` frame of a ``<-`` chain."""
    return " <- ".join(short_path(frame) for frame in stack.split(" <- "))


def table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """A bordered table: two-space gutters, dash rules as wide as each column, the columns in
    ``right`` right-aligned, trailing spaces stripped."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return [rule, line(header), rule, *(line(r) for r in rows), rule]
