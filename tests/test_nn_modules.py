"""torch.nn modules whose rbln path differs from the CPU's: recurrent layers (the fused cell
ops PyTorch takes off the CPU), lazy modules moved to rbln, second-order gradients. Each
compares with the same module on the CPU."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn as nn


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def _pair(make, seed=0):
    torch.manual_seed(seed)
    cpu = make()
    return cpu, copy.deepcopy(cpu).to("rbln")


@pytest.mark.parametrize("cls,kw", [
    (nn.GRU, {}), (nn.LSTM, {}), (nn.GRU, {"bias": False, "num_layers": 2}),
    (nn.LSTM, {"bidirectional": True, "proj_size": 3}), (nn.LSTM, {"bias": False})])
def test_rnn_training_steps_match_cpu(cls, kw):
    cpu, dev = _pair(lambda: cls(5, 6, batch_first=True, **kw))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, dev)]
    for step in range(3):
        x = torch.randn(3, 4, 5)
        losses = []
        for m, opt, xx in ((cpu, opts[0], x), (dev, opts[1], x.to("rbln"))):
            opt.zero_grad()
            out = m(xx)
            loss = sum((t * t).mean() for t in _flat(out))
            loss.backward()
            opt.step()
            losses.append(loss)
        torch.testing.assert_close(losses[1].cpu(), losses[0], rtol=1e-4, atol=1e-5)
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [nn.GRUCell, nn.LSTMCell])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cell_gradients_match_cpu(cls, bias):
    """Forward and backward of one cell step in float64, partial cotangents included (only
    ``h`` of an LSTM cell used, so the fused backward sees no gradient for ``c``)."""
    cpu, dev = _pair(lambda: cls(4, 5, bias=bias).double())
    x = torch.randn(3, 4, dtype=torch.double)
    h = torch.randn(3, 5, dtype=torch.double)
    state = (h, torch.randn(3, 5, dtype=torch.double)) if cls is nn.LSTMCell else h
    grads = []
    for m, dv in ((cpu, "cpu"), (dev, "rbln")):
        xx = x.detach().to(dv).requires_grad_()
        st = tuple(s.detach().to(dv).requires_grad_() for s in _flat(state))
        out = _flat(m(xx, st if cls is nn.LSTMCell else st[0]))
        out[0].sin().sum().backward()
        grads.append([xx.grad, *(s.grad for s in st), *(p.grad for p in m.parameters())])
    for a, b in zip(*grads):
        torch.testing.assert_close(b.cpu(), a)


def test_lstm_double_backward_matches_cpu():
    """With create_graph the fused cell's formula takes PyTorch's differentiable backward."""
    cpu, dev = _pair(lambda: nn.LSTM(3, 4).double())
    x = torch.randn(5, 2, 3, dtype=torch.double)
    res = []
    for m, xx in ((cpu, x), (dev, x.to("rbln"))):
        xx = xx.clone().requires_grad_()
        out, _ = m(xx)
        (g,) = torch.autograd.grad(out.pow(2).sum(), xx, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), xx)
        res.append(gg)
    torch.testing.assert_close(res[1].cpu(), res[0])


@pytest.mark.parametrize("make,shape", [
    (lambda: nn.LazyConv2d(4, 3), (2, 3, 8, 8)),
    (lambda: nn.LazyConvTranspose1d(4, 3), (2, 3, 8)),
    (lambda: nn.LazyLinear(4), (2, 3))])
def test_lazy_module_on_rbln_matches_cpu(make, shape):
    """A lazy module moved to rbln before its first call stays lazy (as on CUDA), keeps its
    parameter objects, and materializes on the first input."""
    torch.manual_seed(0)
    m = make().to("rbln")
    weight = m.weight
    assert isinstance(weight, nn.UninitializedParameter) and weight.device.type == "rbln"
    x = torch.randn(shape)
    out = m(x.to("rbln"))
    assert m.weight is weight and type(weight) is nn.Parameter
    assert weight.device.type == "rbln" and weight.dim() >= 2
    ref = copy.deepcopy(m).cpu()
    torch.testing.assert_close(out.cpu(), ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(m.weight.grad.cpu(), ref.weight.grad)


@pytest.mark.parametrize("x_shape,w_shape,bias", [
    ((2, 3), (4, 3), True), ((3,), (4, 3), True), ((2, 5, 3), (4, 3), False),
    ((3,), (3,), False)])
def test_linear_second_order_gradients_match_cpu(x_shape, w_shape, bias):
    """Gradients of a function of first-order gradients (create_graph=True) through rbln's
    linear equal the CPU's (float64)."""
    torch.manual_seed(0)
    ins = [torch.randn(x_shape, dtype=torch.double), torch.randn(w_shape, dtype=torch.double)]
    if bias:
        ins.append(torch.randn(w_shape[0], dtype=torch.double))
    res = []
    for dv in ("cpu", "rbln"):
        ts = [t.to(dv).requires_grad_() for t in ins]
        y = nn.functional.linear(*ts)
        g = torch.autograd.grad(y.sin().sum(), ts, create_graph=True)
        res.append(torch.autograd.grad(sum((gi * gi).sum() for gi in g), ts))
    for a, b in zip(*res):
        torch.testing.assert_close(b.cpu(), a)


@pytest.mark.parametrize("x_shape", [(5, 7), (2, 3, 7), (7,)])
def test_float64_linear_gradients_equal_cpu_to_float64_precision(x_shape):
    """float64 computes in float64 on rbln: linear's first-order gradients (the device's
    ``linear_backward``, which accumulates half-precision inputs in fp32) keep float64's
    precision instead of passing through fp32."""
    torch.manual_seed(0)
    ins = [torch.randn(x_shape, dtype=torch.double), torch.randn(4, 7, dtype=torch.double),
           torch.randn(4, dtype=torch.double)]
    res = []
    for dv in ("cpu", "rbln"):
        ts = [t.to(dv).requires_grad_() for t in ins]
        y = nn.functional.linear(*ts)
        res.append(torch.autograd.grad(y, ts, torch.linspace(-2, 3, y.numel(), dtype=torch.double)
                                       .reshape(y.shape).to(dv)))
    for a, b in zip(*res):
        torch.testing.assert_close(b.cpu(), a)


@pytest.mark.parametrize("swap", [False, True])
def test_to_empty_from_meta(swap):
    """As for CUDA: a meta module's ``to_empty`` gives fresh Parameters (the same objects with
    ``swap_module_params_on_conversion``)."""
    with torch.device("meta"):
        m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    before = [id(p) for p in m.parameters()]
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        m.to_empty(device="rbln")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)
    for t in (*m.parameters(), *m.buffers()):
        assert t.device.type == "rbln"
    assert all(isinstance(p, nn.Parameter) for p in m.parameters())
    after = [id(p) for p in m.parameters()]
    assert all((a == b) == swap for a, b in zip(before, after))


@pytest.mark.parametrize("make,shape,fmt", [
    (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3), torch.channels_last),
    (lambda: nn.ReflectionPad3d(1), (2, 3, 4, 4, 4), torch.channels_last_3d),
    (lambda: nn.ReplicationPad2d(1), (2, 3, 4, 4), torch.channels_last),
    (lambda: nn.ReplicationPad3d(1), (2, 3, 4, 4, 4), torch.channels_last_3d)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channels_last_modules_match_cpu(make, shape, fmt, dtype):
    """Channels-last input: the same values as the CPU, and the CPU's output memory format."""
    cpu, dev = _pair(lambda: make().to(dtype))
    x = torch.randn(shape, dtype=dtype).to(memory_format=fmt)
    y, yd = cpu(x), dev(x.to("rbln"))
    torch.testing.assert_close(yd.cpu(), y)
    assert yd.is_contiguous(memory_format=fmt) == y.is_contiguous(memory_format=fmt)


def test_float64_attention_double_backward_matches_cpu():
    """float64 attention takes PyTorch's math path on rbln, as on CUDA, whose backward is
    itself differentiable (the fused attention backward is not; the CPU reference is pinned to
    the math path, since the CPU's own choice for 4-D float64 is its flash kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cpu, dev = _pair(lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0,
                                                       batch_first=True).double())
    x = torch.randn(2, 3, 8, dtype=torch.double)
    mem = torch.randn(2, 4, 8, dtype=torch.double)
    res = []
    for m, dv in ((cpu, "cpu"), (dev, "rbln")):
        xx = x.to(dv).requires_grad_()
        with sdpa_kernel(SDPBackend.MATH) if dv == "cpu" else contextlib.nullcontext():
            (g,) = torch.autograd.grad(m(xx, mem.to(dv)).pow(2).sum(), xx, create_graph=True)
            (gg,) = torch.autograd.grad(g.pow(2).sum(), xx)
        res.append(gg)
    torch.testing.assert_close(res[1].cpu(), res[0], rtol=1e-5, atol=1e-5)
