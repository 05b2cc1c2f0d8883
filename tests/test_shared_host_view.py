"""One physical copy: a device block whose memory is its storage's host view.

The virtual NPU's device memory is host RAM. Where the host view holds the device's bytes (from
the first device use, after every transfer, and through writes on either side), the block's
memory *is* the host view. A program's fresh output is both at once (its memory becomes the new
storage's host view); only an output written into an existing storage (in place, ``out=``) is a
second copy, until the next transfer (docs/tensors-and-memory.md, "Physical memory"). Transfers,
residency and the arena's statistics stay those of two copies; `Arena.held` counts the device
memory physically held. Every value is compared with the CPU."""

from __future__ import annotations

import gc

import pytest
import torch

from torch_rbln import events
from torch_rbln.runtime.arena import Arena, round_size
from torch_rbln.runtime.storage import DEVICE, HOST, SYNCED, state_of

D = "rbln"
H = torch.float16


def mm(x, w):
    """The NPU's numerics for a half-precision matmul: an fp32 GEMM, one rounding."""
    return (x.float() @ w.float()).to(H)


def held() -> int:
    return Arena(0).held


def moved(kind: str, since: tuple[int, int]) -> tuple[int, int]:
    n, b = events.total(kind)
    return n - since[0], b - since[1]


def test_a_synced_weight_holds_no_second_copy():
    gc.collect()
    w = torch.randn(64, 256, dtype=H)
    x = torch.randn(8, 64, dtype=H)
    wd, xd = w.to(D), x.to(D)
    alloc0, held0, h2d = torch.rbln.memory_allocated(), held(), events.total("h2d")
    y = xd @ wd
    # transfers and accounting as with two copies: both operands pushed, three blocks booked
    assert moved("h2d", h2d) == (2, w.nbytes + x.nbytes)
    assert torch.rbln.memory_allocated() - alloc0 == sum(
        round_size(t.nbytes) for t in (w, x, y))
    s = state_of(wd)
    assert s.residency == SYNCED and s.has_device_memory and s.shares_host_view
    # physically, the fresh output's memory is its host view too: nothing is held twice
    assert state_of(y).shares_host_view and held() == held0
    d2h = events.total("d2h")
    torch.testing.assert_close(y.cpu(), mm(x, w))
    assert moved("d2h", d2h) == (1, y.nbytes)       # recorded as with two copies
    assert state_of(y).shares_host_view and held() == held0
    o = torch.empty_like(y)
    torch.mm(xd, wd, out=o)         # an output written into an existing storage: its own copy
    assert not state_of(o).shares_host_view
    assert held() - held0 == round_size(o.nbytes)
    torch.testing.assert_close(o.cpu(), mm(x, w))
    assert state_of(o).shares_host_view and held() == held0   # the output's copy let go
    del o
    assert torch.rbln.memory_allocated() - alloc0 == sum(round_size(t.nbytes) for t in (w, x, y))


def test_writes_on_either_side_after_sharing_match_the_cpu():
    w = torch.randn(64, 64, dtype=H)        # device ops take a last dimension of 64s
    x = torch.randn(4, 64, dtype=H)
    wd, xd = w.to(D), x.to(D)
    state_of(xd).device_read()      # only the weight's transfers are counted below
    s = state_of(wd)

    def check(label):
        residency = s.residency
        h2d = events.total("h2d")
        got = (xd @ wd).cpu()        # a device read of the weight
        want = (1, w.nbytes) if residency == HOST else (0, 0)
        assert moved("h2d", h2d) == want, label
        torch.testing.assert_close(got, mm(x, w), msg=label)
        residency = s.residency
        d2h = events.total("d2h")
        torch.testing.assert_close(wd.cpu(), w, rtol=0, atol=0, msg=label)   # a host read
        want = (1, w.nbytes) if residency == DEVICE else (0, 0)
        assert moved("d2h", d2h) == want, label

    check("first use")
    assert s.shares_host_view
    wd[0].fill_(3.0); w[0].fill_(3.0)                        # synced: written on the host
    assert s.residency == HOST and s.shares_host_view
    check("partial host write")
    ix = torch.tensor([1, 5])
    src = torch.randn(2, 64, dtype=H)
    wd.index_copy_(0, ix.to(D), src.to(D)); w.index_copy_(0, ix, src)   # partial device write
    assert s.residency == DEVICE and s.shares_host_view
    check("partial device write")
    wd.mul_(2); w.mul_(2)           # a program's output becomes the device memory
    assert s.residency == DEVICE and not s.shares_host_view
    check("in-place device op")
    assert s.shares_host_view       # the host read let the output go
    new = torch.randn(64, 64, dtype=H)
    wd.copy_(new); w.copy_(new)     # whole host write
    assert s.residency == HOST
    check("copy_ from the CPU")
    pinned = torch.randn(64, 64, dtype=H).pin_memory()
    wd.copy_(pinned, non_blocking=True); w.copy_(pinned)
    check("non_blocking copy")
    wd.add_(1); w.add_(1)
    wd.sub_(0.5); w.sub_(0.5)        # device-latest over an adopted output, written again
    check("two device writes")


def test_freed_shared_block_is_cached_without_memory():
    gc.collect()
    torch.rbln.empty_cache()
    base, held0 = torch.rbln.memory_stats(), held()
    t = torch.ones(1536, dtype=H, device=D)
    state_of(t).device_read()
    assert state_of(t).shares_host_view and held() == held0
    del t
    gc.collect()
    s = torch.rbln.memory_stats()
    # as with a block of its own: freed, cached, reserved
    assert s["allocated.current"] == base["allocated.current"]
    assert s["reserved.current"] - base["reserved.current"] == round_size(3072)
    assert s["cached.current"] - base["cached.current"] == round_size(3072)
    assert held() == held0          # the cache holds it without memory
    u = torch.full((1536,), 7.0, dtype=H, device=D)
    v = u + 1                       # u takes the cached block; v is booked anew
    assert torch.rbln.memory_stats()["num_device_alloc"] - s["num_device_alloc"] == 1
    assert held() == held0          # v's memory is the program's output, its host view too
    assert torch.equal(v.cpu(), torch.full((1536,), 8.0, dtype=H))
    assert torch.equal(u.cpu(), torch.full((1536,), 7.0, dtype=H))
    del u, v
    gc.collect()
    torch.rbln.empty_cache()
    assert torch.rbln.memory_reserved() == torch.rbln.memory_allocated() and held() == held0


@pytest.mark.parametrize("eager", ["0", "1"])
def test_eager_malloc_books_the_block_over_the_host_view(monkeypatch, eager):
    gc.collect()
    monkeypatch.setenv("TORCH_RBLN_EAGER_MALLOC", eager)
    before, held0 = torch.rbln.memory_allocated(), held()
    t = torch.empty(1024, dtype=H, device=D).fill_(1.5)     # written on the host
    booked = round_size(t.nbytes) if eager == "1" else 0
    assert torch.rbln.memory_allocated() - before == booked
    assert state_of(t).shares_host_view == (eager == "1") and held() == held0
    torch.testing.assert_close((t * 2).cpu(), torch.full((1024,), 3.0, dtype=H))
    assert state_of(t).shares_host_view and held() == held0
