"""Device memory of the virtual NPU: one arena per logical device with a caching allocator.

A block is a piece of host RAM standing in for device DRAM. Requests are rounded up to
``BLOCK_ROUND`` bytes; freed blocks stay cached (``reserved``) for reuse by a request of the
same rounded size until :meth:`Arena.empty_cache`. The arena refuses to reserve past its
capacity: it first releases its cache and retries (``num_alloc_retries``), then raises
``torch.OutOfMemoryError`` and leaves every statistic as it was (``num_ooms`` aside).
README: "Device tensors and memory".
"""

from __future__ import annotations

import threading

import torch

BLOCK_ROUND = 512


def round_size(nbytes: int) -> int:
    return max(BLOCK_ROUND, (nbytes + BLOCK_ROUND - 1) // BLOCK_ROUND * BLOCK_ROUND)


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} bytes"


class Block:
    """A device allocation. ``mem`` is the backing RAM (a flat CPU tensor); it may be replaced
    by a program's own output tensor of the same byte size (see ``Buffer.adopt_device``)."""

    __slots__ = ("size", "mem", "arena")

    def __init__(self, size: int, mem: torch.Tensor | None, arena: "Arena"):
        self.size = size
        self.mem = mem
        self.arena = arena


_STAT_KEYS = ("allocated", "reserved", "active")


class Arena:
    def __init__(self, index: int, capacity: int):
        self.index = index
        self.capacity = capacity
        self._cache: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.reset_all()

    # statistics -----------------------------------------------------------------------------
    def reset_all(self) -> None:
        self.cur = dict.fromkeys(_STAT_KEYS, 0)
        self.peak = dict.fromkeys(_STAT_KEYS, 0)
        self.total_alloc = dict.fromkeys(_STAT_KEYS, 0)
        self.total_freed = dict.fromkeys(_STAT_KEYS, 0)
        self.num_alloc_retries = self.num_ooms = 0
        self.num_device_alloc = self.num_device_free = 0
        self.cached = 0
        self.reserved_peak_ever = 0   # process-wide high-water mark (explain's gauge), never reset

    def _add(self, key: str, n: int) -> None:
        c = self.cur[key] = self.cur[key] + n
        self.total_alloc[key] += n
        if c > self.peak[key]:
            self.peak[key] = c

    def _add_tensor_bytes(self, n: int) -> None:
        """``_add`` of "allocated" and "active" (they move together on every malloc), inlined:
        this runs once per op output."""
        cur, peak, total = self.cur, self.peak, self.total_alloc
        a = cur["allocated"] = cur["allocated"] + n
        b = cur["active"] = cur["active"] + n
        total["allocated"] += n
        total["active"] += n
        if a > peak["allocated"]:
            peak["allocated"] = a
        if b > peak["active"]:
            peak["active"] = b

    def _sub(self, key: str, n: int) -> None:
        self.cur[key] -= n
        self.total_freed[key] += n

    def stats(self) -> dict[str, int]:
        out = {}
        for k in _STAT_KEYS:
            out[f"{k}.current"] = self.cur[k]
            out[f"{k}.peak"] = self.peak[k]
            if k != "active":
                out[f"{k}.total_allocated"] = self.total_alloc[k]
                out[f"{k}.total_freed"] = self.total_freed[k]
        out["cached.current"] = self.cached
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        return out

    def reset_peak(self) -> None:
        self.peak = dict(self.cur)

    def reset_accumulated(self) -> None:
        self.total_alloc = dict.fromkeys(_STAT_KEYS, 0)
        self.total_freed = dict.fromkeys(_STAT_KEYS, 0)
        self.num_alloc_retries = self.num_ooms = 0
        self.num_device_alloc = self.num_device_free = 0

    # allocation -----------------------------------------------------------------------------
    def malloc(self, nbytes: int, with_memory: bool = True) -> Block:
        """A block of at least ``nbytes``. ``with_memory=False`` books the block but leaves the
        RAM to the caller (a program output adopted as the block's memory)."""
        size = round_size(nbytes)
        with self._lock:
            lst = self._cache.get(size)
            if lst:
                mem = lst.pop()
                self.cached -= size
                self._add_tensor_bytes(size)
                return Block(size, mem if with_memory else None, self)
            if self.cur["reserved"] + size > self.capacity:
                if self.cached:
                    self.num_alloc_retries += 1
                    self._release_cache()
                if self.cur["reserved"] + size > self.capacity:
                    self.num_ooms += 1
                    raise torch.OutOfMemoryError(
                        f"RBLN out of memory on rbln:{self.index}: tried to allocate "
                        f"{_fmt_bytes(size)} ({size} bytes); device capacity "
                        f"{_fmt_bytes(self.capacity)} ({self.capacity} bytes), "
                        f"{_fmt_bytes(self.cur['allocated'])} ({self.cur['allocated']} bytes) "
                        f"allocated by tensors, {_fmt_bytes(self.cur['reserved'])} "
                        f"({self.cur['reserved']} bytes) reserved in total. Free tensors, call "
                        f"torch.rbln.empty_cache(), or raise TORCH_RBLN_DEVICE_MEMORY.")
            self._add("reserved", size)
            self._add_tensor_bytes(size)
            self.num_device_alloc += 1
            if self.cur["reserved"] > self.reserved_peak_ever:
                self.reserved_peak_ever = self.cur["reserved"]
        mem = torch.empty(size, dtype=torch.uint8) if with_memory else None
        return Block(size, mem, self)

    def free(self, block: Block) -> None:
        size = block.size
        mem, block.mem = block.mem, None
        with self._lock:
            cur, freed = self.cur, self.total_freed
            cur["allocated"] -= size
            cur["active"] -= size
            freed["allocated"] += size
            freed["active"] += size
            if mem is not None and mem.numel() == size and mem.dtype == torch.uint8:
                self._cache.setdefault(size, []).append(mem)
                self.cached += size
            else:
                # adopted memory is not reusable as a raw block: give it back now
                self._sub("reserved", size)
                self.num_device_free += 1

    def _release_cache(self) -> None:
        for size, lst in self._cache.items():
            n = len(lst)
            self.cur["reserved"] -= size * n
            self.total_freed["reserved"] += size * n
            self.num_device_free += n
        self._cache.clear()
        self.cached = 0

    def empty_cache(self) -> None:
        with self._lock:
            self._release_cache()
