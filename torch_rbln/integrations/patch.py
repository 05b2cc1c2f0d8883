"""What a library integration declares, and how its patches are applied.

An :class:`Integration` is one library (``transformers``, ...) with the versions it was checked
against and its :class:`LibraryPatch` es. Each patch waits for one module of the library
(``post_import.when_imported``) and replaces named attributes there, for a place where the
library knows accelerators only by name. A patch never breaks the user's import: a library
version outside ``checked`` gets one warning (the patches are still applied), and a patch that
no longer fits (a target renamed upstream) is skipped with a warning naming it.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class LibraryPatch:
    module: str                # the library module whose import applies it
    targets: tuple[str, ...]   # the attributes replaced (dotted, starting at ``module``)
    why: str                   # what it makes work on rbln
    upstream: str              # the generic fix in the library that would make it unnecessary
    apply: Callable            # apply(module): replace the targets


@dataclass(frozen=True)
class Integration:
    library: str               # the import name (also the distribution name)
    checked: tuple[str, ...]   # the versions its patches were checked against
    patches: tuple[LibraryPatch, ...]


class IntegrationWarning(UserWarning):
    """A library integration did not fully apply (unknown version, a target not found)."""


_applied: dict[str, list[str]] = {}   # library -> "module.target" of each patch applied
_version_checked: set[str] = set()


def applied() -> dict[str, list[str]]:
    """library -> the targets patched so far in this process."""
    return {lib: list(targets) for lib, targets in _applied.items()}


def installed_version(library: str) -> str | None:
    """The version of an imported library (its ``__version__``), None if it has none."""
    return getattr(sys.modules.get(library), "__version__", None)


def apply(integration: Integration, patch: LibraryPatch, module) -> None:
    """Apply ``patch`` to the just-imported ``module``; never raises (it runs inside the user's
    import)."""
    lib = integration.library
    if lib not in _version_checked:
        _version_checked.add(lib)
        version = installed_version(lib)
        if version not in integration.checked:
            warnings.warn(
                f"torch-rbln's {lib} integration was checked against {lib} "
                f"{', '.join(integration.checked)}; {lib} {version} is installed. Its patches "
                f"are applied; should one no longer fit, it is skipped with a warning "
                f"(`python -m torch_rbln.diagnose` lists them)", IntegrationWarning,
                stacklevel=_importer_level(lib))
    try:
        patch.apply(module)
    except Exception as e:
        warnings.warn(
            f"torch-rbln could not patch {', '.join(patch.module + '.' + t for t in patch.targets)}"
            f" of {lib} {installed_version(lib)} ({type(e).__name__}: {e}), so on rbln this may "
            f"not hold: {patch.why}", IntegrationWarning, stacklevel=_importer_level(lib))
        return
    _applied.setdefault(lib, []).extend(f"{patch.module}.{t}" for t in patch.targets)


def _importer_level(library: str) -> int:
    """The ``warnings.warn`` stacklevel (for ``apply``'s caller) of the code that imported the
    library: the first frame outside importlib, this package and the library itself."""
    skip = ("importlib", "torch_rbln", library)
    f, level = sys._getframe(2), 2
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if not (f.f_code.co_filename.startswith("<frozen")
                or any(name == s or name.startswith(s + ".") for s in skip)):
            return level
        f, level = f.f_back, level + 1
    return 2


def replace(owner, new) -> None:
    """``owner.<name>`` (a module's function or a class's method, named as ``new``) becomes
    ``new``, which keeps the original as ``__wrapped__`` and its docstring. For a module
    function, every loaded module of the library that took the original by name (``from .utils
    import name``, run before the patch) takes ``new`` too."""
    name = new.__name__
    orig = getattr(owner, name)
    new.__wrapped__ = orig
    new.__doc__ = orig.__doc__
    setattr(owner, name, new)
    if isinstance(owner, type):
        new.__qualname__ = f"{owner.__qualname__}.{name}"
        return
    package = owner.__name__.split(".")[0]
    for mod_name, mod in list(sys.modules.items()):
        if mod_name == package or mod_name.startswith(package + "."):
            d = getattr(mod, "__dict__", None)
            if d is not None and d.get(name) is orig:
                d[name] = new
