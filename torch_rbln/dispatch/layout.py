"""Does a tensor span its whole storage? The one test every write and every result uses.

A tensor *spans* ``nbytes`` bytes when it starts at offset 0 and its elements are exactly those
bytes, each once (dense: contiguous, or a permutation of a contiguous layout). Writing such a
tensor overwrites its whole storage, so no older data needs to be fetched first; a fresh result
that spans its own storage can become an rbln storage's memory as it is, without a copy.
"""

from __future__ import annotations

import torch


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: ordered by stride, each stride is the product of the sizes
    inside it (dims of size 1 place nothing)."""
    need = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != need:
            return False
        need *= size
    return True


def spans_storage(t: torch.Tensor, nbytes: int | None = None) -> bool:
    """``t`` spans ``nbytes`` bytes (by default the size of its own storage)."""
    if t.storage_offset():
        return False
    if t.numel() * t.element_size() != (t.untyped_storage().nbytes() if nbytes is None else nbytes):
        return False
    return t.is_contiguous() or _dense(t)
