"""Deterministic mode's fill of uninitialized memory (``torch.use_deterministic_algorithms(True)``
with ``torch.utils.deterministic.fill_uninitialized_memory``) on rbln against the CPU: the same
values from every factory that leaves memory uninitialized and from ``resize_``'s grown part;
the fill is a device write (no transfer until the host reads it); off, nothing changes."""

from __future__ import annotations

import contextlib

import pytest
import torch

from conftest import event_delta
from torch_rbln import events
from torch_rbln.runtime.storage import DEVICE, HOST, state_of

D = "rbln"

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
          torch.uint32, torch.uint64, torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.complex64, torch.bool)


@contextlib.contextmanager
def deterministic(fill: bool = True):
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = fill
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.utils.deterministic.fill_uninitialized_memory = before[1]


def _bits(t: torch.Tensor) -> list:
    """The elements as their bytes (NaN compares equal to the same NaN)."""
    t = t.cpu().contiguous()
    return t.view(torch.uint8).tolist() if t.dtype != torch.bool else t.tolist()


def _factories(device, dtype):
    base = torch.zeros(3, 2, dtype=dtype, device=device)
    return {
        "empty": torch.empty(3, 4, dtype=dtype, device=device),
        "empty channels_last": torch.empty(2, 3, 2, 2, dtype=dtype, device=device,
                                           memory_format=torch.channels_last),
        "empty_strided": torch.empty_strided((2, 3), (1, 2), dtype=dtype, device=device),
        "empty_like": torch.empty_like(base),
        "new_empty": base.new_empty((5,)),
        "new_empty_strided": base.new_empty_strided((2, 2), (2, 1)),
        "empty_permuted": torch.empty_permuted((2, 3), (1, 0), dtype=dtype, device=device),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factories_fill_as_on_cpu(dtype):
    with deterministic():
        got = {k: (v.stride(), _bits(v)) for k, v in _factories(D, dtype).items()}
        want = {k: (v.stride(), _bits(v)) for k, v in _factories("cpu", dtype).items()}
    assert got == want


@pytest.mark.parametrize("dtype", (torch.float32, torch.int64, torch.bool, torch.float16), ids=str)
def test_resize_fills_the_grown_part_as_on_cpu(dtype):
    def run(device):
        out = []
        x = torch.ones(3, dtype=dtype, device=device)
        x.resize_(7)                           # grown: the old elements kept, the rest filled
        out.append(_bits(x))
        y = torch.empty(0, dtype=dtype, device=device)
        y.resize_(2, 3)                        # from nothing: all filled
        out.append(_bits(y))
        z = torch.ones(6, dtype=dtype, device=device)[2:]
        z.resize_(6)                           # a view with an offset grows its storage
        out.append(_bits(z))
        w = torch.ones(8, dtype=dtype, device=device)
        w.resize_(4)                           # shrunk, then back within the storage: no fill
        w.resize_(8)
        out.append(_bits(w))
        return out

    with deterministic():
        assert run(D) == run("cpu")


def test_fill_is_a_device_write():
    """The fill runs on the device: the fresh storage's block is booked and device-latest,
    nothing crosses; the host's first read is one d2h, as for any device result."""
    timed = ("runtime",)
    allocated = torch.rbln.memory_allocated()
    with deterministic():
        before = events.snapshot()
        x = torch.empty(1024, dtype=torch.float16, device=D)
        made = event_delta(before, events.snapshot(), timed)
        assert state_of(x).residency == DEVICE and state_of(x).has_device_memory
        assert torch.rbln.memory_allocated() - allocated == 2048
        assert not {k for k in made if k[0] in ("h2d", "d2h", "bounce", "host_op", "cpu_fallback")}
        before = events.snapshot()
        assert torch.isnan(x.cpu()).all()
        assert event_delta(before, events.snapshot(), timed).get(("d2h", "")) == (1, 2048)
        y = x + 1                              # a device op reads it where it is: no h2d
        assert torch.isnan(y.cpu()).all()
        # resize_ of a host-latest tensor fills on the host, where its kept bytes are
        z = torch.ones(4, device=D)
        z.resize_(8)
        assert state_of(z).residency == HOST


def test_off_nothing_is_filled():
    """Without the flags (the default) or with fill_uninitialized_memory=False, a new tensor is
    host-latest without device memory, as before (no cost)."""
    for ctx in (contextlib.nullcontext(), deterministic(fill=False)):
        with ctx:
            x = torch.empty(1024, dtype=torch.float16, device=D)
            assert state_of(x).residency == HOST and not state_of(x).has_device_memory
            y = torch.ones(2, device=D)
            y.resize_(16)
            assert state_of(y).residency == HOST and not state_of(y).has_device_memory


def test_filled_tensor_behaves_as_on_cpu():
    """A filled empty is an ordinary tensor afterwards: overwritten on the device or the host."""
    def run(device):
        x = torch.empty(4, device=device)
        x.copy_(torch.arange(4.))
        y = torch.empty(4, dtype=torch.float16, device=device)
        y[1:3] = 2
        return x.cpu().tolist(), _bits(y)

    with deterministic():
        assert run(D) == run("cpu")
