"""Widened weights: a half-precision operand that widening programs read again and again keeps
its fp32 form between calls, and every write drops it before the next read.

On a host without native half-precision GEMMs a matmul computes on fp32 operands
(``executors.matmul_precision``); converting an unchanged weight on every call is the cost this
removes. The kept form is a cache: a read after any write must see the new values. Each write
route a training or inference loop takes is tried here: the matmul after the write must equal
the CPU's on the values the weight holds then, in a process that forces
the widening form (``TORCH_RBLN_MATMUL_PRECISION=widen``) so the test means the same on every
host."""

from __future__ import annotations

import pytest
import torch

from conftest import run_json

ROUTES = ("inplace_op", "copy_", "out=", "view_fill", "strided_view_op", "no_grad_update",
          "optimizer_step", "cpu_fallback_op", "masked_fill_", "index_copy_", "non_blocking_copy",
          "set_data")

# the loop below, for a kept form (KEPT: its StateHandle property) of the weight that READ
# reads, its result compared with REF on the CPU; H, ROWS and EXTRA (more of the report) too
_SCRIPT = """
import torch
from torch_rbln.runtime.storage import state_of

torch.manual_seed(0)
x = torch.randn(ROWS, 64, dtype=H)
w_cpu = (torch.randn(64, 64) * 0.1).to(H)
x_d = x.to("rbln")

def write(route, w, p=None):
    if route == "inplace_op":
        w.mul_(2)
    elif route == "copy_":
        w.copy_(torch.full_like(w, 0.5))
    elif route == "out=":
        torch.add(w, w, out=w)
    elif route == "view_fill":
        w[:, :16].fill_(3)
    elif route == "strided_view_op":
        w.view(-1)[::7].mul_(-4)
    elif route == "no_grad_update":
        with torch.no_grad():
            p -= 0.5 * torch.ones_like(p)
    elif route == "optimizer_step":
        p.grad = torch.ones_like(p)
        torch.optim.AdamW([p], lr=0.5).step()
    elif route == "cpu_fallback_op":
        w.exp_()                 # no device kernel: the host runs it on the host view
    elif route == "masked_fill_":
        w.masked_fill_(w > 0, 1.0)
    elif route == "index_copy_":
        w.index_copy_(0, torch.tensor([0, 5]).to(w.device), torch.ones(2, 64, dtype=H).to(w.device))
    elif route == "non_blocking_copy":
        src = torch.full((64, 64), -2.0, dtype=H).pin_memory()
        w.copy_(src, non_blocking=True)
        torch.rbln.synchronize()
    elif route == "set_data":
        p.data = torch.full((64, 64), 0.25, dtype=H).to(w.device)

out = dict(EXTRA)
for route in ROUTES:
    p = torch.nn.Parameter(w_cpu.clone().to("rbln"))
    w = p.data if route not in ("no_grad_update", "optimizer_step", "set_data") else p
    for _ in range(3):           # read again and again: the form is kept
        READ(x_d, w.detach())
    kept = getattr(state_of(w.detach()), KEPT)
    write(route, w, p)
    w_now = p.detach()
    dropped = getattr(state_of(w_now), KEPT) == 0
    y = READ(x_d, w_now).cpu()
    again = READ(x_d, w_now).cpu()         # from the newly kept form
    expect = REF(x, w_now.cpu())           # the values the weight holds now, on the CPU
    out[route] = {"kept": kept, "dropped": dropped,
                  "changed": not torch.equal(w_now.cpu(), w_cpu),
                  "err": (y.float() - expect.float()).abs().max().item(),
                  "err_again": (again.float() - expect.float()).abs().max().item()}
print(json.dumps(out))
"""


_WIDENED = """
H, ROWS, KEPT, EXTRA = torch.float16, 128, "widened_bytes", {}
READ = torch.mm
REF = lambda a, w: (a.float() @ w.float()).to(H)     # NPU numerics: fp32 GEMM, one rounding
"""


@pytest.fixture(scope="module")
def routes():
    return run_json(f"ROUTES = {ROUTES!r}\n" + _WIDENED + _SCRIPT,
                    env={"TORCH_RBLN_MATMUL_PRECISION": "widen"})


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("form", ["widened", "packed"])
def test_a_write_drops_the_kept_form_before_the_next_read(request, form, route):
    r = request.getfixturevalue("routes" if form == "widened" else "packed_routes")[route]
    assert r["kept"] > 0, f"three reads of an unchanged weight should keep its {form} form"
    assert r["changed"], "the write must change the weight, or the test proves nothing"
    assert r["dropped"], f"the write must drop the {form} form"
    assert r["err"] == 0 and r["err_again"] == 0, r


def test_kept_forms_are_outside_the_device_accounting():
    from torch_rbln.runtime import executors
    from torch_rbln.runtime.storage import state_of
    if not executors.widens(torch.float16, 128):
        pytest.skip("this host has native fp16 GEMMs: matmuls do not widen")
    x = torch.randn(128, 256, dtype=torch.float16, device="rbln")
    w = torch.randn(256, 256, dtype=torch.float16, device="rbln")
    torch.mm(x, w)
    before = torch.rbln.memory_allocated()
    torch.mm(x, w)
    torch.mm(x, w)
    assert state_of(w).widened_bytes == 256 * 256 * 4
    assert torch.rbln.memory_allocated() == before


_BACKWARD = """
import torch
B = torch.bfloat16
torch.manual_seed(0)
x = torch.randn(128, 64).to(B)
w1, w2 = (torch.randn(128, 64) * 0.1).to(B), (torch.randn(64, 128) * 0.1).to(B)
gy = torch.randn(128, 64).to(B)

# every GEMM has >= WIDEN_MIN_ROWS rows, so each one widens
lin1, lin2 = torch.nn.Linear(64, 128, bias=False), torch.nn.Linear(128, 64, bias=False)
with torch.no_grad():
    lin1.weight.copy_(w1)
    lin2.weight.copy_(w2)
net = torch.nn.Sequential(lin1, lin2).to(B).to("rbln")
xd = x.to("rbln").requires_grad_()
with torch.rbln.explain() as report:
    net(xd).backward(gy.to("rbln"))
direct = torch.ops.aten.linear_backward(xd.detach(), gy.to("rbln"), net[1].weight.detach(),
                                        [True, True, True])

# NPU numerics on the CPU: each GEMM on fp32 operands, one rounding of each result
f = lambda t: t.float()
h = (f(x) @ f(w1).t()).to(B)
dh = (f(gy) @ f(w2)).to(B)
ref = {"dx": (f(dh) @ f(w1)).to(B), "dw1": (f(dh).t() @ f(x)).to(B),
       "dw2": (f(gy).t() @ f(h)).to(B)}
got = {"dx": xd.grad, "dw1": net[0].weight.grad, "dw2": net[1].weight.grad}
print(json.dumps({
    "equal": {k: torch.equal(got[k].cpu(), ref[k]) for k in ref},
    "grad_dtypes": [str(g.dtype) for g in got.values()],
    "direct_dtypes": [str(t.dtype) for t in direct],
    "bounces": report.dump()["hidden_host_bounce"]["total_count"],
    "programs": report.dump()["device_programs_by_op"].get("aten::linear_backward", 0)}))
"""


def test_linear_backward_on_widened_operands_returns_the_op_dtype():
    """Where matmuls widen, ``linear_backward`` takes its operands in fp32 (a weight's kept
    form) and rounds its gradients once, to the operands' dtype: no fp32 gradient for autograd
    to convert through the host afterwards."""
    r = run_json(_BACKWARD, env={"TORCH_RBLN_MATMUL_PRECISION": "widen"})
    assert r["equal"] == {"dx": True, "dw1": True, "dw2": True}, r
    assert r["direct_dtypes"] == ["torch.bfloat16"] * 3, r
    assert r["grad_dtypes"] == ["torch.bfloat16"] * 3, r
    assert r["programs"] == 2 and r["bounces"] == 0, r


_STEPS = """
import torch
from torch_rbln.runtime.storage import state_of
torch.manual_seed(0)
lin = torch.nn.Linear(64, 128, bias=False).to(torch.bfloat16).to("rbln")
opt = torch.optim.AdamW(lin.parameters(), lr=1e-3, fused=True)
x = torch.randn(128, 64, dtype=torch.bfloat16, device="rbln")
kept_after_forward = []
for step in range(5):
    opt.zero_grad()
    y = lin(x)                   # one widening read of the weight ...
    kept_after_forward.append(state_of(lin.weight.detach()).widened_bytes)
    y.sum().backward()           # ... and one in the backward, then the optimizer writes it
    opt.step()
print(json.dumps({"kept": kept_after_forward}))
"""


def test_a_weight_read_in_forward_and_backward_is_widened_once_per_step():
    """Between optimizer steps a weight is read twice (forward, backward), the kept form serving
    the second read: that counts as read again, so every step keeps its first widening."""
    r = run_json(_STEPS, env={"TORCH_RBLN_MATMUL_PRECISION": "widen"})
    assert r["kept"][1:] == [128 * 64 * 4] * 4, r


# ------------------------------------------------------------------------------------------
# packed weights: where the host has native half-precision GEMMs, a linear program takes its
# weight in the GEMM library's blocked layout, kept the same way (executors.packed_dtypes)

_PACKED = """
from torch_rbln.runtime import executors
H, ROWS, KEPT = torch.bfloat16, 16, "packed_bytes"
EXTRA = {"packs": H in executors.packed_dtypes()}
READ = REF = torch.nn.functional.linear       # the plain linear on the CPU, bit for bit
"""


@pytest.fixture(scope="module")
def packed_routes():
    r = run_json(f"ROUTES = {ROUTES!r}\n" + _PACKED + _SCRIPT,
                 env={"TORCH_RBLN_MATMUL_PRECISION": "native"})
    if not r["packs"]:
        pytest.skip("PyTorch's packed linear has no bf16 kernel on this host")
    return r


def test_graph_partitions_take_packed_weights():
    r = run_json("""
        import torch, torch.nn.functional as F
        from torch_rbln.runtime import executors
        from torch_rbln.runtime.storage import state_of
        from torch.profiler import profile, ProfilerActivity
        B = torch.bfloat16
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 128).to(B)
        x = torch.randn(16, 64, dtype=B)
        dev = torch.nn.Linear(64, 128).to(B).to("rbln")
        dev.load_state_dict(lin.state_dict())
        f = torch.compile(lambda t: F.silu(dev(t)), backend="rbln")
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            y = f(x.to("rbln"))
            y2 = f(x.to("rbln"))
        ops = {e.key for e in prof.key_averages()}
        print(json.dumps({"packs": B in executors.packed_dtypes(),
                          "equal": (torch.equal(y.cpu(), F.silu(lin(x)))
                                    and torch.equal(y2.cpu(), y.cpu())),
                          "packed_op": "torch_rbln::packed_linear" in ops,
                          "kept": state_of(dev.weight.detach()).packed_bytes}))
    """, env={"TORCH_RBLN_MATMUL_PRECISION": "native"})
    if not r["packs"]:
        pytest.skip("PyTorch's packed linear has no bf16 kernel on this host")
    assert r == {"packs": True, "equal": True, "packed_op": True, "kept": r["kept"]}, r
    assert r["kept"] > 0, r


def test_a_graph_over_a_dynamic_batch_chooses_the_linear_form_per_call():
    """vLLM traces one graph whose token count is symbolic: each call's linears take the form its
    rows choose, as eager programs do (a decode step's few rows keep the half-precision or packed
    kernel; a prefill's widen), not the form the size hint chose at compile time."""
    r = run_json("""
        import torch, torch.nn.functional as F
        from torch_rbln.runtime import executors
        from torch.profiler import profile, ProfilerActivity
        B = torch.bfloat16
        torch.manual_seed(0)
        dev = torch.nn.Linear(512, 256).to(B).to("rbln")
        f = torch.compile(lambda t: F.silu(dev(t)), backend="rbln", dynamic=True)
        out = {"widens": executors.widens(B, 256), "packs": B in executors.packed_dtypes()}
        with torch.no_grad():
            for rows in (256, 16, 128, 8):
                x = torch.randn(rows, 512, dtype=B).to("rbln")
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    y = f(x).cpu()
                gemms = sorted({(e.key, str(e.input_dtypes[:1])) for e in prof.events()
                                if e.key in ("aten::addmm", "aten::mm", "aten::linear",
                                             "mkldnn::_linear_pointwise")})
                out[rows] = {"equal_eager": torch.equal(y, F.silu(dev(x)).cpu()),
                             "gemms": gemms}
        print(json.dumps(out))
    """)
    if not r["widens"]:
        pytest.skip("bf16 matmuls do not widen on this host: one form serves every call")
    for rows in ("256", "128"):
        assert r[rows]["equal_eager"], r
        assert ["aten::addmm", "['float']"] in r[rows]["gemms"], r      # the widened GEMM
    for rows in ("16", "8"):
        assert r[rows]["equal_eager"], r
        small = {k for k, _ in r[rows]["gemms"]}
        assert ["aten::addmm", "['float']"] not in r[rows]["gemms"], r
        assert small == ({"mkldnn::_linear_pointwise"} if r["packs"] else
                         {"aten::linear", "aten::addmm"}), r
