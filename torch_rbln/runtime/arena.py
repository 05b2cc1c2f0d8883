"""Device memory of the virtual NPU: one arena per logical device with a caching allocator.

The arenas live in the native core (``csrc/Arena.*``); this is their Python face, as
``torch.rbln.memory_*`` and explain's device-memory gauge read them. A block is a piece of host
RAM standing in for device DRAM. Requests are rounded up to ``BLOCK_ROUND`` bytes; freed blocks
stay cached (``reserved``) for reuse by a request of the same rounded size until
:meth:`Arena.empty_cache`. An arena refuses to reserve past its capacity: it first releases its
cache and retries (``num_alloc_retries``), then raises ``torch.OutOfMemoryError`` and leaves
every statistic as it was (``num_ooms`` aside). docs/tensors-and-memory.md ("Device tensors and memory").
"""

from __future__ import annotations

from .. import _C

BLOCK_ROUND = 512
round_size = _C.round_block          # bytes a request of n bytes books


class Arena:
    """The arena of logical device ``index`` (the mapping is committed when one is made)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        _C.arena_capacity(index)      # commits the mapping and checks the index
        self.index = index

    @property
    def capacity(self) -> int:
        return _C.arena_capacity(self.index)

    @property
    def reserved(self) -> int:
        """Bytes reserved now (held by tensors + cached)."""
        return _C.arena_reserved(self.index)

    @property
    def held(self) -> int:
        """Bytes of reserved blocks with memory of their own: the device memory physically held.
        A block whose storage's host view serves as its memory (one copy for both sides) holds
        none. A diagnostic: every statistic counts all blocks alike."""
        return _C.arena_held(self.index)

    def stats(self) -> dict[str, int]:
        """The dotted statistics of ``torch.rbln.memory_stats()``."""
        return _C.arena_stats(self.index)

    def reset_peak(self) -> None:
        _C.arena_reset_peak(self.index)

    def reset_accumulated(self) -> None:
        _C.arena_reset_accumulated(self.index)

    def empty_cache(self) -> None:
        _C.arena_empty_cache(self.index)


def in_use() -> list[Arena]:
    """The arenas of the committed mapping (none before the first real device use)."""
    return [Arena(i) for i in _C.committed_devices()]


def reserved_totals() -> tuple[int, int]:
    """(reserved now, process-wide reserved peak), summed over the arenas: explain's gauge."""
    return _C.reserved_totals()
