"""The ABI handshake: does the installed torch give the backend every private hook it uses?

The backend relies on torch's *private* extension points (dispatcher redispatch, operator
schemas, storage constructors, a few patched attributes) and its native core is built against
torch's C++ headers. Neither carries a compatibility promise, so the backend pins
``torch==2.13.0`` and lists every private name it touches in ``patches.py`` (:data:`HOOKS` is
derived from there). The handshake checks four things, the way the reference checks
``librbln.so``:

1. torch is the pinned version;
2. every hook in :data:`HOOKS` resolves on it;
3. the virtual NPU runtime's ABI window (``runtime.devices.RUNTIME_ABI_MIN_SUPPORTED ..
   RUNTIME_ABI_CURRENT``) accepts :data:`BUILT_ABI`, the runtime interface this backend was
   written against;
4. the native core (``torch_rbln._C``) loads against this torch.

``check()`` runs when the extension loads, before anything is registered, and raises
``ImportError("RBLN ABI mismatch: ...")`` on failure; ``python -m torch_rbln.diagnose`` prints
the same verdict. ``TORCH_RBLN_SKIP_ABI_CHECK`` skips the import-time check only.

Nothing here imports torch at module level: diagnose uses it where ``import torch`` fails.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

from . import patches as _patches
from .patches import Hook

__all__ = ["BUILT_ABI", "TORCH_VERSION", "HOOKS", "Hook", "Result", "handshake", "check"]

# Runtime interface (storage state / arena / allocator of the native core) this backend targets.
# Bump together with the runtime window when that interface changes incompatibly.
BUILT_ABI = 1
TORCH_VERSION = "2.13.0"


# every PyTorch name the backend patches or relies on, from the one list in patches.py
HOOKS: tuple[Hook, ...] = _patches.hooks()


@dataclass
class Result:
    ok: bool
    reasons: list[str] = field(default_factory=list)
    missing: list[Hook] = field(default_factory=list)
    torch_version: str | None = None
    window: tuple[int, int] | None = None
    native: str | None = None          # where the native core was loaded from

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def verdict(self) -> str:
        return "OK" if self.ok else f"MISMATCH -- {self.reason}"


_MISSING = object()


def resolve(path: str, root=None):
    """The object at ``path`` (``torch.a.b``), importing submodules as needed; ``_MISSING`` if
    any step does not exist. ``root``: the torch module to start from (tests pass a stand-in)."""
    parts = path.split(".")
    obj = root if root is not None else sys.modules.get("torch")
    if obj is None:
        obj = importlib.import_module("torch")
    name = parts[0]
    for part in parts[1:]:
        name = f"{name}.{part}"
        nxt = getattr(obj, part, _MISSING)
        if nxt is _MISSING and root is None and isinstance(obj, type(sys)):
            try:  # a submodule that is not imported yet
                nxt = importlib.import_module(name)
            except ImportError:
                nxt = _MISSING
        if nxt is _MISSING:
            return _MISSING
        obj = nxt
    return obj


def runtime_window() -> tuple[int, int]:
    from .runtime import devices
    return devices.RUNTIME_ABI_MIN_SUPPORTED, devices.RUNTIME_ABI_CURRENT


def _window_reason(built: int, lo: int, hi: int) -> str | None:
    # the reference's three reasons, with the virtual NPU runtime in the place of librbln.so
    if lo > hi:
        return (f"the virtual NPU runtime reports an inconsistent ABI window: it accepts "
                f"consumers from {lo} but only implements {hi}, so its two ABI entry points "
                f"disagree")
    if built < lo:
        return (f"this torch-rbln was built against rebel ABI {built}, and the virtual NPU "
                f"runtime no longer accepts consumers below ABI {lo} (it implements {hi})")
    if built > hi:
        return (f"this torch-rbln was built against rebel ABI {built}, but the virtual NPU "
                f"runtime only implements ABI {hi} (accepting {lo} and up)")
    return None


def handshake(at_import: bool = False, torch_module=None) -> Result:
    """Run the checks on the imported torch (``torch_module`` overrides it, for tests).
    ``at_import``: only the hooks needed to load the extension."""
    torch = torch_module if torch_module is not None else importlib.import_module("torch")
    res = Result(ok=True, torch_version=getattr(torch, "__version__", None))
    base = (res.torch_version or "unknown").split("+", 1)[0]
    if base != TORCH_VERSION:
        res.reasons.append(f"torch {res.torch_version} is installed, but this torch-rbln "
                           f"needs torch=={TORCH_VERSION}")
    for hook in HOOKS:
        if at_import and not hook.at_import:
            continue
        if resolve(hook.path, torch_module) is _MISSING:
            res.missing.append(hook)
    if res.missing:
        res.reasons.append(f"torch lacks {len(res.missing)} private hook(s) the backend depends "
                           "on: " + ", ".join(h.path for h in res.missing))
    res.window = runtime_window()
    why = _window_reason(BUILT_ABI, *res.window)
    if why:
        res.reasons.append(why)
    if torch_module is None:
        res.native, why = native_core()
        if why:
            res.reasons.append(f"the native core (torch_rbln._C, built against torch's C++ "
                               f"headers when the package is installed) does not load: {why}; "
                               "reinstall the package (`pip install -e .` in a checkout)")
    res.ok = not res.reasons
    return res


def native_core() -> tuple[str | None, str | None]:
    """(the file ``torch_rbln._C`` loaded from, why it does not load)."""
    try:
        from . import _C
    except ImportError as e:   # not built, or built against another torch (undefined symbols)
        return None, str(e)
    return _C.__file__, None


def mismatch_message(res: Result) -> str:
    from .version import __version__
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None) or "?"
    lo, hi = res.window or (None, None)
    return (f"RBLN ABI mismatch: {res.reason}\n"
            f"  runtime:        virtual NPU (accepts rebel ABI {lo}..{hi})\n"
            f"  torch-rbln:     {__version__} (built against rebel ABI {BUILT_ABI}, "
            f"torch=={TORCH_VERSION})\n"
            f"  torch:          {res.torch_version} ({where})\n"
            "Run `python -m torch_rbln.diagnose` for the full environment report.")


def check() -> str:
    """The import-time handshake: ``"ok"``, ``"skipped:disabled"``, or ``ImportError``."""
    from . import config
    if config.latched("TORCH_RBLN_SKIP_ABI_CHECK"):
        return "skipped:disabled"
    res = handshake(at_import=True)
    if not res.ok:
        raise ImportError(mismatch_message(res))
    return "ok"
