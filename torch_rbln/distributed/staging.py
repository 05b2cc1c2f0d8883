"""The memory a collective moves, and what that does to residency.

A collective names each tensor as ``read`` (sent), ``write`` (received into) or ``inout``
(both, e.g. all_reduce in place) and where the transfer happens:

``device``  the NPU's collective engine works on device memory, as RCCL does on hardware.
            A read needs device residency (an ``h2d`` push if the tensor is host-latest; the
            lazy upload every device consumer triggers), a write leaves the tensor
            device-latest. Nothing crosses to the host.
``host``    the bytes are staged through host memory for gloo (rbln-ccl's fallback for
            reductions it does not run natively, or a gloo process group given rbln tensors):
            a read of a device-latest tensor is a physical ``d2h``, a write leaves the tensor
            host-latest, so the next device use pushes it again.

The transport (gloo) then works on CPU tensors over that memory, with no copy. A tensor that is
not contiguous is gathered into a contiguous buffer on the same side first and scattered back
afterwards (gloo reads a tensor's memory linearly).
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import events
from ..runtime import devices
from ..dispatch.layout import spans_storage
from ..runtime.storage import state_of

READ, WRITE, INOUT = "read", "write", "inout"
DEVICE, HOST = "device", "host"


class Staging:
    """CPU tensors over the memory of one collective's rbln tensors, and the copies back that
    must run once the transfer completed (for tensors that were not contiguous)."""

    def __init__(self, where: str):
        self.where = where
        self.finish: list[Callable[[], None]] = []

    def __call__(self, t: torch.Tensor, mode: str) -> torch.Tensor:
        if t.device.type == "rbln":
            alias = self._alias(t, mode)
        else:
            alias = t
        if alias.is_contiguous():
            return alias
        tmp = alias.contiguous() if mode != WRITE else torch.empty_like(
            alias, memory_format=torch.contiguous_format)
        if mode != READ:
            self.finish.append(lambda: alias.copy_(tmp))
        return tmp

    def _alias(self, t: torch.Tensor, mode: str) -> torch.Tensor:
        state = state_of(t)
        # a write of the whole storage (or after a read of it) needs no older bytes
        whole = mode == INOUT or spans_storage(t)
        if self.where == DEVICE:
            if mode != WRITE:
                state.device_read()
            if mode != READ:
                state.device_write(whole)
            return state.device_alias(t)
        if mode != WRITE:
            state.host_read()
        if mode != READ:
            state.host_write(whole)
        return state.host_alias(t)

    def many(self, ts, mode: str) -> list[torch.Tensor]:
        return [self(t, mode) for t in ts]

    def done(self) -> None:
        for fn in self.finish:
            fn()
        self.finish.clear()


def on_rbln(*tensors) -> bool:
    return any(t.device.type == "rbln" for t in tensors)


def record(op: str, where: str, nbytes: int) -> None:
    """One collective on rbln tensors: an event, and the device mapping committed (the
    collective engine opens the NPUs, like the first allocation does)."""
    devices.commit()
    events.record("collective", f"{op}@{where}", nbytes)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
