"""Graph mode: torch.compile(backend="rbln") on the virtual NPU."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from conftest import run_code
from torch_rbln import events

# fp16 tolerance for a graph (fused, fp32 inside kernels) against eager (rounded per op)
TOL = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _delta(before: dict, kind: str) -> dict:
    now = events.snapshot()[kind]
    out = {}
    for k, (n, _) in now.items():
        d = n - before[kind].get(k, [0, 0])[0]
        if d:
            out[k] = d
    return out


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 256), nn.SiLU(), nn.Linear(256, 64)).half()


def _cpu(t):
    return t.detach().cpu().float()


def test_backend_registered_lazily_by_import_torch():
    r = run_code(
        "import sys, torch\n"
        "assert 'torch_rbln.graph' not in sys.modules and 'torch._dynamo' not in sys.modules\n"
        "from torch._dynamo.backends.registry import list_backends, lookup_backend\n"
        "assert 'rbln' in list_backends(), list_backends()\n"
        "print(lookup_backend('rbln').__module__)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "torch_rbln.graph.backend"


def test_mlp_forward_matches_eager_in_one_graph():
    m = _mlp().to("rbln")
    x = torch.randn(8, 128, dtype=torch.float16).to("rbln")
    with torch.no_grad():
        eager = _cpu(m(x))
        compiled = torch.compile(m, backend="rbln", fullgraph=True)
        with torch.rbln.capture_programs() as programs:
            y = compiled(x)
    assert y.device.type == "rbln"
    torch.testing.assert_close(_cpu(y), eager, **TOL)
    assert [(p.name, p.kind) for p in programs] == [("0/0", "inference")]
    p = programs[0]
    assert p.device == torch.device("rbln:0")
    assert p.device_partitions == 1 and p.host_ops == ()
    assert [s.shape for s in p.output_specs] == [(8, 64)]
    assert sorted(s.shape for s in p.input_specs) == sorted(
        [(256, 128), (256,), (64, 256), (64,), (8, 128)])


def test_mlp_training_step_matches_eager():
    def step(model, fwd, x, t):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loss = ((fwd(x) - t) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    m = _mlp().to("rbln")
    mc = copy.deepcopy(m)
    x = torch.randn(64, 128, dtype=torch.float16).to("rbln")
    t = torch.randn(64, 64, dtype=torch.float16).to("rbln")
    le = step(m, m, x, t)
    compiled = torch.compile(mc, backend="rbln", fullgraph=True)
    with torch.rbln.capture_programs() as programs:
        lc = step(mc, compiled, x, t)
    torch.testing.assert_close(_cpu(lc), _cpu(le), **TOL)
    for (name, p), (_, q) in zip(m.named_parameters(), mc.named_parameters()):
        torch.testing.assert_close(_cpu(q), _cpu(p), **TOL, msg=name)
    assert [(p.name, p.kind) for p in programs] == [("0/0", "forward"), ("0/0", "backward")]


def test_op_without_device_kernel_reported_as_cpu_fallback():
    def f(x, w):
        y = x @ w
        return torch.sin(y) * 2 + y

    x = torch.randn(64, 128, dtype=torch.float16)
    w = torch.randn(128, 64, dtype=torch.float16) * 0.1
    xr, wr = x.to("rbln"), w.to("rbln")
    eager = _cpu(f(xr, wr))
    compiled = torch.compile(f, backend="rbln", fullgraph=True)
    before = events.snapshot()
    with torch.rbln.capture_programs() as programs:
        y = compiled(xr, wr)
    torch.testing.assert_close(_cpu(y), eager, **TOL)
    torch.testing.assert_close(_cpu(y), f(x.float(), w.float()), **TOL)
    assert programs[0].host_ops == (("aten::sin", "no-device-kernel"),)
    assert programs[0].device_partitions == 2          # the matmul, then the mul/add after sin
    assert _delta(before, "cpu_fallback") == {"aten::sin": 1}
    assert _delta(before, "cpu_fallback_reason") == {"no-device-kernel": 1}
    # the device result crosses to the host for sin, and sin's result back to the device
    assert _delta(before, "d2h") and _delta(before, "h2d")


def test_fused_host_partition_rounds_each_op_as_eager():
    # two fp16 host ops in one host partition, compiled to one host kernel: each result is
    # rounded to fp16 as the op-by-op fallback does (rounding once would differ)
    def f(x):
        return torch.sin(torch.sin(x))

    x = torch.randn(64, 128, dtype=torch.float16)
    xr = x.to("rbln")
    eager = f(xr).cpu()
    before = events.snapshot()
    with torch.rbln.capture_programs() as programs:
        y = torch.compile(f, backend="rbln", fullgraph=True)(xr)
    assert torch.equal(y.cpu(), eager) and torch.equal(eager, f(x))
    assert programs[0].host_partitions == 1 and programs[0].device_partitions == 0
    assert _delta(before, "cpu_fallback") == {"aten::sin": 2}


def test_host_partition_with_a_random_op_draws_as_eager():
    # Inductor draws its own random numbers: such a host partition runs op by op
    def f(x):
        return torch.rand_like(x) + torch.sin(x)

    xr = torch.randn(64, 128, dtype=torch.float16).to("rbln")
    torch.manual_seed(0)
    eager = f(xr).cpu()
    compiled = torch.compile(f, backend="rbln", fullgraph=True)
    with torch.rbln.capture_programs() as programs:
        torch.manual_seed(0)
        y = compiled(xr)
    assert torch.equal(y.cpu(), eager)
    assert programs[0].host_ops == (("aten::rand_like", "no-device-kernel"),
                                    ("aten::sin", "no-device-kernel"))


def test_graph_keeps_eager_dtype_rule_and_pads_unaligned_last_dims():
    def f(x):
        return (x.float() * 2).half() + x, x[:, :32] * 3

    x = torch.randn(16, 64, dtype=torch.float16)
    compiled = torch.compile(f, backend="rbln", fullgraph=True)
    before = events.snapshot()
    with torch.rbln.capture_programs() as programs:
        y, z = compiled(x.to("rbln"))
    torch.testing.assert_close(_cpu(y), x.float() * 3, **TOL)
    torch.testing.assert_close(_cpu(z), x[:, :32].float() * 3, **TOL)
    # the compiler table has no dtype column: fp32 stays on the host, as in eager; the
    # unaligned [16, 32] result is padded at the device partition's boundary instead
    assert programs[0].host_ops == (("aten::mul.out", "dtype-not-fp16"),)
    assert _delta(before, "cpu_fallback") == {"aten::mul.out": 1}
    assert _delta(before, "cpu_fallback_reason") == {"dtype-not-fp16": 1}
    assert [b for _, b in programs[0].padded] == [32 * 16 * 2]


_lib = torch.library.Library("rbln_graph_test", "DEF")
_lib.define("scaled(Tensor x, float s) -> Tensor")
_lib.define("scale_into(Tensor x, float s, Tensor(a!) out) -> ()")
_seen = []


def _scaled(x, s):
    _seen.append(x.device.type)
    return x * s                       # an eager device op inside the library's own kernel


def _scale_into(x, s, out):
    _seen.append(out.device.type)
    out.copy_(x * s)


_lib.impl("scaled", _scaled, "PrivateUse1")
_lib.impl("scale_into", _scale_into, "PrivateUse1")
_lib._register_fake("scaled", lambda x, s: torch.empty_like(x))
_lib._register_fake("scale_into", lambda x, s, out: None)


def test_custom_op_with_its_own_rbln_kernel_runs_eagerly_between_partitions():
    # a library's opaque op (vLLM's attention is one) keeps its rbln kernel in a graph: it is
    # called with the rbln tensors, also when it mutates an argument (auto_functionalized)
    def f(x):
        y = torch.ops.rbln_graph_test.scaled(x * 2, 3.0)
        out = torch.empty_like(y)
        torch.ops.rbln_graph_test.scale_into(y + 1, 0.5, out)
        return out - 1

    x = torch.randn(16, 64, dtype=torch.float16)
    xr = x.to("rbln")
    eager = _cpu(f(xr))
    _seen.clear()
    before = events.snapshot()
    with torch.rbln.capture_programs() as programs:
        y = torch.compile(f, backend="rbln", fullgraph=True)(xr)
    torch.testing.assert_close(_cpu(y), eager, **TOL)
    torch.testing.assert_close(_cpu(y), (x.float() * 6 + 1) * 0.5 - 1, **TOL)
    assert _seen == ["rbln", "rbln"]
    assert programs[0].host_ops == ()
    assert _delta(before, "cpu_fallback") == {}


def test_cpu_tensors_in_a_graph_stay_on_the_cpu_unreported():
    f = torch.compile(lambda x, y: (x.to("rbln") * 2, torch.sin(y) + 1), backend="rbln")
    x, y = torch.randn(64, dtype=torch.float16), torch.randn(8)
    before = events.snapshot()
    a, b = f(x, y)
    assert a.device.type == "rbln" and b.device.type == "cpu"
    torch.testing.assert_close(_cpu(a), x.float() * 2, **TOL)
    torch.testing.assert_close(b, torch.sin(y) + 1)
    assert _delta(before, "cpu_fallback") == {}


def test_recompile_per_shape_with_dynamo_compile_ids():
    f = torch.compile(lambda x: torch.relu(x) * x + 1, backend="rbln")
    with torch.rbln.capture_programs() as programs, torch.no_grad():
        for n in (64, 64, 128):
            f(torch.randn(n, 64, dtype=torch.float16).to("rbln"))
    assert [p.name for p in programs] == ["0/0", "0/1"]


def test_dynamic_avoids_shape_recompiles():
    f = torch.compile(lambda x: x * x + 1, backend="rbln", dynamic=True)
    before = events.snapshot()
    with torch.rbln.capture_programs() as programs, torch.no_grad():
        for n in (128, 192, 256):      # not 64 first: duck sizing would tie it to the last dim
            x = torch.randn(n, 64, dtype=torch.float16)
            torch.testing.assert_close(_cpu(f(x.to("rbln"))), x.float() * x.float() + 1, **TOL)
    assert len(programs) == 1
    assert any(isinstance(d, str) for s in programs[0].input_specs for d in s.shape)
    assert _delta(before, "recompile") == {"graph 0/0": 1}
    assert _delta(before, "cpu_fallback") == {}           # shape arithmetic is not an op


def test_explain_steady_over_compiled_forward():
    m = _mlp().to("rbln")
    compiled = torch.compile(m, backend="rbln", fullgraph=True)
    x64 = torch.randn(64, 128, dtype=torch.float16).to("rbln")
    with torch.no_grad():
        cold, warm = torch.rbln.explain_steady(lambda: compiled(x64), return_cold=True)
        assert cold.dump()["recompile_by_op"] == {"graph 0/0": 1}
        assert warm.verdict()["clean"], warm.report()
        x128 = torch.randn(128, 128, dtype=torch.float16).to("rbln")
        with torch.rbln.explain() as p:
            compiled(x128)
    assert p.dump()["recompile_by_op"] == {"graph 0/1": 1}


def test_empty_cache_and_dynamo_reset_drop_compiled_programs():
    f = torch.compile(lambda x: x * 2 + x, backend="rbln")
    x = torch.randn(64, 64, dtype=torch.float16).to("rbln")
    with torch.no_grad():
        f(x)
        before = events.snapshot()
        f(x)
        assert _delta(before, "recompile") == {}
        torch.rbln.empty_cache()
        y = f(x)
        assert _delta(before, "recompile") == {"graph 0/0": 1}
        torch.testing.assert_close(_cpu(y), _cpu(x) * 3, **TOL)
        torch._dynamo.reset()
        with torch.rbln.capture_programs() as programs:
            f(x)
    assert [p.name for p in programs] == ["0/0"]


def test_capture_programs_nested_and_thread_local():
    f = torch.compile(lambda x: x + 1, backend="rbln")
    g = torch.compile(lambda x: x - 1, backend="rbln")
    x = torch.randn(64, dtype=torch.float16).to("rbln")
    with torch.rbln.capture_programs() as outer, torch.no_grad():
        with torch.rbln.capture_programs() as inner:
            f(x)
        t = threading.Thread(target=lambda: g(x))
        t.start()
        t.join()
    assert len(inner) == 1 and len(outer) == 1 and outer[0] is inner[0]


def test_unknown_option_is_rejected():
    f = torch.compile(lambda x: x + 1, backend="rbln", options={"bogus": 1})
    with pytest.raises(Exception, match="unknown rbln options"):
        f(torch.ones(64, dtype=torch.float16).to("rbln"))


@pytest.mark.parametrize("kwargs", [{"options": {"mode": "compile_only"}},
                                    {"options": {"mode": {"compile_only"}}},
                                    {"mode": "compile_only"}])
def test_compile_only_mode_is_refused_clearly(kwargs):
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="rbln", **kwargs)
    with pytest.raises(Exception, match="rbln mode .*compile_only.* is not supported"):
        f(torch.ones(64, dtype=torch.float16).to("rbln"))


# ------------------------------------------------------------------------------------------
# a small Hugging Face Llama (random weights, fp16)

def _llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=512,
                                   max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).half()


def test_llama_forward_matches_eager_and_recompiles_once_per_new_length():
    m = _llama().eval().to("rbln")
    ids = torch.randint(0, 512, (1, 64)).to("rbln")
    compiled = torch.compile(m, backend="rbln", fullgraph=True)
    with torch.no_grad():
        eager = _cpu(m(ids, use_cache=False).logits)
        with torch.rbln.capture_programs() as programs:
            y = compiled(ids, use_cache=False).logits
        torch.testing.assert_close(_cpu(y), eager, **TOL)
        assert [p.name for p in programs] == ["0/0"]
        before = events.snapshot()
        compiled(torch.randint(0, 512, (1, 128)).to("rbln"), use_cache=False)
    recompiles = _delta(before, "recompile")
    assert recompiles == {"graph 0/1": 1}
    # by the compiler's table: only the eager dtype rule (the fp32 RMSNorm and rotary chains,
    # integer mask arithmetic) and ops without a row or kernel keep nodes on the host
    p = programs[0]
    assert {r for _, r in p.host_ops} == {"dtype-not-fp16", "no-device-kernel"}
    assert ("aten::bitwise_and.Tensor", "torch.bitwise_and: supported, not accelerated") in \
        p.in_program_ops


@pytest.mark.slow
def test_llama_training_step_matches_eager():
    m, mc = _llama().to("rbln"), _llama().to("rbln")      # same seed, same weights
    ids = torch.randint(0, 512, (1, 64)).to("rbln")

    def step(model, fwd):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = fwd(ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        return loss

    le = step(m, m)
    lc = step(mc, torch.compile(mc, backend="rbln", fullgraph=True))
    torch.testing.assert_close(_cpu(lc), _cpu(le), **TOL)
    for (name, p), (_, q) in zip(m.named_parameters(), mc.named_parameters()):
        torch.testing.assert_close(_cpu(q), _cpu(p), atol=5e-2, rtol=5e-2, msg=name)


@pytest.mark.parametrize("n", [32, 64, 96, 128])
def test_graph_last_dim_is_padded_at_the_partition_boundary(n):
    x = torch.randn(4, n, dtype=torch.float16)
    compiled = torch.compile(lambda a: a * 3 + a, backend="rbln", dynamic=False)
    before = events.snapshot()
    with torch.rbln.capture_programs() as programs:
        y = compiled(x.to("rbln"))
    torch.testing.assert_close(_cpu(y), x.float() * 4, **TOL)
    p = programs[0]
    assert p.device_partitions == 1 and p.host_ops == () and p.host_partitions == 0
    pad = (-n % 64) * 4 * 2 * 2          # the input and the result, fp16
    assert p.padded == ((("device_0", pad),) if pad else ())
    assert _delta(before, "graph_pad") == ({"graph 0/0 device_0": 1} if pad else {})
    assert _delta(before, "cpu_fallback") == {}


def test_graph_last_dim_rule_for_zero_dim_and_one_element_operands():
    x, s, one = (torch.randn(4, 64, dtype=torch.float16), torch.tensor(2.0, dtype=torch.float16),
                 torch.randn(1, dtype=torch.float16))
    compiled = torch.compile(lambda a, b, c: (a * b, c * c), backend="rbln", dynamic=False)
    with torch.rbln.capture_programs() as programs:
        y, z = compiled(x.to("rbln"), s.to("rbln"), one.to("rbln"))
    torch.testing.assert_close(_cpu(y), x.float() * 2, **TOL)
    torch.testing.assert_close(_cpu(z), one.float() * one.float(), **TOL)
    # both on the device; only the one-element c (and c * c) is padded: a 0-d b has no last dim
    assert programs[0].device_partitions == 1 and programs[0].host_ops == ()
    assert programs[0].padded == (("device_0", 2 * 63 * 2),)


def test_few_row_matmuls_keep_the_half_kernel_of_eager():
    """A decode-shaped Linear (2 rows, a large weight) in a graph gives eager's exact values:
    the half-precision kernel, not a per-call fp32 copy of the weight (which costs more than
    the GEMM and rounds differently)."""
    torch.manual_seed(0)
    x = torch.randn(2, 2048, dtype=torch.float16).to("rbln")
    w = (torch.randn(4096, 2048, dtype=torch.float16) * 0.02).to("rbln")
    with torch.no_grad():
        eager = nn.functional.linear(x, w)
        graph = torch.compile(nn.functional.linear, backend="rbln")(x, w)
    assert torch.equal(graph.cpu(), eager.cpu())


def test_results_keep_the_residency_their_values_reached():
    # a device partition's result is the device's only (a read moves it to the host); one
    # the host also read inside the graph is on both sides (a read moves nothing); each is
    # an rbln tensor of its own that later eager ops and writes treat as any other
    def f(x, w):
        y = x @ w               # a device result, returned as is
        s = torch.sin(y)        # read by the host: y's value is synced there
        return y, y * 2, s

    x = torch.randn(64, 128, dtype=torch.float16)
    w = torch.randn(128, 64, dtype=torch.float16) * 0.1
    xr, wr = x.to("rbln"), w.to("rbln")
    compiled = torch.compile(f, backend="rbln", fullgraph=True)
    compiled(xr, wr)
    mem0 = torch.rbln.memory_allocated()
    y, y2, s = compiled(xr, wr)
    # y and y2 hold device memory; s, made on the host and never read by the device, has none
    assert torch.rbln.memory_allocated() - mem0 == 2 * 64 * 64 * 2
    states = [torch_rbln_state(t) for t in (y, y2, s)]
    assert states == ["synced", "device", "host"], states
    before = events.snapshot()
    ref = f(x.float(), w.float())
    for t, r in zip((y, y2, s), ref):
        torch.testing.assert_close(_cpu(t), r, **TOL)
    assert sum(n for _, n in _delta_amounts(before, "d2h")) == 64 * 64 * 2   # y2's bytes only
    # each result owns its memory: writing one leaves the others and the next call alone
    y.add_(1)
    y2.zero_()
    torch.testing.assert_close(_cpu(y), ref[0] + 1, **TOL)
    y3, y4, _ = compiled(xr, wr)
    torch.testing.assert_close(_cpu(y3), ref[0], **TOL)
    torch.testing.assert_close(_cpu(y4), ref[1], **TOL)
    assert not _cpu(y2).any()


def torch_rbln_state(t) -> str:
    from torch_rbln.runtime.storage import DEVICE, HOST, SYNCED, state_of
    return {DEVICE: "device", HOST: "host", SYNCED: "synced"}[state_of(t).residency]


def _delta_amounts(before: dict, kind: str) -> list:
    now = events.snapshot()[kind]
    return [(k, a - before[kind].get(k, [0, 0])[1]) for k, (n, a) in now.items()
            if n != before[kind].get(k, [0, 0])[0]]
