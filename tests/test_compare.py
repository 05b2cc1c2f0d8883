"""torch.rbln.compare: live golden comparison, records compared offline, the minifier.

Faults are injected with the test-only switch (``torch_rbln.compare.testing.fault``, the
``TORCH_RBLN_TEST_FAULT`` variable): one device op adds a constant to its result, and the
comparison must name that op, its module and its line."""

from __future__ import annotations

import copy
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, clean_env
from torch_rbln import events, tolerances
from torch_rbln.compare import load, offline, stats, testing
from torch_rbln.compare.__main__ import main as cli


class Block(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.act = torch.nn.SiLU()
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return self.down(self.act(self.up(x)))      # the line the act's ops are called from


FORWARD_LINE = inspect.getsourcelines(Block.forward)[1] + 1


def _model(dtype=torch.float16, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(Block(), Block()).to(dtype).to("rbln")


def _x(dtype=torch.float16, grad=False):
    torch.manual_seed(1)
    return torch.randn(8, 64, dtype=dtype).to("rbln").requires_grad_(grad)


def test_injected_fault_is_the_first_divergence_with_op_module_and_line():
    m, x = _model(), _x()
    with testing.fault("aten::silu", nth=2, amount=0.5, where="eager"):
        with torch.rbln.compare() as c:
            m(x)
    first = c.first_divergence()
    op, mod = first["op"], first["module"]
    assert (op["op"], op["module"], op["phase"], op["route"]) == ("aten::silu", "1.act",
                                                                  "forward", "device")
    assert op["at"].startswith(f"{__file__}:{FORWARD_LINE}(forward)")
    assert op["max_abs"] == pytest.approx(0.5, abs=1e-3) and op["outside"] == op["numel"]
    # the first module out of tolerance is the innermost one holding the op; the faulty op
    # is named inside it, and every module around it diverged after it (1.down is right: its
    # golden starts from the same, wrong, inputs)
    assert (mod["path"], mod["class"], mod["first_op"]) == ("1.act", "SiLU", op["seq"])
    d = c.dump()
    assert [m["path"] for m in d["modules"] if m["diverged"]] == ["1.act", "1", "Sequential"]
    assert [e["op"] for e in d["ops"] if e["diverged"]] == ["aten::silu"]   # its own error only
    assert all(not e["diverged"] for e in d["ops"] if e["seq"] != op["seq"])
    text = c.report()
    assert text.startswith("[diverged: 1 op, 3 module calls]  RBLN COMPARE")
    assert "    module  1.act (SiLU) float16: 1,024/1,024 elements out of tolerance" in text
    assert f"first op out of tolerance inside: #{op['seq']} aten::silu" in text
    assert str(c) == text


def test_overflowing_layer_is_found_with_the_overflow_hint():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 64))
    with torch.no_grad():
        m[1].weight.mul_(1e5)               # large activations: beyond fp16's 65504
    m = m.half().to("rbln")
    with torch.rbln.compare() as c:
        m(_x())
    first = c.first_divergence()
    op, mod = first["op"], first["module"]
    assert (mod["path"], op["op"], op["module"]) == ("1", "aten::linear", "1")
    assert op["nonfinite_actual"] > 0 and op["nonfinite_reference"] == 0
    assert op["ref_max"] > 65504
    for e in (op, mod):
        assert e["hint"].startswith("overflow: the golden reaches") and "bfloat16" in e["hint"]
    assert "hint: overflow" in c.report()


def test_backward_ops_are_compared_and_named_after_their_module():
    m, x = _model(), _x(grad=True)
    with testing.fault("aten::silu_backward", nth=1, amount=0.25, where="eager"):
        with torch.rbln.compare() as c:
            m(x).float().sum().backward()
    d = c.dump()
    backward = [e for e in d["ops"] if e["phase"] == "backward"]
    assert {e["op"] for e in backward} >= {"aten::silu_backward", "aten::linear_backward"}
    op = c.first_divergence()["op"]
    # the first backward of a SiLU runs for the last block
    assert (op["op"], op["phase"], op["node"], op["module"]) == (
        "aten::silu_backward", "backward", "SiluBackward0", "1.act")
    assert op["at"].startswith(f"{__file__}:{FORWARD_LINE}(forward)")     # its forward's line
    assert c.first_divergence()["module"] is None       # module outputs (forward) are right
    assert "aten::silu_backward (bw)" in c.report()


def test_a_clean_fp32_model_on_rbln_reports_no_divergence():
    m, x = _model(torch.float32), _x(torch.float32, grad=True)
    with torch.rbln.compare() as c:
        m(x).sum().backward()
    d = c.dump()
    assert c.first_divergence() is None
    assert d["counts"]["ops"] >= 10 and d["counts"]["modules"] == 9   # 1 + 2 blocks + 6 leaves
    assert any(e["phase"] == "backward" for e in d["ops"])
    assert all(e["worst"] <= 1 for e in d["ops"] + d["modules"])
    assert d["tolerances"] == {"float32": {"atol": 1e-4, "rtol": 1e-4}}
    assert c.report().startswith("[within tolerance]  RBLN COMPARE")


def test_a_kept_golden_copy_serves_later_blocks_and_follows_the_model():
    m, x = _model(torch.float32), _x(torch.float32)
    c = torch.rbln.compare(keep_golden=True)
    with c:
        m(x)
    first = c.dump()
    with c:             # the same model again: its copy serves, the report is this block's
        m(x)
    assert c._gold.builds == 1
    again = c.dump()
    assert [e["max_abs"] for e in again["modules"]] == [e["max_abs"] for e in first["modules"]]
    assert again["counts"] == first["counts"]
    # a stale copy would diverge from the device at once: each change must reach it
    with torch.no_grad():
        m[0].up.weight.add_(0.5)                        # in place: copied again
    with c:
        m(x)
    assert c.first_divergence() is None and c._gold.builds == 1
    m[1].down.weight = torch.nn.Parameter(m[1].down.weight.detach() * 2)   # a new parameter
    with c:
        m(x)
    assert c.first_divergence() is None and c._gold.builds == 2
    m[1].act = torch.nn.Tanh()                          # a new module
    with c:
        m(x)
    assert c.first_divergence() is None and c._gold.builds == 3
    m.eval()                                            # a mode
    with c:
        m(x)
    assert c._gold.builds == 4
    plain = torch.rbln.compare()                        # the default keeps nothing after a block
    with plain:
        m(x)
    assert plain._gold is None and plain.first_divergence() is None


def test_tolerances_come_from_the_table_and_can_be_overridden():
    m, x = _model(), _x()
    with testing.fault("aten::silu", nth=1, amount=0.5, where="eager"):
        with torch.rbln.compare(atol={torch.float16: 1.0}) as loose:
            m(x)
    assert loose.first_divergence() is None
    assert loose.dump()["tolerances"]["float16"] == {"atol": 1.0, "rtol": 1e-2}
    with pytest.raises(ValueError, match="float32 or float64"):
        torch.rbln.compare(golden="float16")
    with pytest.raises(KeyError, match="no tolerance for torch.int32"):
        tolerances.for_dtype(torch.int32)


def test_the_tolerance_table_is_the_one_docs_eager_shows():
    assert tolerances.markdown() in (ROOT / "docs" / "eager.md").read_text()


def test_compare_costs_nothing_outside_its_region():
    from torch.nn.modules import module as nn_module
    before = (dict(nn_module._global_forward_hooks), dict(nn_module._global_forward_pre_hooks),
              events._listeners)
    m, x = _model(), _x()
    with torch.rbln.compare():
        assert len(nn_module._global_forward_pre_hooks) == len(before[1]) + 1
        assert torch._C._len_torch_dispatch_stack() == 1
        m(x)
    after = (dict(nn_module._global_forward_hooks), dict(nn_module._global_forward_pre_hooks),
             events._listeners)
    assert after == before and torch._C._len_torch_dispatch_stack() == 0
    # nothing left that makes torch.compile(module) warn of global hooks afterwards
    assert not nn_module._has_any_global_hook()
    with torch.rbln.compare():
        with pytest.raises(RuntimeError, match="must not overlap"):
            with torch.rbln.compare():
                pass


# -- records and the command line ----------------------------------------------------------

LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)


def test_record_and_cli_cpu_fp32_against_rbln_fp16_find_the_live_first_divergence(
        tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    dev = copy.deepcopy(cpu).to(torch.float16).to("rbln")
    ids = torch.randint(0, LLAMA["vocab_size"], (1, 16))
    a, b, b_stats = tmp_path / "cpu-fp32", tmp_path / "rbln-fp16", tmp_path / "rbln-fp16-stats"
    fault = dict(op="aten::silu", nth=2, amount=0.5, where="eager")   # layer 1's MLP
    with torch.no_grad():
        with torch.rbln.compare.record(a, tensors=True):
            cpu(ids)
        with testing.fault(**fault):
            with torch.rbln.compare.record(b, tensors=True):
                dev(ids.to("rbln"))
        with testing.fault(**fault):
            with torch.rbln.compare.record(b_stats):
                dev(ids.to("rbln"))
        with testing.fault(**fault):
            with torch.rbln.compare() as live:
                dev(ids.to("rbln"))
    want = live.first_divergence()
    assert (want["module"]["path"], want["op"]["op"], want["op"]["module"]) == (
        "model.layers.1.mlp.act_fn", "aten::silu", "model.layers.1.mlp.act_fn")

    meta = json.loads((b / "meta.json").read_text())
    assert meta["devices"] == ["rbln"] and "float16" in meta["dtypes"] and meta["tensors"]
    assert json.loads((a / "meta.json").read_text())["devices"] == ["cpu"]
    line = json.loads((b / "index.jsonl").read_text().splitlines()[0])
    assert line["kind"] in ("op", "module") and line["outputs"][0]["sample"]

    for rec in (b, b_stats):            # the tensors, and the summaries alone
        code = cli([str(a), str(rec), "--json", str(tmp_path / "d.json")])
        out = capsys.readouterr().out
        assert code == 1
        d = json.loads((tmp_path / "d.json").read_text())
        got = d["first_divergence"]
        assert (got["module"]["path"], got["op"]["op"], got["op"]["module"]) == (
            want["module"]["path"], want["op"]["op"], want["op"]["module"])
        assert got["op"]["at"] == want["op"]["at"]
        assert out.startswith("[diverged: ")
        assert f"RBLN COMPARE   (B {rec.name} (rbln, float16/float32) against A cpu-fp32 (cpu, " \
               "float32))" in out
        assert "    module  model.layers.1.mlp.act_fn (SiLUActivation) float16: " in out
    assert "sampled" in out and d["modules"][0].get("sampled") == 64

    # the same run against itself: nothing diverges
    assert offline.compare_records(b, b)["first_divergence"] is None
    assert cli([str(a), str(tmp_path / "missing")]) == 2
    with pytest.raises(FileExistsError, match="not an empty directory"):
        torch.rbln.compare.record(a).__enter__()


def test_a_record_keeps_each_result_as_it_was_made_in_any_layout(tmp_path):
    """Results are reduced as they are made and written in batches: a result an op writes
    later in place, and results in other layouts (a transpose, a slice), are recorded as the
    CPU computes them."""
    torch.manual_seed(0)
    x = torch.randn(32, 48)

    def run(t):
        y = t * 2                       # written in place next: recorded before that
        y.add_(1)
        z = (t.t() * 3).t()             # a transposed result, read in its own layout
        return y, z, (t[:, ::2] + 1), torch.relu(t)

    dev = x.half().to("rbln")
    with torch.rbln.compare.record(tmp_path / "r"):
        run(dev)
    rec = load(tmp_path / "r")
    ops = {(e["op"], i): e for i, e in enumerate(rec.ops)}
    want = {"aten::mul.Tensor": [x.half() * 2, (x.half().t() * 3)],
            "aten::add_.Tensor": [x.half() * 2 + 1], "aten::add.Tensor": [x.half()[:, ::2] + 1],
            "aten::relu": [torch.relu(x.half())]}
    seen = {}
    for (op, _), e in sorted(ops.items(), key=lambda kv: kv[0][1]):
        ref = want[op][seen.get(op, 0)]
        seen[op] = seen.get(op, 0) + 1
        out = e["outputs"][0]
        assert out["shape"] == list(ref.shape) and out["nonfinite"] == 0
        assert (out["min"], out["max"]) == (ref.min().item(), ref.max().item())
        pos = stats.positions(ref.numel())
        assert torch.equal(rec.sample(out), ref.reshape(-1)[pos].float())
    assert sum(seen.values()) == 5


def test_errors_pair_elements_in_any_layout_like_row_major():
    torch.manual_seed(0)
    r = torch.randn(64, 48)
    a = r + 1e-3 * torch.randn(64, 48)
    a[3, 5] = 7.0
    want = stats.errors([a.contiguous()], [r.contiguous()], 1e-3, 1e-2)
    assert want["outside"] >= 1 and want["max_abs"] == pytest.approx(abs(7.0 - r[3, 5].item()))
    for got in (stats.errors([a.t()], [r.t()], 1e-3, 1e-2),               # one layout
                stats.errors([a.t().contiguous()], [r.t()], 1e-3, 1e-2),  # two layouts
                stats.errors([a.half().t()], [r.t()], 1e-3, 1e-2)):       # and a dtype
        assert got["numel"] == a.numel()
        assert got["outside"] >= 1 and got["max_abs"] == pytest.approx(want["max_abs"], 1e-3)
    same = stats.errors([a.t()], [r.t()], 1e-3, 1e-2)
    assert same == pytest.approx(want)



def test_errors_over_several_blocks_equal_one_pass_in_float64():
    # blocks of stats.CHUNK elements; an equal block among differing ones, a NaN, an Inf
    torch.manual_seed(1)
    n = 2 * stats.CHUNK + 100
    r = torch.randn(n)
    a = r.clone()
    a[stats.CHUNK:] += 1e-3 * torch.randn(n - stats.CHUNK)
    a[-1] = 9.0
    got = stats.errors([a], [r], 1e-3, 1e-2)
    a64, r64 = a.double(), r.double()
    d = (a64 - r64).abs()
    assert got["max_abs"] == pytest.approx(d.max().item(), rel=1e-6)
    assert got["ref_max"] == pytest.approx(r64.abs().max().item(), rel=1e-6)
    assert got["max_rel"] == pytest.approx((d / r64.abs().clamp_min(1e-3)).max().item(), 1e-5)
    assert got["outside"] == int((d > 1e-3 + 1e-2 * r64.abs()).sum())
    cos = torch.nn.functional.cosine_similarity(a64, r64, dim=0).item()
    assert got["cosine"] == pytest.approx(cos, abs=1e-6)
    a[5], r[7] = float("nan"), float("inf")
    got = stats.errors([a], [r], 1e-3, 1e-2)
    assert got["nonfinite_actual"] == 1 and got["nonfinite_reference"] == 1
    assert got["worst"] == float("inf")
    assert stats.errors([r], [r.clone()], 1e-3, 1e-2)["max_abs"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_error_pass_gives_the_numpy_pass_numbers(dtype, monkeypatch):
    # the native core's pass (csrc/Numerics.cpp) against stats.py's NumPy form: the maxima and
    # the count equal, the cosine within rounding (summed in double); every length around the
    # vector widths, both layouts, rtol or atol zero; NaN/Inf go the NumPy way
    torch.manual_seed(2)
    cases = []
    for n in (1, 7, 8, 9, 15, 16, 17, 33, 1000, 40_000):
        r = torch.randn(n, dtype=dtype) * 3
        a = (r + 2e-3 * torch.randn(n, dtype=dtype)).half().to(dtype)
        a[::5] = r[::5]
        cases.append(([a], [r]))
    m = torch.randn(48, 64, dtype=dtype)
    cases.append(([(m + 1e-2).t()], [m.t()]))                           # one layout, transposed
    cases.append(([m[:, ::2] + 1e-2, m.sum(1)], [m[:, ::2], m.sum(1) + 0.5]))   # two pairs

    def numpy_pass(a, r, atol, rtol):
        with monkeypatch.context() as mp:
            mp.setattr(stats, "_NATIVE", frozenset())
            return stats.errors(a, r, atol, rtol)

    for a, r in cases:
        for atol, rtol in ((1e-3, 1e-2), (1e-2, 0.0), (0.0, 1e-3)):
            assert stats._native(a, r, atol, rtol) is not None     # the native pass took it
            got, want = stats.errors(a, r, atol, rtol), numpy_pass(a, r, atol, rtol)
            assert got.keys() == want.keys()
            for k in want:
                if k == "cosine":
                    assert got[k] == pytest.approx(want[k], abs=1e-6)
                elif not (k == "max_rel" and atol == 0):    # NumPy's: NaN where 0 / 0
                    assert got[k] == want[k], (k, len(a[0]), atol, rtol)
    a, r = cases[6]
    a[0][3] = float("nan")
    assert stats._native(a, r, 1e-3, 1e-2) is None      # the NumPy pass counts NaN/Inf
    assert stats.errors(a, r, 1e-3, 1e-2)["nonfinite_actual"] == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_native_record_summary_gives_the_torch_summary(dtype, monkeypatch):
    # the native core's summary of a result (min, max, NaN/Inf count, samples) against
    # stats.py's torch form: every length around the vector widths, views in several layouts,
    # a NaN, an Inf, nothing finite
    def torch_form(t):
        with monkeypatch.context() as mp:
            mp.setattr(stats, "_SUMMARIZED", frozenset())
            s, x = stats.reduce(t)
            return s, stats.read_samples([x])[0]

    def floats(b):
        return torch.frombuffer(bytearray(b), dtype=torch.float32).nan_to_num(7.0) if b else b

    torch.manual_seed(3)
    for shape in ((), (7,), (31,), (32,), (33,), (40, 17), (64, 130), (3, 5, 7)):
        x = (torch.randn(shape) * 100).to(dtype)
        views = [x]
        if x.dim() >= 2:
            views += [x.transpose(0, 1), x[:, ::2], x.transpose(0, -1)]
        elif x.dim() == 1:
            views += [x.flip(0), x[1:]]
        for v in views:
            for poison in (None, "nan", "inf", "all"):
                w = v.clone() if poison else v
                if poison == "all":
                    w.fill_(float("nan"))
                elif poison:
                    w[tuple(i // 2 for i in w.shape)] = float(poison)
                s, samples = stats.reduce(w)
                assert type(samples) is bytes       # the native summary took it
                want_s, want_samples = torch_form(w)
                assert s == want_s, (shape, poison)
                assert torch.equal(floats(samples), floats(want_samples))
    if dtype in (torch.float32, torch.float64):     # finite values whose sums overflow
        big = torch.full((70,), 3e38, dtype=dtype)
        big[5] = -3e38
        assert stats.reduce(big)[0] == {"numel": 70, "min": big.min().item(),
                                        "max": big.max().item(), "nonfinite": 0}


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 64)
        self.head = torch.nn.Linear(64, 8, bias=False)
        self.head.weight = self.emb.weight                  # tied
        self.scale = torch.ones(64, dtype=torch.float16)    # a plain tensor attribute
        self.seen = []                                      # mutable state of its own
        self.register_forward_hook(lambda m, i, o: None)


class _OwnCopy(torch.nn.Linear):
    copies = 0

    def __deepcopy__(self, memo):
        type(self).copies += 1
        new = torch.nn.Linear(self.in_features, self.out_features)
        new.weight = torch.nn.Parameter(memo[id(self.weight)], requires_grad=False)
        new.bias = torch.nn.Parameter(memo[id(self.bias)], requires_grad=False)
        return new


def test_the_golden_copy_of_a_module_is_deepcopy_with_widened_tensors():
    from torch_rbln.compare import golden
    m = _Tied().half().to("rbln")
    m.scale = m.scale.to("rbln")
    found = {}
    g = golden.widened_copy(m, torch.float32, found)
    assert type(g) is _Tied and g is not m
    assert g.head.weight is g.emb.weight and isinstance(g.emb.weight, torch.nn.Parameter)
    assert g.emb.weight.dtype == torch.float32 and g.emb.weight.device.type == "cpu"
    assert torch.equal(g.emb.weight, m.emb.weight.cpu().float())
    assert g.scale.dtype == torch.float32 and g.scale.device.type == "cpu"
    assert g.seen is not m.seen and g._forward_hooks is not m._forward_hooks
    assert list(g._forward_hooks.values()) == list(m._forward_hooks.values())
    assert len(found) == 2
    # a module that copies itself is copied its own way
    wrapped = torch.nn.Sequential(_OwnCopy(64, 64)).half()
    g = golden.widened_copy(wrapped, torch.float32)
    assert _OwnCopy.copies == 1 and g[0].weight.dtype == torch.float32


# -- graph mode: the accuracy minifier --------------------------------------------------------

MINIFY = """
import torch, torch._dynamo
torch._dynamo.config.repro_after = "dynamo"
torch._dynamo.config.repro_level = 4
torch._dynamo.config.debug_dir_root = {root!r}

def f(x, w):
    return (torch.nn.functional.silu(x @ w) * 2).sum(-1)

x = torch.randn(64, 64, dtype=torch.float16, device="rbln")
w = torch.randn(64, 64, dtype=torch.float16, device="rbln")
try:
    torch.compile(f, backend="rbln")(x, w)
except Exception as e:
    e = getattr(e, "inner_exception", e)
    print(type(e).__name__, getattr(e, "minifier_path", ""))
"""


def _run(args, cwd, env_extra=None, timeout=600):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env=clean_env(env_extra), timeout=timeout)


def _launcher(tmp_path) -> str:
    script = tmp_path / "accuracy.py"
    script.write_text(MINIFY.format(root=str(tmp_path / "debug")))
    r = _run([str(script)], tmp_path, {testing.VAR: "graph:aten::silu"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Accuracy failed for the TorchDynamo produced graph" in r.stderr
    path = r.stdout.split()[-1]
    assert path.endswith("minifier_launcher.py") and os.path.isfile(path), r.stdout
    return path


def test_an_accuracy_failure_under_the_rbln_backend_writes_the_minifier_launcher(tmp_path):
    """Dynamo's accuracy check (repro_level=4) compares the rbln-compiled graph with eager and
    writes a launcher that finds the rbln backend and rbln tensors again."""
    import torch._dynamo

    def f(x):
        return torch.nn.functional.silu(x) * 2

    x = torch.randn(8, 64, dtype=torch.float16).to("rbln")
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(repro_after="dynamo", repro_level=4,
                                         debug_dir_root=str(tmp_path)), \
                testing.fault("aten::silu", where="graph"):
            with pytest.raises(Exception) as info:
                torch.compile(f, backend="rbln")(x)
            # eager keeps the right values: the fault is the graph's alone
            torch.testing.assert_close(f(x).cpu(), f(x.cpu().float()).half(), atol=1e-2,
                                       rtol=1e-2)
    finally:
        torch._dynamo.reset()
    err = getattr(info.value, "inner_exception", info.value)
    assert type(err).__name__ == "AccuracyError"
    src = open(err.minifier_path).read()
    assert "backend='rbln'" in src and "device=device(type='rbln', index=0)" in src
    assert "os.environ['TORCH_RBLN_TEST_FAULT'] = 'graph:aten::silu'" in src


@pytest.mark.slow
def test_the_minifier_narrows_the_faulty_graph_to_the_faulty_op(tmp_path):
    launcher = _launcher(tmp_path)
    folder = os.path.dirname(launcher)
    # the launcher runs on its own and shows the accuracy failure of the rbln backend
    r = _run([launcher, "run"], folder)
    assert r.returncode != 0 and "AccuracyError: Dynamo failed" in r.stderr, r.stderr[-3000:]
    r = _run([launcher], folder)
    assert r.returncode == 0 and "Wrote minimal repro out to repro.py" in r.stdout + r.stderr
    repro = open(os.path.join(folder, "repro.py")).read()
    body = repro[repro.index("def forward"):repro.index("mod = Repro()")]
    assert "silu" in body and "@" not in body and "sum" not in body     # the faulty op alone
    r = _run([os.path.join(folder, "repro.py")], folder)
    assert r.returncode != 0 and "AccuracyError: Dynamo failed" in r.stderr
