"""Backward on every rbln device: the autograd engine runs rbln work on the calling thread.

PyTorch's autograd engine gives each accelerator device a worker thread and sizes that pool
from the device guard's device count. A Python-registered PrivateUse1 guard always reports one
device, so a backward pass that reaches ``rbln:1`` or higher fails an internal assert
(``device_ready_queues_`` in engine.cpp). With ``torch.autograd.set_multithreading_enabled(False)``
in effect the engine runs every node on the thread that called ``backward()`` and never looks
for a device thread, which works for any device index.

That setting is thread-local, so setting it once at import would only cover the importing
thread. Instead every call into the engine (``Tensor.backward``, ``torch.autograd.backward``,
``torch.autograd.grad``, all of which end in ``Variable._execution_engine.run_backward``) runs
under it. Which devices a graph touches is only known by walking it, so this applies to every
backward pass: CPU-only graphs run on the calling thread anyway, and the CPU build of torch
has no other accelerator, so the only cost is that rbln:0 work also runs on the calling thread
instead of a device thread (the same numbers; device work is serialised per process anyway).
README: "Backward on rbln:1 and up".
"""

from __future__ import annotations

import torch
from torch.autograd.variable import Variable

_set = torch._C._set_multithreading_enabled
_get = torch._C._is_multithreading_enabled


class SingleThreadedEngine:
    """Wraps the autograd engine; ``run_backward`` runs with multithreading off."""

    def __init__(self, engine):
        self._engine = engine

    def run_backward(self, *args, **kwargs):
        prev = _get()
        _set(False)
        try:
            return self._engine.run_backward(*args, **kwargs)
        finally:
            _set(prev)

    def __getattr__(self, name):  # queue_callback, is_checkpoint_valid, ...
        return getattr(self._engine, name)


def install() -> None:
    """Route every backward pass through :class:`SingleThreadedEngine` (idempotent)."""
    if not isinstance(Variable._execution_engine, SingleThreadedEngine):
        Variable._execution_engine = SingleThreadedEngine(Variable._execution_engine)
