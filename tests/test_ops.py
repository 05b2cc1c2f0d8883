"""Device ops: results vs CPU, where they ran, the program cache and the pre-dispatch checks."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import run_code
from torch_rbln import events
from torch_rbln.dispatch.optable import BY_NAME, DEVICE_OPS
from torch_rbln.runtime import compiler

LOW = (torch.float16, torch.bfloat16)
TOL = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


class Events:
    """Counter deltas of the event stream over a ``with`` block."""

    def __enter__(self):
        self._before = events.snapshot()
        return self

    def __exit__(self, *exc):
        self.after = events.snapshot()

    def count(self, kind, key=None) -> int:
        a, b = self.after[kind], self._before[kind]
        keys = [key] if key is not None else a.keys()
        return sum(a.get(k, [0, 0])[0] - b.get(k, [0, 0])[0] for k in keys)

    def amount(self, kind, key=None) -> int:
        a, b = self.after[kind], self._before[kind]
        keys = [key] if key is not None else a.keys()
        return sum(a.get(k, [0, 0])[1] - b.get(k, [0, 0])[1] for k in keys)


def rb(*xs):
    return [x.to("rbln") for x in xs]


def _x(*shape, dtype=torch.float16, positive=False):
    t = torch.randn(*shape).to(dtype)
    return t.abs() + 0.1 if positive else t


# (name, op as called by the user, input builder, the op-table entry that must run on device)
CASES = [
    ("add", lambda a, b: a + b, lambda d: (_x(4, 64, dtype=d), _x(4, 64, dtype=d)), "add.out"),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=2), lambda d: (_x(64, dtype=d), _x(64, dtype=d)), "add.out"),
    ("add_scalar", lambda a: a + 1.5, lambda d: (_x(2, 64, dtype=d),), "add.out"),
    ("sub", lambda a, b: a - b, lambda d: (_x(4, 64, dtype=d), _x(64, dtype=d)), "sub.out"),
    ("mul", lambda a, b: a * b, lambda d: (_x(4, 64, dtype=d), _x(4, 64, dtype=d)), "mul.out"),
    ("div", lambda a, b: a / b, lambda d: (_x(4, 64, dtype=d), _x(4, 64, dtype=d, positive=True)), "div.out"),
    ("pow", lambda a: a.pow(2), lambda d: (_x(4, 64, dtype=d),), "pow.Tensor_Scalar_out"),
    ("neg", torch.neg, lambda d: (_x(4, 64, dtype=d),), "neg.out"),
    ("abs", torch.abs, lambda d: (_x(4, 64, dtype=d),), "abs.out"),
    ("rsqrt", torch.rsqrt, lambda d: (_x(4, 64, dtype=d, positive=True),), "rsqrt.out"),
    ("log", torch.log, lambda d: (_x(4, 64, dtype=d, positive=True),), "log.out"),
    ("ceil", torch.ceil, lambda d: (_x(4, 64, dtype=d),), "ceil.out"),
    ("floor", torch.floor, lambda d: (_x(4, 64, dtype=d),), "floor.out"),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), lambda d: (_x(4, 64, dtype=d),), "clamp.out"),
    ("mean", lambda a: a.mean(-1, keepdim=True), lambda d: (_x(4, 64, dtype=d),), "mean.out"),
    ("max", torch.max, lambda d: (_x(4, 64, dtype=d),), "max"),
    ("min", torch.min, lambda d: (_x(4, 64, dtype=d),), "min"),
    ("maximum", torch.maximum, lambda d: (_x(4, 64, dtype=d), _x(4, 64, dtype=d)), "maximum.out"),
    ("minimum", torch.minimum, lambda d: (_x(4, 64, dtype=d), _x(4, 64, dtype=d)), "minimum.out"),
    ("mm", torch.mm, lambda d: (_x(8, 64, dtype=d), _x(64, 128, dtype=d)), "mm.out"),
    ("bmm", torch.bmm, lambda d: (_x(2, 8, 64, dtype=d), _x(2, 64, 64, dtype=d)), "bmm.out"),
    ("addmm", torch.addmm, lambda d: (_x(128, dtype=d), _x(8, 64, dtype=d), _x(64, 128, dtype=d)), "addmm.out"),
    ("silu", F.silu, lambda d: (_x(4, 64, dtype=d),), "silu.out"),
    ("sigmoid", torch.sigmoid, lambda d: (_x(4, 64, dtype=d),), "sigmoid.out"),
    ("softmax", lambda a: a.softmax(-1), lambda d: (_x(4, 64, dtype=d),), "_softmax.out"),
    ("where", lambda c, a, b: torch.where(c, a, b),
     lambda d: (torch.randn(4, 64) > 0, _x(4, 64, dtype=d), _x(4, 64, dtype=d)), "where.self"),
    ("masked_fill", lambda a, m: a.clone().masked_fill_(m, -1.0),
     lambda d: (_x(4, 64, dtype=d), torch.randn(4, 64) > 0), "masked_fill_.Scalar"),
    ("gt", lambda a, b: a > b, lambda d: (_x(4, 64, dtype=d), _x(4, 64, dtype=d)), "gt.Tensor_out"),
    ("eq_scalar", lambda a: a == 0, lambda d: (_x(4, 64, dtype=d).round(),), "eq.Scalar_out"),
    ("logical_not", torch.logical_not, lambda d: (_x(4, 64, dtype=d).round(),), "logical_not.out"),
]


@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name,fn,make,entry", CASES, ids=[c[0] for c in CASES])
def test_device_op_matches_cpu_and_runs_on_device(name, fn, make, entry, dtype):
    args = make(dtype)
    expected = fn(*args)
    with Events() as ev:
        actual = fn(*rb(*args))
    assert actual.device.type == "rbln"
    torch.testing.assert_close(actual.cpu(), expected, **TOL[dtype])
    assert ev.count("dispatch", "aten::" + entry) >= 1
    assert ev.count("cpu_fallback") == 0


def test_linear_inference_mode_arrives_as_linear():
    net = torch.nn.Linear(64, 128).half()
    x = _x(4, 64)
    expected = net(x)
    netr = net.to("rbln")
    with torch.inference_mode(), Events() as ev:
        y = netr(x.to("rbln"))
    torch.testing.assert_close(y.cpu(), expected, **TOL[torch.float16])
    assert ev.count("dispatch", "aten::linear") == 1


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_4d_runs_the_overrideable_device_kernel(causal):
    q, k, v = (_x(1, 2, 64, 64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    with Events() as ev:
        out = F.scaled_dot_product_attention(*rb(q, k, v), is_causal=causal)
    torch.testing.assert_close(out.cpu().float(), expected, atol=2e-3, rtol=2e-3)
    assert ev.count("dispatch", "aten::_scaled_dot_product_fused_attention_overrideable") == 1
    assert ev.count("cpu_fallback") == 0


def test_sdpa_gqa_and_float_mask():
    q, k, v = _x(1, 4, 32, 64), _x(1, 2, 32, 64), _x(1, 2, 32, 64)
    mask = torch.randn(1, 1, 32, 32).half()
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(),
                                              enable_gqa=True)
    out = F.scaled_dot_product_attention(*rb(q, k, v), attn_mask=mask.to("rbln"), enable_gqa=True)
    torch.testing.assert_close(out.cpu().float(), expected, atol=2e-3, rtol=2e-3)


def test_sdpa_unaligned_head_dim_falls_back_in_fp32():
    q, k, v = (_x(1, 2, 32, 16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
    with Events() as ev:
        out = F.scaled_dot_product_attention(*rb(q, k, v))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-3, rtol=1e-3)
    assert ev.count("cpu_fallback_reason", "sdpa: head_dim 16 not aligned to 32") == 1


def test_sdpa_device_kernel_keeps_float64_precision():
    """The device attention body widens fp16/bf16 to fp32; float64 computes in float64 (it
    reaches that body only when called directly: F.scaled_dot_product_attention picks math)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 32, dtype=torch.double) for _ in range(3))
    mask = torch.randn(1, 1, 8, 8, dtype=torch.double)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        *rb(q, k, v), mask.to("rbln"))[0]
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), expected)


def test_sdpa_choice_is_math_for_3d_inputs():
    q, k, v = (_x(2, 64, 64) for _ in range(3))
    with Events() as ev:
        out = F.scaled_dot_product_attention(*rb(q, k, v))
    assert ev.count("dispatch", "aten::_scaled_dot_product_fused_attention_overrideable") == 0
    assert ev.count("dispatch", "aten::bmm.out") >= 1
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v), atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------------
# native data movement

def test_native_copies_match_cpu_for_any_dtype():
    x = torch.randn(6, 64)
    idx = torch.tensor([4, 0, 2])
    xr = x.to("rbln")
    torch.testing.assert_close(torch.cat([xr, xr], 0).cpu(), torch.cat([x, x], 0))
    torch.testing.assert_close(xr.index_select(0, idx).cpu(), x.index_select(0, idx))
    torch.testing.assert_close(xr.index_select(0, idx.to("rbln")).cpu(), x.index_select(0, idx))
    src = torch.randn(3, 64)
    torch.testing.assert_close(xr.index_copy(0, idx.to("rbln"), src.to("rbln")).cpu(),
                               x.index_copy(0, idx, src))
    torch.testing.assert_close(xr.repeat_interleave(2, dim=0).cpu(), x.repeat_interleave(2, dim=0))
    torch.testing.assert_close(torch.arange(3, 64, 2, device="rbln").cpu(), torch.arange(3, 64, 2))
    t = xr.t().clone()
    assert t.stride() == x.t().clone().stride()
    torch.testing.assert_close(t.cpu(), x.t())
    torch.testing.assert_close(xr.clone().fill_(2.5).cpu(), torch.full_like(x, 2.5))
    torch.testing.assert_close(xr.clone().zero_().cpu(), torch.zeros_like(x))


def test_native_ops_follow_residency():
    a = torch.ones(64, 64, dtype=torch.float16, device="rbln")      # host-latest: filled on host
    with Events() as ev:
        b = torch.cat([a, a])
    assert ev.count("h2d") == 0 and ev.count("runtime", "v2v_multi") == 0
    c = a + a                                                       # device-latest result
    with Events() as ev:
        d = torch.cat([c, c])
    assert ev.count("runtime", "v2v_multi") == 1 and ev.count("d2h") == 0
    torch.testing.assert_close(d.cpu(), torch.cat([a.cpu(), a.cpu()]) * 2)


def test_index_copy_in_place_moves_only_the_indexed_rows():
    # a paged KV cache: one large storage, a few rows written per step, also through a view
    cache = torch.randn(256, 2, 128).half()
    c = cache.to("rbln") * 1                        # device-latest storage
    rows, new = torch.tensor([5, 77, 200]), torch.randn(3, 2, 128).half()
    src, idx = new.to("rbln") * 1, rows.to("rbln")
    with Events() as ev:
        out = c.index_copy_(0, idx, src)
    assert out is c
    # the index is uploaded (24 bytes); the cache does not cross in either direction
    assert ev.amount("h2d") == idx.nbytes and ev.count("d2h") == 0
    assert ev.count("runtime", "v2v_multi") == 1
    view = c.view(128, 2, 2, 128)[:, :, 0]          # strided view into the same storage
    view.index_copy_(0, torch.tensor([3, 9]).to("rbln"), src[:2, :, :128].reshape(2, 2, 128))
    cache.index_copy_(0, rows, new)
    cache.view(128, 2, 2, 128)[:, :, 0].index_copy_(0, torch.tensor([3, 9]), new[:2])
    torch.testing.assert_close(c.cpu(), cache)
    host = torch.zeros(8, 64).to("rbln")            # host-latest self and source: on the host
    with Events() as ev:
        host.index_copy_(0, torch.tensor([1, 3]), torch.ones(2, 64).to("rbln"))
    assert ev.count("runtime", "v2v_multi") == 0 and ev.count("h2d") == 0
    torch.testing.assert_close(host.cpu(), torch.zeros(8, 64).index_copy_(
        0, torch.tensor([1, 3]), torch.ones(2, 64)))


def test_cat_of_mixed_dtypes_is_a_strided_copy_fallback(caplog):
    a = torch.randn(2, 64, dtype=torch.float16).to("rbln")
    b = torch.randn(2, 64).to("rbln")
    (a + a).sum  # noqa: B018 - keep `a` alive on the device side
    with Events() as ev:
        out = torch.cat([a, b])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), torch.cat([a.cpu(), b.cpu()]))
    assert ev.count("bounce", "strided_v2v_cpu_fallback") == 1
    r = run_code("import torch\na=torch.ones(2,64,dtype=torch.float16,device='rbln')\n"
                 "torch.cat([a, a.float()])", env={"TORCH_RBLN_DISABLE_FALLBACK": "strided_copy_error"})
    assert r.returncode != 0 and "batched strided copy failed" in r.stderr


# ------------------------------------------------------------------------------------------
# the program cache

def _recompiles(fn) -> int:
    with Events() as ev:
        fn()
    return ev.count("recompile")


def test_cache_key_shape_dtype_scalars_and_aliasing():
    a, b = (_x(8, 64).to("rbln") for _ in range(2))
    assert _recompiles(lambda: a + b) == 1
    assert _recompiles(lambda: a + b) == 0                     # warm hit
    assert _recompiles(lambda: a + a) == 1                     # aliasing pattern differs
    assert _recompiles(lambda: torch.add(a, b, alpha=2)) == 1  # a new baked scalar
    c = _x(16, 64).to("rbln")
    assert _recompiles(lambda: c + c) == 1                     # new shape
    bf = _x(8, 64, dtype=torch.bfloat16).to("rbln")
    assert _recompiles(lambda: bf + bf) == 1                   # new dtype
    d = _x(16, 64).to("rbln")
    assert _recompiles(lambda: d + d) == 0                     # same key as c + c
    for s in (1, 1.0, True):                                   # typed scalars differ
        assert _recompiles(lambda: torch.mul(a, s)) == 1


def test_warm_hits_are_counted():
    a = _x(8, 128).to("rbln")
    a * a
    with Events() as ev:
        for _ in range(3):
            a * a
    assert ev.count("warm_hit", "aten::mul.out") == 3 and ev.count("recompile") == 0


def test_empty_cache_and_dynamo_reset_drop_programs():
    a = _x(8, 192).to("rbln")
    a - a
    assert _recompiles(lambda: a - a) == 0
    torch.rbln.empty_cache()
    assert compiler.cache_size() == 0
    assert _recompiles(lambda: a - a) == 1
    importlib.import_module("torch._dynamo").reset()
    assert compiler.cache_size() == 0
    assert _recompiles(lambda: a - a) == 1


def test_compile_lowers_to_npu_primitives():
    a = _x(4, 64).to("rbln")
    F.silu(a)
    progs = [p for p in compiler._cache.values() if p.op == "aten::silu.out"]
    assert progs and set(progs[-1].primitives) <= compiler.NPU_PRIMITIVES
    prims, meta = compiler.lower(torch.ops.aten._softmax_backward_data.default,
                                 (torch.empty(2, 64, dtype=torch.float16),) * 2 + (1, torch.float16), {})
    assert prims == ("_softmax_backward_data",) and meta[0] == (2, 64)


def test_first_compile_does_not_import_dynamo():
    r = run_code("import sys, torch\n"
                 "a = torch.ones(64, dtype=torch.float16, device='rbln')\n"
                 "a + a; a * a; torch.softmax(a, 0)\n"
                 "print('dynamo' if 'torch._dynamo' in sys.modules else 'no-dynamo')")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no-dynamo"


def test_compile_error_falls_back_or_raises():
    a = _x(4, 64, positive=True)
    with Events() as ev:
        out = a.to("rbln").pow(1.7)
    assert ev.count("cpu_fallback_reason", "compile-error") == 1
    torch.testing.assert_close(out.cpu(), a.pow(1.7), **TOL[torch.float16])
    r = run_code("import torch\na=torch.ones(64,dtype=torch.float16,device='rbln')\na.pow(1.7)",
                 env={"TORCH_RBLN_DISABLE_FALLBACK": "compile_error"})
    assert r.returncode != 0 and "CompileError" in r.stderr and "pow" in r.stderr


# ------------------------------------------------------------------------------------------
# pre-dispatch checks

def _reason(fn) -> list:
    with Events() as ev:
        fn()
    return [k for k, v in ev.after["cpu_fallback_reason"].items()
            if v[0] != ev._before["cpu_fallback_reason"].get(k, [0])[0]]


def _checked(fn, *cpu_args):
    """The fallback reasons of ``fn`` on the rbln twins of ``cpu_args``; its result must equal
    the CPU's (the fallback computes right, not only for the counters)."""
    out = []
    reasons = _reason(lambda: out.append(fn(*(a.to("rbln") for a in cpu_args))))
    torch.testing.assert_close(out[0].cpu(), fn(*cpu_args), equal_nan=True, atol=1e-3, rtol=1e-3)
    return reasons


def test_check_reasons():
    f32, h = torch.randn(64), _x(64)
    assert _checked(lambda a: a + a, f32) == ["dtype-not-fp16"]
    assert _checked(lambda a, b: a + b, h, f32) == ["dtype-not-fp16"]            # mixed dtypes
    s = torch.tensor(1.0, dtype=torch.float16)
    assert _checked(lambda a: a + a, s) == ["all-scalar inputs"]
    base = _x(128)
    assert _checked(lambda a, b: a[64:] + b, base, h) == ["storage-offset"]
    bad = torch.full((64,), float("nan"), dtype=torch.float16)
    assert _checked(lambda a, b: a + b, bad, h) == ["nan/inf input"]
    odd = _x(4, 48)
    assert _checked(lambda a: a + a, odd) == ["last-dim-not-64-aligned"]
    assert _checked(lambda a: torch.div(a, a, rounding_mode="floor"), h) == ["div-rounding-fp16"]
    # TensorList arguments are exempt from the 64-alignment rule
    assert _checked(lambda a: torch.cat([a, a]), odd) == []


def test_fp32_add_has_no_fast_path_but_mul_has():
    assert not BY_NAME["add.out"].fast_path and BY_NAME["mul.out"].fast_path


def test_deploy_mode_skips_the_scan_read_live(monkeypatch):
    bad = torch.full((64,), float("inf"), dtype=torch.float16).to("rbln")
    monkeypatch.setenv("TORCH_RBLN_DEPLOY", "ON")
    assert _reason(lambda: bad * 2) == []
    monkeypatch.setenv("TORCH_RBLN_DEPLOY", "OFF")
    assert _reason(lambda: bad * 2) == ["nan/inf input"]


def test_nan_scan_reads_device_latest_inputs_on_host():
    a = _x(4, 256).to("rbln")
    b = a + a                       # device-latest
    with Events() as ev:
        F.silu(b)
    assert ev.count("d2h") == 1
    with Events() as ev:
        F.silu(b)                   # synced now, and known finite: no transfer
    assert ev.count("d2h") == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nan_scan_finds_every_nonfinite_value_wherever_it_is(dtype):
    """The scan reads exponent bits: NaN, +inf and -inf at every position of lengths that are
    not multiples of a vector, in whole storages, offset views and strided views; the largest
    finite values and subnormals are not flagged."""
    from torch_rbln.dispatch.rules import has_nonfinite
    big = torch.finfo(dtype).max
    for n in (1, 7, 8, 9, 16, 17, 31, 33, 4096 + 5):
        for pos in sorted({0, n // 2, n - 1}):
            for bad in (float("nan"), float("inf"), -float("inf"), None):
                x = torch.full((n,), big if pos % 2 else -big, dtype=dtype)
                x[n // 3] = torch.finfo(dtype).tiny / 2            # a subnormal
                if bad is not None:
                    x[pos] = bad
                d = x.to("rbln")
                assert has_nonfinite(d) == (bad is not None), (n, pos, bad)
                if n > 2:       # a view at an offset, and a strided view
                    assert has_nonfinite(d[1:]) == (bad is not None and pos >= 1)
                    assert has_nonfinite(d[::2]) == (bad is not None and pos % 2 == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_nan_scan_of_views_with_a_dense_last_dim(dtype):
    """Slices of the last axis (the halves of a head), row ranges and transposed batches read
    their rows of memory one run at a time: a bad value counts exactly when the view holds it,
    however it sits in the storage."""
    from torch_rbln.dispatch.rules import has_nonfinite
    views = {"last-axis slice": lambda t: t[..., 3:],
             "rows": lambda t: t[:, 1:4],
             "transposed": lambda t: t.transpose(0, 1),
             "both": lambda t: t.transpose(0, 1)[1:, :, :-2]}
    for n in (2, 9, 40):
        idx = torch.arange(4 * 5 * n).view(4, 5, n)
        for flat in sorted({0, 7, 4 * 5 * n // 2, 4 * 5 * n - 1}):
            x = torch.zeros(4 * 5 * n, dtype=dtype)
            x[flat] = float("nan")
            d = x.view(4, 5, n).to("rbln")
            for name, view in views.items():
                holds = bool((view(idx) == flat).any())
                assert has_nonfinite(view(d)) == holds, (n, flat, name)


def test_dev_disable_checks_warns_once_and_is_read_live(monkeypatch):
    import torch_rbln.dispatch.checks as checks
    monkeypatch.setattr(checks, "_warned_dev", False)
    f32 = torch.randn(64).to("rbln")
    monkeypatch.setenv("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK", "dtype")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert _reason(lambda: f32 + f32) == []
        assert _reason(lambda: f32 + f32) == []
    assert sum("Do NOT use in production" in str(x.message) for x in w) == 1
    monkeypatch.delenv("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK")
    assert _reason(lambda: f32 + f32) == ["dtype-not-fp16"]


def test_trace_function_sends_ops_to_cpu():
    h = _x(64).to("rbln")
    sys.settrace(lambda *a: None)
    try:
        reasons = _reason(lambda: h + h)
    finally:
        sys.settrace(None)
    assert reasons == ["trace"]


def test_every_table_entry_is_registered():
    for e in DEVICE_OPS:
        name = e.name if "." in e.name else e.name + ".default"
        packet, _, ov = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), ov)
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"), e.name


def test_dispatch_strict_exempts_a_dtype_from_the_alignment_rule():
    code = ("import torch\nfrom torch_rbln import events\n"
            "a = torch.ones(4, 48, dtype=torch.float16, device='rbln')\n"
            "a + a\nprint(sorted(events.counters['cpu_fallback_reason']))")
    assert run_code(code).stdout.split("\n")[-2] == "['last-dim-not-64-aligned']"
    r = run_code(code, env={"TORCH_RBLN_DISPATCH_STRICT": "float16"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[]"


# the last-dimension rule at its boundary: multiples of 64 run on the device, others do not
@pytest.mark.parametrize("n", [32, 64, 96, 128])
def test_last_dim_rule_at_its_boundary(n):
    a, b = _x(4, n), _x(4, n)
    with Events() as ev:
        got = a.to("rbln") + b.to("rbln")
    torch.testing.assert_close(got.cpu(), a + b, **TOL[torch.float16])
    on_device = n % 64 == 0
    assert ev.count("cpu_fallback", "aten::add.out") == (0 if on_device else 1)
    assert ev.count("cpu_fallback_reason", "last-dim-not-64-aligned") == (0 if on_device else 1)
    assert ev.count("dispatch", "aten::add.out") == 1


def test_last_dim_rule_for_zero_dim_and_one_element_operands():
    x, s, one = _x(4, 64), torch.tensor(1.5, dtype=torch.float16), _x(1)
    with Events() as ev:
        got = x.to("rbln") + s.to("rbln")               # a 0-d operand has no last dimension
    torch.testing.assert_close(got.cpu(), x + s, **TOL[torch.float16])
    assert ev.count("cpu_fallback") == 0 and ev.count("dispatch", "aten::add.out") == 1
    with Events() as ev:
        got = one.to("rbln") * one.to("rbln")           # one element: a last dimension of 1
    torch.testing.assert_close(got.cpu(), one * one, **TOL[torch.float16])
    assert ev.count("cpu_fallback_reason", "last-dim-not-64-aligned") == 1
    with Events() as ev:
        got = x.to("rbln") * one.to("rbln")             # broadcast: the 1-element operand decides
    torch.testing.assert_close(got.cpu(), x * one, **TOL[torch.float16])
    assert ev.count("cpu_fallback_reason", "last-dim-not-64-aligned") == 1
