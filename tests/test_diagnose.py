"""``python -m torch_rbln.diagnose`` and the ABI handshake (torch_rbln/abi.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, clean_env, run_code

PKG = ROOT / "torch_rbln"


def run_diagnose(env=None, cwd=None, pythonpath=None) -> subprocess.CompletedProcess:
    full = clean_env()
    full.pop("PYTHONPATH", None)
    full.update(env or {})
    if pythonpath:
        full["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "torch_rbln.diagnose"], capture_output=True,
                          text=True, env=full, cwd=cwd or ROOT, timeout=300)


def block(report: str, header: str) -> list[str]:
    """The lines of one report section, from its header to the next blank line."""
    lines = report.splitlines()
    start = lines.index(header)
    end = lines.index("", start)
    return lines[start:end]


def test_normal_install_reports_ok():
    r = run_diagnose(cwd="/")
    assert r.returncode == 0 and r.stdout == ""
    err = r.stderr
    assert err.startswith("Running torch-rbln environment diagnostics...\n"
                          "=== torch-rbln environment diagnostics ===")
    pkg = block(err, "torch-rbln package:")
    from importlib import metadata
    installed = [d for d in metadata.distributions(name="torch-rbln-vnpu")
                 if str(getattr(d, "_path", "")).endswith(".dist-info")]
    editable = '"editable": true' in (installed[0].read_text("direct_url.json") or "")
    assert f"  install_type: {'editable' if editable else 'normal'}" in pkg
    assert f"  loaded from: {os.path.realpath(PKG)}" in pkg
    assert not any("shadowing" in line for line in pkg)
    import torch
    assert f"  version: {torch.__version__} (this torch-rbln needs 2.13.0)" in block(err, "torch package:")
    rt = block(err, "virtual NPU runtime:")
    assert "  NPU model: RBLN-CA25" in rt and "  physical NPUs on the host: 1" in rt
    assert "    rbln:0: NPUs [0], memory 16.00 GiB" in rt
    abi = block(err, "rebel ABI handshake:")
    assert abi[-1] == "  verdict: OK"
    assert "  runtime accepts: 1..1 (min_supported..current)" in abi
    assert re.search(r"private hooks: (\d+) of \1 present", "\n".join(abi))
    assert block(err, "settings check:") == ["settings check:", "  verdict: OK (0 variable(s) set, all valid)"]
    from torch_rbln import amp
    cast = len(amp.ops_cast_by("AutocastCUDA")) - len(amp.CUDA_ONLY)
    assert block(err, "autocast:") == [
        "autocast:",
        "  dtypes: torch.float16, torch.bfloat16 (default torch.float16, as for CUDA)",
        "  vendor's 0.12 binding: none (get_amp_supported_dtype() is [] there: autocast "
        "disables itself)",
        f"  cast ops: {cast}, CUDA's lists and policies (CUDA's own cudnn_convolution, "
        "cudnn_convolution_transpose aside)",
        "  verdict: OK"]
    assert "  RBLN_DEVICES= (not set)" in block(err, "Environment variables (affecting torch-rbln):")
    libs = block(err, "library integrations (patched when the library is imported):")
    for lib, checked in (("transformers", "5.23.0"), ("accelerate", "1.16.0"),
                         ("safetensors", "0.8.0")):
        version = metadata.version(lib)
        assert f"  {lib} {version} (checked against {checked})" in libs
        unchecked = any(line.startswith(f"  >>> {lib} {version} was not checked") for line in libs)
        assert unchecked == (version != checked)
    assert ("    transformers.trainer.Trainer._save_rng_state, transformers.trainer.Trainer."
            "_load_rng_state: resuming restores the rbln generators") in libs
    assert "    safetensors.safe_open: load_file and safe_open onto rbln, rbln:N, torch.device" in libs
    assert err.rstrip().splitlines()[-1].startswith(f"Python: {sys.executable}")


def test_mapping_and_bad_values_in_the_report():
    r = run_diagnose(env={"TORCH_RBLN_VIRTUAL_NPUS": "6", "RBLN_NPUS_PER_DEVICE": "4",
                          "TORCH_RBLN_DEPLOY": "yes", "RBLN_PROFILER": "1"})
    assert r.returncode == 0
    rt = block(r.stderr, "virtual NPU runtime:")
    assert "    rbln:0: NPUs [0, 1, 2, 3], memory 64.00 GiB" in rt
    assert any("[Warning] 2 physical NPU(s) are unused" in line for line in rt)
    env = block(r.stderr, "Environment variables (affecting torch-rbln):")
    i = env.index("  TORCH_RBLN_DEPLOY=yes")
    assert env[i + 1].startswith("  >>> invalid: Invalid TORCH_RBLN_DEPLOY value `yes`")
    i = env.index("  RBLN_PROFILER=1")
    assert env[i + 1].startswith("  >>> no effect on a virtual NPU host")

    r = run_diagnose(env={"TORCH_RBLN_VIRTUAL_NPUS": "2", "RBLN_DEVICE_MAP": "[0,1,2]"})
    assert r.returncode == 0
    rt = block(r.stderr, "virtual NPU runtime:")
    assert any(line.startswith("  device mapping: invalid -- ") and "has 3 NPUs" in line
               for line in rt)


MISSING_HOOK = """
import torch
{delete}
from torch_rbln import diagnose
diagnose.main()
"""


@pytest.mark.parametrize("path", ["torch._C._len_torch_dispatch_stack",
                                  "torch.library.Library.fallback"])
def test_simulated_missing_hook_is_a_mismatch(path):
    owner, _, attr = path.rpartition(".")
    code = MISSING_HOOK.format(delete=f"import {owner.rsplit('.', 1)[0]}\ndelattr({owner}, '{attr}')")
    # diagnose mode: `import torch` leaves the backend alone, like `python -m torch_rbln.diagnose`
    r = run_code(code, env={"TORCH_RBLN_DIAGNOSE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    abi = block(r.stderr, "rebel ABI handshake:")
    assert any(line.startswith(f"    [MISSING] {path}  (used for: ") for line in abi)
    assert abi[-1].startswith("  verdict: MISMATCH -- ") and path in abi[-1]


def test_missing_hook_fails_the_import_clearly():
    r = run_code("import torch\n"
                 "del torch._C._len_torch_dispatch_stack\n"
                 "import torch_rbln\n", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode != 0
    assert ("ImportError: RBLN ABI mismatch: torch lacks 1 private hook(s) the backend depends "
            "on: torch._C._len_torch_dispatch_stack") in r.stderr
    assert "Run `python -m torch_rbln.diagnose` for the full environment report." in r.stderr


VERSION_SKEW = """
import torch
torch.__version__ = "2.12.0"
try:
    import torch_rbln
except ImportError as e:
    print("ImportError:", str(e).splitlines()[0])
else:
    print("loaded", torch_rbln.status, (torch.ones(2, device="rbln") + 1).device)
"""


def test_skip_abi_check():
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    r = run_code(VERSION_SKEW, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == ("ImportError: RBLN ABI mismatch: torch 2.12.0 is installed, but "
                                "this torch-rbln needs torch==2.13.0")
    for value in ("1", "on", "TRUE", "Yes"):
        r = run_code(VERSION_SKEW, env={**env, "TORCH_RBLN_SKIP_ABI_CHECK": value})
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == "loaded initialized rbln:0"

    r = run_diagnose(env={"TORCH_RBLN_SKIP_ABI_CHECK": "1"})
    abi = block(r.stderr, "rebel ABI handshake:")
    assert "  verdict: OK" in abi
    assert abi[-1] == ("  >>> check is DISABLED via TORCH_RBLN_SKIP_ABI_CHECK; import will not "
                       "enforce it.")

    # a bad value: test_env.py::test_a_bad_value_never_breaks_import_torch


def test_report_when_import_torch_fails(tmp_path):
    broken = tmp_path / "torch"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise ImportError("libtorch_cpu.so: cannot open shared object file")\n')
    r = run_diagnose(pythonpath=tmp_path)
    assert r.returncode == 0
    err = r.stderr
    assert block(err, "torch package:")[1] == (
        "  import failed: ImportError: libtorch_cpu.so: cannot open shared object file")
    assert "    rbln:0: NPUs [0], memory 16.00 GiB" in block(err, "virtual NPU runtime:")
    abi = block(err, "rebel ABI handshake:")
    assert ("  verdict: MISMATCH -- torch could not be imported (ImportError: libtorch_cpu.so: "
            "cannot open shared object file)") in abi
    assert abi[-1].startswith("  error: could not import torch: ")
    assert err.rstrip().splitlines()[-1].startswith("Python: ")


def test_shadowing_copy_is_flagged(tmp_path):
    shutil.copytree(PKG, tmp_path / "torch_rbln",
                    ignore=shutil.ignore_patterns("__pycache__"))
    r = run_diagnose(pythonpath=tmp_path, cwd=tmp_path)
    assert r.returncode == 0
    pkg = block(r.stderr, "torch-rbln package:")
    assert f"  loaded from: {os.path.realpath(tmp_path / 'torch_rbln')}" in pkg
    assert f"  installed at: {os.path.realpath(PKG)}" in pkg
    assert ("  >>> Local package is shadowing the installed wheel (loaded from != installed at)."
            in pkg)


def test_autocast_kernels_missing_an_op_cuda_casts_is_a_mismatch(monkeypatch):
    import torch
    from torch_rbln import amp, diagnose
    monkeypatch.setattr(amp, "coverage", lambda: ({"aten::mm", "aten::bmm"}, set()))
    assert diagnose.autocast_section(torch)[-1] == (
        "  verdict: MISMATCH -- CUDA's autocast casts 2 op(s) rbln's does not: aten::bmm, "
        "aten::mm")


def test_diagnose_mode_skips_backend_init():
    r = run_code("import torch, torch_rbln\n"
                 "print(torch_rbln.status, hasattr(torch, 'rbln'))",
                 env={"TORCH_RBLN_DIAGNOSE": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["uninitialized", "False"]


@pytest.mark.parametrize("argv,expected", [
    (["python", "-m", "torch_rbln.diagnose"], True),
    (["python", "-X", "importtime", "-u", "-m", "torch_rbln.diagnose"], True),
    (["python", "-mtorch_rbln.diagnose"], True),
    (["python", "-m", "pytest", "torch_rbln.diagnose"], False),
    (["python", "script.py", "-m", "torch_rbln.diagnose"], False),
    (["python", "-c", "import torch", "-m", "torch_rbln.diagnose"], False),
])
def test_started_as_diagnose(argv, expected):
    import torch_rbln
    assert torch_rbln._started_as_diagnose(argv) is expected


# -- the handshake itself ----------------------------------------------------------------------

def test_runtime_window(monkeypatch):
    from torch_rbln import abi
    from torch_rbln.runtime import devices
    assert abi.handshake().ok
    for lo, hi, words in ((abi.BUILT_ABI + 1, abi.BUILT_ABI + 2, "no longer accepts consumers below"),
                          (abi.BUILT_ABI - 1, abi.BUILT_ABI - 1, "only implements ABI"),
                          (abi.BUILT_ABI + 1, abi.BUILT_ABI, "inconsistent ABI window")):
        monkeypatch.setattr(devices, "RUNTIME_ABI_MIN_SUPPORTED", lo)
        monkeypatch.setattr(devices, "RUNTIME_ABI_CURRENT", hi)
        res = abi.handshake()
        assert not res.ok and words in res.reason
        assert abi.mismatch_message(res).startswith(f"RBLN ABI mismatch: {res.reason}\n")


def test_every_hook_resolves_on_the_pinned_torch():
    from torch_rbln import abi
    res = abi.handshake()
    assert res.missing == [] and res.ok, res.reason
    assert res.native.endswith(".so")


def test_a_native_core_that_does_not_load_is_a_mismatch(monkeypatch):
    from torch_rbln import abi
    monkeypatch.setattr(abi, "native_core", lambda: (None, "undefined symbol: _ZN3c10foo"))
    res = abi.handshake()
    assert not res.ok
    assert "the native core (torch_rbln._C" in res.reason and "undefined symbol" in res.reason
    assert "reinstall the package" in abi.mismatch_message(res)


# `torch._x.y` chains, `from torch._x import y` and `import torch._x` in the package sources
_CHAIN = re.compile(r"\btorch(?:\.\w+)*\.(?:_(?!_(?:file|version)__)\w*)(?:\.\w+)*")
_FROM = re.compile(r"^[ \t]*from[ \t]+(torch(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]+)", re.M)


def _private_uses() -> set[str]:
    found = set()
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        src = re.sub(r'""".*?"""', "", src, flags=re.S)          # docstrings name things too
        src = "\n".join(line.split("#", 1)[0] for line in src.splitlines())
        for m in _CHAIN.finditer(src):
            parts = m.group(0).split(".")
            # torch.ops.<ns>.<op>.<overload>: operator names such as `_softmax` are public
            if parts[1] == "ops" and not any(p.startswith("_") for p in parts[5:]):
                continue
            found.add(m.group(0))
        for mod, names in _FROM.findall(src):
            for name in (n.split(" as ")[0].strip() for n in names.strip("()").split(",")):
                if name and (name.startswith("_") or "._" in mod):
                    found.add(f"{mod}.{name}")
    return found


def test_hooks_list_every_private_torch_name_the_package_uses():
    """A private torch name used anywhere in the package must be in abi.HOOKS (or be a module
    on the way to one), so the handshake can never fall behind the code."""
    from torch_rbln import abi
    paths = [h.path for h in abi.HOOKS]
    uncovered = sorted(u for u in _private_uses()
                       if not any(p == u or p.startswith(u + ".") for p in paths))
    assert not uncovered, f"add these to torch_rbln/abi.py HOOKS: {uncovered}"
