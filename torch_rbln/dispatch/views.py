"""Metadata-only ops: they touch sizes, strides and storage, never data.

They run PyTorch's own CPU kernel on the rbln tensor itself (redispatch below PrivateUse1), so
the result shares the rbln storage and keeps ``device == rbln``. No transfer, no event.
"""

from __future__ import annotations

import torch

from ..runtime.storage import CPU_KEYSET
from .optable import overload

# overloads whose CPU kernel only rewrites metadata
VIEW_OPS = (
    "view",
    "as_strided",
    "_reshape_alias",
    "_unsafe_view",
    "alias",
    "unfold",
    "view_as_real",
    "view_as_complex",
    "set_.source_Storage_storage_offset",
    "as_strided_",
    "_neg_view",
    "_conj",
)


def _redispatch(op: torch._ops.OpOverload):
    handle = op._handle

    def kernel(*args, **kwargs):
        return handle.redispatch_boxed(CPU_KEYSET, *args, **kwargs)

    kernel.__name__ = f"rbln_view_{op.__name__}"
    return kernel


def kernels() -> dict:
    return {name: _redispatch(overload(name)) for name in VIEW_OPS}
