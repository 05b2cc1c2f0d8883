"""The one rule set: eager's inlined checks and a real device-op call give the reason the rule
set gives, on random operands; the check table of docs/eager.md is that rule set."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from torch_rbln import config, events
from torch_rbln.dispatch import checks, rules
from torch_rbln.dispatch.optable import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32]
LAST = [64, 128, 48, 1]

# one operand: (kind, dtype, leading dims, last dim, storage offset, NaN); the first operand of
# a call is always an rbln tensor (else the op never reaches the rbln kernel)
def operand(kinds=("rbln", "rbln0", "cpu0", "float")):
    return st.tuples(st.sampled_from(kinds), st.sampled_from(DTYPES), st.integers(0, 2),
                     st.sampled_from(LAST), st.booleans(), st.booleans())


pair = st.tuples(operand(("rbln", "rbln0")), operand())


def _make(spec, shape_from=None):
    kind, dtype, lead, last, offset, nan = spec
    if kind == "float":
        return float("nan") if nan else 2.0
    shape = () if kind in ("rbln0", "cpu0") else (shape_from or (2,) * lead + (last,))
    n = max(1, torch.Size(shape).numel())
    base = torch.arange(n + (1 if offset else 0), dtype=torch.float32) % 7 + 1
    if nan and dtype.is_floating_point:
        base[-1] = float("nan")
    if kind == "cpu0":
        return base[-1].to(dtype)
    x = base.to(dtype).to("rbln")
    if offset and shape:
        x = x[1:]                                   # contiguous, storage offset 1
    return x[:n].view(shape) if shape else x[-1]


def _args(entry_name, specs):
    if entry_name == "where.self":
        cond = (torch.arange(64) % 2 == 0).to("rbln")
        a = _make(specs[0], (64,))
        b = _make(specs[1], (64,))
        if isinstance(b, float):
            b = torch.tensor(b)                       # torch.where wraps a Python scalar
        return (cond, a, b), {}
    a = _make(specs[0])
    b = _make(specs[1], tuple(a.shape) or None)
    if isinstance(b, torch.Tensor) and b.dim() and a.dim() == 0:
        b = b.reshape(-1)[:1].reshape(())             # keep the pair broadcastable
    kwargs = {"rounding_mode": "floor"} if entry_name == "div.out_mode" else {}
    return (a, b), kwargs


OPS = {
    "add.out": torch.ops.aten.add.Tensor,
    "mul.out": torch.ops.aten.mul.Tensor,
    "div.out_mode": torch.ops.aten.div.Tensor_mode,
    "where.self": torch.ops.aten.where.self,
}


def _operands(name, args, kwargs):
    entry = BY_NAME[name]
    return rules.classify(entry, rules.tensor_slots(entry, OPS[name]), args, kwargs)


def _recorded_reason(fn) -> str | None:
    seen = []

    def listener(kind, key, amount):
        if kind == "cpu_fallback_reason":
            seen.append(key)
    events.listen(listener)
    try:
        fn()
    finally:
        events.unlisten(listener)
    assert len(seen) <= 1, seen
    return seen[0] if seen else None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(OPS)), pair, st.booleans())
def test_eager_checks_agree_with_the_rule_set(name, specs, deploy):
    args, kwargs = _args(name, specs)
    if deploy:
        os.environ["TORCH_RBLN_DEPLOY"] = "ON"
    try:
        o = _operands(name, args, kwargs)
        want = rules.first_failure(o)
        # the inlined form on the same operands
        assert checks.check(o.entry, o.tensors, o.dtype_tensors, o.scalars, args, kwargs) == want
        # and the kernel itself (the scan marks a finite storage: asking again changes nothing)
        assert _recorded_reason(lambda: OPS[name](*args, **kwargs)) == want
    finally:
        os.environ.pop("TORCH_RBLN_DEPLOY", None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair, st.sets(st.sampled_from(config.CHECK_NAMES)))
def test_skipped_checks_are_the_rule_set_without_them(specs, off):
    args, kwargs = _args("add.out", specs)
    o = _operands("add.out", args, kwargs)
    want = rules.first_failure(o, skip=frozenset(off))
    os.environ["TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK"] = ",".join(sorted(off))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # the once-per-process development warning
            got = checks.check(o.entry, o.tensors, o.dtype_tensors, o.scalars, args, kwargs)
    finally:
        os.environ.pop("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK")
    assert got == want


def test_skip_names_are_the_configs():
    assert {r.skip for r in rules.RULES if r.skip} == set(config.CHECK_NAMES)


def test_docs_check_table_is_the_rule_set():
    page = (ROOT / "docs" / "eager.md").read_text()
    section = page.split("## Pre-dispatch checks", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    table = []
    for line in rows:
        _, _, what, reason, skip, _ = (c.strip() for c in line.split("|"))
        m = re.search(r"=(\w+)`", skip)         # `...=nan_inf`, `TORCH_RBLN_DISPATCH_STRICT=<dtype>`
        table.append((reason.strip("`"), m.group(1) if m else ""))
    assert table == [(r.reason, r.skip) for r in rules.RULES]
