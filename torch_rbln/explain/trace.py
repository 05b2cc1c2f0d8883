"""Call-site capture for ``explain(with_stack=True)``.

A listener on the event stream, attached only while such a region is open (so a plain region
and code outside regions pay nothing). The first time an op falls back or compiles, and the
first time each bounce site fires, it records the user's call site: the innermost frames that
belong neither to torch, nor to this package, nor to the standard library.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import torch

import torch_rbln

# event kinds whose key gets a call site (op names for the first two, bounce site keys last)
TRACED = frozenset(("cpu_fallback", "recompile", "bounce"))
DEPTH = 3   # user frames per site, innermost first


_OURS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, torch_rbln))
_STDLIB = tuple({os.path.abspath(p) + os.sep for p in
                 (sysconfig.get_paths().get(n) for n in ("stdlib", "platstdlib")) if p})


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):          # <frozen ...> is the import system; <string> is user code
        return filename.startswith("<frozen")
    path = os.path.abspath(filename)
    if path.startswith(_OURS):
        return True
    # third-party packages (a model library, say) are the user's code even when they are
    # installed below the standard library directory
    return path.startswith(_STDLIB) and "-packages" + os.sep not in path


_is_library_cache: dict[str, bool] = {}


def call_site(depth: int = DEPTH) -> str | None:
    """``file:line(func) <- file:line(func) ...`` for the caller's own frames, or None."""
    frames = []
    f = sys._getframe(1)
    while f is not None and len(frames) < depth:
        code = f.f_code
        fn = code.co_filename
        lib = _is_library_cache.get(fn)
        if lib is None:
            lib = _is_library_cache[fn] = _is_library(fn)
        if not lib:
            frames.append(f"{fn}:{f.f_lineno}({code.co_name})")
        f = f.f_back
    return " <- ".join(frames) if frames else None


class Recorder:
    """Collects the first call site per op / bounce site while attached to the stream."""

    def __init__(self):
        self.sites: dict[str, str] = {}

    def __call__(self, kind: str, key: str, amount: int) -> None:
        if kind in TRACED and key not in self.sites:
            site = call_site()
            if site is not None:
                self.sites.setdefault(key, site)
