"""Sparse and quantized tensors: the NPU has neither, so rbln refuses them with a clear error.

An rbln storage holds a strided (dense) tensor of a plain dtype. Two ways reach the refusal:
an op dispatched to the sparse or quantized rbln keys (``torch.zeros(..., layout=sparse_coo,
device="rbln")``, ``torch._empty_affine_quantized(..., device="rbln")``, ``.to("rbln")`` of a
sparse or quantized CPU tensor) lands on the fallback registered for those keys, and an op
that the CPU fallback ran for rbln inputs and that returned such a tensor (``to_sparse``,
``quantize_per_tensor``) is stopped before its result would become an rbln tensor.
"""

from __future__ import annotations

import torch

# dispatch keys of the layouts the NPU does not have -> the name users know them by
KEYS = {
    "SparsePrivateUse1": "sparse (COO)",
    "SparseCsrPrivateUse1": "sparse compressed (CSR/CSC/BSR/BSC)",
    "QuantizedPrivateUse1": "quantized",
}


def unsupported(kind: str, op_name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{kind} tensors are not supported on rbln (`{op_name}`): the NPU holds strided, dense "
        f"tensors only. Keep {kind} tensors on the CPU, or make them dense first "
        f"(`.to_dense()`, `.dequantize()`) and move the dense tensor to rbln.")


def fallback_for(key: str):
    """The boxed fallback of one unsupported-layout dispatch key."""
    kind = KEYS[key]

    def refuse(op, *args, **kwargs):
        raise unsupported(kind, op.name())
    return refuse


def checked(result, op_name: str):
    """``result`` (a CPU op's output for rbln inputs), refused when an rbln tensor cannot hold
    it: a sparse or quantized tensor."""
    if isinstance(result, torch.Tensor):
        if result.layout is not torch.strided:
            raise unsupported("sparse" if result.layout is torch.sparse_coo else
                              f"sparse compressed ({result.layout})", op_name)
        if result.is_quantized:
            raise unsupported("quantized", op_name)
    elif isinstance(result, (list, tuple)):
        for r in result:
            checked(r, op_name)
    return result
