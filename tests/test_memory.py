"""Virtual NPU memory: lazy allocation, exact caching-allocator statistics, out-of-memory
behaviour, and the torch.rbln memory API (in fresh processes where the arena must be new)."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from conftest import run_code
from torch_rbln.runtime.arena import round_size
from torch_rbln.runtime.storage import state_of

D = "rbln"


def touch(t):
    """First device use of ``t`` (a device op reads it)."""
    state_of(t).device_read()
    return t


def test_allocation_is_lazy_until_first_device_use():
    gc.collect()              # garbage of earlier tests must not be freed mid-test
    torch.rbln.empty_cache()
    before = torch.rbln.memory_allocated()
    t = torch.empty(1000, 100, device=D)
    assert torch.rbln.memory_allocated() == before
    touch(t)
    assert torch.rbln.memory_allocated() == before + round_size(400_000)
    del t
    gc.collect()
    assert torch.rbln.memory_allocated() == before


def test_stats_are_exact_sums_of_rounded_blocks():
    gc.collect()
    torch.rbln.empty_cache()
    torch.rbln.reset_peak_memory_stats()
    base = torch.rbln.memory_stats()
    sizes = [1, 511, 512, 513, 4096, 100_003, 1 << 20]
    ts = [touch(torch.empty(n, dtype=torch.uint8, device=D)) for n in sizes]
    s = torch.rbln.memory_stats()
    want = sum(round_size(n) for n in sizes)
    assert s["allocated.current"] - base["allocated.current"] == want
    assert s["allocated.peak"] >= base["allocated.current"] + want
    assert s["reserved.current"] - base["reserved.current"] == want
    assert torch.rbln.memory_allocated() == s["allocated.current"]
    assert torch.rbln.max_memory_allocated() == s["allocated.peak"]
    del ts
    gc.collect()
    s2 = torch.rbln.memory_stats()
    assert s2["allocated.current"] == base["allocated.current"]
    assert s2["allocated.total_freed"] - base["allocated.total_freed"] == want
    # freed blocks stay cached (reserved) until empty_cache
    assert s2["reserved.current"] - base["reserved.current"] == want
    assert s2["cached.current"] >= want
    assert torch.rbln.max_memory_allocated() >= base["allocated.current"] + want
    torch.rbln.reset_peak_memory_stats()
    assert torch.rbln.max_memory_allocated() == torch.rbln.memory_allocated()
    torch.rbln.empty_cache()
    assert torch.rbln.memory_reserved() == torch.rbln.memory_allocated()
    torch.rbln.reset_accumulated_memory_stats()
    assert torch.rbln.memory_stats()["allocated.total_allocated"] == 0


def test_cached_block_is_reused():
    gc.collect()
    torch.rbln.empty_cache()
    a = touch(torch.empty(3000, dtype=torch.uint8, device=D))
    reserved = torch.rbln.memory_reserved()
    del a
    gc.collect()
    b = touch(torch.empty(3000, dtype=torch.uint8, device=D))
    assert torch.rbln.memory_reserved() == reserved
    del b


def test_eager_malloc_is_read_at_each_allocation(monkeypatch):
    before = torch.rbln.memory_allocated()
    monkeypatch.setenv("TORCH_RBLN_EAGER_MALLOC", "1")
    t = torch.empty(2048, dtype=torch.uint8, device=D)
    assert torch.rbln.memory_allocated() == before + 2048
    monkeypatch.setenv("TORCH_RBLN_EAGER_MALLOC", "0")
    u = torch.empty(2048, dtype=torch.uint8, device=D)
    assert torch.rbln.memory_allocated() == before + 2048
    monkeypatch.setenv("TORCH_RBLN_EAGER_MALLOC", "yes")
    with pytest.raises(ValueError, match="TORCH_RBLN_EAGER_MALLOC"):
        torch.empty(10, device=D)
    del t, u


def test_memory_api_device_arguments():
    assert torch.rbln.memory_allocated("rbln") == torch.rbln.memory_allocated(0)
    assert torch.rbln.memory_allocated(torch.device("rbln:0")) == torch.rbln.memory_allocated()
    with pytest.raises(TypeError):
        torch.rbln.memory_allocated(True)
    with pytest.raises(ValueError, match="Expected an 'rbln' device, got 'cpu'"):
        torch.rbln.memory_stats("cpu")
    with pytest.raises(ValueError, match=r"rbln device index 256 is out of range \[0, 1\)"):
        torch.rbln.memory_stats("rbln:256")
    free, total = torch.rbln.mem_get_info()
    assert total == torch.rbln.get_device_properties(0).total_memory and 0 <= free <= total
    text = torch.rbln.memory_summary()
    assert text.startswith("torch_rbln memory summary (device=rbln:0, MiB)")
    assert "alloc retries:" in text


OOM_SCRIPT = r"""
import json, torch
from torch_rbln.runtime.storage import state_of
keep = torch.arange(1024, dtype=torch.float32, device="rbln")
state_of(keep).device_read()
before = torch.rbln.memory_stats()
big = torch.empty(3 << 20, dtype=torch.uint8, device="rbln")   # host view only: lazy
err = None
try:
    state_of(big).device_read()
except torch.OutOfMemoryError as e:
    err = str(e)
after = torch.rbln.memory_stats()
same = {k: after[k] == before[k] for k in before if k not in ("num_ooms",)}
ok_after = (keep * 2).cpu().equal(torch.arange(1024, dtype=torch.float32) * 2)
small = torch.ones(64, dtype=torch.float16, device="rbln") + 1
print(json.dumps({"err": err, "same": same, "ooms": after["num_ooms"], "ok": ok_after,
                  "small": small.cpu().tolist()[:2]}))
"""


def test_out_of_memory_is_clean():
    r = run_code(OOM_SCRIPT, env={"TORCH_RBLN_DEVICE_MEMORY": "2MiB"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "tried to allocate" in out["err"] and "(3145728 bytes)" in out["err"]
    assert "capacity 2.00 MiB (2097152 bytes)" in out["err"]
    assert "allocated by tensors" in out["err"]
    assert all(out["same"].values()), out["same"]
    assert out["ooms"] == 1 and out["ok"] and out["small"] == [2.0, 2.0]


def test_leak_loop_returns_to_baseline():
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    x = torch.randn(64, 256, dtype=torch.float16, device=D)

    def step():
        a = torch.randn(64, 256, dtype=torch.float16).to(D)
        b = a * 2.0 + x
        c = b.t().contiguous()
        return c[0, 0].item()

    for _ in range(200):
        step()
    gc.collect()
    base_alloc = torch.rbln.memory_allocated()
    rss = proc.memory_info().rss
    for _ in range(10_000):
        step()
    gc.collect()
    assert torch.rbln.memory_allocated() == base_alloc
    assert proc.memory_info().rss - rss < 50 << 20


def test_storage_resize_keeps_bytes_and_frees_memory():
    """``UntypedStorage.resize_`` (FSDP frees and regrows parameters this way) as on the CPU:
    the kept bytes survive from the latest side, tensors see the new memory, 0 frees it."""
    y = torch.arange(128, dtype=torch.float16).to("rbln") + 1   # device-latest
    st = y.untyped_storage()
    st.resize_(128)                                            # keep the first 64 elements
    kept = torch.empty(0, dtype=torch.float16, device="rbln").set_(st, 0, (64,))
    torch.testing.assert_close((kept * 1).cpu(), torch.arange(64, dtype=torch.float16) + 1)
    del y
    used = torch.rbln.memory_allocated()           # kept's device block, pushed by kept * 1
    st.resize_(0)
    assert st.nbytes() == 0 and torch.rbln.memory_allocated() < used
    st.resize_(128)
    kept.set_(st, 0, (64,)).copy_(torch.full((64,), 3.0, dtype=torch.float16))
    torch.testing.assert_close((kept * 2).cpu(), torch.full((64,), 6.0, dtype=torch.float16))
