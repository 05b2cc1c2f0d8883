"""Post-import hooks: run a function on a module once its import has finished, without
importing it.

``when_imported(name, fn)`` calls ``fn(module)`` right after ``import name`` completes: at once
if the module is already imported, otherwise when some later import of it finishes. The
libraries this package teaches rbln (``integrations/``) are never imported by ``import torch``;
their patches wait here for the user's own import.

The moment an import finishes is the one importlib marks on the module's spec: it sets
``spec._initializing = False`` once ``exec_module`` has returned, successfully or not
(``importlib._bootstrap._load_unlocked``, unchanged since Python 3.4). A watched spec gets a
subclass whose ``_initializing`` setter runs the hooks at that point. This works for a module
whose import has not begun (a finder at the front of ``sys.meta_path`` watches its spec as the
import system finds it) and for one whose import is running right now: a library that imports
torch part-way through its own import (``from transformers import TrainingArguments`` as the
first line of a script) is still initializing when the backend loads, and is patched as soon as
its import finishes.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable

_waiting: dict[str, list[Callable]] = {}
_lock = threading.RLock()


def when_imported(name: str, fn: Callable) -> None:
    """Call ``fn(module)`` once module ``name`` is imported (now, if it already is)."""
    with _lock:
        mod = sys.modules.get(name)
        spec = getattr(mod, "__spec__", None)
        if mod is not None and not getattr(spec, "_initializing", False):
            fn(mod)
            return
        _waiting.setdefault(name, []).append(fn)
        if mod is not None and spec is not None:
            _watch(spec)                   # its import is running: patch when it finishes
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def waiting() -> tuple[str, ...]:
    """The modules with hooks still waiting for their import."""
    return tuple(_waiting)


def _finished(spec) -> None:
    """``spec``'s import is over: run its hooks if it succeeded (a failed import leaves the
    module out of ``sys.modules``; its hooks wait for the next try)."""
    mod = sys.modules.get(spec.name)
    if mod is None or getattr(mod, "__spec__", None) is not spec:
        return
    with _lock:
        hooks = _waiting.pop(spec.name, [])
        if not _waiting and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
    for fn in hooks:
        fn(mod)


class _Watched:
    """Mixed into a watched spec's class: ``_initializing = False`` ends its import."""

    @property
    def _initializing(self):
        return self.__dict__.get("_initializing", False)

    @_initializing.setter
    def _initializing(self, value):
        self.__dict__["_initializing"] = value
        if not value:
            self.__class__ = self._rbln_unwatched     # once: the spec is plain again
            _finished(self)


_watched_classes: dict[type, type] = {}


def _watch(spec) -> None:
    cls = type(spec)
    if issubclass(cls, _Watched):
        return
    if cls not in _watched_classes:
        _watched_classes[cls] = type(f"_Watched{cls.__name__}", (_Watched, cls),
                                     {"_rbln_unwatched": cls})
    spec.__class__ = _watched_classes[cls]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it and watches the spec of a waiting
    module. One dict lookup for every other import, and gone once nothing waits."""

    def find_spec(self, name, path=None, target=None):
        if name not in _waiting:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                _watch(spec)
                return spec
        return None


_FINDER = _Finder()
