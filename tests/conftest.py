"""Shared test setup. `import torch` loads the rbln backend through its entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
