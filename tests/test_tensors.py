"""Device tensors with real storage: factories, copies, views, metadata ops, serialization,
modules and autograd, each compared with the same code on the CPU."""

from __future__ import annotations

import io

import pytest
import torch

from torch_rbln.runtime.storage import DEVICE, HOST, SYNCED, state_of

D = "rbln"


def same(r: torch.Tensor, c: torch.Tensor):
    assert r.device.type == "rbln"
    rc = r.cpu()
    assert rc.dtype == c.dtype and rc.shape == c.shape
    torch.testing.assert_close(rc, c, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("make", [
    lambda dev: torch.empty(0, 3, device=dev).shape,
    lambda dev: torch.zeros(3, 5, device=dev),
    lambda dev: torch.ones(2, 64, dtype=torch.float16, device=dev),
    lambda dev: torch.full((2, 3), 7.5, device=dev),
    lambda dev: torch.arange(10, device=dev),
    lambda dev: torch.arange(64, dtype=torch.float16, device=dev),
    lambda dev: torch.linspace(0, 1, 7, device=dev),
    lambda dev: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev),
    lambda dev: torch.tensor(3, device=dev),
    lambda dev: torch.empty_strided((2, 3), (1, 2), device=dev).stride(),
    lambda dev: torch.zeros_like(torch.ones(3, 4, device=dev)),
    lambda dev: torch.ones_like(torch.ones(3, 4, device=dev)),
    lambda dev: torch.full_like(torch.ones(3, 4, device=dev), 2),
    lambda dev: torch.empty_like(torch.ones(3, 4, device=dev)).shape,
    lambda dev: torch.eye(3, device=dev),
], ids=lambda f: None)
def test_factories_match_cpu(make):
    r, c = make(D), make("cpu")
    if isinstance(c, torch.Tensor):
        same(r, c)
    else:
        assert r == c


def test_random_factories_use_the_rbln_generator():
    torch.rbln.manual_seed(123)
    a = [torch.rand(5, device=D).cpu(), torch.randn(5, device=D).cpu(),
         torch.randint(0, 100, (5,), device=D).cpu(), torch.rand_like(torch.ones(5, device=D)).cpu()]
    torch.rbln.manual_seed(123)
    b = [torch.rand(5, device=D).cpu(), torch.randn(5, device=D).cpu(),
         torch.randint(0, 100, (5,), device=D).cpu(), torch.rand_like(torch.ones(5, device=D)).cpu()]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    state = torch.rbln.get_rng_state()
    x = torch.randn(3, device=D).cpu()
    torch.rbln.set_rng_state(state)
    assert torch.equal(torch.randn(3, device=D).cpu(), x)


def test_random_ops_without_a_generator_argument_use_the_rbln_generator():
    # native_dropout (behind nn.Dropout) has no generator argument: on the CPU it draws from
    # the global generator; on rbln from the device's, like every other random op
    x = torch.ones(1000, device=D)
    drop = torch.nn.Dropout(0.5)
    cpu_state = torch.random.get_rng_state()

    def run(seed):
        torch.rbln.manual_seed(seed)
        return drop(x).cpu()

    a = run(5)
    assert torch.equal(torch.random.get_rng_state(), cpu_state)     # the CPU's is untouched
    torch.random.manual_seed(99)
    assert torch.equal(run(5), a) and not torch.equal(run(6), a)
    assert 400 < int((a == 0).sum()) < 600 and set(a.unique().tolist()) == {0.0, 2.0}
    # the device generator advanced exactly as the CPU's advances for the same op
    torch.rbln.manual_seed(5)
    drop(x)
    g = torch.Generator().manual_seed(5)
    torch.random.default_generator.set_state(g.get_state())
    drop(torch.ones(1000))
    assert torch.equal(torch.rbln.get_rng_state(), torch.random.get_rng_state())


def test_to_and_back_and_dtype():
    x = torch.randn(4, 64)
    r = x.to(D)
    assert r.device == torch.device("rbln:0")
    same(r, x)
    same(r.to(torch.float16), x.half())
    same(x.half().to(D).to(torch.float32), x.half().float())
    assert torch.equal(r.to("cpu"), x)
    assert r.to(D) is r


@pytest.mark.parametrize("view", [
    lambda t: t.view(8, 32), lambda t: t.t(), lambda t: t.transpose(0, 1)[3:9],
    lambda t: t.view(2, 2, 64).permute(2, 0, 1), lambda t: t[1:3, 5:40:3], lambda t: t[:1].expand(3, 64),
    lambda t: t.unsqueeze(1).squeeze(1), lambda t: t.unfold(1, 8, 4), lambda t: t[:, :4].diagonal(),
    lambda t: t.narrow(1, 3, 4), lambda t: t.reshape(-1), lambda t: t.t().reshape(-1),
    lambda t: t.as_strided((3, 3), (2, 5), 1), lambda t: t.select(1, 7), lambda t: t[..., None],
    lambda t: t.flatten(), lambda t: t.view(torch.int32), lambda t: t.contiguous(),
    lambda t: t.t().contiguous(), lambda t: t.t().clone(), lambda t: t.movedim(0, 1),
])
def test_views_read_like_cpu(view):
    x = torch.randn(4, 64)
    r = x.to(D)
    v = view(r)
    same(v, view(x))


def test_views_share_storage_and_write_through():
    x = torch.randn(4, 64)
    r = x.to(D)
    v = r.t()[2:10]
    assert v.untyped_storage().data_ptr() == r.untyped_storage().data_ptr()
    assert v._base is r
    for fn in (lambda t: t[1:3, 2:5].fill_(5.0), lambda t: t.t()[0].add_(1),
               lambda t: t.view(2, 128)[1].mul_(2), lambda t: t.select(1, 3).zero_(),
               lambda t: t.split(16, 1)[2].copy_(torch.ones(4, 16)),
               lambda t: t.unbind(0)[3].neg_(), lambda t: t.chunk(2, 1)[1].sub_(0.5),
               lambda t: t.narrow(0, 1, 2).clamp_(-0.1, 0.1), lambda t: t.diagonal().fill_(9)):
        fn(r)
        fn(x)
        same(r, x)


def test_split_chunk_unbind():
    x = torch.randn(6, 64)
    r = x.to(D)
    for a, b in zip(r.split([1, 2, 3]), x.split([1, 2, 3])):
        same(a, b)
    for a, b in zip(r.chunk(3, 1), x.chunk(3, 1)):
        same(a, b)
    for a, b in zip(r.unbind(1), x.unbind(1)):
        same(a, b)


@pytest.mark.parametrize("src_dev,dst_dev", [("cpu", D), (D, "cpu"), (D, D)])
@pytest.mark.parametrize("case", ["plain", "noncontig_src", "noncontig_dst", "broadcast", "dtype"])
def test_copy_every_direction(src_dev, dst_dev, case):
    base = torch.randn(8, 64)
    src = base
    dst_shape, dst_dtype = (8, 64), torch.float32
    if case == "noncontig_src":
        src, dst_shape = base.t(), (64, 8)
    if case == "broadcast":
        src = base[0]
    if case == "dtype":
        dst_dtype = torch.float16
    expect = torch.zeros(dst_shape, dtype=dst_dtype)
    dst = torch.zeros(dst_shape, dtype=dst_dtype, device=dst_dev)
    if case == "noncontig_dst":
        expect, dst = expect.t().contiguous().t(), torch.zeros(64, 8, device=dst_dev).t()
    expect.copy_(src)
    dst.copy_(src.to(src_dev))
    assert dst.device.type == dst_dev
    torch.testing.assert_close(dst.cpu(), expect, rtol=0, atol=0)


def test_copy_between_overlapping_views():
    # partly overlapping views of one storage: the CPU's error; the same view, or disjoint
    # views: the CPU's copy
    x = torch.arange(128.0)
    r = x.to(D)
    for dst, src in ((slice(1, 65), slice(0, 64)), (slice(0, 64), slice(32, 96))):
        with pytest.raises(RuntimeError, match="refer to a single memory location") as cpu:
            x[dst].copy_(x[src])
        with pytest.raises(RuntimeError) as dev:
            r[dst].copy_(r[src])
        assert str(dev.value) == str(cpu.value)
    for t in (x, r):
        t[0:64].copy_(t[64:128])
        t[8:16].copy_(t[8:16])
        t.view(8, 16)[:, :8].copy_(t.view(8, 16)[:, 8:])
    same(r, x)


def test_resize_and_set():
    r = torch.arange(4.0, device=D)
    r.resize_(8)
    assert r.shape == (8,)
    assert r[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    r.resize_(2, 2)
    assert r.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    a = torch.arange(6.0, device=D)
    b = torch.empty(0, device=D)
    b.set_(a.untyped_storage(), 0, (2, 3), (3, 1))
    same(b, torch.arange(6.0).view(2, 3))
    c = torch.empty(0, device=D).set_(a)
    same(c, torch.arange(6.0))
    b.add_(1)
    same(a, torch.arange(6.0) + 1)


def test_item_tolist_print():
    x = torch.randn(3, 64)
    r = x.to(D)
    assert r[1, 2].item() == x[1, 2].item()
    assert r[0, :5].tolist() == x[0, :5].tolist()
    assert "device='rbln:0'" in repr(r)
    assert str(r.cpu()) in str(r).replace(", device='rbln:0'", "")
    assert repr(torch.tensor(2.5, device=D)) == "tensor(2.5000, device='rbln:0')"


def test_save_and_load_with_map_location(tmp_path):
    x = torch.randn(4, 64)
    r = x.to(D)
    path = tmp_path / "t.pt"
    torch.save({"a": r, "view": r[1:, 3:], "h": r.half()}, path)
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["a"].device.type == "cpu" and torch.equal(on_cpu["a"], x)
    assert torch.equal(on_cpu["view"], x[1:, 3:])
    back = torch.load(path)
    assert back["a"].device == torch.device("rbln:0")
    same(back["view"], x[1:, 3:])
    assert back["view"].untyped_storage().data_ptr() == back["a"].untyped_storage().data_ptr()
    mapped = torch.load(path, map_location="rbln")
    same(mapped["h"], x.half())
    cpu_saved = tmp_path / "c.pt"
    torch.save(x, cpu_saved)
    same(torch.load(cpu_saved, map_location="rbln:0"), x)


def test_module_to_keeps_tied_weights_and_matches_cpu():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(10, 64), torch.nn.Linear(64, 10, bias=False))
    m[1].weight = m[0].weight
    ids = torch.tensor([[1, 2, 3]])
    want = m(ids)
    m.to(D)
    assert m[1].weight is m[0].weight
    assert m[0].weight.device.type == "rbln"
    got = m(ids.to(D))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    m.cpu()
    assert m[1].weight is m[0].weight and m[0].weight.device.type == "cpu"


def test_requires_grad_and_backward_match_cpu():
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    w = torch.randn(64, 64)
    wr = w.to(D).requires_grad_()
    loss_r = torch.tanh(x.to(D) @ wr).pow(2).mean()
    loss_r.backward()
    wc = w.clone().requires_grad_()
    loss_c = torch.tanh(x @ wc).pow(2).mean()
    loss_c.backward()
    assert wr.grad.device.type == "rbln"
    torch.testing.assert_close(loss_r.cpu(), loss_c.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wr.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-6)


def test_residency_states_follow_the_rules():
    from torch_rbln import events

    def count(kind):
        return events.total(kind)[0]

    a = torch.ones(64, dtype=torch.float16, device=D)
    b = torch.ones(64, dtype=torch.float16, device=D)
    assert state_of(a).residency == HOST and not state_of(a).has_device_memory   # lazy
    h0, d0 = count("h2d"), count("d2h")
    c = a + b
    assert count("h2d") - h0 == 2                  # first device use pushes both inputs
    assert state_of(a).residency == SYNCED and state_of(c).residency == DEVICE
    c.cpu()
    assert count("d2h") - d0 == 1                  # device-latest -> one physical d2h
    assert state_of(c).residency == SYNCED
    c.cpu()
    a.cpu()
    assert count("d2h") - d0 == 1                  # synced and host-latest reads move nothing
    a.copy_(torch.full((64,), 2.0))               # a host write (copy from the CPU)
    assert state_of(a).residency == HOST


def test_storage_construction_clone_and_deepcopy():
    import copy
    x = torch.randn(4, 64)
    r = x.to(D)
    s = torch.UntypedStorage(32, device=D)
    assert s.device == torch.device("rbln:0") and s.nbytes() == 32
    assert r.untyped_storage().clone().device.type == "rbln"
    c = copy.deepcopy(r)
    assert c.untyped_storage().data_ptr() != r.untyped_storage().data_ptr()
    same(c, x)
    m = torch.nn.Linear(64, 8).to(D)
    m2 = copy.deepcopy(m)
    same(m2.weight, m.weight.cpu())
    seq = torch.UntypedStorage([1, 2, 250], device=D)      # from a sequence of bytes, as on cuda
    assert seq.device == torch.device("rbln:0") and seq.tolist() == [1, 2, 250]
