"""``torch.rbln.capture_programs()``: see each program the rbln graph backend builds.

::

    with torch.rbln.capture_programs() as programs:
        compiled(x)
    programs[0].name          # the Dynamo compile id, "0/0"

The scope is thread-local; nested scopes all receive each program, in build order. A backward
graph is compiled at the first ``backward()``, possibly on another thread: it goes to
the scopes that were open on the thread that compiled its forward (if still open) as well.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["capture_programs", "CompiledProgram", "InputSpec", "OutputSpec"]


@dataclass(frozen=True)
class InputSpec:
    """One input of a program. ``shape`` holds ints, or the symbol's name for a dynamic extent;
    ``arg`` is the position in the program's call."""
    name: str
    shape: tuple
    dtype: torch.dtype
    arg: int
    data_ptr: int | None = None


@dataclass(frozen=True)
class OutputSpec:
    shape: tuple
    dtype: torch.dtype
    arg: int


@dataclass(frozen=True)
class CompiledProgram:
    """A compiled graph. ``name`` is the Dynamo compile id (``"0/0"``); ``kind`` is
    ``"inference"``, ``"forward"`` or ``"backward"``; ``function`` runs it on rbln tensors.
    ``device_partitions`` counts the device launches per call, ``host_partitions`` the host
    runs; ``host_ops`` lists ``(op, reason)`` for each node that runs on the host,
    ``in_program_ops`` ``(op, compiler row)`` for each node the compiler keeps on its host
    side inside a device program; ``nodes`` ``(where, op, why)`` for every placed node;
    ``padded`` ``(partition, bytes)`` for each device partition whose boundary pads an
    unaligned last dim."""
    name: str
    device: torch.device
    function: Callable[..., Any]
    input_specs: tuple = ()
    output_specs: tuple = ()
    kind: str = "inference"
    device_partitions: int = 0
    host_ops: tuple = field(default=())
    host_partitions: int = 0
    in_program_ops: tuple = field(default=())
    nodes: tuple = field(default=())
    padded: tuple = field(default=())


_tls = threading.local()
_open: set[int] = set()       # ids of the scopes (lists) not yet closed, on any thread


def _scopes() -> list:
    s = getattr(_tls, "scopes", None)
    if s is None:
        s = _tls.scopes = []
    return s


@contextlib.contextmanager
def capture_programs():
    """Collect every program the rbln backend compiles on this thread inside the scope."""
    programs: list[CompiledProgram] = []
    scopes = _scopes()
    scopes.append(programs)
    _open.add(id(programs))
    try:
        yield programs
    finally:
        _open.discard(id(programs))
        # by identity: two scopes that collected nothing compare equal
        for i in range(len(scopes) - 1, -1, -1):
            if scopes[i] is programs:
                del scopes[i]
                break


def open_scopes() -> tuple:
    """The scopes open on this thread (for a later :func:`publish` from another thread)."""
    return tuple(_scopes())


def publish(program: CompiledProgram, also: tuple = ()) -> None:
    """Hand ``program`` to this thread's scopes and to those of ``also`` still open."""
    targets = list(_scopes())
    for scope in also:
        if id(scope) in _open and not any(scope is t for t in targets):
            targets.append(scope)
    for scope in targets:
        scope.append(program)
