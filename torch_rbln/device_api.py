"""torch.rbln device management: counts, selection, properties, topology (docs/torch-rbln.md ("torch.rbln
API") and "Several devices")."""

from __future__ import annotations

import torch

from . import amp
from .runtime import devices

__all__ = [
    "current_device", "device_count", "physical_device_count", "is_available", "is_dummy_device",
    "is_initialized", "get_amp_supported_dtype", "get_device_properties", "get_device_name",
    "get_device_capability", "set_device", "synchronize", "device", "device_of", "device_summary",
    "init", "is_bf16_supported", "is_tf32_supported", "can_device_access_peer",
    "is_current_stream_capturing", "get_sync_debug_mode", "set_sync_debug_mode",
    "OutOfMemoryError", "AcceleratorError",
]

# torch.cuda's names for PyTorch's device-generic errors (torch.rbln raises the same types)
OutOfMemoryError = torch.OutOfMemoryError
AcceleratorError = torch.AcceleratorError

_initialized = False


def _get_device_index(dev, optional: bool = False) -> int:
    """int passthrough; ``torch.device``/str must be rbln; no index -> current device."""
    if isinstance(dev, bool):
        raise TypeError(f"Invalid device type: {type(dev).__name__}")
    if isinstance(dev, int):
        return dev
    if dev is None:
        if optional:
            return -1
        raise ValueError("Expected a torch.device with a specified index or an integer, but got: None")
    if isinstance(dev, str):
        dev = torch.device(dev)
    if isinstance(dev, torch.device):
        if dev.type != "rbln":
            raise ValueError(f"Expected rbln device, but got {dev.type}")
        return dev.index if dev.index is not None else devices.current()
    raise TypeError(f"Invalid device type: {type(dev).__name__}")


def _index_or_current(device) -> int:
    """The index ``device`` names; the current device for ``None`` or an rbln device
    without an index."""
    return devices.current() if device is None else _get_device_index(device)


def device_count() -> int:
    """Number of logical RBLN devices. Never raises: 0 (and a warning) on a malformed
    ``RBLN_*`` configuration. Plans the device mapping without committing it."""
    return devices.count()


def physical_device_count() -> int:
    """Physical NPUs visible to this process, regardless of grouping."""
    try:
        return len(devices.visible())
    except Exception:
        return 0


def is_available() -> bool:
    """Whether an RBLN device is usable. Never raises."""
    try:
        return devices.count() > 0
    except Exception:
        return False


def is_dummy_device() -> bool:
    """The virtual NPU executes programs, so it is never the host-backed dummy device."""
    return False


def is_initialized() -> bool:
    """Whether the device runtime is in use: the mapping is committed (a tensor was created on
    rbln, or ``_lazy_init()`` ran) or a device was selected. PyTorch's own utilities read this
    through ``torch.rbln._initialized`` (``torch.utils.checkpoint`` saves and restores the rbln
    RNG only then), as they read ``torch.cuda._initialized``."""
    return _initialized or devices.is_committed() or device_count() == 0


def _lazy_init() -> None:
    """Initialize the device runtime now (commit the device mapping), as
    ``torch.cuda._lazy_init`` does; idempotent."""
    devices.commit()


def init() -> None:
    """Initialize the device runtime now (``torch.cuda.init``); it otherwise initializes itself
    at the first device use."""
    _lazy_init()


def _is_compiled() -> bool:
    return True


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """The NPU computes bfloat16 natively."""
    return is_available()


def is_tf32_supported() -> bool:
    """TF32 is an NVIDIA tensor-core format: float32 matmuls on the NPU are not rounded to it
    (``torch.backends.cuda.matmul.allow_tf32`` has no rbln counterpart)."""
    return False


def can_device_access_peer(device, peer_device) -> bool:
    """Whether ``device`` reads ``peer_device``'s memory directly: never; data between logical
    devices goes through the host (docs/several-devices.md ("Several devices"))."""
    _check_index(_get_device_index(device))
    _check_index(_get_device_index(peer_device))
    return False


def is_current_stream_capturing() -> bool:
    """rbln streams are never capturing: there is no stream capture (compiled graphs come from
    ``torch.compile``)."""
    return False


def get_sync_debug_mode() -> int:
    """0: rbln does not report synchronizing calls (``torch.cuda.set_sync_debug_mode``)."""
    return 0


def set_sync_debug_mode(debug_mode) -> None:
    if debug_mode not in (0, "default"):
        raise RuntimeError("torch.rbln.set_sync_debug_mode: rbln does not detect synchronizing "
                           "calls (every op finishes when launched on the virtual NPU), so only "
                           "mode 0 ('default') applies")


def _exchange_device(device: int) -> int:
    """Make ``device`` current and return the previous current device (-1: no change)."""
    if device < 0:
        return -1
    prev = devices.current()
    if device != prev:
        devices.set_current(_check_index(device))
    return prev


_maybe_exchange_device = _exchange_device


def get_amp_supported_dtype() -> list:
    """The dtypes ``torch.autocast("rbln", dtype=...)`` takes: float16 and bfloat16, which the
    device computes (the vendor's 0.12 binding gives ``[]``; see ``amp.py``)."""
    return list(amp.SUPPORTED_DTYPES)


def _check_index(idx: int) -> int:
    n = devices.count_or_raise()
    if not 0 <= idx < n:
        raise ValueError(f"rbln device index {idx} is out of range [0, {n})")
    return idx


def current_device() -> int:
    devices.count_or_raise()
    return devices.current()


def set_device(device) -> None:
    """Select the current device. Bookkeeping only: commits nothing. Negative/None: no-op."""
    global _initialized
    idx = _get_device_index(device, optional=True)
    if idx < 0:
        return
    devices.set_current(_check_index(idx))
    _initialized = True


class _DeviceProperties:
    __slots__ = ("name", "total_memory", "memory_per_chiplet", "num_chiplet", "npu_count")

    def __init__(self, name, total_memory, memory_per_chiplet, num_chiplet, npu_count):
        self.name = name
        self.total_memory = total_memory
        self.memory_per_chiplet = memory_per_chiplet
        self.num_chiplet = num_chiplet
        self.npu_count = npu_count

    def __repr__(self):
        return (f"DeviceProperties(name='{self.name}', total_memory={self.total_memory}, "
                f"memory_per_chiplet={self.memory_per_chiplet}, num_chiplet={self.num_chiplet}, "
                f"npu_count={self.npu_count})")


def get_device_properties(device=None) -> _DeviceProperties:
    idx = _check_index(_index_or_current(device))
    p = devices.plan()
    npus = len(p.groups[idx])
    return _DeviceProperties(p.npu_name, p.memory_per_npu * npus, p.memory_per_npu // p.chiplets,
                             p.chiplets, npus)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> dict:
    return {}


def synchronize(device=None) -> None:
    """Wait until the work queued on every stream of the device has finished (programs run to
    completion when launched; queued work is what overlaps with the host). Commits the
    mapping."""
    idx = _check_index(_index_or_current(device))
    devices.arena(idx)
    from . import _C
    _C._synchronize_device(idx)


class device:
    """Context manager that selects ``device`` and restores the previous one on exit."""

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx < 0:
            return self
        self.prev_idx = devices.current()
        if self.idx != self.prev_idx:
            devices.set_current(_check_index(self.idx))
        return self

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx >= 0:
            devices.set_current(self.prev_idx)
        return False


class device_of(device):
    """Select the device of ``obj`` (a Tensor or Storage); no-op for non-rbln objects."""

    def __init__(self, obj):
        if not isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            raise TypeError(f"Expected Tensor or Storage, but got {type(obj).__name__}")
        dev = obj.device
        super().__init__(dev.index if dev.type == "rbln" and dev.index is not None else -1)


def summary_text(plan=None) -> str:
    """The logical -> physical table (``device_summary()``), for ``plan`` or the current one."""
    return devices.summary_text(plan or devices.plan())


def device_summary() -> None:
    """Print the logical -> physical device table."""
    print(summary_text())
