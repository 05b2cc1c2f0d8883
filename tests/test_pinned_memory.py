"""Pinned host memory for rbln (docs/torch-rbln.md ("Pinned memory")), run in fresh processes."""

from __future__ import annotations

import pytest

from conftest import run_json


@pytest.fixture(scope="module")
def out():
    return run_json("""
    import gc
    import torch_rbln._C as C
    res = {}
    base = C._pinned_memory_stats()["active_requests"]
    x = torch.randn(1000)
    p = x.pin_memory()
    e = torch.empty(64, pin_memory=True)
    res["pinned"] = [p.is_pinned(), torch.equal(p, x), x.is_pinned(), p[10:].is_pinned(),
                     e.is_pinned(), torch.zeros(4).pin_memory("rbln").is_pinned()]
    res["live"] = C._pinned_memory_stats()["active_requests"] - base
    del p, e
    gc.collect()
    res["freed"] = C._pinned_memory_stats()["active_requests"] - base
    torch.accelerator.empty_host_cache()

    # non_blocking copies in both directions give the right bytes
    src = torch.arange(4096, dtype=torch.float16).pin_memory()
    d = src.to("rbln", non_blocking=True)
    y = (d * 2).to("cpu", non_blocking=True)     # to the host: a pinned result, as on CUDA
    torch.rbln.synchronize()
    res["non_blocking"] = [torch.equal(d.cpu(), src), torch.equal(y, src * 2), y.is_pinned()]

    # PyTorch's OpInfo samples of `to`, with rbln -> cpu and cpu -> rbln device arguments
    from torch.testing._internal.common_methods_invocations import op_db
    to = next(o for o in op_db if o.name == "to")

    def swap(v, dev):
        if isinstance(v, (str, torch.device)) and torch.device(v).type == "rbln":
            return torch.device(dev)
        if isinstance(v, torch.Tensor):
            return v.to(dev)
        return v

    bad, n = [], 0
    for dtype in (torch.float32, torch.float16):
        for s in to.sample_inputs("rbln", dtype):
            for src_dev, dst_dev in (("rbln", "cpu"), ("cpu", "rbln")):
                inp = s.input.to(src_dev)
                args = [swap(a, dst_dev) for a in s.args]
                ref_args = [swap(a, "cpu") for a in s.args]
                moves = any(isinstance(a, (str, torch.device, torch.Tensor)) for a in s.args)
                got = inp.to(*args, **s.kwargs)
                want = s.input.cpu().to(*ref_args, **s.kwargs)
                n += 1
                if not (got.dtype == want.dtype and torch.equal(got.cpu(), want)
                        and got.device.type == (dst_dev if moves else src_dev)):
                    bad.append(repr((src_dev, dst_dev, s.args[1:], s.kwargs)))
    res["opinfo_to"] = [n, bad]
    print(json.dumps(res))
    """)


def test_pin_memory_and_is_pinned(out):
    assert out["pinned"] == [True, True, False, True, True, True]


def test_pinned_blocks_are_freed_with_their_tensors(out):
    assert out["live"] == 2 and out["freed"] == 0


def test_non_blocking_copies_give_the_right_bytes(out):
    assert out["non_blocking"] == [True, True, True]


def test_opinfo_to_samples_between_rbln_and_cpu(out):
    n, bad = out["opinfo_to"]
    assert n >= 80 and bad == []


TRAIN = """
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(256, 16, generator=gen)
    Y = (X @ torch.randn(16, 1, generator=gen)).tanh() + 0.05 * torch.randn(256, 1, generator=gen)
    ds = TensorDataset(X, Y)

    def train(device, workers):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dl = DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(1), pin_memory=device != "cpu")
        losses, pinned = [], []
        for epoch in range(3):
            for xb, yb in dl:
                pinned.append(xb.is_pinned() and yb.is_pinned())
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                loss = F.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, pinned

    ref, _ = train("cpu", 0)
    res = {"cpu": ref}
    for workers in (0, 2):
        losses, pinned = train("rbln", workers)
        res[f"rbln{workers}"] = [losses, all(pinned)]
    print(json.dumps(res))
"""


def test_dataloader_pin_memory_training_matches_cpu():
    # with the blocking fallback disabled, every batch copy ran on the copy engine
    out = run_json(TRAIN, {"TORCH_RBLN_DISABLE_FALLBACK": "non_blocking_copy"})
    ref = out["cpu"]
    assert ref[-1] < 0.5 * ref[0]                      # it trains
    for workers in (0, 2):
        losses, pinned = out[f"rbln{workers}"]
        assert pinned, f"num_workers={workers}: batches were not pinned"
        assert losses == pytest.approx(ref, rel=1e-4, abs=1e-6), f"num_workers={workers}"
