"""RBLN PyTorch on a virtual NPU.

``import torch`` loads this package through the ``torch.backends`` entry point, which makes
``device="rbln"`` work and ``torch.rbln`` the device module. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
disables autoload; ``import torch_rbln`` then enables the backend explicitly. In diagnose mode
(``TORCH_RBLN_DIAGNOSE=1``, or ``python -m torch_rbln.diagnose``) nothing is initialised.
"""

from __future__ import annotations

import os
import sys

from .version import __version__  # noqa: F401

status = "uninitialized"


def _started_as_diagnose(argv: list[str]) -> bool:
    """``python [options] -m torch_rbln.diagnose``: scan the interpreter's own options only."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return i + 1 < len(argv) and argv[i + 1] == "torch_rbln.diagnose"
        if a.startswith("-m"):
            return a[2:] == "torch_rbln.diagnose"
        if a in ("-c", "-", "--") or not a.startswith("-"):
            return False            # a command, stdin or a script: not `-m`
        i += 2 if a in ("-X", "-W", "--check-hash-based-pycs") else 1
    return False


def is_diagnose_mode() -> bool:
    """``TORCH_RBLN_DIAGNOSE=1``, or the process runs ``python -m torch_rbln.diagnose``."""
    if _started_as_diagnose(getattr(sys, "orig_argv", None) or []):
        return True
    raw = os.environ.get("TORCH_RBLN_DIAGNOSE")
    if raw is None:
        return False
    from . import config
    try:
        return config.parse("TORCH_RBLN_DIAGNOSE", raw)
    except config.EnvError as e:
        config.defer("TORCH_RBLN_DIAGNOSE", e)     # `import torch` still works; first use raises
        return False


def torch_backends_entry_point() -> None:
    """Initialise the backend once (idempotent); resets to uninitialized if it fails."""
    global status
    if status != "uninitialized" or is_diagnose_mode():
        return
    status = "initializing"
    try:
        import torch  # noqa: F401
        from . import abi
        abi.check()   # before _backend touches any hook: a torch without them fails clearly here
        from . import _backend
        _backend.setup()
    except BaseException:
        status = "uninitialized"
        raise
    status = "initialized"


torch_backends_entry_point()
