"""Lazy clones (``Tensor._lazy_clone()``, copy-on-write) of rbln tensors against the CPU's: the
same copy-on-write flags, storages, data addresses and values after every step PyTorch's own
tests take (clone, view, read, write either side), writes through every route of the backend,
PyTorch's parallel-materialize error; and the residency, events and device memory of the shared
and materialized storages."""

from __future__ import annotations

import gc

import pytest
import torch

from conftest import event_delta
from torch_rbln import events
from torch_rbln.runtime.storage import (DEVICE, HOST, live_storage_states, shared_states,
                                        state_of)

D = "rbln"
is_cow = torch._C._is_cow_tensor
data_address = torch._C._data_address
storage_address = torch._C._storage_address

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
          torch.float64, torch.complex64, torch.complex128, torch.float16, torch.bfloat16,
          torch.bool)


def _flags(*ts):
    return [is_cow(t) for t in ts]


def _steps(device, dtype):
    """What PyTorch's test_lazy_clone* tests observe, step by step, on ``device``."""
    seen = []
    t = torch.tensor([[0, 1], [2, 3]], device=device, dtype=dtype)
    t_storage, t_data = storage_address(t), data_address(t)
    clone = t._lazy_clone()
    view = t.view([4])
    seen.append(("cloned", _flags(t, clone, view), storage_address(t) == t_storage,
                 storage_address(view) == t_storage, storage_address(clone) != t_storage,
                 data_address(clone) == t_data, data_address(view) == t_data))
    res = t + clone                          # a read of both: nothing materializes
    seen.append(("read", _flags(t, clone), res.cpu().tolist()))
    view += torch.ones(1, device=device, dtype=dtype)  # t's storage gets memory of its own
    t_new = data_address(t)
    seen.append(("t written", _flags(t, view, clone), t_new != t_data,
                 data_address(view) == t_new, data_address(clone) == t_data,
                 t.cpu().tolist(), clone.cpu().tolist()))
    clone += torch.ones(1, device=device, dtype=dtype)  # the last one: keeps the memory
    seen.append(("clone written", _flags(t, view, clone), data_address(clone) == t_data,
                 data_address(t) == t_new, storage_address(clone) != t_storage,
                 t.cpu().tolist(), clone.cpu().tolist()))
    return seen


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lazy_clone_steps_match_cpu(dtype):
    assert _steps(D, dtype) == _steps("cpu", dtype)


def test_lazy_clone_of_lazy_clone_and_last_reference_match_cpu():
    def steps(device):
        t = torch.arange(6., device=device)
        c1 = t._lazy_clone()
        c2 = c1._lazy_clone()
        seen = [_flags(t, c1, c2), data_address(c2) == data_address(t)]
        del t
        c1.mul_(2)                            # two still share: c1 is copied
        seen += [_flags(c1, c2), c1.cpu().tolist(), c2.cpu().tolist()]
        before = data_address(c2)
        c2.add_(1)                            # the last: no copy
        seen += [_flags(c2), data_address(c2) == before, c2.cpu().tolist()]
        return seen

    assert steps(D) == steps("cpu")


def _parallel(device, dtype, num_threads, num_parallel, skip_first):
    """(error on the lazy clone?, error on a plain tensor?) of torch._test_parallel_materialize."""
    old = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        out = []
        for t in (torch.tensor([[0, 1], [2, 3]], device=device, dtype=dtype)._lazy_clone(),
                  torch.tensor([[0, 1], [2, 3]], device=device, dtype=dtype)):
            try:
                torch._test_parallel_materialize(t, num_parallel, skip_first)
                out.append(None)
            except RuntimeError as e:
                out.append("Materializing a storage in the loop function of at::parallel_for"
                           in str(e))
        return out
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", (torch.float32, torch.int64, torch.bool, torch.float16), ids=str)
def test_parallel_materialize_error_as_on_cpu(dtype):
    for args in ((1, 1, False), (1, 1, True), (1, 10, False), (1, 10, True), (2, 1, False),
                 (2, 1, True), (2, 10, False), (2, 10, True), (2, 2, False), (2, 2, True)):
        assert _parallel(D, dtype, *args) == _parallel("cpu", dtype, *args), args


def _write_routes():
    """In-place writes through each route of the backend (name, write(t, device))."""
    return (
        ("device op", lambda t, d: t.mul_(2)),
        ("device op's CPU run", lambda t, d: t.sin_()),
        ("boxed CPU fallback", lambda t, d: t.masked_fill_(t > 3, 0)),
        ("copy from cpu", lambda t, d: t.copy_(torch.full(t.shape, 7., dtype=t.dtype))),
        ("copy on the device", lambda t, d: t.copy_(torch.full(t.shape, 7., dtype=t.dtype, device=d))),
        ("slice copy", lambda t, d: t[1:3].copy_(torch.zeros(2, dtype=t.dtype))),
        ("fill_", lambda t, d: t.fill_(5)),
        ("zero_", lambda t, d: t.zero_()),
        ("index_copy_", lambda t, d: t.index_copy_(0, torch.tensor([0, 2], device=d),
                                                   torch.ones(2, dtype=t.dtype, device=d))),
        ("out=", lambda t, d: torch.add(t, 1, out=t)),
        ("data_ptr()", lambda t, d: t.data_ptr()),
    )


@pytest.mark.parametrize("source", ("host-latest", "device-latest"))
@pytest.mark.parametrize("written", ("clone", "source"))
@pytest.mark.parametrize("route", [r[0] for r in _write_routes()])
def test_every_write_route_materializes_as_on_cpu(route, written, source):
    write = dict(_write_routes())[route]

    def run(device):
        base = torch.arange(1., 9., dtype=torch.float16)
        t = base.to(device)
        if source == "device-latest":
            t = t * 1                           # a device op's output
        c = t._lazy_clone()
        target, other = (c, t) if written == "clone" else (t, c)
        write(target, device)
        return (_flags(t, c), target.cpu().tolist(), other.cpu().tolist(),
                data_address(t) == data_address(c))

    assert run(D) == run("cpu")


def test_read_routes_do_not_materialize():
    t = torch.arange(8., dtype=torch.float16, device=D) * 1
    c = t._lazy_clone()
    _ = (t + c, t.sin(), t.sum(), t.cpu(), t.clone(), c[1:3].contiguous(), torch.cat([t, c]),
         repr(c), c.tolist(), t.float())
    assert _flags(t, c) == [True, True]


TIMED = ("runtime", "warm_hit", "recompile", "cpu_fallback", "device_program")


def _events_of(fn) -> dict:
    before = events.snapshot()
    fn()
    return event_delta(before, events.snapshot(), timed=TIMED)


def test_device_latest_clone_is_copied_on_the_device():
    """The shared storage is device-latest: the written side gets a device copy (a ``v2v`` of
    the storage, a new block) on top of what the write records anyway; nothing crosses; the
    other keeps its memory and residency."""
    plain = torch.arange(256., dtype=torch.float16, device=D) * 1
    plain.add_(1)                            # compiled: the two runs below are warm alike
    plain = torch.arange(256., dtype=torch.float16, device=D) * 1
    t = torch.arange(256., dtype=torch.float16, device=D) * 1
    c = t._lazy_clone()
    assert state_of(t) == state_of(c) and state_of(c).residency == DEVICE
    allocated = torch.rbln.memory_allocated()
    baseline = _events_of(lambda: plain.add_(1))
    delta = _events_of(lambda: c.add_(1))
    assert {k: v for k, v in delta.items() if baseline.get(k) != v} == {("v2v", ""): (1, 512)}
    assert state_of(c) != state_of(t) and state_of(c).residency == DEVICE
    assert state_of(t).residency == DEVICE
    assert torch.rbln.memory_allocated() - allocated == 512
    assert torch.equal(c.cpu(), torch.arange(256., dtype=torch.float16) + 1)
    assert torch.equal(t.cpu(), torch.arange(256., dtype=torch.float16))


def test_host_latest_clone_is_copied_on_the_host():
    t = torch.arange(256., dtype=torch.float16, device=D)
    c = t._lazy_clone()
    assert state_of(c).residency == HOST
    delta = _events_of(lambda: c.copy_(torch.ones(256, dtype=torch.float16)))
    assert not {k for k in delta if k[0] in ("v2v", "d2h", "h2d")}
    assert state_of(c).residency == HOST and state_of(t).residency == HOST
    assert not state_of(c).has_device_memory


def test_shared_storage_counts_its_device_memory_once_and_frees_it():
    gc.collect()
    states, shared = live_storage_states(), shared_states()
    allocated = torch.rbln.memory_allocated()
    for _ in range(3):
        t = torch.randn(1024, dtype=torch.float16, device=D) * 1   # one block
        clones = [t._lazy_clone() for _ in range(3)]
        clones.append(clones[0]._lazy_clone())
        assert torch.rbln.memory_allocated() - allocated == 2048
        clones[1].mul_(3)                      # its own block
        assert torch.rbln.memory_allocated() - allocated == 4096
        del t
        clones[0].add_(1)                      # copied: clones[2] and [3] still share
        del clones
        gc.collect()
        assert torch.rbln.memory_allocated() == allocated
    assert live_storage_states() == states and shared_states() == shared


def test_storage_resize_of_a_lazy_clone():
    """UntypedStorage.resize_ gives a lazy clone new memory of its own; its sibling keeps the old.
    (The CPU's resize leaves the copy-on-write materializer behind and fails the next write, so
    the reference is an eager clone, which a lazy clone stands for.)"""
    def run(device, clone):
        t = torch.arange(4., device=device)
        c = clone(t)
        c.untyped_storage().resize_(32)
        c.set_(c.untyped_storage(), 0, (8,), (1,))
        c[4:] = 9
        c[0] = 5
        return t.cpu().tolist(), c.cpu().tolist()

    assert run(D, torch.Tensor._lazy_clone) == run("cpu", torch.Tensor.clone)
    t = torch.arange(4., device=D)
    c = t._lazy_clone()
    c.untyped_storage().resize_(32)
    assert _flags(t, c) == [True, False]
    t.add_(1)                                 # the last one sharing the old memory
    assert _flags(t) == [False] and t.cpu().tolist() == [1., 2., 3., 4.]


def test_lazy_clone_on_rbln1():
    from conftest import run_json
    res = run_json("""
        import torch
        t = torch.arange(4., device="rbln:1") * 1
        c = t._lazy_clone()
        c.add_(1)
        print(json.dumps([str(c.device), torch._C._is_cow_tensor(c), c.cpu().tolist(),
                          t.cpu().tolist(), torch.rbln.memory_allocated(0)]))
        """, env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert res == ["rbln:1", False, [1., 2., 3., 4.], [0., 1., 2., 3.], 0]


def test_autograd_through_a_lazy_clone():
    def run(device):
        x = torch.tensor([1., 2., 3.], device=device, requires_grad=True)
        y = x._lazy_clone()
        (y * y).sum().backward()
        return x.grad.cpu().tolist()

    assert run(D) == run("cpu")
