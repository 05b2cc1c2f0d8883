"""Graph mode places nodes by the RBLN compiler's op table (dispatch/compiler_optable.py)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_rbln import events
from torch_rbln.dispatch import compiler_optable
from torch_rbln.explain import remedies
from torch_rbln.graph import placement

TOL = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _h(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float16) * scale


def _warm(fn, *args):
    """Compile ``fn`` on rbln, call it cold, then explain a warm call: (result, dump, program)."""
    compiled = torch.compile(fn, backend="rbln", fullgraph=True, dynamic=False)
    rargs = [a.to("rbln") for a in args]
    with torch.no_grad(), torch.rbln.capture_programs() as programs:
        compiled(*rargs)
        with torch.rbln.explain() as p:
            out = compiled(*rargs)
    return out, p, programs[0]


# the functions of issue 20: each op is accelerated by the compiler (or an eager device op)
CASES = {
    "exp_cos": (lambda x: torch.exp(x) + torch.cos(x), lambda: (_h(8, 64),),
                {"aten::exp", "aten::cos"}),
    "amax_amin": (lambda x: x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True),
                  lambda: (_h(8, 64),), {"aten::amax", "aten::amin"}),
    "addcdiv": (lambda a, b, c: torch.addcdiv(torch.addcmul(a, b, c), b, c.abs() + 1),
                lambda: (_h(8, 64), _h(8, 64), _h(8, 64)), {"aten::addcmul", "aten::addcdiv"}),
    "baddbmm": (lambda a, b, c: torch.baddbmm(a, b, c),
                lambda: (_h(2, 64, 64), _h(2, 64, 64, scale=0.1), _h(2, 64, 64, scale=0.1)),
                {"aten::baddbmm"}),
    "flip": (lambda x: torch.flip(x, [-1]) * 2, lambda: (_h(8, 64),), {"aten::flip"}),
    "cumsum": (lambda x: torch.cumsum(x, -1), lambda: (_h(8, 64),), {"aten::cumsum"}),
    "unaligned": (lambda a, b: (a + b) * a, lambda: (_h(8, 100), _h(8, 100)),
                  {"aten::add.out", "aten::mul.out"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiler_accelerated_functions_run_without_host_nodes(name):
    fn, make, device_ops = CASES[name]
    torch.manual_seed(0)
    args = make()
    out, p, prog = _warm(fn, *args)
    expected = fn(*[a.float() for a in args])
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)
    d = p.dump()
    assert d["dispatch"]["cpu_fallback"] == 0, p.report()
    assert d["graph"]["by_where"]["host"] == 0 and d["graph"]["by_where"]["in-program"] == 0
    assert device_ops <= {r["op"] for r in d["graph"]["nodes"] if r["where"] == "device"}
    assert prog.device_partitions == 1 and prog.host_partitions == 0 and prog.host_ops == ()
    assert d["runtime_residency"]["real_host_sync_d2h"]["count"] == 0
    assert "host nodes" in p.report()       # the graph mode line: where each node ran


def test_report_names_each_node_and_its_compiler_row():
    _, p, _ = _warm(CASES["exp_cos"][0], _h(8, 64))
    r = p.report()
    assert r.startswith("[clean]")
    assert "  graph mode: 3 device nodes, 0 in program (host side), 0 host nodes" in r
    assert "torch.exp: supported, accelerated" in r and "torch.cos: supported, accelerated" in r


def test_unaligned_partition_is_compiled_whole_and_padded_once():
    _, p, prog = _warm(CASES["unaligned"][0], _h(8, 100), _h(8, 100))
    pad = p.dump()["graph"]["padding"]
    assert pad == {"count": 1, "bytes": 3 * 28 * 8 * 2}       # two inputs and the result
    assert prog.padded == (("device_0", pad["bytes"]),)
    assert p.dump()["graph"]["rules"]["last_dim"] == compiler_optable.LAST_DIM
    assert "last dim padded to 64 at partition boundaries: 1x" in p.report()


def test_cumsum_off_its_64_rule_stays_in_the_program_on_its_host_side():
    x = _h(8, 96)
    out, p, prog = _warm(lambda a: torch.cumsum(a * 2, -1) + 1, x)
    torch.testing.assert_close(out.cpu().float(), torch.cumsum(x.float() * 2, -1) + 1, **TOL)
    assert prog.in_program_ops == (("aten::cumsum", "torch.cumsum: supported, accelerated when "
                                                    "the input's last dim is a multiple of 64"),)
    # no extra partition and no transfer around it
    assert prog.device_partitions == 1 and prog.host_partitions == 0
    d = p.dump()
    assert d["dispatch"]["cpu_fallback"] == 0 and d["graph"]["by_where"]["in-program"] == 1
    assert d["runtime_residency"]["real_host_sync_d2h"]["count"] == 0


def test_supported_not_accelerated_ops_add_no_partition():
    x = _h(8, 64)
    out, p, prog = _warm(lambda a: (torch.erf(a * 2) * 3, torch.argmax(a, -1)), x)
    torch.testing.assert_close(out[0].cpu().float(), torch.erf(x.float() * 2) * 3, **TOL)
    assert torch.equal(out[1].cpu(), torch.argmax(x, -1))
    assert sorted(op for op, _ in prog.in_program_ops) == ["aten::argmax", "aten::erf"]
    assert prog.device_partitions == 1 and prog.host_partitions == 0 and prog.host_ops == ()
    nodes = p.dump()["graph"]["nodes"]
    assert {"where": "in-program", "op": "aten::erf", "count": 1,
            "why": "torch.erf: supported, not accelerated"} in nodes
    assert "    in program  aten::erf" in p.report()


def test_eager_dtype_rule_is_kept_and_the_tip_does_not_suggest_graph_mode():
    x = _h(8, 64)
    out, p, prog = _warm(lambda a: torch.cos(a.float() * 2).half() + a, x)
    torch.testing.assert_close(out.cpu().float(), torch.cos(x.float() * 2) + x.float(), **TOL)
    assert ("aten::cos", "dtype-not-fp16") in prog.host_ops
    host = [r for r in p.dump()["graph"]["nodes"] if r["where"] == "host"]
    assert {"op": "aten::cos", "where": "host", "count": 1,
            "why": "dtype-not-fp16 | torch.cos: supported, accelerated"} in host
    r = p.report()
    assert "try: cast to fp16/bf16 (already graph mode)" in r
    assert "graph mode, or" not in r
    assert "graph mode (torch.compile" not in p.help("dispatch/cpu_fallback")


def test_ops_without_a_row_keep_their_host_placement():
    _, p, prog = _warm(lambda a: torch.sin(a) * 2, _h(8, 64))
    assert prog.host_ops == (("aten::sin", "no-device-kernel"),)
    assert "try: host op in graph mode too; see why:" in p.report()


def _dump(by_op, reasons, graph_host=()):
    d = {"cpu_fallback_by_op": by_op, "cpu_fallback_reasons": reasons}
    if graph_host:
        d["graph"] = {"nodes": [{"where": "host", "op": op, "why": "", "count": n}
                                for op, n in graph_host]}
    return d


def test_eager_fallback_tip_names_graph_mode_only_for_ops_the_compiler_accelerates():
    graph_tip = remedies.SHORT_FIX["cpu_fallback"]
    assert "graph mode" in graph_tip
    # accelerated rows, and eager device ops (their rows were not retrieved)
    assert remedies.fallback_fix(_dump({"aten::add.out": 1}, {"dtype-not-fp16": 1}))[0] == graph_tip
    assert remedies.fallback_fix(_dump({"aten::mul.out": 1}, {"dtype-not-fp16": 1}))[0] == graph_tip
    assert remedies.fallback_fix(_dump({"aten::flip": 1}, {"no-device-kernel": 1}))[0] == graph_tip
    # supported only, or no row: graph mode would not move them
    for op in ("aten::argmax", "aten::sin"):
        tip = remedies.fallback_fix(_dump({op: 1}, {"no-device-kernel": 1}))[0]
        assert "graph mode" in tip and tip != graph_tip
    # already in a graph
    d = _dump({"aten::add.out": 2}, {"dtype-not-fp16": 2}, [("aten::add.out", 2)])
    assert remedies.fallback_case(d) == "graph-dtype"
    d = _dump({"aten::add.out": 3}, {"dtype-not-fp16": 3}, [("aten::add.out", 2)])
    assert remedies.fallback_case(d) == "eager"


def test_rows_cover_the_reference_and_say_where_it_stops():
    rows = {r.name: r for r in compiler_optable.ROWS}
    assert rows["torch.cumsum"].condition == "last-dim-64"
    assert not rows["torch.erf"].accelerated and rows["torch.exp"].accelerated
    assert all(r.source for r in compiler_optable.ROWS)
    # alphabetical, and nothing past the last retrieved row
    names = [r.name for r in compiler_optable.ROWS]
    assert names == sorted(names) and names[-1] == compiler_optable.RETRIEVED_THROUGH
    assert compiler_optable.accelerates("aten::sin") is None
    assert compiler_optable.accelerates("aten::argmax") is False


def _covered(node: torch.fx.Node) -> bool:
    p = placement.place(node)
    return p.where in ("device", "in-program", "free")


@pytest.mark.parametrize("name", compiler_optable.DECOMPOSE)
def test_each_decomposition_reaches_covered_primitives(name):
    aten = torch.ops.aten
    x = torch.randn(4, 64, dtype=torch.float16, device="rbln")
    mask = torch.rand(4, 64, device="rbln") > 0.5
    call = {"threshold_backward": lambda a: aten.threshold_backward(a, a, 0.0),
            "rsub": lambda a: aten.rsub(a, 1.0),
            "native_dropout_backward": lambda a: aten.native_dropout_backward(a, mask, 2.0)}[name]
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        gm = make_fx(call, decomposition_table=compiler_optable.decompositions(),
                     tracing_mode="fake")(mode.from_tensor(x))
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert ops and all(_covered(n) for n in ops), [(n.target, placement.place(n)) for n in ops]
    assert all(n.target.overloadpacket.__name__ != name for n in ops)


def test_rsub_in_a_graph_is_a_device_sub():
    before = events.snapshot()["cpu_fallback"]
    x = _h(8, 64)
    out, p, prog = _warm(lambda a: 1 - a * 2, x)
    torch.testing.assert_close(out.cpu().float(), 1 - x.float() * 2, **TOL)
    assert prog.host_ops == () and events.snapshot()["cpu_fallback"] == before
    assert any(op == "aten::sub.out" for w, op, _ in prog.nodes if w == "device")


def test_padding_with_a_dynamic_batch_counts_by_size_hints():
    x = _h(128, 100)
    xr = x.to("rbln")
    torch._dynamo.mark_dynamic(xr, 0)
    f = torch.compile(lambda a: a * 2 + 1, backend="rbln")
    with torch.no_grad(), torch.rbln.capture_programs() as programs:
        out = f(xr)
    torch.testing.assert_close(out.cpu().float(), x.float() * 2 + 1, **TOL)
    assert any(isinstance(d, str) for s in programs[0].input_specs for d in s.shape)
    assert programs[0].padded == (("device_0", 2 * 28 * 128 * 2),)
