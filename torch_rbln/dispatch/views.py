"""Metadata-only ops: they touch sizes, strides and storage, never data.

They run PyTorch's own CPU kernel on the rbln tensor itself (redispatch below PrivateUse1), so
the result shares the rbln storage and keeps ``device == rbln``. No transfer, no event, no
decision: the kernel is the native core's (``csrc/Views.cpp``), a view costs what it costs on
the CPU plus one redispatch.
"""

from __future__ import annotations

from .. import _C

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
    "_nested_view_from_buffer",   # a nested tensor over the buffer's storage (its metadata on the CPU)
)


def register() -> None:
    """Register :data:`VIEW_OPS` on PrivateUse1 (the native redispatch kernel)."""
    _C.register_views(list(VIEW_OPS))
