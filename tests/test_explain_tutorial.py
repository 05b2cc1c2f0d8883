"""The tutorial's explain steps (3 and 4), run as scripts in fresh processes the way a user
runs them; the printed reports must carry the tutorial's rows and lines."""

from __future__ import annotations

import ast
import re

from conftest import EXAMPLES, run_script

FOOTER = "  (detail: p.help(signal) | raw: p.dump())"
HEADER = re.compile(r"^\[(clean|overhead: \d+ signals?)\]  RBLN EXPLAIN   "
                    r"\(region wall [\d.]+(us|ms|s) \| device mem [\d.]+ (B|KB|MB|GB) peak, reserved\)$")


def _line_of(script: str, code: str) -> int:
    lines = (EXAMPLES / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip() == code)


def test_step3_add_fp32():
    r = run_script("add_fp32.py", cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "rbln:0 torch.float32 tensor([1., 2., 3., 4.])"
    assert out[1].startswith("[overhead: 1 signal]  RBLN EXPLAIN   (region wall ") and HEADER.match(out[1])
    assert "dispatch/cpu_fallback      1     --  try: graph mode, or a supported dtype" in out
    line = _line_of("add_fp32.py", "c = a + b")
    assert f"    aten::add.out  1  at add_fp32.py:{line}(<module>)" in out
    assert "    why: dtype-not-fp16 1" in out
    assert "    candidates (no fast-path handler): add.out" in out
    assert re.search(r"^  dispatch/cpu_fallback:  \(sum [\d.]+(us|ms|s) wall\)$", r.stdout, re.M)
    assert out[-1] == FOOTER


def test_step4_explain_demo():
    r = run_script("explain_demo.py", cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    reports = [m.start() for m in re.finditer(r"^\[(clean|overhead)", text, re.M)]
    assert len(reports) == 2
    clean, overhead = text[reports[0]:reports[1]], text[reports[1]:]
    assert HEADER.match(clean.splitlines()[0]) and clean.startswith("[clean]")
    assert "  checked: host_bounce, v2v_slow, cpu_fallback, recompile -- none fired" in clean
    assert '  note: clean = no hidden host overhead, not "fast"' in clean

    lines = overhead.splitlines()
    assert lines[0].startswith("[overhead: 2 signals]  RBLN EXPLAIN   (region wall ")
    assert ("host_bounce/d2d_copy       1  512 B  no DMA (low cost) | try: make contiguous, or v2v engine"
            in lines)
    assert "dispatch/cpu_fallback      1     --  try: graph mode, or a supported dtype" in lines
    n = _line_of("explain_demo.py", "w = x.float() * 2.0")
    assert f"    at explain_demo.py:{n}(<module>)" in lines
    assert f"    aten::mul.out  1  at explain_demo.py:{n}(<module>)" in lines
    assert "    why: dtype-not-fp16 1" in lines
    assert not any("candidates" in line for line in lines)   # mul.out has a host fast path
    assert ("  >> physical d2h (real transfer): 0 -- everything above served on host, no crossing"
            in lines)

    verdict_line = next(line for line in lines if line.startswith("{'clean'"))
    verdict = ast.literal_eval(verdict_line)
    assert verdict["clean"] is False
    assert verdict["reasons"] == ["hidden host bounce (torch-side): 1x, 512 B",
                                  "cpu_fallback: 1x (ran on CPU)"]
    i = lines.index(verdict_line)
    assert lines[i + 1] == "['recompile/cold-compile: 3x']"
    assert lines[i + 2] == "True"

    diff = lines[i + 3:]
    assert diff[0] == "RBLN EXPLAIN DIFF   (A -> B; you placed both points)"
    rows = {row.split()[0]: row.split()[1:] for row in diff if row.startswith(("host_bounce", "runtime/", "cpu_", "recompile"))}
    assert rows["recompile"] == ["3", "0", "--", "--", "gone", "in", "B"]
    push = rows["runtime/h2d_push"]
    assert int(push[0]) > 0 and push[1] == "0" and push[-3:] == ["gone", "in", "B"]
    assert rows["runtime/physical_d2h"] == ["2", "2", "4.00", "KB", "4.00", "KB", ">>", "persists"]
    assert rows["host_bounce"] == ["0", "0", "--", "--"]
    assert rows["cpu_fallback"] == ["0", "0", "--", "--"]
