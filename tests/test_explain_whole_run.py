"""The explain report of a whole run: ``python -m torch_rbln.explain SCRIPT`` / ``-m MODULE``
and ``TORCH_RBLN_EXPLAIN_AT_EXIT=1``, each in a fresh process as a user runs them."""

from __future__ import annotations

import json
import textwrap

from conftest import run_script

PROGRAM = textwrap.dedent("""\
    import sys, torch
    print("argv", sys.argv[1:], __name__)
    x = torch.arange(64, dtype=torch.float32).to("rbln")
    y = x * 2                                # fp32: falls back to the CPU
    print("y", y.cpu()[:3].tolist())
    with torch.rbln.explain() as p:          # a region of the program's own, inside the run's
        z = torch.ones(64, dtype=torch.float16, device="rbln") + 1
    print("inner", p.dump()["dispatch"]["cpu_fallback"])
    if len(sys.argv) > 1 and sys.argv[1] == "boom":
        raise ValueError("boom")
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """)


def _runner(*args, env=None, cwd=None):
    return run_script("-m", "torch_rbln.explain", *args, env=env, cwd=cwd)


def test_script_keeps_argv_and_exit_status_and_reports_the_fallback(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = _runner("--with-stack", "--json", "out.json", "prog.py", "3", "--flag", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["argv ['3', '--flag'] __main__", "y [0.0, 2.0, 4.0]",
                                     "inner 0"]
    err = r.stderr.splitlines()
    head = next(line for line in err if "RBLN EXPLAIN" in line)
    assert head.startswith("[overhead: 2 signals]  RBLN EXPLAIN   (whole run: prog.py | region wall ")
    assert "dispatch/cpu_fallback      1     --  try: graph mode, or a supported dtype" in err
    assert "    aten::mul.out  1  at prog.py:4(<module>)" in err
    assert "    why: dtype-not-fp16 1" in err
    assert err[-1] == "  (raw: python -m torch_rbln.explain --json PATH)"
    dump = json.loads((tmp_path / "out.json").read_text())
    assert dump["cpu_fallback_by_op"] == {"aten::mul.out": 1}
    assert dump["label"] == "whole run: prog.py"


def test_module_and_an_uncaught_exception(tmp_path):
    (tmp_path / "progmod.py").write_text(PROGRAM)
    r = _runner("-m", "progmod", "boom", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == "argv ['boom'] __main__"
    assert "ValueError: boom" in r.stderr
    assert "(whole run: progmod | region wall " in r.stderr
    assert "    aten::mul.out  1" in r.stderr.splitlines()


def test_explain_at_exit_reports_each_rank(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {"TORCH_RBLN_EXPLAIN_AT_EXIT": "1", "RANK": "1", "WORLD_SIZE": "2"}
    r = run_script(tmp_path / "prog.py", "0", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "argv ['0'] __main__"
    assert "RBLN EXPLAIN   (whole run, rank 1/2 | region wall " in r.stderr
    assert "    aten::mul.out  1" in r.stderr.splitlines()
