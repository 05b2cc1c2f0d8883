"""The PrivateUse1 allocator and the native storage state: storages made by PyTorch's own paths,
per-device correctness on rbln:1, recycled host views that start fresh, the arena's retry, and
no leaks over many create/free cycles."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from conftest import run_code
from torch_rbln.runtime.arena import round_size
from torch_rbln.runtime.storage import DEVICE, HOST, live_storage_states, state_of

D = "rbln"


PYTORCH_PATHS_ON_RBLN1 = r"""
import copy, io, json, torch
from torch_rbln.runtime.storage import state_of
x = torch.randn(4, 64)
r = x.to("rbln:1")
saved = io.BytesIO(); torch.save(r, saved)
cpu_saved = io.BytesIO(); torch.save(x, cpu_saved)
made = {
    "to": r,
    "UntypedStorage": torch.UntypedStorage(96, device="rbln:1"),
    "storage.clone": r.untyped_storage().clone(),
    "deepcopy": copy.deepcopy(r),
    "load": (saved.seek(0), torch.load(saved))[1],
    "load map_location": (cpu_saved.seek(0), torch.load(cpu_saved, map_location="rbln:1"))[1],
    "empty_like": torch.empty_like(r),
    "new_empty": r.new_empty(3),
    "zeros": torch.zeros(5, device="rbln:1"),
    "clone (device op)": r.half().clone(),
    "add (device op)": r.half() + r.half(),
    "sin (CPU fallback)": torch.sin(r),
    "cat": torch.cat([r, r]),
    "module": torch.nn.Linear(64, 8).to("rbln:1").weight,
}
with torch.rbln.device(1):
    made["current device"] = torch.empty(2, device="rbln")
res = {}
for name, v in made.items():
    storage = v if isinstance(v, torch.UntypedStorage) else v.untyped_storage()
    t = v if isinstance(v, torch.Tensor) else torch.empty(0, dtype=torch.uint8, device=v.device).set_(v)
    s = state_of(t)
    res[name] = [str(storage.device), s.index, s.adopted, s.nbytes == storage.nbytes()]
ref = x.clone()
res["values"] = [torch.equal(made["deepcopy"].cpu(), ref), torch.equal(made["load"].cpu(), ref),
                 torch.equal(made["load map_location"].cpu(), ref),
                 torch.equal(torch.empty(0, device="rbln:1").set_(made["storage.clone"]).cpu().view(4, 64), ref)]
res["rbln0_untouched"] = torch.rbln.memory_stats(0)["allocated.total_allocated"]
res["rbln1_used"] = torch.rbln.memory_allocated(1) > 0
print(json.dumps(res))
"""


def test_pytorch_paths_make_storages_through_the_allocator_on_rbln1():
    r = run_code(PYTORCH_PATHS_ON_RBLN1, env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    values = out.pop("values")
    assert values == [True] * 4
    assert out.pop("rbln0_untouched") == 0 and out.pop("rbln1_used")
    for name, (device, index, adopted, nbytes_match) in out.items():
        assert (device, index, adopted, nbytes_match) == ("rbln:1", 1, False, True), name


PER_INDEX = r"""
import json, torch
from torch_rbln import events
from torch_rbln.runtime.storage import state_of
res = {}
h0 = events.total("h2d")
a = torch.arange(1024, dtype=torch.float16).to("rbln:1")
b = torch.ones(1024, dtype=torch.float16, device="rbln:1")
c = a + b                          # two h2d pushes on rbln:1, the output adopted there
res["h2d"] = [events.total("h2d")[0] - h0[0], events.total("h2d")[1] - h0[1]]
s0, s1 = torch.rbln.memory_stats(0), torch.rbln.memory_stats(1)
res["allocated"] = [s0["allocated.current"], s1["allocated.current"]]
res["num_device_alloc"] = [s0["num_device_alloc"], s1["num_device_alloc"]]
res["states"] = [state_of(t).index for t in (a, b, c)] + [state_of(c).residency]
res["value"] = c.cpu().float().sum().item()
del a, b, c
import gc; gc.collect()
res["after_free"] = [torch.rbln.memory_allocated(1), torch.rbln.memory_reserved(1)]
torch.rbln.empty_cache(1)
res["after_empty_cache"] = torch.rbln.memory_reserved(1)
print(json.dumps(res))
"""


def test_each_device_has_its_own_arena_and_counts():
    r = run_code(PER_INDEX, env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    block = round_size(2048)
    assert out["h2d"] == [2, 4096]
    assert out["allocated"] == [0, 3 * block]
    assert out["num_device_alloc"] == [0, 3]
    assert out["states"] == [1, 1, 1, DEVICE]
    assert out["value"] == sum(range(1024)) + 1024
    # the inputs' blocks stay cached; the adopted output's memory is given back at once
    assert out["after_free"] == [0, 2 * block]
    assert out["after_empty_cache"] == 0


def test_recycled_host_views_start_fresh():
    """A storage that reuses a freed one's host view inherits nothing from it: not its device
    memory, not its residency, not the NaN/Inf scan's mark, not its device data."""
    gc.collect()
    base = torch.rbln.memory_allocated()
    a = torch.full((128,), 3.0, dtype=torch.float16, device=D)
    old = torch.empty(128, dtype=torch.float16, device=D)     # a host view from the pool
    torch.mul(a, 2, out=old)                         # device-latest, device memory booked
    assert (old + 1).cpu()[0].item() == 7.0          # scanned finite as fp16 on the way
    assert state_of(old).has_device_memory and state_of(old).finite_dtype is torch.float16
    ptr = old.data_ptr()
    del old
    gc.collect()
    new = torch.empty(128, dtype=torch.float16, device=D)
    assert new.data_ptr() == ptr                     # the pool handed the same host view back
    s = state_of(new)
    assert s.residency == HOST and not s.has_device_memory and s.finite_dtype is None
    new.copy_(torch.full((128,), float("nan"), dtype=torch.float16))
    from torch_rbln import events
    before = events.snapshot()["cpu_fallback_reason"].get("nan/inf input", [0, 0])[0]
    out = (new + a).cpu()                            # scanned again: the NaN is seen
    after = events.snapshot()["cpu_fallback_reason"].get("nan/inf input", [0, 0])[0]
    assert after - before == 1 and torch.isnan(out).all()
    new.copy_(torch.arange(128, dtype=torch.float16))
    torch.testing.assert_close((new + a).cpu(), torch.arange(128, dtype=torch.float16) + 3)
    del a, new, out, s
    gc.collect()
    assert torch.rbln.memory_allocated() == base


def test_storage_made_outside_the_allocator_is_adopted():
    whole = torch.arange(64, dtype=torch.uint8).to(D).untyped_storage()
    part = whole[16:48]                              # a storage over part of whole's memory
    t = torch.empty(0, dtype=torch.uint8, device=D).set_(part)
    s = state_of(t)
    assert s.adopted and s.nbytes == 32 and s.index == 0
    assert t.cpu().tolist() == list(range(16, 48))
    assert not state_of(torch.empty(3, device=D)).adopted
    with pytest.raises(TypeError, match="expected an rbln storage"):
        state_of(torch.ones(2))


RETRY = r"""
import gc, json, torch
from torch_rbln.runtime.storage import state_of
a = torch.empty(1536 << 10, dtype=torch.uint8, device="rbln")
state_of(a).device_read()
del a; gc.collect()                     # 1.5 MiB stays cached (reserved)
before = torch.rbln.memory_stats()
b = torch.empty(1 << 20, dtype=torch.uint8, device="rbln")
state_of(b).device_read()               # does not fit next to the cache: release, retry
after = torch.rbln.memory_stats()
print(json.dumps({k: [before[k], after[k]] for k in ("reserved.current", "cached.current",
      "num_alloc_retries", "num_device_free", "num_ooms", "allocated.current")}))
"""


def test_arena_releases_its_cache_and_retries():
    r = run_code(RETRY, env={"TORCH_RBLN_DEVICE_MEMORY": "2MiB"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    assert out["reserved.current"] == [1536 << 10, mib]
    assert out["cached.current"] == [1536 << 10, 0]
    assert out["num_alloc_retries"] == [0, 1]
    assert out["num_device_free"] == [0, 1]
    assert out["num_ooms"] == [0, 0]
    assert out["allocated.current"] == [0, mib]


def test_create_free_cycles_return_to_baseline():
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    x = torch.ones(64, dtype=torch.float16, device=D)
    sizes = (0, 1, 64, 1000, 4096, 70_000)

    def cycle(i):
        n = sizes[i % len(sizes)]
        t = torch.empty(n, dtype=torch.float16, device=D)
        kind = i % 4
        if kind == 1:
            state_of(t).device_read()                # a device block, then freed with t
        elif kind == 2:
            t = x + x                                # a program output adopted as device memory
        elif kind == 3:
            t = torch.UntypedStorage(n, device=D)    # PyTorch's own storage constructor
        return t

    for i in range(200):
        cycle(i)
    gc.collect()
    base = (live_storage_states(), torch.rbln.memory_allocated())
    rss = proc.memory_info().rss
    for i in range(10_000):
        cycle(i)
    gc.collect()
    assert (live_storage_states(), torch.rbln.memory_allocated()) == base
    assert proc.memory_info().rss - rss < 20 << 20
