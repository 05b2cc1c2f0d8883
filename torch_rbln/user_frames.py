"""Which stack frames are the user's: warnings and call sites point there, not into the library.

A frame is library code when its file lies in torch, in this package or in the standard library
(third-party packages installed below it, a model library say, count as the user's), or when it
is Python's import machinery (``<frozen ...>``). Every other frame is the user's: their scripts,
``<string>`` under ``python -c``, ``<stdin>``. Used by the CPU-fallback log's ``TRACE`` warning,
the ``out=`` resize warning and ``explain(with_stack=True)`` (docs/debugging.md ("torch.rbln.explain")).
"""

from __future__ import annotations

import os
import sys
import sysconfig

import torch

_LIBRARIES = tuple(os.path.dirname(os.path.abspath(f)) + os.sep
                   for f in (torch.__file__, __file__))
_STDLIB = tuple({os.path.abspath(p) + os.sep for p in
                 (sysconfig.get_paths().get(n) for n in ("stdlib", "platstdlib")) if p})
_is_library_cache: dict[str, bool] = {}


def _classify(filename: str) -> bool:
    if filename.startswith("<"):          # <frozen ...> is the import system; <string> is user code
        return filename.startswith("<frozen")
    path = os.path.abspath(filename)
    if path.startswith(_LIBRARIES):
        return True
    return path.startswith(_STDLIB) and "-packages" + os.sep not in path


def treat_as_library(*paths: str) -> None:
    """Count frames of files under ``paths`` (files or folders) as library code too: for a
    harness that runs user code through frames of its own (the docs tests, a notebook runner),
    so call sites name the user's lines only."""
    global _LIBRARIES
    _LIBRARIES += tuple(os.path.abspath(p) + ("" if os.path.isfile(p) else os.sep) for p in paths)
    _is_library_cache.clear()


def is_library(filename: str) -> bool:
    """Whether a frame of ``filename`` is library code (see the module docstring)."""
    lib = _is_library_cache.get(filename)
    if lib is None:
        lib = _is_library_cache[filename] = _classify(filename)
    return lib


def first_user_frame(f):
    """``(frame, depth)`` of the first user frame from ``f`` outwards (``f`` is depth 1);
    ``(None, 1)`` when there is none."""
    depth = 1
    while f is not None:
        if not is_library(f.f_code.co_filename):
            return f, depth
        f = f.f_back
        depth += 1
    return None, 1


def stacklevel() -> int:
    """The ``warnings.warn`` stacklevel, for the caller of this function, that names the first
    user frame."""
    return first_user_frame(sys._getframe(1))[1]


def site_frames(f, depth: int = 3) -> tuple:
    """The innermost ``depth`` user frames from frame ``f`` outwards, as ``(code, lasti)``
    pairs: a call site captured without formatting it (a frame's line number costs a walk of
    its code's line table), for :func:`site_text` to name when it is read."""
    frames = []
    while f is not None and len(frames) < depth:
        code = f.f_code
        if not is_library(code.co_filename):
            frames.append((code, f.f_lasti))
        f = f.f_back
    return tuple(frames)


# (id(code), lasti) -> (code, "file:line(func)"); the code is kept, so its id stays its own
_texts: dict[tuple[int, int], tuple] = {}


def _line(code, lasti: int) -> int:
    """The line of the instruction at byte offset ``lasti`` (what ``frame.f_lineno`` says)."""
    if lasti >= 0:
        for start, end, line in code.co_lines():
            if start <= lasti < end and line is not None:
                return line
    return code.co_firstlineno


def site_text(frames: tuple) -> str | None:
    """``file:line(func) <- file:line(func) ...`` of :func:`site_frames`' capture, or None."""
    if not frames:
        return None
    parts = []
    for code, lasti in frames:
        hit = _texts.get((id(code), lasti))
        if hit is None or hit[0] is not code:
            hit = _texts[(id(code), lasti)] = (
                code, f"{code.co_filename}:{_line(code, lasti)}({code.co_name})")
        parts.append(hit[1])
    return " <- ".join(parts)


def call_site(depth: int = 3) -> str | None:
    """``file:line(func) <- file:line(func) ...``: the caller's innermost ``depth`` user frames,
    or None."""
    return site_text(site_frames(sys._getframe(1), depth))
