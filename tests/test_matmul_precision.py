"""Half-precision matmuls per CPU: NPU numerics (fp32 accumulation, one rounding) from the
dtype's native GEMM where the CPU has one (AVX512-FP16/AMX, AVX512-BF16), else from widened fp32
operands; eager and graph programs make the same choice, and diagnose shows it. This host may
have no native kernels, so the native branch is exercised by forcing the choice."""

from __future__ import annotations

import json

import pytest
import torch

from test_devices import probe
from torch_rbln.graph import rewrite
from torch_rbln.runtime import executors

H = torch.float16


def _detect(monkeypatch, cap, flags, isa=None, ratios=None):
    """The choice on a described CPU; ``ratios``: the measured native/widened time per dtype
    (default: native as fast as widening)."""
    ratios = ratios or {}
    monkeypatch.setattr(executors, "_measured_ratios",
                        lambda key, dtypes: {d: ratios.get(d, 1.0) for d in dtypes})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: cap)
    monkeypatch.setattr(executors, "_cpu_flags", lambda: set(flags))
    if isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    monkeypatch.delenv("TORCH_RBLN_MATMUL_PRECISION", raising=False)
    from torch_rbln import config
    monkeypatch.setattr(config, "_latched", {})
    return executors.matmul_precision.__wrapped__()


@pytest.mark.parametrize("cap,flags,isa,native", [
    ("AVX2", {"avx2", "f16c"}, None, set()),
    ("AVX512", {"avx512f"}, None, set()),
    ("AVX512", {"avx512f", "avx512_bf16"}, None, {torch.bfloat16}),
    ("AVX512", {"avx512f", "avx512_fp16", "avx512_bf16"}, None, {H, torch.bfloat16}),
    ("AVX512", {"amx_bf16", "amx_fp16", "amx_tile"}, None, {H, torch.bfloat16}),
    # the kernel paths forced down: ATEN_CPU_CAPABILITY=avx2 / ONEDNN_MAX_CPU_ISA=AVX2
    ("AVX2", {"amx_bf16", "amx_fp16", "avx512_fp16"}, None, set()),
    ("AVX512", {"amx_bf16", "amx_fp16", "avx512_fp16"}, "AVX2", set()),
    ("AVX512", {"avx512_fp16", "avx512_bf16"}, "AVX512_CORE_BF16", {torch.bfloat16}),
])
def test_the_choice_follows_the_cpu(monkeypatch, cap, flags, isa, native):
    p = _detect(monkeypatch, cap, flags, isa)
    assert set(p.native) == native
    assert p.form(H) == ("native" if H in native else "widen")
    assert cap in p.reason and p.summary.startswith("float16 ")


def test_a_native_kernel_measured_slower_than_widening_is_not_taken(monkeypatch):
    """AVX512-BF16 without AMX: on some CPUs bf16's GEMM takes twice fp32's time."""
    flags = {"avx512f", "avx512_fp16", "avx512_bf16"}
    p = _detect(monkeypatch, "AVX512", flags, ratios={torch.bfloat16: 1.7, H: 1.1})
    assert set(p.native) == {H}
    assert p.form(torch.bfloat16) == "widen"
    assert "bfloat16's native GEMM measured 1.70x the time of widening" in p.reason
    assert "float16's native" not in p.reason.replace("bfloat16's", "")


def test_the_measurement_is_made_once_per_host_and_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed = []

    def timing(dtype):
        timed.append(dtype)
        return 1.5
    monkeypatch.setattr(executors, "_time_native_over_widened", timing)
    both = [H, torch.bfloat16]
    assert executors._measured_ratios("host-a", both) == {H: 1.5, torch.bfloat16: 1.5}
    assert executors._measured_ratios("host-a", both) == {H: 1.5, torch.bfloat16: 1.5}
    assert len(timed) == 2                                  # the second read the cache
    executors._measured_ratios("host-b", [H])               # another host: its own entry
    assert len(timed) == 3
    cache = tmp_path / "torch_rbln" / "matmul-precision.json"
    assert set(json.loads(cache.read_text())) == {"host-a", "host-b"}
    cache.write_text("not json")                            # a damaged cache: measured again
    assert executors._measured_ratios("host-a", [H]) == {H: 1.5}
    assert len(timed) == 4


def test_an_unwritable_cache_only_means_measuring_again(monkeypatch, tmp_path):
    (tmp_path / "torch_rbln").write_text("a file where the directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(executors, "_time_native_over_widened", lambda d: 0.9)
    assert executors._measured_ratios("host", [H]) == {H: 0.9}


def test_the_measurement_times_both_forms_and_restores_the_threads():
    n = torch.get_num_threads()
    r = executors._time_native_over_widened(torch.float16)
    assert r > 0 and torch.get_num_threads() == n


def _matmul_graph():
    def f(a, b):
        return torch.mm(a, b) + 1
    return torch.fx.symbolic_trace(f)


@pytest.mark.parametrize("native", [frozenset(), frozenset({H})])
def test_graph_programs_widen_only_what_the_cpu_has_no_kernel_for(monkeypatch, native):
    from torch._subclasses.fake_tensor import FakeTensorMode
    gm = _matmul_graph()
    with FakeTensorMode() as mode:
        a = mode.from_tensor(torch.ones(64, 64, dtype=H))
        b = mode.from_tensor(torch.ones(64, 8, dtype=H))
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                n.meta["val"] = a if n.name == "a" else b
            elif n.target is torch.mm:
                n.target = torch.ops.aten.mm.default
                n.meta["val"] = torch.ops.aten.mm.default(a, b)
    monkeypatch.setattr(executors, "matmul_precision",
                        lambda: executors.MatmulPrecision(native, "forced"))
    rewrite.fp32_matmuls(gm)
    casts = [n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert len(casts) == (0 if H in native else 3)     # two operands widened, one rounding


EAGER = """
    import torch
    from torch_rbln import _C
    from torch_rbln.runtime import executors
    torch.manual_seed(0)
    # K = 1024: long enough that the two kernels round differently on every host kind seen
    a, b = torch.randn(64, 1024).half(), torch.randn(1024, 64).half()
    da, db = a.to("rbln"), b.to("rbln")
    n = _C.warm_path_served()
    got = [torch.mm(da, db).cpu() for _ in range(2)]          # cold (Python), warm (native)
    w = b.t().contiguous()
    got += [torch.nn.functional.linear(da, w.to("rbln")).cpu() for _ in range(2)]
    native = [torch.mm(a, b)] * 2 + [torch.nn.functional.linear(a, w)] * 2
    widened = [torch.mm(a.float(), b.float()).half()] * 2 + [
        torch.nn.functional.linear(a.float(), w.float()).half()] * 2
    # few rows (a decode step) keep the half-precision kernel either way
    few = [torch.mm(da[:8].contiguous(), db).cpu() for _ in range(2)]
    print(json.dumps({"form": executors.matmul_precision().form(torch.float16),
                      "served": _C.warm_path_served() - n,
                      "native": [bool(torch.equal(g, r)) for g, r in zip(got, native)],
                      "widened": [bool(torch.equal(g, r)) for g, r in zip(got, widened)],
                      "few": [bool(torch.equal(g, torch.mm(a[:8], b))) for g in few],
                      "differ": not torch.equal(native[0], widened[0])}))
"""


@pytest.mark.parametrize("choice", ["native", "widen"])
def test_eager_programs_compute_as_chosen(choice):
    """Both paths (the cold Python kernel and the native warm path) run the chosen kernel."""
    out = probe(EAGER, {"TORCH_RBLN_MATMUL_PRECISION": choice})
    assert out["form"] == choice and out["served"] == 3
    assert out["differ"]                  # the two kernels round differently on these inputs
    assert out[{"native": "native", "widen": "widened"}[choice]] == [True] * 4
    assert out["few"] == [True, True]


def test_diagnose_shows_the_choice():
    from torch_rbln import diagnose
    lines = diagnose.cpu_section(torch)
    assert any(line.strip().startswith("half-precision matmuls: float16 ") for line in lines)
    assert any(torch.backends.cpu.get_cpu_capability() in line for line in lines)


def test_processes_starting_together_measure_once(tmp_path):
    """Ranks or workers started at once all take the one measurement made under the lock."""
    import os
    import subprocess
    import sys
    log = tmp_path / "measured"
    body = ("import json, time, torch; from torch_rbln.runtime import executors as e\n"
            "def timing(d):\n"
            f"    open({str(log)!r}, 'a').write('x')\n"
            "    time.sleep(0.5)\n"
            "    return 1.0\n"
            "e._time_native_over_widened = timing\n"
            "print(json.dumps(e._measured_ratios('host', [torch.float16])[torch.float16]))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TORCH_RBLN_MATMUL_PRECISION": "widen"}
    procs = [subprocess.Popen([sys.executable, "-c", body], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [json.loads(o) for o in outs] == [1.0] * 3
    assert log.read_text() == "x"                           # one process measured
    cache = json.loads((tmp_path / "torch_rbln" / "matmul-precision.json").read_text())
    assert cache == {"host": {"float16": 1.0}}
