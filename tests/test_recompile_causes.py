"""Why an op compiled again: explain, dump() and the INFO log name the argument and the part of
its cache key that differs from the op's closest earlier program."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import run_code
from torch_rbln.dispatch import recompile_causes

H = torch.float16


@pytest.fixture(autouse=True)
def _fresh_programs():
    # the closest earlier program is searched in the process-wide cache: start from none
    torch.rbln.empty_cache()
    yield


def _causes(p, op="aten::mul.out"):
    return [(r["argument"], r["part"], r["before"], r["after"], r["count"])
            for r in p.dump().get("recompile_causes", []) if r["op"] == op]


def test_growing_sequence_names_dim_1_and_its_range():
    outs, refs = [], []
    with torch.rbln.explain(with_stack=True) as p:
        for n in range(16, 24):
            a = torch.full((1, n, 64), 0.5, dtype=H).to("rbln")
            outs.append((a * a).cpu())
            refs.append(a.cpu() * a.cpu())
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r)
    causes = _causes(p)
    # each step differs from the step before it, in dim 1 of both operands and nothing else
    assert {(arg, part) for arg, part, *_ in causes} == {("input 0", "dim 1"), ("input 1", "dim 1")}
    assert sorted((b, a) for arg, _, b, a, _ in causes if arg == "input 0") == \
        [(n, n + 1) for n in range(16, 23)]
    report = p.report()
    line = next(x for x in report.splitlines() if "dim 1: took" in x)
    assert "aten::mul.out  input 0, input 1 dim 1: took 8 values in 16..23 (7 recompiles)" in line
    assert "at test_recompile_causes.py:" in line or "tests/test_recompile_causes.py:" in line
    assert "fix: pad or bucket dim 1 to a few sizes" in report


def test_changing_cpu_scalar_is_named_as_a_baked_scalar():
    a = torch.full((4, 64), 2.0, dtype=H).to("rbln")
    with torch.rbln.explain() as p:
        outs = [(a * torch.tensor(s)).cpu() for s in (0.5, 0.25, 0.125)]
    for o, s in zip(outs, (0.5, 0.25, 0.125)):
        torch.testing.assert_close(o, a.cpu() * torch.tensor(s))
    assert _causes(p) == [("scalar operand 1", "baked value", 0.5, 0.25, 1),
                          ("scalar operand 1", "baked value", 0.25, 0.125, 1)]   # in order
    report = p.report()
    assert "scalar operand 1 baked value: took 3 values in 0.125..0.5 (2 recompiles)" in report
    assert "pass it as a device tensor" in report


def test_a_device_scalar_does_not_recompile():
    # the fix the report gives for a baked scalar: the value becomes an input of one program
    a = torch.full((4, 64), 2.0, dtype=H).to("rbln")
    a * torch.tensor(0.5, dtype=H, device="rbln")
    with torch.rbln.explain() as p:
        outs = [(a * torch.tensor(s, dtype=H, device="rbln")).cpu() for s in (0.25, 0.125)]
    torch.testing.assert_close(outs[1], a.cpu() * 0.125)
    assert p.dump()["dispatch"]["recompile_miss"] == 0


def test_dtype_and_contiguity_changes_are_named():
    base = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) / 64
    a = base.to(H).to("rbln")
    with torch.rbln.explain() as p:
        r1 = (a * a).cpu()
        b = base.to(torch.bfloat16).to("rbln")
        r2 = (b * b).cpu()
        r3 = (a.t() * a).cpu()
    torch.testing.assert_close(r1, base.to(H) * base.to(H))
    torch.testing.assert_close(r2, base.to(torch.bfloat16) * base.to(torch.bfloat16))
    torch.testing.assert_close(r3, base.to(H).t() * base.to(H))
    causes = _causes(p)
    assert ("input 0", "dtype", "torch.float16", "torch.bfloat16", 1) in causes
    assert ("input 1", "dtype", "torch.float16", "torch.bfloat16", 1) in causes
    assert ("input 0", "contiguity", "contiguous", "non-contiguous", 1) in causes
    report = p.report()
    assert "input 0, input 1 dtype: torch.float16 -> torch.bfloat16 (1 recompile)" in report
    assert "input 0 contiguity: contiguous -> non-contiguous (1 recompile)" in report
    assert "make the input contiguous" in report


def test_dump_holds_the_causes_as_data():
    with torch.rbln.explain(with_stack=True) as p:
        for n in (64, 128):
            x = torch.ones(2, n, dtype=H, device="rbln")
            torch.testing.assert_close((x + x).cpu(), torch.full((2, n), 2.0, dtype=H))
    rows = [r for r in p.dump()["recompile_causes"] if r["op"] == "aten::add.out"]
    assert len(rows) == 2       # both operands, one recompile
    for r in rows:
        assert set(r) == {"op", "argument", "part", "before", "after", "count", "at"}
        assert (r["part"], r["before"], r["after"], r["count"]) == ("dim 1", 64, 128, 1)
        assert "test_recompile_causes.py:" in r["at"]
    # cause keys stay out of the per-op call sites
    assert all("\t" not in k for k in p.dump()["trace_by_op"])


def test_a_cold_compile_has_no_cause():
    with torch.rbln.explain() as p:
        x = torch.ones(3, 64, dtype=H, device="rbln")
        (x - x).cpu()
    assert p.dump()["recompile_by_op"]["aten::sub.out"] == 1
    assert "recompile_causes" not in p.dump()


def test_closest_key_is_the_fewest_parts_then_the_most_recent():
    t = lambda shape, ordinal=0: (torch.Size(shape), H, True, ordinal)  # noqa: E731
    older = ("aten::mul.out", 0, (t((1, 16)), t((1, 16))), ())
    newer = ("aten::mul.out", 0, (t((1, 17)), t((1, 17))), ())
    other = ("aten::mul.out", 0, (t((8, 16)), t((8, 16))), ())
    key = ("aten::mul.out", 0, (t((1, 18)), t((1, 18))), ())
    assert recompile_causes.closest(key, [older, newer, other]) == [
        ("input 0", "dim 1", "17", "18"), ("input 1", "dim 1", "17", "18")]
    aliased = ("aten::mul.out", 0, (t((1, 18)), t((1, 18), 0)), ())
    distinct = ("aten::mul.out", 0, (t((1, 18)), t((1, 18), 1)), ())
    assert recompile_causes.diff(aliased, distinct) == [
        ("input 1", "alias", "same tensor as input 0", "distinct")]


def test_info_log_names_each_cause_on_its_own_line():
    r = run_code("import torch\n"
                 "for n in (64, 128, 192):\n"
                 "    x = torch.ones(1, n, dtype=torch.float16, device='rbln')\n"
                 "    (x * x).cpu()\n", env={"TORCH_RBLN_LOG_LEVEL": "INFO"})
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"^\[[\d\- :.]+\]\[I\] (`aten::mul.out` compiled again: .*)$", r.stderr, re.M)
    assert lines == ["`aten::mul.out` compiled again: input 0 dim 1: 64 -> 128",
                     "`aten::mul.out` compiled again: input 1 dim 1: 64 -> 128",
                     "`aten::mul.out` compiled again: input 0 dim 1: 128 -> 192",
                     "`aten::mul.out` compiled again: input 1 dim 1: 128 -> 192"]
