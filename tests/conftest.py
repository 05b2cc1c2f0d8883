"""Shared test setup. `import torch` loads the rbln backend through its entry point."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# A process claims the NPUs it commits (one lock file per NPU in a per-user runtime dir, see
# torch_rbln/runtime/claims.py), as processes on an NPU host do. Keep this session's claims
# apart from other runs on the machine, and the pytest process's own apart from the processes
# the tests start (which run one after another and each claim NPU 0 again).
_RUNTIME_DIRS = tempfile.mkdtemp(prefix="torch-rbln-tests-")
atexit.register(shutil.rmtree, _RUNTIME_DIRS, True)
os.environ["XDG_RUNTIME_DIR"] = os.path.join(_RUNTIME_DIRS, "pytest")
CHILD_RUNTIME_DIR = os.path.join(_RUNTIME_DIRS, "children")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run tests marked slow (full OpInfo sweep, big models)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("TORCH_RBLN_RUNSLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: opt in with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def clean_env(env=None) -> dict:
    """This process's environment without its TORCH_RBLN_* / RBLN_* variables, plus ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_RBLN_", "RBLN_"))}
    full["XDG_RUNTIME_DIR"] = CHILD_RUNTIME_DIR
    full.update(env or {})
    return full


def run_script(path, *args, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run a Python script in a fresh process (the way a user runs the tutorial)."""
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          env=clean_env(env), cwd=cwd, timeout=timeout)


def run_code(code: str, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run ``python -c code`` in a fresh process."""
    return run_script("-c", code, env=env, cwd=cwd, timeout=timeout)


def run_json(body: str, env=None, timeout=300) -> dict:
    """Run ``body`` (indented code is dedented) in a fresh process after ``import json, torch``;
    it must ``print(json.dumps(...))`` last. Returns that JSON."""
    r = run_code("import json, torch\n" + textwrap.dedent(body), env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def warm_path(on: bool):
    """The native warm path switched on or off for the block (tests compare both paths)."""
    from torch_rbln import _C
    before = _C.warm_path_enabled()
    _C.set_warm_path(on)
    try:
        yield
    finally:
        _C.set_warm_path(before)


def event_delta(before: dict, after: dict, timed) -> dict:
    """(kind, key) -> (count, amount) of the counters that moved between two
    ``events.snapshot()``s; the amounts of the ``timed`` kinds (durations, which differ run to
    run) are None."""
    out = {}
    for kind, table in after.items():
        for key, (n, amount) in table.items():
            n0, a0 = before[kind].get(key, [0, 0])
            if n != n0:
                out[(kind, key)] = (n - n0, None if kind in timed else amount - a0)
    return out


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
