"""Attention dropout: the mask is a program input drawn from the device's generator.

The device attention program takes its dropout mask as an input: the forward draws a seed from
the device's generator and returns it as the op's ``philox_seed``; the backward rebuilds the
same mask from that seed (docs/eager.md ("Eager execution"), attention).
"""

from __future__ import annotations

import torch

from ..runtime import executors, generators

_SDPA = "_scaled_dot_product_fused_attention_overrideable"
_SDPA_BACKWARD = _SDPA + "_backward"
# where ``dropout_p`` sits in each attention op's arguments
DROPOUT_AT = {_SDPA: 4, _SDPA_BACKWARD: 12}


def attention_dropout_p(name: str, args, kwargs) -> float:
    """``dropout_p`` of a call of the attention op ``name`` (0.0 for any other op)."""
    i = DROPOUT_AT.get(name)
    if i is None:
        return 0.0
    return args[i] if len(args) > i else kwargs.get("dropout_p", 0.0)


def _dropout_seed(index: int) -> int:
    """One draw from rbln:index's generator: the seed of one attention dropout mask (so
    ``torch.rbln.manual_seed`` / ``torch.manual_seed`` make the masks repeat)."""
    gen = generators.default_host(index)
    return int(torch.empty((), dtype=torch.int64).random_(generator=gen))


def with_attention_dropout(name: str, fn, index: int | None = None):
    """``fn`` (an attention op's kernel or program body) given its dropout mask when
    ``dropout_p > 0``; with ``dropout_p == 0`` the call goes straight through.

    The forward draws a seed from the generator of rbln:``index`` (the device of ``q`` when
    None), builds the mask from it (``executors.dropout_keep``) and returns the seed as the
    op's ``philox_seed``; the backward rebuilds the same mask from that seed, as CUDA's
    attention kernels do with their Philox state."""
    forward = name == _SDPA

    def run(*args, **kwargs):
        p = attention_dropout_p(name, args, kwargs)
        if not p:
            return fn(*args, **kwargs)
        q, k = (args[0], args[1]) if forward else (args[1], args[2])
        shape = (*q.shape[:-1], k.shape[-2])
        if forward:
            seed = _dropout_seed(q.device.index if index is None else index)
        else:
            seed = int(args[14] if len(args) > 14 else kwargs["philox_seed"])
        res = fn(*args, dropout_mask=executors.dropout_keep(seed, shape, p), **kwargs)
        if not forward:
            return res
        res = list(res)
        res[6] = torch.tensor(seed, dtype=torch.int64, device=res[0].device)
        res[7] = torch.zeros((), dtype=torch.int64, device=res[0].device)
        return tuple(res)

    run.__name__ = getattr(fn, "__name__", name)
    return run
