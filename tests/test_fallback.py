"""The boxed CPU fallback, the fallback switches and the fallback log."""

from __future__ import annotations

import re
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import EXAMPLES, run_code, run_script
from test_ops import Events


def rb(x):
    return x.to("rbln")


def test_functional_op_result_is_rbln_and_logged_as_host_op():
    x = torch.randn(4, 64)
    with Events() as ev:
        y = torch.sin(rb(x))
    assert y.device.type == "rbln"
    torch.testing.assert_close(y.cpu(), torch.sin(x))
    assert ev.count("host_op") == 1 and ev.count("cpu_fallback") == 0


def test_inplace_op_writes_the_rbln_tensor():
    x = torch.randn(4, 64)
    xr = rb(x)
    ret = xr.exp_()
    assert ret is xr
    torch.testing.assert_close(xr.cpu(), x.exp())


def test_out_op_with_resize():
    x = torch.randn(4, 64)
    out = torch.empty(0, device="rbln")
    torch.cos(rb(x), out=out)
    assert out.shape == (4, 64)
    torch.testing.assert_close(out.cpu(), torch.cos(x))
    out2 = torch.empty(3, 64, device="rbln")
    with pytest.warns(UserWarning, match="resized"):
        torch.cumsum(rb(x), 0, out=out2)
    torch.testing.assert_close(out2.cpu(), torch.cumsum(x, 0))


def _host_op_outcome(monkeypatch, general: bool):
    """Results, events, residency and warnings of structured out= host ops (``cos.out`` through
    the catch-all, ``sgn.out`` registered explicitly), on the lean route or the general one."""
    from torch_rbln.dispatch import fallback
    from torch_rbln.runtime.storage import state_of
    lean = fallback._run_plain_out
    taken = []

    def route(*a):
        res = None if general else lean(*a)
        taken.append(res is not None)
        return res
    monkeypatch.setattr(fallback, "_run_plain_out", route)
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    out = []
    with Events() as ev:
        dx = rb(x) * 1.0                                  # device-latest: the read is a d2h
        y = torch.cos(dx)                                 # the functional form's own output
        o = torch.empty(4, 64, device="rbln")
        torch.sgn(dx, out=o)                              # an out= of the right shape
        a = rb(x)
        torch.sin(a, out=a)                               # the output is the input
        r = torch.empty(3, 64, device="rbln")
        with pytest.warns(UserWarning, match="resized"):
            torch.cos(dx, out=r)                          # resized, with PyTorch's warning
        for t in (y, o, a, r):
            out.append((t.cpu(), t.shape, state_of(t).residency))
    counts = {k: ev.count(k) for k in ("host_op", "d2h", "h2d", "cpu_fallback", "dispatch")}
    counts.update({k + " bytes": ev.amount(k) for k in ("d2h", "h2d")})
    return out, counts, taken


def test_structured_host_ops_take_the_lean_route_with_the_general_outcome(monkeypatch):
    lean = _host_op_outcome(monkeypatch, general=False)
    monkeypatch.undo()
    general = _host_op_outcome(monkeypatch, general=True)
    # the lean route served the outputs of their own, and left to the general one the output
    # that is an input (whose overlap the kernel judges) and the resized output
    assert lean[2] == [True, True, False, False] and not any(general[2])
    assert lean[1] == general[1]
    for (lv, ls, lr), (gv, gs, gr) in zip(lean[0], general[0]):
        assert ls == gs and lr == gr
        torch.testing.assert_close(lv, gv, rtol=0, atol=0)
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    want = [torch.cos(x), torch.sgn(x), torch.sin(x), torch.cos(x)]
    for (v, _, _), w in zip(lean[0], want):
        torch.testing.assert_close(v, w)


def test_device_op_resize_warning_points_at_the_callers_line():
    a = rb(torch.ones(4, 64, dtype=torch.float16))
    out = torch.empty(3, 64, dtype=torch.float16, device="rbln")
    with pytest.warns(UserWarning, match="resized") as w:
        torch.add(a, a, out=out); line = sys._getframe().f_lineno  # noqa: E702
    assert [(x.filename, x.lineno) for x in w] == [(__file__, line)]
    assert out.shape == (4, 64)


def test_view_returning_op_shares_the_rbln_storage():
    x = rb(torch.randn(4, 64))
    parts = torch.unbind(x, 0)
    d = torch.diagonal(x)
    assert parts[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert d.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    x.add_(1.0)
    torch.testing.assert_close(parts[1].cpu(), x.cpu()[1])


def test_multiple_outputs_and_tensorlist_io():
    x = torch.randn(4, 64)
    v, i = torch.max(rb(x), dim=1)
    assert v.device.type == i.device.type == "rbln"
    torch.testing.assert_close((v.cpu(), i.cpu()), torch.max(x, dim=1))
    chunks = torch.split(rb(x), [1, 3])
    torch.testing.assert_close([c.cpu() for c in chunks], list(torch.split(x, [1, 3])))
    st = torch.stack([rb(x), rb(x)])
    torch.testing.assert_close(st.cpu(), torch.stack([x, x]))
    ys = torch._foreach_mul([rb(x), rb(x)], 3.0)
    torch.testing.assert_close([y.cpu() for y in ys], [x * 3, x * 3])


def test_optional_tensors_mixed_devices_scalars_and_zero_dim():
    x, w, b = torch.randn(2, 8), torch.ones(8), torch.zeros(8)
    y = F.layer_norm(rb(x), (8,), rb(w), None)                 # optional bias absent
    torch.testing.assert_close(y.cpu(), F.layer_norm(x, (8,), w, None))
    y = F.layer_norm(rb(x), (8,), rb(w), rb(b))
    torch.testing.assert_close(y.cpu(), F.layer_norm(x, (8,), w, b))
    s = rb(torch.tensor(2.0))
    torch.testing.assert_close(torch.atan2(rb(x), s).cpu(), torch.atan2(x, torch.tensor(2.0)))
    m = torch.lerp(rb(x), rb(torch.ones(2, 8)), 0.25)          # Python scalar weight
    torch.testing.assert_close(m.cpu(), torch.lerp(x, torch.ones(2, 8), 0.25))
    idx = torch.tensor([1, 0])                                  # a CPU index for an rbln tensor
    torch.testing.assert_close(rb(x)[idx].cpu(), x[idx])


def test_result_lands_on_the_first_rbln_argument_device():
    r = run_code(
        "import torch\n"
        "x = torch.randn(4, 64).to('rbln:1')\n"
        "y = torch.sin(x)\n"
        "z = torch.atan2(torch.tensor(1.0), x)\n"
        "print(y.device, z.device)",
        env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["rbln:1", "rbln:1"]


def test_transfers_follow_residency():
    x = rb(torch.randn(4, 64, dtype=torch.float16))
    with Events() as ev:
        torch.sin(x)                       # host-latest input: served on the host
    assert ev.count("d2h") == 0
    y = x + x                              # device-latest
    with Events() as ev:
        torch.sin(y)
    assert ev.count("d2h") == 1


def test_convolution_overrideable_and_backward():
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    xr, wr = rb(x.detach()).requires_grad_(), rb(w.detach()).requires_grad_()
    y = F.conv2d(xr, wr, padding=1)
    torch.testing.assert_close(y.cpu(), F.conv2d(x, w, padding=1), atol=1e-5, rtol=1e-5)
    y.sum().backward()
    F.conv2d(x, w, padding=1).sum().backward()
    torch.testing.assert_close(xr.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(wr.grad.cpu(), w.grad, atol=1e-4, rtol=1e-4)


def test_fp32_device_op_fallback_is_counted_with_reason():
    a = rb(torch.arange(64, dtype=torch.float32))
    with Events() as ev:
        c = a + a
    assert ev.count("cpu_fallback", "aten::add.out") == 1
    assert ev.count("cpu_fallback_reason", "dtype-not-fp16") == 1
    assert ev.count("host_op") == 0
    torch.testing.assert_close(c.cpu(), torch.arange(64.0) * 2)


# ------------------------------------------------------------------------------------------
# TORCH_RBLN_DISABLE_FALLBACK and the log

LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\]\[I\] `aten::sin` op ran on CPU "
                      r"instead of RBLN$")
TRACE_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\]\[W\] TRACE$")


def test_sin_demo_log_format():
    r = run_script("sin_demo.py", env={"TORCH_RBLN_LOG_LEVEL": "INFO"}, cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    i = next(n for n, line in enumerate(lines) if LOG_LINE.match(line))
    assert TRACE_LINE.match(lines[i + 1])
    assert lines[i + 2] == "sin_demo.py:5: UserWarning: TRACE"
    assert lines[i + 3].strip() == "y = torch.sin(x)"


def test_trace_warning_under_python_c(tmp_path):
    # `python -c` code has no source file and `__main__` is served by BuiltinImporter
    r = run_code("import torch\nx = torch.ones(64, dtype=torch.float16, device='rbln')\n"
                 "torch.sin(x)\nprint('ok')", env={"TORCH_RBLN_LOG_LEVEL": "INFO"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert "<string>:3: UserWarning: TRACE" in r.stderr.splitlines()


def test_log_is_silent_at_default_level():
    r = run_script(EXAMPLES / "sin_demo.py", cwd=EXAMPLES)
    assert r.returncode == 0 and "ran on CPU" not in r.stderr and "TRACE" not in r.stderr


def test_deprecated_log_alias():
    r = run_script(EXAMPLES / "sin_demo.py", env={"TORCH_RBLN_LOG": "INFO"}, cwd=EXAMPLES)
    assert r.returncode == 0 and "`aten::sin` op ran on CPU instead of RBLN" in r.stderr


def test_unsupported_op_disabled_names_the_op():
    r = run_script(EXAMPLES / "sin_demo.py", env={"TORCH_RBLN_DISABLE_FALLBACK": "unsupported_op"},
                   cwd=EXAMPLES)
    assert r.returncode != 0
    assert "The operator `aten::sin" in r.stderr
    assert "remove 'unsupported_op' from `TORCH_RBLN_DISABLE_FALLBACK`" in r.stderr


def test_unsupported_op_is_fixed_at_load_and_spares_explicit_host_ops():
    r = run_code("import os, torch\n"
                 "os.environ['TORCH_RBLN_DISABLE_FALLBACK'] = 'unsupported_op'\n"
                 "x = torch.randn(4, 64).to('rbln')\n"
                 "torch.sin(x)\n"                       # still falls back: read at load only
                 "print(torch.flip(x, [0]).device)")
    assert r.returncode == 0, r.stderr
    r = run_code("import torch\nx = torch.randn(4, 64).to('rbln')\n"
                 "print(torch.flip(x, [0]).device)",       # explicitly routed to the host
                 env={"TORCH_RBLN_DISABLE_FALLBACK": "all"})
    assert r.returncode == 0 and r.stdout.strip() == "rbln:0", r.stderr


def test_check_fallbacks_are_not_disabled_by_the_switch():
    r = run_code("import torch\na = torch.ones(64, device='rbln')\nprint((a + a).device)",
                 env={"TORCH_RBLN_DISABLE_FALLBACK": "all"})
    assert r.returncode == 0 and r.stdout.strip() == "rbln:0", r.stderr


def _device_resident(x):
    """``x`` on rbln with its latest data in device memory (a device op's result)."""
    from torch_rbln.runtime.storage import DEVICE, state_of
    y = rb(x) * 1
    assert state_of(y).residency == DEVICE
    return y


@pytest.mark.parametrize("write", ["setitem", "index_put_", "normal_"])
def test_inplace_fallback_on_device_resident_data_reaches_the_next_device_op(write):
    x = torch.randn(4, 64).half()
    y, want = _device_resident(x), x.clone()
    with Events() as ev:
        if write == "setitem":
            mask = x > 0
            y[rb(mask)] = 2.0
            want[mask] = 2.0
        elif write == "index_put_":
            idx, vals = torch.tensor([0, 2]), torch.full((2, 64), -3.0).half()
            y.index_put_((rb(idx),), rb(vals))
            want.index_put_((idx,), vals)
        else:
            torch.rbln.manual_seed(1)       # (x came from the CPU generator, seeded alike)
            y.normal_()
    if write == "normal_":
        want = y.cpu()                      # the host view holds the draw
        assert not torch.equal(want, x)
    assert ev.count("host_op") >= 1 and ev.count("d2h") >= 1      # read from the device first
    with Events() as ev:
        z = y * 1                                                  # the next device op
    assert ev.count("dispatch", "aten::mul.out") == 1 and ev.count("cpu_fallback") == 0
    assert ev.count("h2d") == 1                                    # it pushes the written data
    assert torch.equal(z.cpu(), want) and torch.equal(y.cpu(), want)
