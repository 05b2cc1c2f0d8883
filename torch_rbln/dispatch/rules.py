"""May this op instance run on the device: the dtype catalog and the op-specific gates."""

from __future__ import annotations

import torch

from .. import config

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "int32": torch.int32, "int64": torch.int64, "int16": torch.int16, "int8": torch.int8,
           "uint8": torch.uint8, "bool": torch.bool}

DISPATCH_DTYPES: frozenset = frozenset()
STRICT_DTYPES: frozenset = frozenset()


def configure() -> None:
    """Snapshot the dtype catalog (TORCH_RBLN_DISPATCH_DTYPES / _STRICT are read at import)."""
    global DISPATCH_DTYPES, STRICT_DTYPES
    DISPATCH_DTYPES = frozenset({torch.float16, torch.bfloat16} |
                                {_DTYPES[n] for n in config.latched("TORCH_RBLN_DISPATCH_DTYPES")})
    STRICT_DTYPES = frozenset(_DTYPES[n] for n in config.latched("TORCH_RBLN_DISPATCH_STRICT"))


# -------------------------------------------------------------------------------------------
# op-specific gates, evaluated before the generic checks (the reference's kernel-level checks)

_SDPA_DTYPES = (torch.float16, torch.bfloat16)


def sdpa_unsupported(q, k, v, attn_bias) -> str | None:
    """Why the device attention kernel cannot take these inputs (``can_use_rbln_sdpa``)."""
    if q.dim() < 3:
        return "dim < 3 not supported"
    if q.dim() > 4:
        return "dim > 4 not supported"
    if q.is_nested:
        return "nested tensors not supported"
    if q.dtype not in _SDPA_DTYPES:
        return f"dtype {q.dtype} not supported"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return "q/k/v dtypes differ"
    if q.shape[-3] % k.shape[-3] or k.shape[-3] != v.shape[-3]:
        return "GQA head counts not divisible"
    if q.numel() == 0 or k.numel() == 0:
        return "empty input"
    if attn_bias is not None and attn_bias.dim() not in (2, 3, 4):
        return f"mask dim {attn_bias.dim()} not supported"
    if q.shape[-1] % 32:
        return f"head_dim {q.shape[-1]} not aligned to 32"
    if q.shape[-2] % 32:
        return f"query sequence length {q.shape[-2]} not aligned to 32"
    if k.shape[-2] % 32:
        return f"key sequence length {k.shape[-2]} not aligned to 32"
    return None


def _sdpa_gate(args, kwargs):
    q, k, v = args[:3]
    bias = args[3] if len(args) > 3 else kwargs.get("attn_bias")
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    if dropout and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, bias)):
        raise NotImplementedError("RBLN SDPA does not support dropout_p > 0 with autograd")
    why = sdpa_unsupported(q, k, v, bias)
    return None if why is None else f"sdpa: {why}"


def _sdpa_backward_gate(args, kwargs):
    why = sdpa_unsupported(args[1], args[2], args[3], args[4])
    return None if why is None else f"sdpa_backward: {why}"


GATES = {
    "_scaled_dot_product_fused_attention_overrideable": _sdpa_gate,
    "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward_gate,
}
