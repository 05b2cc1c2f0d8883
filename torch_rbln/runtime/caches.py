"""Caches of compiled programs that ``torch.rbln.empty_cache()`` drops.

A layer that keeps programs (the eager program cache, graph mode's device programs) registers a
function that drops them; ``empty_cache()`` calls every one. The runtime never needs to know
which layers hold programs, and a layer that was never imported has nothing registered.
"""

from __future__ import annotations

from typing import Callable

_drops: list[Callable[[], None]] = []


def register(drop: Callable[[], None]) -> Callable[[], None]:
    """Have :func:`drop_all` call ``drop`` (idempotent); returns ``drop``."""
    if drop not in _drops:
        _drops.append(drop)
    return drop


def drop_all() -> None:
    """Drop every registered cache; each program recompiles when it is next needed."""
    for drop in list(_drops):
        drop()
