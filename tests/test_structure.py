"""The package's shape: no import circle between its modules, and docs/layout.md
names every module there is (and none that is gone)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "torch_rbln"
NATIVE = {"torch_rbln._C"}     # the compiled core: a leaf, it imports no package module


def _modules() -> dict[str, tuple[Path, bool]]:
    """dotted name -> (file, is a package ``__init__``)"""
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def _imports(name: str, path: Path, is_pkg: bool, modules) -> set[str]:
    """Every package module ``name`` imports, at module level or inside a function."""
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in modules or sub in NATIVE else target)
    return {m for m in out if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_package_modules():
    modules = _modules()
    graph = {m: _imports(m, p, is_pkg, modules) for m, (p, is_pkg) in modules.items()}
    assert "torch_rbln.dispatch.rules" in graph["torch_rbln.graph.placement"]   # sees lazy imports
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _layout_block() -> str:
    return (ROOT / "docs" / "layout.md").read_text().split("```", 2)[1]


def test_docs_layout_names_every_module():
    block = _layout_block()
    named = set(re.findall(r"[\w]+\.py\b", block))
    files = {p.name for p in PKG.rglob("*.py")}
    folders = {p.parent.relative_to(PKG).as_posix() + "/" for p in PKG.rglob("*.py")} - {"./"}
    assert files - named == set(), "modules missing from docs/layout.md"
    assert named - files == set(), "docs/layout.md names modules that do not exist"
    for folder in folders:
        assert f" {folder} " in block or f" {folder}\n" in block, folder
