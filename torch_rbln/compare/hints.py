"""What to change where a result leaves its tolerance (data, and the rules that pick a hint).

Three causes have a known remedy in half precision:

* ``overflow``   a value beyond the dtype's range became Inf (fp16 holds +-65504): compute it
  in bfloat16 (fp32's range) or keep the op in float32;
* ``reduction``  a reduction over a long axis rounds its partial sums: accumulate in float32;
* ``autocast``   softmax, normalizations and the other ops autocast keeps in float32 (its fp32
  list) take half-precision inputs: run them in float32, as autocast does.
"""

from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)

# a reduction over at least this many elements per result is a long one
LONG_REDUCTION = 1024

REDUCTIONS = frozenset({
    "sum", "mean", "nansum", "nanmean", "prod", "cumsum", "cumprod", "var", "std", "var_mean",
    "std_mean", "norm", "linalg_vector_norm", "logsumexp", "logcumsumexp", "dist",
})

# ops autocast runs in float32 (aten/src/ATen/autocast_mode.cpp, the fp32 and fp32 set_opt_dtype
# lists), as packet names
AUTOCAST_FP32 = frozenset({
    "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm",
    "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm", "batch_norm",
    "native_batch_norm", "instance_norm", "frobenius_norm", "nuclear_norm", "norm",
    "linalg_vector_norm", "cosine_similarity", "exp", "expm1", "log", "log10", "log2", "log1p",
    "pow", "reciprocal", "rsqrt", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "softplus",
    "cumsum", "cumprod", "logsumexp", "cross_entropy_loss", "nll_loss", "mse_loss", "l1_loss",
    "binary_cross_entropy_with_logits", "kl_div", "dist", "pdist", "cdist", "renorm",
})

# module classes whose outputs come from those ops (a name ending)
AUTOCAST_MODULES = ("Norm", "Softmax", "LogSoftmax", "Softmin")

TEXT = {
    "overflow": "overflow: the golden reaches {ref_max:.4g}, beyond {dtype}'s range "
                "(+-{limit:.6g}) -> use bfloat16 (fp32's range) or keep this {what} in float32",
    "reduction": "a reduction over {length} elements in {dtype} -> accumulate in float32 "
                 "(dtype=torch.float32, or upcast its input)",
    "autocast": "{name} takes {dtype} inputs; autocast keeps it in float32 (its fp32 list) -> "
                "run it in float32 (torch.autocast, or .float() around it)",
}


def packet(op: str) -> str:
    """``aten::softmax.int`` -> ``softmax``."""
    return op.split("::", 1)[-1].split(".", 1)[0].rstrip("_")


def _dtype(name: str) -> torch.dtype | None:
    return getattr(torch, name.removeprefix("torch."), None)


def overflow(e: dict, dtype: str, what: str) -> str | None:
    dt = _dtype(dtype)
    if dt is None or not dt.is_floating_point or not e["nonfinite_actual"]:
        return None
    limit = torch.finfo(dt).max
    if e["ref_max"] <= limit:
        return None
    return TEXT["overflow"].format(ref_max=e["ref_max"], dtype=dtype, limit=limit, what=what)


def for_op(op: str, dtype: str, e: dict, reduced: int | None) -> str | None:
    """The hint for an op out of tolerance (``reduced``: elements per result of a reduction)."""
    h = overflow(e, dtype, "op")
    if h:
        return h
    if _dtype(dtype) not in HALF:
        return None
    name = packet(op)
    if name in REDUCTIONS and reduced is not None and reduced >= LONG_REDUCTION:
        return TEXT["reduction"].format(length=f"{reduced:,}", dtype=dtype)
    if name in AUTOCAST_FP32:
        return TEXT["autocast"].format(name=name, dtype=dtype)
    return None


def for_module(cls: str, dtype: str, e: dict) -> str | None:
    """The hint for a module whose output is out of tolerance."""
    h = overflow(e, dtype, "module")
    if h:
        return h
    if _dtype(dtype) in HALF and cls.endswith(AUTOCAST_MODULES):
        return TEXT["autocast"].format(name=cls, dtype=dtype)
    return None
