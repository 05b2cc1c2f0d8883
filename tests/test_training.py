"""Autograd and optimizer steps on rbln match the CPU run."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from test_ops import Events


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))

    def forward(self, x):
        return self.net(x)


class TinyTransformer(nn.Module):
    """One pre-norm decoder block with causal SDPA attention (4-D q/k/v)."""

    def __init__(self, d=64, heads=2, vocab=128):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.ff(self.norm2(x))
        return self.head(x)


def _train(model, inputs, target, opt_cls, steps, loss_fn):
    opt = opt_cls(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(inputs).float(), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# fp16 parameters with AdamW (no fp32 master weights) turn NaN on the CPU as well
@pytest.mark.parametrize("opt_cls,dtype", [(torch.optim.SGD, torch.float32),
                                           (torch.optim.AdamW, torch.float32),
                                           (torch.optim.SGD, torch.float16)],
                         ids=["sgd-fp32", "adamw-fp32", "sgd-fp16"])
def test_mlp_training_matches_cpu(opt_cls, dtype):
    torch.manual_seed(0)
    cpu = MLP().to(dtype)
    dev = copy.deepcopy(cpu).to("rbln")
    x, y = torch.randn(8, 64).to(dtype), torch.randn(8, 64)
    loss = nn.functional.mse_loss
    with Events() as ev:
        got = _train(dev, x.to("rbln"), y.to("rbln"), opt_cls, 3, loss)
    want = _train(cpu, x, y, opt_cls, 3, loss)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, want, **tol)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **tol)
    if dtype == torch.float16:
        # forward and backward matmuls ran on the device
        assert ev.count("dispatch", "aten::linear") >= 6
        assert ev.count("dispatch", "aten::linear_backward") >= 6
        assert ev.count("dispatch", "aten::silu_backward.grad_input") >= 3


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.AdamW], ids=["sgd", "adamw"])
def test_transformer_training_matches_cpu(opt_cls):
    torch.manual_seed(0)
    cpu = TinyTransformer()
    dev = copy.deepcopy(cpu).to("rbln")
    tokens = torch.randint(0, 128, (2, 32))
    target = torch.randint(0, 128, (2, 32))

    def loss(logits, t):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))

    got = _train(dev, tokens.to("rbln"), target.to("rbln"), opt_cls, 3, loss)
    want = _train(cpu, tokens, target, opt_cls, 3, loss)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # attention is computed by a different (equally exact) fp32 algorithm than the CPU's
    # flash kernel; AdamW normalises gradients, so rounding-level differences in near-zero
    # gradients move a parameter by up to lr per step
    tol = 1e-4 if opt_cls is torch.optim.SGD else 3 * 1e-2 * 0.1
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=tol, rtol=1e-4)


def test_fp16_attention_backward_runs_on_device_and_matches():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64) for _ in range(3))
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    nn.functional.scaled_dot_product_attention(*refs, is_causal=True).sum().backward()
    devs = [t.half().to("rbln").requires_grad_() for t in (q, k, v)]
    with Events() as ev:
        out = nn.functional.scaled_dot_product_attention(*devs, is_causal=True)
        out.float().sum().backward()
    assert ev.count("dispatch", "aten::_scaled_dot_product_fused_attention_overrideable_backward") == 1
    assert ev.count("cpu_fallback", "aten::_scaled_dot_product_fused_attention_overrideable_backward") == 0
    for d, r in zip(devs, refs):
        torch.testing.assert_close(d.grad.cpu().float(), r.grad, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_adam_steps_on_the_device_like_the_cpu_fused_kernel(opt_cls, dtype):
    """``fused=True``: one device program per step, the CPU fused kernel's values bit for bit,
    and parameters, gradients and states never leave device memory."""
    from torch_rbln.runtime.storage import DEVICE, state_of
    torch.manual_seed(0)
    start = [torch.randn(64, 128).to(dtype), torch.randn(128).to(dtype)]
    grads = [[torch.randn(p.shape).to(dtype) for p in start] for _ in range(3)]
    got = {}
    for dev in ("cpu", "rbln"):
        params = [nn.Parameter(p.clone().to(dev)) for p in start]
        opt = opt_cls(params, lr=0.01, weight_decay=0.1, fused=True)
        with Events() as ev:
            for step in grads:
                for p, g in zip(params, step):
                    p.grad = g.to(dev)
                opt.step()
        if dev == "rbln":
            name = "aten::_fused_adamw_" if opt_cls is torch.optim.AdamW else "aten::_fused_adam_"
            assert ev.count("device_program", name) == 3
            assert ev.count("recompile", name) <= 1 and ev.count("cpu_fallback", name) == 0
            state = opt.state[params[0]]
            for t in (params[0], state["exp_avg"], state["exp_avg_sq"]):
                assert state_of(t.detach()).residency == DEVICE
        got[dev] = [p.detach().cpu() for p in params]
    for a, b in zip(got["cpu"], got["rbln"]):
        assert torch.equal(a, b)


def test_backward_runs_on_the_calling_thread_with_the_same_gradients():
    """The backward pass of rbln tensors runs on the thread that started it (a device worker
    thread would start a second OpenMP team on the host's cores): hooks see the caller's
    thread, from the main thread and from another one, through backward() and autograd.grad;
    the caller's multithreading setting is left as it was; gradients equal the CPU's."""
    import threading

    def run(device):
        seen = []
        w = torch.arange(64, dtype=torch.float32, device=device).requires_grad_()
        w.register_hook(lambda g: seen.append(threading.get_ident()) or g)
        (w * w).sum().backward()
        g2 = torch.autograd.grad((w * 3).sum(), w)[0]
        return w.grad.cpu(), g2.cpu(), seen

    before = torch._C._is_multithreading_enabled()
    grad, g2, seen = run("rbln")
    assert seen == [threading.get_ident()] * 2
    ref, ref2, _ = run("cpu")
    assert torch.equal(grad, ref) and torch.equal(g2, ref2)
    assert torch._C._is_multithreading_enabled() == before
    box = {}
    t = threading.Thread(target=lambda: box.update(res=run("rbln"), me=threading.get_ident()))
    t.start()
    t.join()
    assert box["res"][2] == [box["me"]] * 2 and torch.equal(box["res"][0], ref)
