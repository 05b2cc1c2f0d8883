"""The virtual NPU host: physical NPUs, logical devices, and the plan/commit lifecycle.

The host has ``TORCH_RBLN_VIRTUAL_NPUS`` physical NPUs of model ``RBLN_FORCE_NPU_NAME``.
Queries (``device_count()``...) *plan* the logical->physical mapping from ``RBLN_DEVICES`` /
``RBLN_VISIBLE_DEVICES``, ``RBLN_DEVICE_MAP`` and ``RBLN_NPUS_PER_DEVICE``; the first real use
(an allocation, ``synchronize()``) *commits* it, after which the variables are no longer read.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

from .. import config
from .arena import Arena

# Emulated NPU models: name -> (memory per NPU in bytes, chiplets per NPU)
NPU_MODELS = {
    "RBLN-CA25": (16 << 30, 1),
    "RBLN-CA22": (16 << 30, 1),
    "RBLN-CA12": (16 << 30, 1),
    "RBLN-CA02": (16 << 30, 1),
    "RBLN-CR13": (144 << 30, 4),
}


class DeviceConfigError(RuntimeError):
    """The RBLN_* device configuration cannot be mapped onto this host."""


@dataclass(frozen=True)
class Plan:
    groups: tuple[tuple[int, ...], ...]      # logical index -> physical NPU ids (system ids)
    unused: tuple[int, ...]                  # visible NPUs left out by grouping
    visible: tuple[int, ...]                 # system ids visible to this process
    npu_name: str
    memory_per_npu: int
    chiplets: int


_lock = threading.RLock()
_committed: Plan | None = None
_arenas: dict[int, Arena] = {}


def physical_npus() -> int:
    return config.parse("TORCH_RBLN_VIRTUAL_NPUS")


def _make_plan() -> Plan:
    n_phys = physical_npus()
    name = config.parse("RBLN_FORCE_NPU_NAME")
    mem, chiplets = NPU_MODELS.get(name, (16 << 30, 1))
    override = config.parse("TORCH_RBLN_DEVICE_MEMORY")
    if override is not None:
        mem = override
    visible = config.parse("RBLN_DEVICES")
    if visible is None:
        visible = config.parse("RBLN_VISIBLE_DEVICES")
    if visible is None:
        visible = tuple(range(n_phys))
    for v in visible:
        if v >= n_phys:
            raise DeviceConfigError(
                f"RBLN_DEVICES names physical NPU {v}, but this virtual host has {n_phys} NPU(s) "
                f"(ids 0..{n_phys - 1}); set TORCH_RBLN_VIRTUAL_NPUS to emulate more")
    dmap = config.parse("RBLN_DEVICE_MAP")
    unused: tuple[int, ...] = ()
    if dmap is not None:
        for g in dmap:
            for i in g:
                if i >= len(visible):
                    raise DeviceConfigError(
                        f"RBLN_DEVICE_MAP names NPU {i}, but only {len(visible)} NPU(s) are "
                        f"visible (ids index the visible pool 0..{len(visible) - 1})")
        groups = tuple(tuple(visible[i] for i in g) for g in dmap)
        used = {i for g in dmap for i in g}
        unused = tuple(visible[i] for i in range(len(visible)) if i not in used)
    else:
        k = config.parse("RBLN_NPUS_PER_DEVICE")
        n = len(visible) // k
        groups = tuple(tuple(visible[j * k:(j + 1) * k]) for j in range(n))
        unused = tuple(visible[n * k:])
    return Plan(groups, unused, tuple(visible), name, mem, chiplets)


def plan() -> Plan:
    """The mapping as it would be committed now (the committed one once frozen)."""
    with _lock:
        if _committed is not None:
            return _committed
        return _make_plan()


def commit() -> Plan:
    """Freeze the mapping (first real device use)."""
    global _committed
    if _committed is not None:
        return _committed
    with _lock:
        if _committed is None:
            p = _make_plan()
            if p.unused:
                warnings.warn(f"{len(p.unused)} physical NPU(s) are unused due to grouping "
                              f"constraints: {list(p.unused)}", stacklevel=3)
            _committed = p
            from .. import log
            log.on_mapping_committed(p)
        return _committed


def is_committed() -> bool:
    return _committed is not None


def count() -> int:
    """Logical device count; never raises (0 and a warning on a malformed configuration)."""
    try:
        return len(plan().groups)
    except (config.EnvError, DeviceConfigError) as e:
        warnings.warn(f"torch.rbln: no usable RBLN device: {e}", stacklevel=3)
        return 0


def count_or_raise() -> int:
    n = len(plan().groups)
    if n == 0:
        raise RuntimeError("No RBLN device is available: the RBLN_* configuration leaves no "
                           "logical device (check RBLN_DEVICES / RBLN_DEVICE_MAP)")
    return n


def arena(index: int) -> Arena:
    a = _arenas.get(index)
    if a is not None:
        return a
    with _lock:
        p = commit()
        if not 0 <= index < len(p.groups):
            raise RuntimeError(f"rbln device index {index} is out of range [0, {len(p.groups)})")
        a = _arenas.get(index)
        if a is None:
            a = _arenas[index] = Arena(index, p.memory_per_npu * len(p.groups[index]))
        return a


def arenas() -> dict[int, Arena]:
    return _arenas


# current device (per thread, like torch.cuda)
_tls = threading.local()


def current() -> int:
    return getattr(_tls, "index", 0)


def set_current(index: int) -> None:
    _tls.index = index
