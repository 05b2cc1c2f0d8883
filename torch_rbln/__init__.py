"""RBLN PyTorch on a virtual NPU.

``import torch`` loads this package through the ``torch.backends`` entry point, which makes
``device="rbln"`` work and ``torch.rbln`` the device module. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
disables autoload; ``import torch_rbln`` then enables the backend explicitly. In diagnose mode
(``TORCH_RBLN_DIAGNOSE=1``, or ``python -m torch_rbln.diagnose``) nothing is initialised.
"""

from __future__ import annotations

import os
import sys

try:
    from importlib.metadata import PackageNotFoundError, version as _version
    __version__ = _version("torch-rbln-vnpu")
except Exception:  # not installed (source tree)
    __version__ = "0.0.0"

status = "uninitialized"


def is_diagnose_mode() -> bool:
    if os.environ.get("TORCH_RBLN_DIAGNOSE") == "1":
        return True
    argv = getattr(sys, "orig_argv", None) or []
    return "torch_rbln.diagnose" in argv[:4] and "-m" in argv[:4]


def torch_backends_entry_point() -> None:
    """Initialise the backend once (idempotent); resets to uninitialized if it fails."""
    global status
    if status != "uninitialized" or is_diagnose_mode():
        return
    status = "initializing"
    try:
        import torch  # noqa: F401
        from . import _backend
        _backend.setup()
    except BaseException:
        status = "uninitialized"
        raise
    status = "initialized"


torch_backends_entry_point()
