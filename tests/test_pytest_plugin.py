"""The pytest plugin, run on small test files with pytester in a fresh pytest process each."""

from __future__ import annotations

import pytest

from conftest import CHILD_RUNTIME_DIR

pytest_plugins = ["pytester"]

TESTS = '''
import pytest, torch

@pytest.mark.rbln(max_fallbacks=0)
def test_clean():
    x = torch.full((64,), 1.5, dtype=torch.float16, device="rbln")
    x + x                                  # warm: the region below compiles nothing new
    with torch.rbln.explain() as p:        # the test's own region nests in the plugin's
        y = x + x
    assert p.verdict()["clean"]
    torch.testing.assert_close(y.cpu(), torch.full((64,), 3.0, dtype=torch.float16))

@pytest.mark.rbln(max_fallbacks=0)
def test_falls_back():
    x = torch.arange(64, dtype=torch.float32).to("rbln")
    torch.testing.assert_close((x * 3).cpu(), torch.arange(64, dtype=torch.float32) * 3)

def test_unmarked_fallback():
    x = torch.arange(64, dtype=torch.float32).to("rbln")
    (x - 1).cpu()

def test_no_rbln():
    assert 1 + 1 == 2
'''


def _line(code: str) -> int:
    return next(i for i, line in enumerate(TESTS.lstrip("\n").splitlines(), 1) if code in line)


@pytest.fixture
def run(pytester, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", CHILD_RUNTIME_DIR)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyfile(test_budget=TESTS)

    def go(*args):
        return pytester.runpytest_subprocess("-p", "torch_rbln.pytest_plugin", "-p", "no:cacheprovider",
                                             *args, timeout=600)
    return go


def test_marker_fails_the_test_that_falls_back_and_rbln_explain_lists_it(run):
    r = run("--rbln-explain", "-k", "clean or falls_back or no_rbln")
    r.assert_outcomes(passed=2, failed=1)
    out = r.stdout.str()
    assert "FAILED test_budget.py::test_falls_back" in out
    assert "rbln budget exceeded (@pytest.mark.rbln): cpu_fallback 1 > max_fallbacks=0" in out
    assert "  dispatch/cpu_fallback:" in out
    assert f"    aten::mul.out  1  at test_budget.py:{_line('(x * 3)')}(test_falls_back)" in out
    assert "    why: dtype-not-fp16 1" in out
    section = out.split("rbln explain: hidden NPU overhead per test", 1)[1].splitlines()[1:]
    listed = [line for line in section if line.startswith("test_budget.py::")]
    # the clean test's body compiled its add and read the result back: listed, not failed
    names = [line.split(":")[2] for line in listed]
    assert names == ["test_clean", "test_falls_back"], listed
    assert listed[0].endswith("test_clean: recompile 1 (aten::add.out 1), d2h 1 (128 B)")
    assert "cpu_fallback 1 (aten::mul.out 1)" in listed[1]


def test_strict_fails_every_rbln_test_that_falls_back(run):
    r = run("--rbln-strict", "-k", "unmarked or no_rbln")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert "rbln budget exceeded (--rbln-strict): cpu_fallback 1 > max_fallbacks=0" in out
    assert f"aten::sub.out  1  at test_budget.py:{_line('(x - 1)')}(test_unmarked_fallback)" in out


def test_without_options_nothing_changes(run):
    r = run("-k", "unmarked or no_rbln")
    r.assert_outcomes(passed=2)
    assert "rbln explain" not in r.stdout.str()
