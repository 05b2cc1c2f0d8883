"""Every environment variable: its effect, its read time, and what a malformed value does.

Variables are read at import, at runtime start or at commit, so each check runs in a fresh
process (``probe``); "read at import" is shown by setting the variable *after* ``import torch``
and seeing no effect, "live" by seeing the effect of a change mid-process. The device-mapping
variables' effects and bad values are in test_devices.py; their read time is here.
"""

from __future__ import annotations

import pytest

from conftest import ROOT, run_code, run_script
from test_devices import probe

FALLBACKS = """
from torch_rbln import events
def reasons(f):
    before = {k: v[0] for k, v in events.counters["cpu_fallback_reason"].items()}
    f()
    return sorted(k for k, v in events.counters["cpu_fallback_reason"].items()
                  if v[0] > before.get(k, 0))
def error(f):
    try:
        f()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None
"""


FIRST_USE = """
import torch
print("imported")
try:
    x = torch.ones(2, 64, dtype=torch.float16, device="rbln")
    (x + x).cpu()
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


def first_use_error(env: dict) -> str:
    """The error of the first rbln use in a process whose ``import torch`` must succeed: a bad
    value never breaks the import (the backend loads on every ``import torch``)."""
    r = run_code(FIRST_USE, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "imported" and len(lines) == 2, r.stdout
    return lines[1]


def test_docs_env_md_is_generated_from_config():
    from torch_rbln import config
    doc = (ROOT / "docs" / "env.md").read_text()
    assert doc == config.markdown(), "docs/env.md is stale: regenerate it (see its header)"
    for name, *_ in config.describe():
        assert f"| `{name}` |" in doc


def test_every_variable_has_tests():
    """A variable added to config.VARS must at least be exercised by these tests."""
    import re
    from torch_rbln import config
    text = "".join((ROOT / "tests" / f).read_text()
                   for f in ("test_env.py", "test_devices.py", "test_diagnose.py"))
    untested = [n for n in config.VARS if not re.search(rf"""['"]{n}['"]""", text)]
    assert not untested, untested


# -- a bad value in any variable ----------------------------------------------------------------

# a value each documented variable does not accept (TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK
# accepts every value: unknown check names are ignored, as the reference documents)
BAD = {
    "TORCH_RBLN_LOG_LEVEL": "LOUD", "TORCH_RBLN_LOG": "loud",
    "TORCH_RBLN_LOG_PATH": "/missing-dir/rbln.log", "TORCH_RBLN_DIAGNOSE": "maybe",
    "TORCH_RBLN_SKIP_ABI_CHECK": "perhaps", "TORCH_RBLN_DISPATCH_DTYPES": "float99",
    "TORCH_RBLN_DISPATCH_STRICT": "float99", "TORCH_RBLN_DEPLOY": "yes",
    "TORCH_RBLN_EAGER_MALLOC": "2", "TORCH_RBLN_DISABLE_FALLBACK": "maybe",
    "TORCH_RBLN_EXPLAIN_AT_EXIT": "2",
    "RBLN_DEVICES": "abc", "RBLN_VISIBLE_DEVICES": "abc", "RBLN_NPUS_PER_DEVICE": "3",
    "RBLN_DEVICE_MAP": "0,1", "RBLN_FORCE_NPU_NAME": "GPU-1", "RBLN_DUMMY_DEVICE": "maybe",
    "TORCH_RBLN_VIRTUAL_NPUS": "none", "TORCH_RBLN_DEVICE_MEMORY": "lots",
    "TORCH_RBLN_NATIVE_WARM_PATH": "maybe", "TORCH_RBLN_MATMUL_PRECISION": "fast",
    "TORCH_RBLN_C10D_ASYNC": "sometimes", "RBLN_FORCE_LOOPBACK_CONTROL_PLANE": "maybe",
    "TORCH_RBLN_TEST_FAULT": "silu@first",
}
# read only by torch.distributed (each collective, each group creation; tested at the end of
# this file), so a first device use never reads them
DISTRIBUTED_ONLY = {"TORCH_RBLN_C10D_ASYNC", "RBLN_FORCE_LOOPBACK_CONTROL_PLANE"}


def test_test_fault_values():
    """TORCH_RBLN_TEST_FAULT (test only, runtime/faults.py): where, the op, the run, the amount."""
    from torch_rbln import config
    parse = lambda raw: config.parse("TORCH_RBLN_TEST_FAULT", raw)   # noqa: E731
    assert parse("") is None
    assert parse("aten::silu") == ("both", "aten::silu", None, 1.0)
    assert parse("graph:aten::mul.Tensor@3+0.5") == ("graph", "aten::mul.Tensor", 3, 0.5)
    assert parse("eager:aten::add+-2") == ("eager", "aten::add", None, -2.0)
    for bad in ("silu", "aten::silu@0", "cpu:aten::silu", "aten::silu+x"):
        with pytest.raises(config.EnvError, match="TORCH_RBLN_TEST_FAULT"):
            parse(bad)


def test_a_bad_value_never_breaks_import_torch():
    """Every variable set to a bad value: `import torch` works, the first rbln use raises an
    error naming the variable, the value and what is accepted, and `python -m
    torch_rbln.diagnose` reports each as a failed check. The variables read at import share a
    process (one error lists them all); the others share one too (read at first use: each error
    is seen, then that variable unset, until the first use succeeds)."""
    from torch_rbln import config
    assert set(BAD) == set(config.VARS) - {"TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK"}
    at_import = {k: v for k, v in BAD.items() if config.VARS[k].read_at in ("import", "category")}
    later = {k: v for k, v in BAD.items() if k not in at_import and k not in DISTRIBUTED_ONLY}

    def named(err, name, value):
        return name in err and f"`{value}`" in err

    # TORCH_RBLN_LOG is not read while TORCH_RBLN_LOG_LEVEL is set (the new name wins)
    for group in ({k: v for k, v in at_import.items() if k != "TORCH_RBLN_LOG_LEVEL"},
                  {"TORCH_RBLN_LOG_LEVEL": at_import["TORCH_RBLN_LOG_LEVEL"]}):
        err = first_use_error(group)
        assert err.startswith("EnvError: "), err
        for name, value in group.items():
            assert named(err, name, value), (name, err)
        assert err.count("expected") == len(group)          # what each accepts

    r = run_code("""
import os, torch
print("imported")
while True:
    try:
        x = torch.ones(2, 64, dtype=torch.float16, device="rbln")
        (x + x).cpu()
        break
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
        names = [n for n in os.environ if n.startswith("RBLN_") or n.startswith("TORCH_RBLN_")]
        bad = [n for n in names if f"Invalid {n} " in str(e)]
        if not bad:
            break
        for n in bad:
            del os.environ[n]
print("used")
""", env={**later, "TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK": "bogus"})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "imported" and lines[-1] == "used", r.stdout   # unknown check names: ignored
    errors = lines[1:-1]
    assert all(e.startswith("EnvError: ") and "expected" in e for e in errors), errors
    for name, value in later.items():
        assert any(named(e, name, value) for e in errors), (name, errors)

    from test_diagnose import block, run_diagnose
    r = run_diagnose(env=BAD)
    assert r.returncode == 0
    check = block(r.stderr, "settings check:")
    for name, value in BAD.items():
        line = next((x for x in check if x.startswith(f"  [FAIL] {name}={value}: ")), None)
        assert line is not None and f"`{value}`" in line and "expected" in line, check
    assert check[-1].startswith(f"  verdict: FAILED -- {len(BAD)} of {len(BAD)} variable(s) set")


# -- logging (import) -----------------------------------------------------------------------

LOG_PROBE = FALLBACKS + """
x = torch.ones(2, 64, device="rbln")
os.environ["TORCH_RBLN_LOG_LEVEL"] = os.environ.get("SET_AFTER_IMPORT", "")
if not os.environ["TORCH_RBLN_LOG_LEVEL"]:
    del os.environ["TORCH_RBLN_LOG_LEVEL"]
torch.sin(x)
print(json.dumps({}))
"""
LOGGED = "`aten::sin` op ran on CPU instead of RBLN"


def run_log_probe(tmp_path, env, prefix="import os, json, torch\n"):
    script = tmp_path / "log_probe.py"      # a script, the way the tutorial runs its examples
    script.write_text(prefix + LOG_PROBE)
    return run_script(script, env=env, cwd=tmp_path)


def test_log_level(tmp_path):
    r = run_log_probe(tmp_path, {"TORCH_RBLN_LOG_LEVEL": "INFO"})
    assert r.returncode == 0 and LOGGED in r.stderr and "UserWarning: TRACE" in r.stderr
    r = run_log_probe(tmp_path, {"SET_AFTER_IMPORT": "INFO"})
    assert r.returncode == 0 and LOGGED not in r.stderr          # read at import only


def test_deprecated_log_alias(tmp_path):
    r = run_log_probe(tmp_path, {"TORCH_RBLN_LOG": "INFO"},
                      "import os, json, warnings\nwarnings.simplefilter('always')\nimport torch\n")
    assert r.returncode == 0 and LOGGED in r.stderr
    assert "TORCH_RBLN_LOG is deprecated; use TORCH_RBLN_LOG_LEVEL" in r.stderr
    r = run_log_probe(tmp_path, {"TORCH_RBLN_LOG": "INFO", "TORCH_RBLN_LOG_LEVEL": "WARNING"})
    assert r.returncode == 0 and LOGGED not in r.stderr          # the new name wins


def test_log_path(tmp_path):
    log = tmp_path / "rbln.log"
    r = run_log_probe(tmp_path, {"TORCH_RBLN_LOG_LEVEL": "INFO", "TORCH_RBLN_LOG_PATH": str(log)})
    assert r.returncode == 0 and LOGGED in log.read_text()
    late = tmp_path / "late.log"
    r = run_log_probe(tmp_path, {"TORCH_RBLN_LOG_LEVEL": "INFO"},
                      f"import os, json, torch\nos.environ['TORCH_RBLN_LOG_PATH'] = {str(late)!r}\n")
    assert r.returncode == 0 and not late.exists()              # read at import only


# -- import-time switches ---------------------------------------------------------------------

def test_diagnose_flag():
    r = run_code("import torch, torch_rbln\nprint(torch_rbln.status, hasattr(torch, 'rbln'))",
                 env={"TORCH_RBLN_DIAGNOSE": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["uninitialized", "False"]
    r = run_code("import os, torch\nos.environ['TORCH_RBLN_DIAGNOSE'] = '1'\nimport torch_rbln\n"
                 "print(torch_rbln.status, torch.ones(1, device='rbln').device)")
    assert r.returncode == 0 and r.stdout.split() == ["initialized", "rbln:0"]


def test_skip_abi_check_is_read_when_the_extension_loads():
    """Effect and bad values: test_diagnose.py::test_skip_abi_check. Read time: the extension's
    load, which is `import torch_rbln` when autoload is off."""
    code = ("import os, torch\ntorch.__version__ = '2.12.0'\n"
            "os.environ['TORCH_RBLN_SKIP_ABI_CHECK'] = '1'\nimport torch_rbln\n"
            "print(torch_rbln.status)")
    r = run_code(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "initialized"


@pytest.mark.parametrize("name,value,case,reason", [
    ("TORCH_RBLN_DISPATCH_DTYPES", "float32", "x32 + x32", "dtype-not-fp16"),
    ("TORCH_RBLN_DISPATCH_STRICT", "float16", "odd + odd", "last-dim-not-64-aligned"),
])
def test_dispatch_catalog(name, value, case, reason):
    body = f"""
        x32 = torch.ones(2, 64, device="rbln")
        odd = torch.ones(2, 3, dtype=torch.float16, device="rbln")
        res = {{"first": reasons(lambda: {case})}}
        os.environ["{name}"] = "{value}"                 # too late: read at import
        res["late"] = reasons(lambda: {case})
        print(json.dumps(res))
    """
    assert probe(body, {}, FALLBACKS) == {"first": [reason], "late": [reason]}
    assert probe(body, {name: value}, FALLBACKS) == {"first": [], "late": []}


def test_native_warm_path_is_read_at_import():
    """Off: every call takes the Python kernel (the same events; test_warm_path.py compares
    the two paths); setting it after import changes nothing."""
    body = """
        from torch_rbln import _C, events
        a = torch.ones(2, 64, dtype=torch.float16, device="rbln")
        os.environ["TORCH_RBLN_NATIVE_WARM_PATH"] = "0"          # too late: read at import
        n = _C.warm_path_served()
        for _ in range(3):
            a + a
        print(json.dumps({"served": _C.warm_path_served() - n,
                          "hits": events.counters["warm_hit"]["aten::add.out"][0]}))
    """
    assert probe(body, {}) == {"served": 2, "hits": 2}
    assert probe(body, {"TORCH_RBLN_NATIVE_WARM_PATH": "0"}) == {"served": 0, "hits": 2}


def test_matmul_precision_is_read_at_import():
    """Its effect: test_matmul_precision.py; set after import it changes nothing."""
    body = """
        from torch_rbln.runtime import executors
        os.environ["TORCH_RBLN_MATMUL_PRECISION"] = "native"      # too late: read at import
        print(json.dumps(executors.matmul_precision().form(torch.float16)))
    """
    assert probe(body, {"TORCH_RBLN_MATMUL_PRECISION": "widen"}) == "widen"


# -- live variables ---------------------------------------------------------------------------

def test_deploy_is_live():
    out = probe("""
        nan = torch.full((2, 64), float("nan"), dtype=torch.float16, device="rbln")
        res = {"off": reasons(lambda: nan + nan)}
        os.environ["TORCH_RBLN_DEPLOY"] = "ON"
        res["on"] = reasons(lambda: nan + nan)
        res["still_nan"] = bool((nan + nan).isnan().all())
        os.environ["TORCH_RBLN_DEPLOY"] = "on"          # exactly ON, nothing else
        res["bad"] = error(lambda: nan + nan)
        del os.environ["TORCH_RBLN_DEPLOY"]
        res["unset"] = reasons(lambda: nan + nan)
        print(json.dumps(res))
    """, {}, FALLBACKS)
    assert out["off"] == ["nan/inf input"] and out["on"] == [] and out["still_nan"]
    assert "Invalid TORCH_RBLN_DEPLOY value `on`" in out["bad"]
    assert out["unset"] == ["nan/inf input"]


def test_the_live_variables_follow_any_change_of_the_environment():
    # the warm path reuses its last pass over the environment while it looks unchanged: a
    # variable set where another was just unset (the entry count unchanged), one set again, and
    # the last entry replaced must each be seen by the next op
    out = probe("""
        nan = torch.full((2, 64), float("nan"), dtype=torch.float16, device="rbln")
        os.environ["ZZ_UNRELATED"] = "1"
        res = {"off": reasons(lambda: nan + nan)}
        del os.environ["ZZ_UNRELATED"]
        os.environ["TORCH_RBLN_DEPLOY"] = "ON"
        res["swapped_in"] = reasons(lambda: nan + nan)
        os.environ["TORCH_RBLN_DEPLOY"] = "OFF"
        res["set_again"] = reasons(lambda: nan + nan)
        os.environ["ZZ_UNRELATED"] = "2"
        del os.environ["TORCH_RBLN_DEPLOY"]
        os.environ["TORCH_RBLN_DEPLOY"] = "ON"
        res["readded"] = reasons(lambda: nan + nan)
        print(json.dumps(res))
    """, {}, FALLBACKS)
    assert out["off"] == ["nan/inf input"] and out["swapped_in"] == []
    assert out["set_again"] == ["nan/inf input"] and out["readded"] == []


def test_dev_disable_op_cpu_fallback_is_live():
    out = probe("""
        nan = torch.full((2, 64), float("nan"), dtype=torch.float16, device="rbln")
        res = {"off": reasons(lambda: nan + nan)}
        os.environ["TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK"] = "bogus,dtype"   # unknown: ignored
        res["other_check"] = reasons(lambda: nan + nan)
        os.environ["TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK"] = "nan_inf"
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            res["on"] = reasons(lambda: nan + nan)
            reasons(lambda: nan + nan)
        res["warnings"] = [str(x.message) for x in w]
        print(json.dumps(res))
    """, {}, FALLBACKS)
    assert out["off"] == ["nan/inf input"] and out["other_check"] == ["nan/inf input"]
    assert out["on"] == []
    assert out["warnings"] == []   # it already warned once, at the first non-empty value

    out = probe("""
        nan = torch.full((2, 64), float("nan"), dtype=torch.float16, device="rbln")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r1 = reasons(lambda: nan + nan)
            reasons(lambda: nan + nan)
        print(json.dumps({"r": r1, "warnings": [str(x.message) for x in w]}))
    """, {"TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK": "all"}, FALLBACKS)
    assert out["r"] == []
    assert [m for m in out["warnings"] if "Do NOT use in production" in m] == [
        "Enabling `TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK` may lead to unexpected behavior. "
        "Do NOT use in production."]


def test_eager_malloc_is_live():
    out = probe("""
        a = torch.empty(1024, dtype=torch.float16, device="rbln")
        res = {"lazy": torch.rbln.memory_allocated()}
        os.environ["TORCH_RBLN_EAGER_MALLOC"] = "1"
        b = torch.empty(1024, dtype=torch.float16, device="rbln")
        res["eager"] = torch.rbln.memory_allocated()
        os.environ["TORCH_RBLN_EAGER_MALLOC"] = "yes"
        res["bad"] = error(lambda: torch.empty(8, device="rbln"))
        print(json.dumps(res))
    """, {}, FALLBACKS)
    assert out["lazy"] == 0 and out["eager"] >= 2048
    assert "Invalid TORCH_RBLN_EAGER_MALLOC value `yes`" in out["bad"]


def test_disable_fallback_per_category():
    body = """
        x = torch.ones(2, 64, device="rbln")
        res = {"unsupported": error(lambda: torch.atan2(x, x))}
        os.environ["TORCH_RBLN_DISABLE_FALLBACK"] = "unsupported_op"   # fixed at load: no effect
        res["unsupported_late"] = error(lambda: torch.atan2(x, x))
        res["strided"] = error(lambda: torch.cat([x.half(), x]))
        os.environ["TORCH_RBLN_DISABLE_FALLBACK"] = "strided_copy_error"   # read on each check
        res["strided_late"] = error(lambda: torch.cat([x.half(), x]))
        print(json.dumps(res))
    """
    out = probe(body, {}, FALLBACKS)
    assert out["unsupported"] is None and out["unsupported_late"] is None
    assert out["strided"] is None
    assert out["strided_late"].startswith("StridedCopyError: aten::cat.out: batched strided copy")
    out = probe(body, {"TORCH_RBLN_DISABLE_FALLBACK": "all"}, FALLBACKS)
    assert out["unsupported"].startswith(
        "NotImplementedError: The operator `aten::atan2.out` is not implemented for RBLN devices.")
    assert "Invalid TORCH_RBLN_DISABLE_FALLBACK option `bogus`, expected one of: all," in (
        first_use_error({"TORCH_RBLN_DISABLE_FALLBACK": "unsupported_op,bogus"}))


# -- device mapping (commit) ------------------------------------------------------------------

@pytest.mark.parametrize("name,value,expected", [
    ("RBLN_DEVICES", "1,2", [[1], [2]]),
    ("RBLN_VISIBLE_DEVICES", "3", [[3]]),
    ("RBLN_NPUS_PER_DEVICE", "2", [[0, 1], [2, 3]]),
    ("RBLN_DEVICE_MAP", "[3],[0,1]", [[3], [0, 1]]),
])
def test_mapping_variables_are_read_until_commit(name, value, expected):
    out = probe(f"""
        res = {{"default": groups()}}
        os.environ["{name}"] = "{value}"                 # after import, before first use
        res["planned"] = groups()
        torch.ones(1, device="rbln")                     # first real use: commit
        del os.environ["{name}"]
        res["frozen"] = groups()
        print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "4"})
    assert out == {"default": [[0], [1], [2], [3]], "planned": expected, "frozen": expected}


# -- the virtual host (runtime start) ----------------------------------------------------------

HOST_PROBE = """
    res = {{}}
    os.environ["{name}"] = "{value}"                     # after import: the runtime has not started
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res["count"] = torch.rbln.device_count()
        res["phys"] = torch.rbln.physical_device_count()
        if res["count"]:
            p = torch.rbln.get_device_properties(0)
            res["name"], res["memory"] = p.name, p.total_memory
    res["warnings"] = [str(x.message) for x in w]
    os.environ["{name}"] = "{later}"                     # after the first query: ignored
    res["count_later"] = torch.rbln.device_count()
    res["memory_later"] = torch.rbln.get_device_properties(0).total_memory if res["count"] else 0
    print(json.dumps(res))
"""


def host_probe(name, value, later, env=None):
    return probe(HOST_PROBE.format(name=name, value=value, later=later), env or {})


def test_virtual_npus():
    out = host_probe("TORCH_RBLN_VIRTUAL_NPUS", "3", "5")
    assert (out["count"], out["phys"], out["count_later"]) == (3, 3, 3)
    for bad in ("0", "two"):
        out = host_probe("TORCH_RBLN_VIRTUAL_NPUS", bad, "1")
        assert out["count"] == 0 and out["count_later"] == 1    # a failed start is retried
        assert any(f"Invalid TORCH_RBLN_VIRTUAL_NPUS value `{bad}`" in m for m in out["warnings"])


def test_force_npu_name():
    out = host_probe("RBLN_FORCE_NPU_NAME", "RBLN-CR13", "RBLN-CA25")
    assert (out["name"], out["memory"]) == ("RBLN-CR13", 144 << 30)
    assert out["memory_later"] == 144 << 30
    out = host_probe("RBLN_FORCE_NPU_NAME", "RBLN-XX1", "RBLN-CA25")
    assert out["count"] == 0
    assert any("Invalid RBLN_FORCE_NPU_NAME value `RBLN-XX1`" in m for m in out["warnings"])


def test_device_memory():
    out = host_probe("TORCH_RBLN_DEVICE_MEMORY", "64MiB", "1GiB")
    assert out["memory"] == 64 << 20 and out["memory_later"] == 64 << 20
    out = probe("""
        x = torch.ones(1024, 1024, dtype=torch.float16, device="rbln")   # 2 MiB
        print(json.dumps({"oom": error(lambda: x + x),
                          "total": torch.rbln.mem_get_info()[1]}))
    """, {"TORCH_RBLN_DEVICE_MEMORY": "3MiB"}, FALLBACKS)
    assert out["total"] == 3 << 20
    assert out["oom"].startswith("OutOfMemoryError")
    for bad in ("lots", "512KiB"):
        out = host_probe("TORCH_RBLN_DEVICE_MEMORY", bad, "1GiB")
        assert out["count"] == 0
        assert any(f"Invalid TORCH_RBLN_DEVICE_MEMORY value `{bad}`" in m for m in out["warnings"])


def test_dummy_device_is_validated_not_emulated():
    out = host_probe("RBLN_DUMMY_DEVICE", "1", "0")
    assert out["count"] == 1
    assert any("does not emulate the host-backed dummy device" in m for m in out["warnings"])
    out = host_probe("RBLN_DUMMY_DEVICE", "off", "1")
    assert out["count"] == 1 and out["warnings"] == []
    out = host_probe("RBLN_DUMMY_DEVICE", "4", "0")
    assert out["count"] == 0
    assert any("Invalid RBLN_DUMMY_DEVICE value `4`" in m for m in out["warnings"])


# -- rbln-ccl (torch.distributed) -------------------------------------------------------------

def test_c10d_async_is_read_by_every_collective(monkeypatch):
    """Default: a collective completes before it returns (the reference's synchronous mode);
    set, it returns at once and ``wait()`` completes it. Multi-rank behaviour of both modes:
    test_distributed.py."""
    import datetime
    import torch
    import torch.distributed as dist
    from torch_rbln.config import EnvError
    from torch_rbln.distributed.process_group import ProcessGroupRBLN
    pg = ProcessGroupRBLN(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30), "env")
    opts = dist.distributed_c10d.AllreduceOptions()
    x = torch.ones(4, dtype=torch.float16, device="rbln")
    monkeypatch.delenv("TORCH_RBLN_C10D_ASYNC", raising=False)
    assert pg.allreduce([x], opts).is_completed()          # completed before returning
    monkeypatch.setenv("TORCH_RBLN_C10D_ASYNC", "1")
    w = pg.allreduce([x], opts)
    assert w.wait() and w.get_future().wait()[0] is x and x.cpu().tolist() == [1.0] * 4
    monkeypatch.setenv("TORCH_RBLN_C10D_ASYNC", "sometimes")
    with pytest.raises(EnvError, match="Invalid TORCH_RBLN_C10D_ASYNC value `sometimes`"):
        pg.allreduce([x], opts)


def test_loopback_control_plane_is_read_when_a_group_is_created():
    code = """
import json, os, torch, torch.distributed as dist
os.environ["RBLN_FORCE_LOOPBACK_CONTROL_PLANE"] = os.environ.pop("FORCE_LATER", "0")
dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)   # rbln: rbln-ccl
assert dist.group.WORLD.name() == "rbln-ccl", dist.group.WORLD.name()
print(json.dumps([os.environ.get("RBLN_LOCAL_IP"), os.environ.get("RBLN_ROOT_IP")]))
"""
    def ips(env):
        r = run_code(code, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip().splitlines()[-1]
    assert ips({}) == '["127.0.0.1", "127.0.0.1"]'                       # defaults
    assert ips({"RBLN_LOCAL_IP": "10.0.0.5"}) == '["10.0.0.5", "127.0.0.1"]'
    assert ips({"RBLN_LOCAL_IP": "10.0.0.5", "FORCE_LATER": "1"}) == '["127.0.0.1", "127.0.0.1"]'
    r = run_code(code, env={"FORCE_LATER": "maybe"})
    assert r.returncode != 0
    assert "Invalid RBLN_FORCE_LOOPBACK_CONTROL_PLANE value `maybe`" in r.stderr
