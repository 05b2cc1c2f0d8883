"""The fused RNN cell ops PyTorch's recurrent layers take on every device but the CPU.

``aten::lstm_cell``/``gru_cell`` (and so ``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``,
``nn.GRUCell``) compute the two gate matmuls, then hand the gate arithmetic to
``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` when the input is not on the CPU
(``RNN.cpp``: ``is_cuda() || is_xpu() || is_privateuseone()``). PyTorch has those kernels for
CUDA only, so the CPU fallback has nothing to run. These kernels compute the same arithmetic
with aten ops on rbln tensors, each a device op, and save the same workspace the CUDA kernels
save, so PyTorch's own autograd formulas apply unchanged: the backward ops below when grad
mode is off during backward, ``_thnn_differentiable_*_cell_backward`` (composite, already
device-generic) when it is on (double backward).

Workspace layouts, as ``aten/src/ATen/native/cuda/RNN.cu`` writes them:
LSTM ``[i, f, g, o]`` (the activated gates, 4H); GRU ``[r, z, n, hx, h_n]`` (5H; ``h_n`` is the
hidden part of the new gate with its bias, before ``r`` scales it).
"""

from __future__ import annotations

import torch


def _add_biases(input_gates, hidden_gates, input_bias, hidden_bias):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    return input_gates, hidden_gates


def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    ig, hg = _add_biases(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = (ig + hg).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat((i, f, g, o), 1)


def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    gcx = torch.zeros_like(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        gog = grad_hy * tanh_cy
        gcx = gcx + grad_hy * o * (1 - tanh_cy * tanh_cy)
    else:
        gog = torch.zeros_like(o)
    gates = torch.cat((gcx * g * (1 - i) * i,
                       gcx * cx * (1 - f) * f,
                       gcx * i * (1 - g * g),
                       gog * (1 - o) * o), 1)
    return gates, gcx * f, gates.sum(0) if has_bias else None


def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig, hg = _add_biases(input_gates, hidden_gates, input_bias, hidden_bias)
    ir, iz, in_ = ig.chunk(3, 1)
    hr, hz, hn = hg.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat((r, z, n, hx, hn), 1)


def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    gz = grad_hy * (hx - n) * (1 - z) * z
    ghx = grad_hy * z
    gn = grad_hy * (1 - z) * (1 - n * n)
    gr = gn * hn * (1 - r) * r
    grad_input = torch.cat((gr, gz, gn), 1)
    grad_hidden = torch.cat((gr, gz, gn * r), 1)
    if has_bias:
        return grad_input, grad_hidden, ghx, grad_input.sum(0), grad_hidden.sum(0)
    return grad_input, grad_hidden, ghx, None, None


KERNELS = {
    "_thnn_fused_lstm_cell": fused_lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": fused_lstm_cell_backward_impl,
    "_thnn_fused_gru_cell": fused_gru_cell,
    "_thnn_fused_gru_cell_backward": fused_gru_cell_backward,
}
