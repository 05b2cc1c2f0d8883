"""Nested tensors (``torch.nested``, strided layout) on rbln against the CPU: the inference fast
paths of nn.TransformerEncoder / TransformerEncoderLayer / MultiheadAttention, which make nested
tensors from padding masks, and the ``torch.nested`` basics. dispatch/nested.py."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from conftest import run_code
from test_ops import Events
from torch_rbln.guard import GuardError

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")

DEV = "rbln"


def _padded(t: torch.Tensor) -> torch.Tensor:
    return t.to_padded_tensor(0.0) if t.is_nested else t


def _same(r: torch.Tensor, c: torch.Tensor) -> None:
    """rbln result ``r`` equals CPU result ``c`` (nested: the same components)."""
    assert r.device.type == "rbln" and r.is_nested == c.is_nested
    if c.is_nested:
        assert torch.equal(r._nested_tensor_size(), c._nested_tensor_size())
        for a, b in zip(r.unbind(), c.unbind(), strict=True):
            assert a.device.type == "rbln"
            torch.testing.assert_close(a.cpu(), b)
    else:
        torch.testing.assert_close(r.cpu(), c)


def _inputs():
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4])
    return x, mask


def _components(*lengths, dim=8):
    return [torch.randn(n, dim) for n in lengths]


# ----------------------------------------------------------------------------------------------
# the fast paths


def _fast_path(module, *args, **kwargs):
    """``module(*args, **kwargs)`` in eval mode under no_grad on the CPU and, a copy of it, on
    rbln with the tensor arguments moved there (one argument given twice stays one tensor);
    asserts the outputs are equal and returns the rbln run's events."""
    module = module.eval()
    module_r = copy.deepcopy(module).to(DEV)
    moved: dict = {}

    def to_rbln(v):
        return moved.setdefault(id(v), v.to(DEV)) if isinstance(v, torch.Tensor) else v
    args_r, kwargs_r = [to_rbln(a) for a in args], {k: to_rbln(v) for k, v in kwargs.items()}
    with torch.no_grad():
        want = module(*args, **kwargs)
        with Events() as ev:
            got = module_r(*args_r, **kwargs_r)
    if isinstance(want, tuple):                    # MultiheadAttention: (output, weights)
        want, got = want[0], got[0]
    _same(got, want)
    return ev


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_fast_path_with_padding_mask_matches_cpu(norm_first):
    x, mask = _inputs()
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
    ev = _fast_path(enc, x, src_key_padding_mask=mask)
    # the fused layer ran (the fast path), once per layer, on the host
    assert ev.count("host_op", "aten::_transformer_encoder_layer_fwd") == 2
    # with post-norm layers the encoder packs the batch into a nested tensor (PyTorch turns the
    # nested path off for norm_first) and pads the output back
    nested = 0 if norm_first else 1
    assert ev.count("host_op", "aten::_nested_tensor_from_mask") == nested
    assert ev.count("host_op", "aten::to_padded_tensor") == nested


def test_encoder_fast_path_without_mask_matches_cpu():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2)
    ev = _fast_path(enc, _inputs()[0])
    assert ev.count("host_op", "aten::_transformer_encoder_layer_fwd") == 2


@pytest.mark.parametrize("nested", [False, True], ids=["padding-mask", "nested"])
def test_encoder_layer_fast_path_matches_cpu(nested):
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, activation="gelu")
    if nested:
        ev = _fast_path(layer, torch.nested.nested_tensor(_components(2, 5, 4)))
    else:
        x, mask = _inputs()
        ev = _fast_path(layer, x, src_key_padding_mask=mask)
    assert ev.count("host_op", "aten::_transformer_encoder_layer_fwd") == 1


@pytest.mark.parametrize("nested", [False, True], ids=["padding-mask", "nested"])
def test_multihead_attention_fast_path_matches_cpu(nested):
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    if nested:
        q = torch.nested.nested_tensor(_components(2, 5))
        ev = _fast_path(mha, q, q, q, need_weights=False)
    else:
        q, mask = _inputs()
        ev = _fast_path(mha, q, q, q, key_padding_mask=mask, need_weights=False)
    assert ev.count("host_op", "aten::_native_multi_head_attention") == 1


# ----------------------------------------------------------------------------------------------
# torch.nested basics


def test_construction_and_metadata():
    parts = _components(2, 4, dim=3)
    c = torch.nested.nested_tensor(parts)
    r = torch.nested.nested_tensor(parts, device=DEV)
    assert r.is_nested and r.device == torch.device("rbln:0")
    assert r.size(0) == 2 and r.dim() == 3 and r.dtype == torch.float32
    for get in ("_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets"):
        meta = getattr(r, get)()
        assert meta.device.type == "cpu" and torch.equal(meta, getattr(c, get)())
    _same(r, c)
    _same(torch.nested.nested_tensor(parts, device=DEV, dtype=torch.float16),
          torch.nested.nested_tensor(parts, dtype=torch.float16))
    _same(torch.nested.as_nested_tensor([p.to(DEV) for p in parts]),
          torch.nested.as_nested_tensor(parts))
    _same(torch.nested.as_nested_tensor(parts, device=DEV), torch.nested.as_nested_tensor(parts))


def test_as_nested_tensor_of_a_tensor_is_a_view_of_its_storage():
    x = torch.randn(2, 3, 4)
    xr = x.to(DEV)
    nt = torch.nested.as_nested_tensor(xr)
    _same(nt, torch.nested.as_nested_tensor(x))
    assert nt.untyped_storage().data_ptr() == xr.untyped_storage().data_ptr()
    nt.mul_(2)                                    # a host op writes the shared storage
    torch.testing.assert_close(xr.cpu(), x * 2)


def test_unbind_and_printing():
    parts = _components(2, 1, dim=3)
    c, r = torch.nested.nested_tensor(parts), torch.nested.nested_tensor(parts, device=DEV)
    with Events() as ev:
        pieces = r.unbind()
    assert ev.count("host_op") == 0               # views of the buffer: metadata only
    assert all(p.device.type == "rbln" for p in pieces)
    assert all(p.untyped_storage().data_ptr() == r.untyped_storage().data_ptr() for p in pieces)
    _same(pieces[1], parts[1])
    assert str(r).replace(", device='rbln:0'", "") == str(c)


@pytest.mark.parametrize("name", [
    "add_scalar", "mul_nested", "sub_nested", "div_scalar", "add_", "mul_", "relu", "gelu",
    "tanh", "neg", "abs", "softmax", "sum", "to_padded", "to_padded_func", "to_padded_size",
    "linear", "matmul", "bmm", "layer_norm", "transpose", "reshape", "view", "unsqueeze",
    "chunk", "narrow", "select", "clone", "contiguous", "zeros_like", "ones_like", "masked_fill",
    "to_half", "ge", "cat",
])
def test_op_matches_cpu(name):
    a, b = _components(2, 4, dim=6), _components(2, 4, dim=6)
    w, bias = torch.randn(5, 6), torch.randn(5)
    ops = {
        "add_scalar": lambda x, y, w, b: x + 1,
        "mul_nested": lambda x, y, w, b: x * y,
        "sub_nested": lambda x, y, w, b: x - y,
        "div_scalar": lambda x, y, w, b: x / 4,
        "add_": lambda x, y, w, b: x.clone().add_(y),
        "mul_": lambda x, y, w, b: x.clone().mul_(3),
        "relu": lambda x, y, w, b: torch.relu(x),
        "gelu": lambda x, y, w, b: nn.functional.gelu(x),
        "tanh": lambda x, y, w, b: torch.tanh(x),
        "neg": lambda x, y, w, b: -x,
        "abs": lambda x, y, w, b: x.abs(),
        "softmax": lambda x, y, w, b: torch.softmax(x, -1),
        "sum": lambda x, y, w, b: x.sum(-1, keepdim=True),
        "to_padded": lambda x, y, w, b: x.to_padded_tensor(-1.0),
        "to_padded_func": lambda x, y, w, b: torch.nested.to_padded_tensor(x, 0.5),
        "to_padded_size": lambda x, y, w, b: x.to_padded_tensor(0.0, (2, 6, 7)),
        "linear": lambda x, y, w, b: nn.functional.linear(x, w, b),
        "matmul": lambda x, y, w, b: torch.matmul(x, y.transpose(1, 2)),
        "bmm": lambda x, y, w, b: torch.bmm(x, y.transpose(1, 2).contiguous()),
        "layer_norm": lambda x, y, w, b: nn.functional.layer_norm(x, (6,), y.unbind()[0][0],
                                                                   y.unbind()[0][1]),
        "transpose": lambda x, y, w, b: x.transpose(1, 2),
        "reshape": lambda x, y, w, b: x.reshape(2, -1, 3, 2),
        "view": lambda x, y, w, b: x.view(2, -1, 6),
        "unsqueeze": lambda x, y, w, b: x.unsqueeze(2),
        "chunk": lambda x, y, w, b: x.chunk(2, -1)[1],
        "narrow": lambda x, y, w, b: x.narrow(0, 1, 1),
        "select": lambda x, y, w, b: x.select(0, 1),
        "clone": lambda x, y, w, b: x.clone(),
        "contiguous": lambda x, y, w, b: x.transpose(1, 2).contiguous(),
        "zeros_like": lambda x, y, w, b: torch.zeros_like(x),
        "ones_like": lambda x, y, w, b: torch.ones_like(x),
        "masked_fill": lambda x, y, w, b: x.masked_fill(y > 0, 7.0),
        "to_half": lambda x, y, w, b: x.to(torch.float16),
        "ge": lambda x, y, w, b: x >= 0.5,
        "cat": lambda x, y, w, b: torch.cat([x, y]),
    }
    f = ops[name]
    want = f(torch.nested.nested_tensor(a), torch.nested.nested_tensor(b), w, bias)
    got = f(torch.nested.nested_tensor(a, device=DEV), torch.nested.nested_tensor(b, device=DEV),
            w.to(DEV), bias.to(DEV))
    _same(got, want)


def test_empty_nested_tensors():
    for parts in ([], [torch.zeros(0, 3), torch.ones(2, 3)]):
        c = torch.nested.nested_tensor(parts)
        r = torch.nested.nested_tensor(parts, device=DEV)
        _same(r, c)
        _same(r + 1, c + 1)
        _same(r.clone(), c.clone())


def test_errors_are_the_cpus():
    parts = _components(2, 4, dim=3)
    c, r = torch.nested.nested_tensor(parts), torch.nested.nested_tensor(parts, device=DEV)
    for f in (lambda t: t.stride(), lambda t: torch.where(t > 0, t, t),
              lambda t: t.transpose(1, 2).to(torch.float16)):
        with pytest.raises(RuntimeError) as cpu_error:
            f(c)
        with pytest.raises(RuntimeError) as rbln_error:
            f(r)
        assert str(rbln_error.value) == str(cpu_error.value)


def test_moves_between_cpu_and_rbln():
    parts = _components(2, 4, dim=3)
    c = torch.nested.nested_tensor(parts)
    r = c.to(DEV)
    assert r.is_nested and r.device.type == "rbln"
    _same(r, c)
    for back in (r.cpu(), r.to("cpu"), r.to(device="cpu", dtype=torch.float64)):
        assert back.is_nested and back.device.type == "cpu"
        want = c.to(back.dtype)
        assert torch.equal(back.to_padded_tensor(0.0), want.to_padded_tensor(0.0))
    _same(r.to(DEV), c)


def _device_latest_nested():
    """A nested rbln tensor whose buffer's latest data is in device memory (a device op's
    result viewed as nested)."""
    from torch_rbln.runtime.storage import DEVICE, state_of
    x = torch.randn(2, 3, 64, dtype=torch.float16)
    base = x.to(DEV) * 1
    assert state_of(base).residency == DEVICE
    return torch.nested.as_nested_tensor(base), torch.nested.as_nested_tensor(x)


def test_transfers_are_counted_as_for_dense_tensors():
    r, c = _device_latest_nested()
    with Events() as ev:
        y = r + 1                       # a host op on device-latest data: one physical d2h
    assert ev.count("host_op", "aten::add.Tensor") == 1
    assert ev.count("d2h") == 1 and ev.amount("d2h") == 2 * 3 * 64 * 2
    _same(y, c + 1)
    with Events() as ev:
        y.cpu()                         # host-latest (a host op's result): nothing moves
    assert ev.count("d2h") == 0
    r, c = _device_latest_nested()
    with Events() as ev:
        back = r.cpu()                  # the copy engine's d2h, as for a dense tensor
    assert ev.count("d2h") == 1 and ev.count("host_op") == 0
    assert torch.equal(back.to_padded_tensor(0.0), c.to_padded_tensor(0.0))


def test_explain_region_reports_the_transfer_of_a_nested_host_op():
    r, _ = _device_latest_nested()
    with torch.rbln.explain() as report:
        r.softmax(-1)
    assert report.dump()["runtime_residency"]["real_host_sync_d2h"] == {
        "count": 1, "bytes": 2 * 3 * 64 * 2}


def test_guard_names_nested_host_ops_and_lets_metadata_ops_pass():
    r = torch.nested.nested_tensor(_components(2, 4, dim=3), device=DEV)
    with torch.rbln.guard(fallback="disallow"):
        r.unbind(), r.transpose(1, 2), r.cpu(), r.clone()
        with pytest.raises(GuardError, match=r"`aten::add.Tensor` ran on the CPU"):
            r + 1


def test_host_route_views_of_a_nested_input_share_its_storage():
    # ops returning views of a nested operand, run by the CPU fallback: the views are rebuilt
    # on the rbln storage (the ops here normally take the metadata route)
    from torch_rbln.dispatch import fallback
    parts = _components(2, 4, dim=3)
    r = torch.nested.nested_tensor(parts, device=DEV)
    alias = fallback.run_on_cpu(torch.ops.aten.alias.default, (r,), {})
    assert alias.is_nested and alias.device.type == "rbln"
    assert alias.untyped_storage().data_ptr() == r.untyped_storage().data_ptr()
    pieces = fallback.run_on_cpu(torch.ops.aten.unbind.int, (r, 0), {})
    assert all(p.device.type == "rbln" and not p.is_nested for p in pieces)
    pieces[1].fill_(5.0)
    alias.unbind()[0].zero_()
    _same(r, torch.nested.nested_tensor([torch.zeros(2, 3), torch.full((4, 3), 5.0)]))


def test_autograd_through_nested_ops_matches_cpu():
    parts = _components(2, 4, dim=3)
    c = torch.nested.nested_tensor(parts, requires_grad=True)
    r = torch.nested.nested_tensor(parts, device=DEV, requires_grad=True)
    for t in (c, r):
        (t * 2).relu().to_padded_tensor(0.0).sum().backward()
    _same(r.grad, c.grad)


def test_fallback_log_names_the_nested_host_ops():
    r = run_code(
        "import copy, torch\n"
        "enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, "
        "batch_first=True), 1).eval().to('rbln')\n"
        "x = torch.randn(2, 4, 8, device='rbln')\n"
        "mask = torch.tensor([[False] * 4, [False, False, True, True]], device='rbln')\n"
        "with torch.no_grad():\n"
        "    out = enc(x, src_key_padding_mask=mask)\n"
        "print(out.device, out.is_nested)\n",
        env={"TORCH_RBLN_LOG_LEVEL": "INFO"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["rbln:0", "False"]
    for op in ("_nested_tensor_from_mask", "_transformer_encoder_layer_fwd", "to_padded_tensor"):
        assert f"`aten::{op}` op ran on CPU instead of RBLN" in r.stderr


def test_a_nested_tensor_on_a_second_device():
    r = run_code(
        "import torch\n"
        "nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], device='rbln:1')\n"
        "print(nt.device, (nt + 1).device, nt.unbind()[0].device, nt.to('rbln:0').device)\n"
        "print((nt * 2).to('rbln:0').to_padded_tensor(0.0).sum().item())\n",
        env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["rbln:1", "rbln:1", "rbln:1", "rbln:0", "18.0"]


def test_nested_op_table_covers_the_composites_with_nested_kernels():
    # an op with both a CompositeImplicitAutograd and a nested kernel would reach the composite
    # (and fail on the nested tensor's sizes) unless rbln registers it on NestedTensorPrivateUse1
    from torch_rbln.dispatch import nested
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    registered = {f"aten::{n}" for n in nested.ON_RBLN + nested.ON_HOST}
    for name in torch._C._dispatch_get_all_op_names():
        if (name.startswith("aten::") and "_test_" not in name
                and has(name, "NestedTensorCPU") and has(name, "CompositeImplicitAutograd")):
            assert name in registered, name
    for name in registered:
        assert has(name, "NestedTensorCPU"), name
        assert has(name, "NestedTensorPrivateUse1"), name


def test_no_warning_beyond_the_cpus():
    parts = _components(2, 4, dim=3)
    with warnings.catch_warnings(record=True) as cpu:
        warnings.simplefilter("always")
        torch.nested.nested_tensor(parts).softmax(-1).to_padded_tensor(0.0)
    with warnings.catch_warnings(record=True) as rbln:
        warnings.simplefilter("always")
        torch.nested.nested_tensor(parts, device=DEV).softmax(-1).to_padded_tensor(0.0).cpu()
    assert [str(w.message) for w in rbln] == [str(w.message) for w in cpu]
