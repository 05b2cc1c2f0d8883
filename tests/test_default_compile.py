"""``torch.compile(f)`` with the default backend on rbln tensors runs through the rbln graph
backend (docs/graph-mode.md ("Graph mode")); run in a fresh process. Inductor itself is replaced by a
recorder here, so the test checks where each graph goes without compiling C++ (the rbln backend
compiles its own partitions with Inductor too: those calls are not counted)."""

from __future__ import annotations

from conftest import run_json


def test_default_compile_on_rbln_runs_the_rbln_backend():
    out = run_json("""
    import sys
    import torch._inductor.compile_fx as cfx
    inductor_calls = []
    def recorder(gm, inputs, **kwargs):
        if sys._getframe(1).f_code.co_name != "_inductor":    # not an rbln partition
            inductor_calls.append(len(inputs))
        return gm.forward
    cfx.compile_fx = recorder

    def f(x):
        return torch.sin(x) * 2 + x                  # fp32: host nodes, nothing to fuse

    def make():
        return torch.ones(4, 16, device="rbln") * 3  # no rbln input, an rbln value inside

    x = torch.randn(8, 16)
    res = {}
    with torch.rbln.explain() as e:
        y = torch.compile(f)(x.to("rbln"))
        z = torch.compile(f, fullgraph=True, mode="reduce-overhead")(x.to("rbln") + 1)
        m = torch.compile(make)()
    res["rbln"] = [str(y.device), torch.allclose(y.cpu(), f(x)),
                   str(z.device), torch.allclose(z.cpu(), f(x + 1)),
                   str(m.device), torch.equal(m.cpu(), torch.full((4, 16), 3.0))]
    res["graphs"] = sorted(e.dump()["recompile_by_op"])
    res["inductor_for_rbln"] = list(inductor_calls)
    c = torch.compile(f)(x)                          # CPU tensors: Inductor as before
    res["cpu"] = [str(c.device), torch.allclose(c, f(x)), len(inductor_calls)]
    print(json.dumps(res))
    """)
    assert out["rbln"] == ["rbln:0", True, "rbln:0", True, "rbln:0", True]
    assert len([g for g in out["graphs"] if g.startswith("graph ")]) == 3   # one per graph
    assert out["inductor_for_rbln"] == []
    assert out["cpu"] == ["cpu", True, 1]
