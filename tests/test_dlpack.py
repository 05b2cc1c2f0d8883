"""DLPack on rbln against the CPU: export (``__dlpack__`` with its keywords, ``to_dlpack``) and
import (``torch.from_dlpack``, ``torch.utils.dlpack.from_dlpack``) give the same values, dtypes,
shapes and strides, share memory as the CPU's do, copy where the CPU copies and raise where it
raises; the capsule names the NPU (``kDLExtDev`` and the index); the export syncs the host view
and leaves it host-latest, and an import shares the exporter's storage and residency."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.dlpack import DLDeviceType, from_dlpack, to_dlpack

from conftest import event_delta, run_json
from torch_rbln import events
from torch_rbln.runtime.storage import DEVICE, HOST, state_of

D = "rbln"

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
          torch.float64, torch.complex64, torch.complex128, torch.float16, torch.bfloat16,
          torch.bool, torch.uint16, torch.uint32, torch.uint64)

ROUTES = {
    "protocol": lambda x: torch.from_dlpack(x),
    "capsule": lambda x: from_dlpack(to_dlpack(x)),
    "torch.to_dlpack": lambda x: torch.from_dlpack(torch.to_dlpack(x)),
    "unversioned": lambda x: torch.from_dlpack(x.__dlpack__()),
    "max_version 0.8": lambda x: torch.from_dlpack(x.__dlpack__(max_version=(0, 8))),
    "max_version 1.0": lambda x: torch.from_dlpack(x.__dlpack__(max_version=(1, 0))),
    "max_version 2.0": lambda x: torch.from_dlpack(x.__dlpack__(max_version=(2, 0))),
}


def _roundtrip(device, dtype, route):
    torch.manual_seed(0)
    x = torch.testing.make_tensor((5,), dtype=dtype, device="cpu").to(device)
    z = ROUTES[route](x)
    return (z.device.type, z.dtype, z.shape, z.stride(), z.cpu().tolist(),
            z.data_ptr() == x.data_ptr())


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_matches_cpu(dtype, route):
    got, want = _roundtrip(D, dtype, route), _roundtrip("cpu", dtype, route)
    assert got[0] == "rbln" and got[1:] == want[1:]


def test_noncontiguous_views_match_cpu():
    def run(device):
        x = torch.arange(25., device=device).reshape(5, 5)
        out = []
        for v in (x[0], x[:, 0], x[1, :], x[1], x.t(), x[::3][:1], x[1:, 2:4]):
            z = torch.from_dlpack(v)
            # (the storage offset differs: an rbln import is a view of the exporter's storage,
            # the CPU's a storage of its own starting at the exported data)
            out.append((z.shape, z.stride(), z.data_ptr() == v.data_ptr(), z.cpu().tolist()))
        return out

    assert run(D) == run("cpu")


def test_dlpack_device_names_the_npu():
    x = torch.ones(2, device=D)
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    assert torch.ones(2).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    res = run_json("""
        from torch.utils.dlpack import from_dlpack, to_dlpack
        x = torch.arange(4., device="rbln:1")
        y = torch.from_dlpack(x)
        z = from_dlpack(to_dlpack(x))
        z[0] = 7
        print(json.dumps([[int(v) for v in x.__dlpack_device__()], str(y.device), str(z.device),
                          x.cpu().tolist(), y.data_ptr() == x.data_ptr()]))
        """, env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert res == [[12, 1], "rbln:1", "rbln:1", [7., 1., 2., 3.], True]


def test_writes_are_shared_as_on_cpu():
    def run(device):
        x = torch.arange(6., device=device)
        z = from_dlpack(to_dlpack(x))
        z[0] = z[0] + 20.0                     # the importer writes: the exporter sees it
        y = torch.from_dlpack(x[2:])
        x.mul_(2)                              # the exporter writes: the importers see it
        y[1] = -1
        return x.cpu().tolist(), z.cpu().tolist(), y.cpu().tolist()

    assert run(D) == run("cpu")


def test_copy_and_device_requests_as_on_cpu():
    """torch.from_dlpack(device=, copy=) and __dlpack__(dl_device=, copy=) as PyTorch gives them:
    a move shares memory, a copy does not, another device copies."""
    def run(device):
        x = torch.arange(5., device=device)
        here = x.__dlpack_device__()
        out = []
        for kw in ({}, {"copy": None}, {"copy": False}, {"copy": True}, {"device": device},
                   {"device": device, "copy": True}, {"device": "cpu"},
                   {"device": "cpu", "copy": True}):
            z = torch.from_dlpack(x, **kw)
            out.append((z.device.type, z.data_ptr() == x.data_ptr(), z.cpu().tolist()))
        for kw in ({"dl_device": here}, {"dl_device": here, "copy": True},
                   {"dl_device": (DLDeviceType.kDLCPU, 0)},
                   {"dl_device": (DLDeviceType.kDLCPU, 0), "copy": True}):
            z = torch.from_dlpack(x.__dlpack__(max_version=(1, 0), **kw))
            out.append((z.device.type, z.data_ptr() == x.data_ptr(), z.cpu().tolist()))
        return out

    got, want = run(D), run("cpu")
    # on the CPU a request for the CPU is a move; on rbln it is a copy to the other device
    cpu_kw = (6, 7, 10, 11)
    assert [g for i, g in enumerate(got) if i not in cpu_kw] == [
        ("rbln", *w[1:]) for i, w in enumerate(want) if i not in cpu_kw]
    assert [got[i] for i in cpu_kw] == [("cpu", False, want[i][2]) for i in cpu_kw]


def _error(fn):
    try:
        fn()
    except Exception as e:                     # noqa: BLE001 - the type and message compared
        return type(e).__name__, str(e).split("\n")[0]
    return None


def test_errors_as_on_cpu():
    def run(device):
        x = torch.arange(5., device=device)
        return [
            _error(lambda: torch.zeros(2, device=device, requires_grad=True).__dlpack__()),
            _error(lambda: torch.tensor([1 + 1j], device=device).conj().__dlpack__()),
            _error(lambda: x.__dlpack__(stream=object())),
            _error(lambda: x.__dlpack__(max_version=(1, 0),
                                        dl_device=(DLDeviceType.kDLHexagon, 0))),
        ]

    assert run(D) == run("cpu")
    assert all(run(D))
    x = torch.arange(5., device=D)
    msg = _error(lambda: torch.from_dlpack(x, device="cpu", copy=False))
    assert msg[0] == "ValueError" and "without copying" in msg[1]


def test_numpy_refuses_rbln_tensors_as_cuda_ones():
    x = torch.arange(3., device=D)
    assert _error(lambda: x.numpy())[0] == "TypeError"
    assert _error(lambda: np.from_dlpack(x)) is not None
    assert np.from_dlpack(x.cpu()).tolist() == [0., 1., 2.]


TIMED = ("runtime", "warm_hit", "recompile", "cpu_fallback", "device_program")


def test_export_syncs_the_host_view_and_leaves_it_host_latest():
    h = torch.randn(256, dtype=torch.float16)
    x = h.to(D) * 2                            # device-latest
    assert state_of(x).residency == DEVICE
    before = events.snapshot()
    y = torch.from_dlpack(x)
    delta = event_delta(before, events.snapshot(), TIMED)
    assert delta.get(("d2h", "")) == (1, 512)
    assert state_of(x).residency == HOST and state_of(y) == state_of(x)
    before = events.snapshot()
    z = x + 1                                  # the consumer may have written: pushed again
    assert event_delta(before, events.snapshot(), TIMED).get(("h2d", "")) == (1, 512)
    x.mul_(3)                                  # a device write the importer then reads
    assert torch.equal(y.cpu(), h * 6) and torch.equal(z.cpu(), h * 2 + 1)


def test_export_of_a_lazy_clone_materializes_as_on_cpu():
    def run(device):
        t = torch.arange(4., device=device)
        c = t._lazy_clone()
        z = torch.from_dlpack(c)
        z[0] = 9
        return (torch._C._is_cow_tensor(t), torch._C._is_cow_tensor(c), t.cpu().tolist(),
                c.cpu().tolist())

    assert run(D) == run("cpu")


def test_import_outlives_the_exporter():
    x = torch.arange(4., device=D)
    cap = to_dlpack(x)
    y = torch.from_dlpack(x[1:])
    del x
    z = from_dlpack(cap)
    assert z.cpu().tolist() == [0., 1., 2., 3.] and y.cpu().tolist() == [1., 2., 3.]
    z[1] = 5
    assert y.cpu().tolist() == [5., 2., 3.]
