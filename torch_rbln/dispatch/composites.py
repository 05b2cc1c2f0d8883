"""PrivateUse1 entry points PyTorch calls in place of a regular op, and autograd kernels.

* ``_fused_sdp_choice``: SDPA backend selection. ``overrideable`` (the device attention kernel,
  ``_scaled_dot_product_fused_attention_overrideable``) when q, k and v are all 4-D and not
  float64, ``math`` (PyTorch's decomposition into matmul/softmax, each a device op) otherwise.
* ``scaled_dot_product_attention``: PyTorch's C++ SDPA consults a per-backend selection stub
  that only C++ can register for PrivateUse1, so the selection is applied here, on the
  PrivateUse1 and AutogradPrivateUse1 keys: the overrideable op (whose autograd formula calls
  the device backward), or PyTorch's own composite (the math path).
* ``linear`` under autograd: ``aten::linear`` is CompositeImplicit, so a PrivateUse1 kernel for
  it would leave autograd without a formula. With autograd recording, the op runs through a
  Function whose backward is the device's ``aten::linear_backward``; otherwise (no_grad, or no
  input requiring grad) it goes straight to the device kernel. Its backward is itself
  differentiable when the graph is kept (double backward), as PyTorch's own linear is.

docs/eager.md ("Pre-dispatch checks") (the SDPA gate) and "Autograd".
"""

from __future__ import annotations

import torch

_MATH, _OVERRIDEABLE = 0, 4     # torch.nn.attention.SDPBackend values


def fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                     scale=None, enable_gqa=False):
    # float64 takes the math path, as on CUDA (whose fused kernels take no float64 either):
    # its backward is differentiable, so double backward (gradgradcheck) works
    if query.dim() == 4 and key.dim() == 4 and value.dim() == 4 and query.dtype != torch.float64:
        return _OVERRIDEABLE
    return _MATH


_sdpa = torch.ops.aten.scaled_dot_product_attention.default
_sdpa_overrideable = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    choice = fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                              enable_gqa=enable_gqa)
    if choice == _OVERRIDEABLE and (enable_gqa or query.shape[-3] == key.shape[-3]):
        return _sdpa_overrideable(query, key, value, attn_mask, dropout_p, is_causal, False,
                                  scale=scale)[0]
    return _sdpa.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                           enable_gqa=enable_gqa)


_linear = torch.ops.aten.linear.default
_linear_backward = torch.ops.aten.linear_backward.default
_below_autograd = torch._C._AutoDispatchBelowAutograd


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.bias_shape = bias.shape if bias is not None else None
        with _below_autograd():
            return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        mask = [need[0], need[1], ctx.has_bias and need[2]]
        if torch.is_grad_enabled() or weight.dim() == 1:
            # double backward (create_graph=True): aten::linear_backward has no derivative,
            # so its results would be constants to the second pass; differentiable ops instead
            # (and for a 1-D weight, which the device's linear_backward does not take)
            dx, dw, db = _linear_backward_differentiable(x, grad, weight, mask, ctx.bias_shape)
            if dw is not None:
                dw = dw.reshape(weight.shape)
        else:
            dx, dw, db = _linear_backward(x, grad, weight, mask)
        # traced (torch.compile), the op's meta kernel returns all three whatever the mask
        return tuple(g if m else None for g, m in zip((dx, dw, db), mask))


def _linear_backward_differentiable(x, grad, weight, mask, bias_shape):
    if weight.dim() == 1:       # F.linear with a 1-D weight: one output feature, squeezed
        weight, grad = weight.unsqueeze(0), grad.unsqueeze(-1)
    g2 = grad.reshape(-1, grad.shape[-1])
    dx = grad.matmul(weight) if mask[0] else None
    dw = g2.t().matmul(x.reshape(-1, x.shape[-1])) if mask[1] else None
    db = g2.sum(0).reshape(bias_shape) if mask[2] else None
    return dx, dw, db


def linear_autograd(x, weight, bias=None):
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _Linear.apply(x, weight, bias)
    with _below_autograd():
        return _linear(x, weight, bias)


KERNELS = {"_fused_sdp_choice": fused_sdp_choice,
           "scaled_dot_product_attention": scaled_dot_product_attention}
AUTOGRAD_KERNELS = {"linear": linear_autograd,
                    "scaled_dot_product_attention": scaled_dot_product_attention}
