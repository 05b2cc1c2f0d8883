"""Which process uses which NPU of the host: one lock file per physical NPU.

On an NPU host every process that commits its device mapping opens each NPU it maps, so two
processes that both see a card share it (its memory, its compute). Launchers therefore give
each process its own card (``RBLN_VISIBLE_DEVICES`` per ``LOCAL_RANK`` under ``torchrun``).
The virtual NPUs of one machine are shared the same way: at commit a process takes an
exclusive ``flock`` on ``<runtime dir>/npu<id>.lock`` for each NPU it maps and keeps it for its
lifetime (the kernel drops it when the process ends, however it ends, so no lock is ever
stale). A card already held by another process gives a warning naming that process.

The runtime dir is per user: ``$XDG_RUNTIME_DIR/torch-rbln``, else ``/tmp/torch-rbln-<uid>``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no claims
    fcntl = None

_held: dict[int, int] = {}      # physical NPU id -> open file descriptor holding its lock


def runtime_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return os.path.join(base, "torch-rbln")
    return os.path.join(tempfile.gettempdir(), f"torch-rbln-{os.getuid()}")


def _path(npu: int) -> str:
    return os.path.join(runtime_dir(), f"npu{npu}.lock")


def holder(npu: int) -> str:
    """``"pid N (command)"`` of the process that claimed ``npu`` last, or ``""``."""
    try:
        with open(_path(npu)) as f:
            return f.read().strip()
    except OSError:
        return ""


def _describe_self() -> str:
    cmd = " ".join(getattr(sys, "orig_argv", sys.argv) or ["python"])
    return f"pid {os.getpid()} ({cmd[:120]})"


def claim(npus) -> list[int]:
    """Claim each physical NPU in ``npus`` for this process; returns the ones another live
    process holds (each also warned about). Never raises: a host without a usable runtime dir
    simply does not track claims."""
    if fcntl is None:
        return []
    from ..user_frames import stacklevel as user_stacklevel
    busy = []
    for npu in npus:
        if npu in _held:
            continue
        try:
            d = runtime_dir()
            os.makedirs(d, mode=0o700, exist_ok=True)
            fd = os.open(_path(npu), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return busy
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            busy.append(npu)
            who = holder(npu) or "another process"
            warnings.warn(
                f"physical NPU {npu} is already in use by {who}: both processes now share its "
                "memory and compute. Every process opens each NPU it can see when it first uses "
                "a device, so give each process its own NPUs before that (RBLN_VISIBLE_DEVICES; "
                "under torchrun one per LOCAL_RANK)", stacklevel=user_stacklevel())
            continue
        os.set_inheritable(fd, False)
        os.ftruncate(fd, 0)
        os.write(fd, _describe_self().encode())
        _held[npu] = fd
    return busy


def held() -> tuple[int, ...]:
    """The physical NPUs this process holds."""
    return tuple(sorted(_held))
