"""torch.rbln memory statistics and allocator control, torch.cuda-style (docs/tensors-and-memory.md ("Device tensors
and memory"))."""

from __future__ import annotations

import os

import torch

from .runtime import devices

__all__ = [
    "empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "memory_stats_as_nested_dict",
    "memory_cached", "max_memory_cached", "reset_max_memory_allocated", "reset_max_memory_cached",
    "caching_allocator_alloc", "caching_allocator_delete", "get_allocator_backend",
    "host_memory_stats", "reset_peak_host_memory_stats", "reset_accumulated_host_memory_stats",
    "device_memory_used", "get_per_process_memory_fraction",
]


def _normalize_device(device) -> int:
    if isinstance(device, bool):
        raise TypeError(f"Expected an 'rbln' device, got a bool ({device!r})")
    if device is None:
        return devices.current()
    if isinstance(device, int):
        idx = device
    elif isinstance(device, (str, torch.device)):
        raw = device
        try:
            d = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"Invalid device string {raw!r}: {e}") from None
        if d.type != "rbln":
            raise ValueError(f"Expected an 'rbln' device, got '{d.type}' (from {raw!r})")
        if isinstance(raw, str) and ":" in raw:
            idx = int(raw.split(":", 1)[1])   # the raw suffix, so "rbln:256" is range-checked
        else:
            idx = d.index if d.index is not None else devices.current()
    else:
        raise TypeError(f"Expected an 'rbln' device, got {type(device).__name__} ({device!r})")
    n = devices.count()
    if n > 0 and not 0 <= idx < n:
        raise ValueError(f"rbln device index {idx} is out of range [0, {n})")
    return idx


def _arena(device):
    idx = _normalize_device(device)
    if devices.count() == 0:
        return None
    return devices.arena(idx)


def memory_stats(device=None) -> dict:
    """Caching-allocator statistics of ``device`` with the dotted keys
    (``allocated.current``, ``reserved.peak``, ...)."""
    a = _arena(device)
    return a.stats() if a is not None else {}


def memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated.current", 0)


def max_memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated.peak", 0)


def memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved.current", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved.peak", 0)


def reset_peak_memory_stats(device=None) -> None:
    a = _arena(device)
    if a is not None:
        a.reset_peak()


def reset_accumulated_memory_stats(device=None) -> None:
    a = _arena(device)
    if a is not None:
        a.reset_accumulated()


def empty_cache(device=None) -> None:
    """Release cached device blocks and drop the compiled-program caches: everything the user
    is not holding."""
    from .runtime import caches
    from .runtime.storage import clear_host_pool
    caches.drop_all()
    clear_host_pool()
    if devices.count() == 0:
        return
    if device is None:
        for a in devices.arenas():
            a.empty_cache()
    else:
        a = _arena(device)
        if a is not None:
            a.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory, all of this process's holders included."""
    a = _arena(device)
    if a is None:
        raise RuntimeError("torch.rbln.mem_get_info: no RBLN device is available")
    capacity = a.capacity
    return capacity - a.reserved, capacity


def memory_summary(device=None, abbreviated: bool = False) -> str:
    a = _arena(device)
    if a is None:
        return "torch_rbln memory summary: no statistics (no RBLN device or allocator uninitialized)\n"
    idx = a.index
    plan = devices.plan()
    mib = 1 << 20
    s = a.stats()
    cols = ("allocated", "alloc peak", "reserved", "resv peak", "active", "cached")
    vals = (s["allocated.current"], s["allocated.peak"], s["reserved.current"], s["reserved.peak"],
            s["active.current"], s["cached.current"])
    npu = plan.groups[idx][0] if idx < len(plan.groups) else idx
    rule = "-" * (5 + 9 + 13 * len(cols))
    lines = [
        f"torch_rbln memory summary (device=rbln:{idx}, MiB)",
        f"scope: pid {os.getpid()} -- caching allocator only, this process only",
        "npu: physical NPU id as in device_summary() (relative to RBLN_VISIBLE_DEVICES, may differ from rbln-smi)",
        f"{'npu':>5}{'chiplet':>9}" + "".join(f"{c:>13}" for c in cols),
        rule,
        f"{npu:>5}{0:>9}" + "".join(f"{v / mib:>13.1f}" for v in vals),
        rule,
        f"{'':>5}{'total':>9}" + "".join(f"{v / mib:>13.1f}" for v in vals),
        f"alloc retries: {s['num_alloc_retries']}   ooms: {s['num_ooms']}",
    ]
    return "\n".join(lines) + "\n"


def memory_stats_as_nested_dict(device=None) -> dict:
    """``memory_stats`` with its dotted keys nested (``{"allocated": {"current": ...}}``)."""
    out: dict = {}
    for key, value in memory_stats(device).items():
        node = out
        *path, leaf = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _deprecated(old: str, new: str) -> None:
    import warnings
    warnings.warn(f"torch.rbln.{old} has been renamed to torch.rbln.{new}", FutureWarning,
                  stacklevel=3)


def memory_cached(device=None) -> int:
    """Deprecated name of :func:`memory_reserved` (as in torch.cuda)."""
    _deprecated("memory_cached", "memory_reserved")
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    _deprecated("max_memory_cached", "max_memory_reserved")
    return max_memory_reserved(device)


def reset_max_memory_allocated(device=None) -> None:
    """Deprecated: resets every peak, as torch.cuda's does."""
    _deprecated("reset_max_memory_allocated", "reset_peak_memory_stats")
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None) -> None:
    _deprecated("reset_max_memory_cached", "reset_peak_memory_stats")
    reset_peak_memory_stats(device)


_raw_blocks: dict = {}     # data pointer -> the uint8 rbln tensor holding it


def caching_allocator_alloc(size: int, device=None, stream=None) -> int:
    """``size`` bytes from the caching allocator of ``device``; returns the data pointer, freed
    by :func:`caching_allocator_delete`. ``stream`` is accepted (the arena is not per stream)."""
    idx = _normalize_device(device)
    t = torch.empty(int(size), dtype=torch.uint8, device=torch.device("rbln", idx))
    _raw_blocks[t.data_ptr()] = t
    return t.data_ptr()


def caching_allocator_delete(mem_ptr: int) -> None:
    if _raw_blocks.pop(mem_ptr, None) is None:
        raise ValueError(f"torch.rbln.caching_allocator_delete: {mem_ptr:#x} was not allocated by "
                         "torch.rbln.caching_allocator_alloc")


def get_allocator_backend() -> str:
    """The device allocator: the arena's caching allocator (docs/tensors-and-memory.md ("Device tensors and
    memory")); there is no other."""
    return "native"


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction of the device's memory this process may reserve: all of it (the capacity is
    ``TORCH_RBLN_DEVICE_MEMORY``; there is no per-process fraction to set)."""
    _normalize_device(device)
    return 1.0


def host_memory_stats() -> dict:
    """Statistics of the pinned host allocator (``pin_memory()`` blocks)."""
    from . import _C
    return dict(_C._pinned_memory_stats())


def reset_peak_host_memory_stats() -> None:
    from . import _C
    _C._pinned_memory_reset_peak()


def reset_accumulated_host_memory_stats() -> None:
    from . import _C
    _C._pinned_memory_reset_accumulated()


def device_memory_used(device=None) -> int:
    """Bytes of the device's memory in use: what this process's arena reserves (the virtual NPU
    keeps no account of other processes)."""
    free, total = mem_get_info(device)
    return total - free
