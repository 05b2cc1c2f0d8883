"""Activation checkpointing with dropout on rbln: the recomputed forward draws the same masks.

``torch.utils.checkpoint`` saves and restores a device's RNG only when its device module reads
as initialized (``torch.rbln._initialized``, as ``torch.cuda._initialized``); these tests check
that the gradients then equal the un-checkpointed step bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint


def test_rbln_reads_initialized_once_a_tensor_exists():
    torch.ones(1, device="rbln")
    assert torch.rbln._initialized and torch.rbln.is_initialized()
    torch.rbln._lazy_init()                       # idempotent, as torch.cuda._lazy_init


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_checkpoint_with_dropout_gives_the_uncheckpointed_gradients(dtype, use_reentrant):
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32).to("rbln", dtype)
    x0 = torch.randn(8, 32, dtype=dtype).to("rbln")

    def f(x):
        return torch.nn.functional.dropout(lin(x).relu(), 0.5, training=True) * 2

    def grads(ckpt, seed):
        torch.rbln.manual_seed(seed)
        x = x0.clone().requires_grad_()
        y = checkpoint(f, x, use_reentrant=use_reentrant) if ckpt else f(x)
        y.sum().backward()
        g = (x.grad.cpu(), lin.weight.grad.cpu())
        lin.weight.grad = None
        return g

    plain, ckpt = grads(False, 3), grads(True, 3)
    assert not torch.equal(plain[0], grads(False, 4)[0])   # the mask matters
    assert torch.equal(plain[0], ckpt[0]) and torch.equal(plain[1], ckpt[1])


def test_fork_rng_restores_the_rbln_generator():
    torch.rbln.manual_seed(5)
    with torch.random.fork_rng(devices=[0], device_type="rbln"):
        a = torch.rand(16, device="rbln")
    b = torch.rand(16, device="rbln")
    assert torch.equal(a.cpu(), b.cpu())


transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              attention_dropout=0.1)


def _llama_steps(device, attn_implementation, checkpointing, steps=3):
    """``steps`` AdamW steps of a tiny Llama in train mode (attention dropout 0.1)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIG, attn_implementation=attn_implementation)
    model = transformers.LlamaForCausalLM(cfg).to(device).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16),
                        generator=torch.Generator().manual_seed(1)).to(device)
    torch.manual_seed(7)
    torch.rbln.manual_seed(7)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_llama_gradient_checkpointing_steps_equal_the_plain_steps(attn_implementation):
    ckpt, plain = (_llama_steps("rbln", attn_implementation, c) for c in (True, False))
    assert ckpt[0] == plain[0]
    assert all(torch.equal(a, b) for a, b in zip(ckpt[1], plain[1]))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_llama_gradient_checkpointing_steps_match_the_cpu():
    """Eager attention's dropout is ``F.dropout``, which on rbln runs the CPU kernel on the rbln
    generator's state: seeded alike, both draw the same masks, so the runs are comparable."""
    dev, cpu = _llama_steps("rbln", "eager", True), _llama_steps("cpu", "eager", True)
    torch.testing.assert_close(dev[0], cpu[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(dev[1], cpu[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_checkpoint_restores_the_generator_of_the_inputs_device():
    """Inputs on rbln:1: the recomputation draws from rbln:1's generator as the forward did."""
    from conftest import run_json
    out = run_json("""
    from torch.utils.checkpoint import checkpoint
    x0 = torch.randn(64, 64).to("rbln:1")

    def f(x):
        return torch.nn.functional.dropout(x * 1.5, 0.5, training=True)

    grads = []
    for ckpt in (False, True):
        torch.manual_seed(11)
        x = x0.clone().requires_grad_()
        (checkpoint(f, x, use_reentrant=False) if ckpt else f(x)).sum().backward()
        grads.append(x.grad.cpu())
    print(json.dumps({"equal": torch.equal(*grads), "dropped": bool((grads[0] == 0).any())}))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert out == {"equal": True, "dropped": True}
