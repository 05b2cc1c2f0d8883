"""The virtual NPU host: physical NPUs, logical devices, and the plan/commit lifecycle.

Two things are read from the environment, at two different times:

* the *host* (``TORCH_RBLN_VIRTUAL_NPUS`` NPUs of model ``RBLN_FORCE_NPU_NAME``, each with
  ``TORCH_RBLN_DEVICE_MEMORY`` bytes) is read once, at the first device query: the hardware of a
  real host does not change while a process runs either;
* the *mapping* (``RBLN_DEVICES`` / ``RBLN_VISIBLE_DEVICES``, ``RBLN_DEVICE_MAP``,
  ``RBLN_NPUS_PER_DEVICE``) is re-planned by every query until the first real use (an rbln
  tensor, ``synchronize()``, a collective) *commits* it; after that the variables are no longer
  read. At commit the process claims its NPUs (``claims``: shared between processes as on a
  host).

Nothing here imports torch, so ``python -m torch_rbln.diagnose`` can plan the mapping on a
machine where ``import torch`` fails. docs/several-devices.md ("Several devices").
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass

from .. import config

_log = logging.getLogger("torch_rbln")

# Emulated NPU models: name -> (memory per NPU in bytes, chiplets per NPU)
NPU_MODELS = {
    "RBLN-CA25": (16 << 30, 1),
    "RBLN-CA22": (16 << 30, 1),
    "RBLN-CA12": (16 << 30, 1),
    "RBLN-CA02": (16 << 30, 1),
    "RBLN-CR13": (144 << 30, 4),
}
DEFAULT_MODEL = (16 << 30, 1)

# The runtime's ABI window (the analogue of librbln.so's rbln_abi_min_supported() /
# rbln_abi_current()): the backend's torch_rbln.abi.BUILT_ABI must fall inside it.
RUNTIME_ABI_MIN_SUPPORTED = 1
RUNTIME_ABI_CURRENT = 1


class DeviceConfigError(RuntimeError):
    """The RBLN_* device configuration cannot be mapped onto this host."""


@dataclass(frozen=True)
class Host:
    npus: int                 # physical NPUs on the virtual host (system ids 0..npus-1)
    npu_name: str
    memory_per_npu: int
    chiplets: int


@dataclass(frozen=True)
class Plan:
    groups: tuple[tuple[int, ...], ...]      # logical index -> physical NPU ids (system ids)
    unused: tuple[int, ...]                  # visible NPUs left out by grouping
    visible: tuple[int, ...]                 # system ids visible to this process
    npu_name: str
    memory_per_npu: int
    chiplets: int


_lock = threading.RLock()
_host: Host | None = None
_committed: Plan | None = None


def host() -> Host:
    """The virtual host, read from the environment at the first call and fixed afterwards."""
    global _host
    if _host is None:
        with _lock:
            if _host is None:
                if config.parse("RBLN_DUMMY_DEVICE"):
                    warnings.warn("RBLN_DUMMY_DEVICE is set: the virtual NPU runs on any machine, "
                                  "so it does not emulate the host-backed dummy device; devices "
                                  "execute programs as usual", stacklevel=3)
                name = config.parse("RBLN_FORCE_NPU_NAME")
                mem, chiplets = NPU_MODELS.get(name, DEFAULT_MODEL)
                override = config.parse("TORCH_RBLN_DEVICE_MEMORY")
                _host = Host(config.parse("TORCH_RBLN_VIRTUAL_NPUS"), name,
                             mem if override is None else override, chiplets)
    return _host


def _visible(h: Host) -> tuple[int, ...]:
    """System ids of the NPUs this process may use. RBLN_DEVICES wins over its alias."""
    for name in ("RBLN_DEVICES", "RBLN_VISIBLE_DEVICES"):
        ids = config.parse(name)
        if ids is None:
            continue
        for v in ids:
            if v >= h.npus:
                raise DeviceConfigError(
                    f"{name} names physical NPU {v}, but this virtual host has {h.npus} NPU(s) "
                    f"(ids 0..{h.npus - 1}); set TORCH_RBLN_VIRTUAL_NPUS to emulate more")
        return ids
    return tuple(range(h.npus))


def _groups(visible: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """(groups of system ids, unused system ids). Ids in RBLN_DEVICE_MAP index the visible
    pool; RBLN_DEVICE_MAP > RBLN_NPUS_PER_DEVICE > one NPU per device."""
    dmap = config.parse("RBLN_DEVICE_MAP")
    if dmap is not None:
        for g in dmap:
            for i in g:
                if i >= len(visible):
                    raise DeviceConfigError(
                        f"RBLN_DEVICE_MAP names NPU {i}, but only {len(visible)} NPU(s) are "
                        f"visible (ids index the visible pool 0..{len(visible) - 1})")
        used = {i for g in dmap for i in g}
        return (tuple(tuple(visible[i] for i in g) for g in dmap),
                tuple(v for i, v in enumerate(visible) if i not in used))
    k = config.parse("RBLN_NPUS_PER_DEVICE")
    n = len(visible) // k
    return tuple(visible[j * k:(j + 1) * k] for j in range(n)), visible[n * k:]


def _make_plan(settings: bool = True) -> Plan:
    if settings:
        config.check_settings()   # a bad setting of any kind: the first device use says so
    h = host()
    visible = _visible(h)
    groups, unused = _groups(visible)
    return Plan(groups, unused, visible, h.npu_name, h.memory_per_npu, h.chiplets)


def plan(settings: bool = True) -> Plan:
    """The mapping as it would be committed now (the committed one once frozen). Raises
    :class:`~torch_rbln.config.EnvError` or :class:`DeviceConfigError` on a bad configuration
    (with ``settings``, also on a bad value of any other variable: no device is usable then)."""
    p = _committed
    if p is not None:
        return p
    with _lock:
        return _committed or _make_plan(settings)


def visible() -> tuple[int, ...]:
    """Visible physical NPUs, whatever the grouping (a bad RBLN_DEVICE_MAP does not matter)."""
    p = _committed
    return p.visible if p is not None else _visible(host())


def commit() -> Plan:
    """Freeze the mapping (first real device use) and claim its NPUs; later edits of the
    variables are ignored."""
    global _committed
    p = _committed
    if p is not None:
        return p
    with _lock:
        if _committed is None:
            p = _make_plan()
            if p.unused:
                warnings.warn(f"{len(p.unused)} physical NPU(s) are unused due to grouping "
                              f"constraints: {list(p.unused)}", stacklevel=3)
            _committed = p
            if _native is not None:
                _native._commit_device_count(len(p.groups))
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("Device configuration complete:\n%s", summary_text(p))
            from . import claims
            claims.claim(npu for g in p.groups for npu in g)
        return _committed


def is_committed() -> bool:
    return _committed is not None


def count() -> int:
    """Logical device count; never raises (0 and a warning on a malformed configuration)."""
    p = _committed
    if p is not None:
        return len(p.groups)
    try:
        return len(plan().groups)
    except (config.EnvError, DeviceConfigError) as e:
        warnings.warn(f"torch.rbln: no usable RBLN device: {e}", stacklevel=3)
        return 0


def _no_device() -> RuntimeError:
    return RuntimeError("No RBLN device is available: the RBLN_* configuration leaves no logical "
                        "device (check RBLN_DEVICES / RBLN_DEVICE_MAP / RBLN_NPUS_PER_DEVICE, "
                        "and torch.rbln.device_summary())")


def count_or_raise() -> int:
    """Logical device count; the detailed configuration error, or "no device", if there is none."""
    n = len(plan().groups)
    if n == 0:
        raise _no_device()
    return n


def claim(index: int) -> int:
    """First real use of logical device ``index`` (a tensor is created on it): commit the
    mapping and check the index against it."""
    p = _committed or commit()
    n = len(p.groups)
    if not 0 <= index < n:
        if n == 0:
            raise _no_device()
        raise RuntimeError(f"rbln device index {index} is out of range [0, {n}): this process sees "
                           f"{n} logical RBLN device(s) (see torch.rbln.device_summary())")
    return index


def mixed_devices(first: int, other: int) -> RuntimeError:
    """PyTorch's own error for an op whose tensor operands sit on two devices."""
    return RuntimeError("Expected all tensors to be on the same device, but found at least two "
                        f"devices, rbln:{first} and rbln:{other}!")


def arena(index: int):
    """The arena of logical device ``index`` (commits the mapping; the index is range-checked)."""
    from .arena import Arena  # torch-dependent: imported on first device use only
    return Arena(index)


def arenas() -> list:
    """The arenas of the committed mapping (none before the first real use)."""
    from .arena import in_use
    return in_use() if _committed is not None else []


def summary_text(p: Plan) -> str:
    """The reference's topology table; columns stretch to fit, Status never narrower than
    "Active (Aggregated)"."""
    rows = [(f"rbln:{i}", "[ " + ", ".join(map(str, g)) + " ]",
             "Active (Aggregated)" if len(g) > 1 else "Active") for i, g in enumerate(p.groups)]
    if p.unused:
        rows.append(("-", "[ " + ", ".join(map(str, p.unused)) + " ]", "Unused"))
    head = ("Logical Device", "Physical NPU IDs", "Status")
    w = [max(len(head[c]), *(len(r[c]) for r in rows)) if rows else len(head[c]) for c in range(3)]
    w[2] = max(w[2], len("Active (Aggregated)"))
    sep = "+" + "+".join("-" * (x + 2) for x in w) + "+"

    def line(r):
        return "|" + "|".join(f" {r[c]:<{w[c]}} " for c in range(3)) + "|"

    out = ["[RBLN] Device Topology Initialized:", sep, line(head), sep, *map(line, rows), sep]
    if p.unused:
        out.append(f"[Warning] {len(p.unused)} physical NPU(s) are unused due to grouping "
                   "constraints.")
    return "\n".join(out)


# The current device (per thread, like torch.cuda) lives in the native core's device guard, so
# PyTorch's C++ (DeviceGuard, torch.accelerator, autograd's device threads) and this module
# see one value. Until the backend binds the native core (diagnose mode never does), a Python
# thread-local stands in.
_native = None
_tls = threading.local()


def bind_native(native) -> None:
    """Hand the current device and the device count over to the native core's guard."""
    global _native
    native.set_device(current())
    native._set_device_count_source(count)
    if _committed is not None:
        native._commit_device_count(len(_committed.groups))
    _native = native


def current() -> int:
    n = _native
    return n.current_device() if n is not None else getattr(_tls, "index", 0)


def set_current(index: int) -> None:
    n = _native
    if n is not None:
        n.set_device(index)
    else:
        _tls.index = index
