"""The install command's build settings (``setup.py``), read before anything compiles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT


def _setup(build_type: str) -> subprocess.CompletedProcess:
    # `--name` evaluates the extension's settings and prints the project name, compiling nothing
    env = {**os.environ, "TORCH_RBLN_BUILD_TYPE": build_type}
    return subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("build_type", ["Release", "Debug"])
def test_build_type_accepted(build_type):
    r = _setup(build_type)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "torch-rbln-vnpu"


def test_bad_build_type_stops_the_install_naming_it():
    r = _setup("Fast")
    assert r.returncode != 0
    assert "Invalid TORCH_RBLN_BUILD_TYPE value `Fast`, expected Release or Debug" in r.stderr
