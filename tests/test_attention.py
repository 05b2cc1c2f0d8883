"""Attention against the CPU reference: fully masked rows and attention dropout.

A query row whose mask excludes every key gives zeros, forward and backward, as PyTorch's math
attention (``_safe_softmax``) defines it, on every path that computes attention: the device
program, its fp32 host fallback, the math path for non-4-D inputs and graph mode. Dropout masks
come from the rbln generator; for the same mask, results and gradients equal the CPU's
(``aten::_scaled_dot_product_attention_math`` given that ``dropout_mask``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from test_ops import Events

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
IDS = ["fp16", "bf16", "fp32"]
# vs an fp32 CPU reference (fp32 runs on the host in fp32)
TOL = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
       torch.float32: dict(atol=1e-4, rtol=1e-4)}
SDPA = "aten::_scaled_dot_product_fused_attention_overrideable"
_math = torch.ops.aten._scaled_dot_product_attention_math


def _qkv(shape_q, shape_kv, dtype):
    return (torch.randn(*shape_q).to(dtype), torch.randn(*shape_kv).to(dtype),
            torch.randn(*shape_kv).to(dtype))


def _masks(L, S, kind, dtype):
    """A causal-looking mask whose rows 0 and 3 exclude every key."""
    keep = torch.ones(L, S, dtype=torch.bool).tril()
    keep[0] = False
    keep[3] = False
    if kind == "bool":
        return keep
    return torch.zeros(L, S, dtype=dtype).masked_fill(keep.logical_not(), float("-inf"))


def _loss(out):
    # weights that differ per feature, so that every gradient term matters
    return (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum()


def _run(q, k, v, mask, device, **kw):
    """Output and input gradients (q, k, v and a float mask) of attention on ``device``."""
    leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    m = None if mask is None else mask.detach().to(device)
    if m is not None and m.is_floating_point():
        m.requires_grad_()
    out = F.scaled_dot_product_attention(*leaves, attn_mask=m, **kw)
    _loss(out).backward()
    grads = [t.grad.cpu().float() for t in leaves]
    if m is not None and m.requires_grad:
        grads.append(m.grad.cpu().float())
    return out.detach().cpu().float(), grads


def _reference(q, k, v, mask, **kw):
    return _run(q.float(), k.float(), v.float(),
                None if mask is None else (mask if mask.dtype == torch.bool else mask.float()),
                "cpu", **kw)


def _assert_like_cpu(q, k, v, mask, dtype, masked_rows=(0, 3), **kw):
    want, want_g = _reference(q, k, v, mask, **kw)
    got, got_g = _run(q, k, v, mask, "rbln", **kw)
    assert not got.isnan().any()
    assert torch.equal(got[..., masked_rows, :], torch.zeros_like(got[..., masked_rows, :]))
    torch.testing.assert_close(got, want, **TOL[dtype])
    for g, w in zip(got_g, want_g):
        assert not g.isnan().any()
        torch.testing.assert_close(g, w, **TOL[dtype])
    # a fully masked query row gets no gradient
    assert torch.equal(got_g[0][..., masked_rows, :], torch.zeros_like(got_g[0][..., masked_rows, :]))


def test_issue_snippet_gives_zeros_like_the_cpu():
    q = k = v = torch.randn(1, 2, 4, 64)
    m = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    m[0, :] = False
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    got = F.scaled_dot_product_attention(*(t.to("rbln") for t in (q, k, v)), attn_mask=m.to("rbln"))
    assert torch.equal(want[:, :, 0], torch.zeros_like(want[:, :, 0]))
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", DTYPES[:2], ids=IDS[:2])
def test_masked_rows_on_the_device_program(dtype, kind):
    q, k, v = _qkv((2, 2, 32, 64), (2, 2, 32, 64), dtype)
    with Events() as ev:
        _assert_like_cpu(q, k, v, _masks(32, 32, kind, dtype), dtype)
    assert ev.count("dispatch", SDPA) == ev.count("dispatch", SDPA + "_backward") == 1
    # a -inf float mask is caught by the NaN/Inf scan: the same program runs on the host
    on_host = 0 if kind == "bool" else 1
    assert ev.count("cpu_fallback", SDPA) == ev.count("cpu_fallback", SDPA + "_backward") == on_host
    assert ev.count("cpu_fallback_reason", "nan/inf input") == 2 * on_host


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_masked_rows_on_the_fp32_host_fallback(dtype, kind):
    # L = 8 is not a multiple of 32: the attention program runs on the host in fp32
    q, k, v = _qkv((1, 2, 8, 64), (1, 2, 8, 64), dtype)
    with Events() as ev:
        _assert_like_cpu(q, k, v, _masks(8, 8, kind, dtype), dtype)
    if dtype != torch.float32:
        assert ev.count("cpu_fallback_reason", "sdpa: query sequence length 8 not aligned to 32") == 1


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_masked_rows_on_the_math_path(dtype, kind):
    q, k, v = _qkv((2, 32, 64), (2, 32, 64), dtype)          # 3-D: PyTorch's math attention
    with Events() as ev:
        _assert_like_cpu(q, k, v, _masks(32, 32, kind, dtype), dtype)
    assert ev.count("dispatch", SDPA) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_masked_rows_with_gqa_and_is_causal(dtype):
    q, k, v = _qkv((1, 4, 32, 64), (1, 2, 32, 64), dtype)
    _assert_like_cpu(q, k, v, _masks(32, 32, "bool", dtype), dtype, enable_gqa=True)
    # is_causal on top of a mask that empties rows 0 and 3
    keep = torch.ones(32, 32, dtype=torch.bool)
    keep[0] = keep[3] = False
    _assert_like_cpu(q, k, v, keep, dtype, enable_gqa=True, is_causal=True)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masked_rows_in_graph_mode(kind):
    torch._dynamo.reset()
    dtype = torch.float16
    q, k, v = _qkv((1, 2, 32, 64), (1, 2, 32, 64), dtype)
    mask = _masks(32, 32, kind, dtype)

    def attend(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    compiled = torch.compile(attend, backend="rbln")
    leaves = [t.to("rbln").requires_grad_() for t in (q, k, v)]
    with torch.rbln.capture_programs() as programs:
        out = compiled(*leaves, mask.to("rbln"))
        _loss(out).backward()
    assert [p.kind for p in programs] == ["forward", "backward"]
    assert all(p.device_partitions == 1 and not p.host_ops for p in programs)
    want, want_g = _reference(q, k, v, mask)
    got = out.detach().cpu().float()
    assert torch.equal(got[..., (0, 3), :], torch.zeros_like(got[..., (0, 3), :]))
    torch.testing.assert_close(got, want, **TOL[dtype])
    for leaf, w in zip(leaves, want_g):
        assert not leaf.grad.cpu().isnan().any()
        torch.testing.assert_close(leaf.grad.cpu().float(), w, **TOL[dtype])


def test_left_padded_batch_in_a_llama_matches_the_cpu():
    """Batched inputs with left padding: the padded query rows see no key at all."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=128)
    cpu = transformers.LlamaForCausalLM(cfg).eval()
    dev = transformers.LlamaForCausalLM(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("rbln")
    ids = torch.randint(0, 256, (2, 32))
    attention = torch.ones(2, 32, dtype=torch.long)
    attention[1, :5] = 0                       # the second sequence is left-padded
    with torch.no_grad():
        want = cpu(ids, attention_mask=attention).logits
        got = dev(ids.to("rbln"), attention_mask=attention.to("rbln")).logits.cpu()
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------
# dropout

def _dropout_mask(fn, q, k, p, seed):
    """The keep-mask an attention call draws after ``torch.rbln.manual_seed(seed)``, read back
    through an identity ``v``: the output is then the dropped, rescaled weights themselves."""
    S = k.shape[-2]
    eye = torch.eye(S, dtype=q.dtype).expand(*k.shape[:-2], S, S).to("rbln")
    torch.rbln.manual_seed(seed)
    w = fn(q.to("rbln"), k.to("rbln"), eye, p).cpu()
    return w != 0


def _sdpa(q, k, v, p):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_dropout_matches_the_cpu_for_the_same_mask(dtype):
    p = 0.3
    q, k, v = _qkv((2, 2, 32, 64), (2, 2, 64, 64), dtype)     # S == head_dim: eye(S) is a v
    keep = _dropout_mask(_sdpa, q, k, p, seed=7)
    assert abs(1 - keep.float().mean().item() - p) < 0.05

    leaves = [t.to("rbln").requires_grad_() for t in (q, k, v)]
    torch.rbln.manual_seed(7)
    with Events() as ev:
        out = _sdpa(*leaves, p)
    out.float().sum().backward()
    if dtype != torch.float32:
        assert ev.count("dispatch", SDPA) == 1 and ev.count("cpu_fallback") == 0

    ref = [t.float().requires_grad_() for t in (q, k, v)]
    want = _math(*ref, None, p, False, dropout_mask=keep)[0]
    want.sum().backward()
    torch.testing.assert_close(out.detach().cpu().float(), want.detach(), **TOL[dtype])
    for leaf, r in zip(leaves, ref):
        torch.testing.assert_close(leaf.grad.cpu().float(), r.grad, **TOL[dtype])


def test_dropout_with_gqa_mask_and_host_fallback_matches_the_cpu():
    p = 0.5
    q, k, v = _qkv((1, 4, 8, 64), (1, 2, 64, 64), torch.float16)   # L = 8: host fallback
    bias = torch.randn(8, 64).half()

    def fn(q, k, v, p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to("rbln"), dropout_p=p,
                                              enable_gqa=True)

    keep = _dropout_mask(fn, q, k, p, seed=1)
    leaves = [t.to("rbln").requires_grad_() for t in (q, k, v)]
    torch.rbln.manual_seed(1)
    out = fn(*leaves, p)
    out.float().sum().backward()
    ref = [t.float().requires_grad_() for t in (q, k, v)]
    want = _math(*ref, bias.float(), p, False, dropout_mask=keep, enable_gqa=True)[0]
    want.sum().backward()
    torch.testing.assert_close(out.detach().cpu().float(), want.detach(), **TOL[torch.float16])
    for leaf, r in zip(leaves, ref):
        torch.testing.assert_close(leaf.grad.cpu().float(), r.grad, **TOL[torch.float16])


def test_dropout_masks_come_from_the_rbln_generator():
    q, k, v = (t.to("rbln") for t in _qkv((1, 2, 32, 64), (1, 2, 32, 64), torch.float16))

    def run(seed, seeder=torch.rbln.manual_seed):
        seeder(seed)
        return _sdpa(q, k, v, 0.5).cpu()

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(run(0, torch.manual_seed), a)        # torch.manual_seed seeds rbln too
    # the CPU generator does not decide the mask
    torch.rbln.manual_seed(0)
    torch.random.default_generator.manual_seed(123)
    assert torch.equal(_sdpa(q, k, v, 0.5).cpu(), a)
    # successive calls draw new masks
    torch.rbln.manual_seed(0)
    assert not torch.equal(_sdpa(q, k, v, 0.5).cpu(), _sdpa(q, k, v, 0.5).cpu())


class _Attention(torch.nn.Module):
    """Attention with dropout on its weights, the way Hugging Face models call it."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)


def test_eval_and_dropout_p_zero_stay_on_the_fast_path():
    q, k, v = (t.to("rbln") for t in _qkv((1, 2, 32, 64), (1, 2, 32, 64), torch.float16))
    gen = torch_rbln_generator()
    m = _Attention(0.1).eval()
    state = gen.get_state()
    with Events() as ev:
        out = m(q, k, v)
    assert torch.equal(gen.get_state(), state)          # nothing drawn
    assert ev.count("dispatch", SDPA) == 1 and ev.count("cpu_fallback") == 0
    torch.testing.assert_close(out.cpu(), _sdpa(q, k, v, 0.0).cpu(), atol=0, rtol=0)
    m.train()
    m(q, k, v)
    assert not torch.equal(gen.get_state(), state)


def torch_rbln_generator():
    from torch_rbln.random import default_generator
    return default_generator(0)


def test_dropout_on_the_math_path_draws_from_the_rbln_generator():
    q, k, v = (t.to("rbln") for t in _qkv((2, 32, 64), (2, 32, 64), torch.float16))

    def run(seed):
        torch.rbln.manual_seed(seed)
        return _sdpa(q, k, v, 0.5).cpu()

    assert torch.equal(run(3), run(3)) and not torch.equal(run(3), run(4))


def test_dropout_in_graph_mode_matches_the_cpu_for_the_same_mask():
    torch._dynamo.reset()
    p = 0.4
    q, k, v = _qkv((1, 2, 32, 64), (1, 2, 64, 64), torch.float16)
    compiled = torch.compile(_sdpa, backend="rbln")
    keep = _dropout_mask(compiled, q, k, p, seed=5)
    assert torch.equal(keep, _dropout_mask(_sdpa, q, k, p, seed=5))    # eager draws the same
    leaves = [t.to("rbln").requires_grad_() for t in (q, k, v)]
    torch.rbln.manual_seed(5)
    with torch.rbln.capture_programs() as programs:
        out = compiled(*leaves, p)
        out.float().sum().backward()
    # a fused program would draw its mask once, at compile time: attention runs on the host
    ops = [op for prog in programs for op in prog.host_ops]
    assert (SDPA, "sdpa: dropout in a graph") in ops
    assert (SDPA + "_backward", "sdpa: dropout in a graph") in ops
    ref = [t.float().requires_grad_() for t in (q, k, v)]
    want = _math(*ref, None, p, False, dropout_mask=keep)[0]
    want.sum().backward()
    torch.testing.assert_close(out.detach().cpu().float(), want.detach(), **TOL[torch.float16])
    for leaf, r in zip(leaves, ref):
        torch.testing.assert_close(leaf.grad.cpu().float(), r.grad, **TOL[torch.float16])


def test_bert_trains_with_attention_dropout():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1,
                                  num_attention_heads=1, intermediate_size=128,
                                  max_position_embeddings=64, attn_implementation="sdpa")
    assert cfg.attention_probs_dropout_prob > 0
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).to("rbln").train()
    ids = torch.randint(0, 128, (2, 32)).to("rbln")
    labels = torch.tensor([0, 1]).to("rbln")

    def step(seed):
        torch.rbln.manual_seed(seed)
        model.zero_grad()
        loss = model(ids, labels=labels).loss
        loss.backward()
        return loss.item(), [p.grad.cpu().clone() for p in model.parameters() if p.grad is not None]

    l0, g0 = step(0)
    l1, g1 = step(0)
    assert l0 == l1 and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert all(torch.isfinite(g).all() for g in g0)


def test_the_device_program_reads_logsumexp_off_its_softmax():
    """The attention program takes each row's logsumexp from its softmax instead of a pass of
    its own: the weights are the softmax kernel's, and logsumexp matches ``torch.logsumexp``
    to fp32 rounding, ``-inf`` on a fully masked row and NaN on a row holding a NaN."""
    from torch_rbln.runtime import executors
    torch.manual_seed(0)
    s = torch.randn(2, 4, 64, 64) * 4
    s[0, 0, 3] = float("-inf")
    s[1, 1, 5, 7] = float("nan")
    w, lse = executors._softmax_and_lse(s)
    ref = torch.logsumexp(s, -1)
    finite = ref.isfinite()
    assert torch.allclose(lse[finite], ref[finite], rtol=0, atol=1e-5)
    assert lse[0, 0, 3] == float("-inf") and lse[1, 1, 5].isnan()
    assert torch.equal(w[0, 0, 3], torch.zeros(64))
    keep = ~s.isinf().all(-1, keepdim=True).expand_as(s)
    assert torch.allclose(w[keep], torch.softmax(s, -1)[keep], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_the_device_op_takes_3d_inputs_as_its_meta_kernel_does(causal, kv_heads):
    """``F.scaled_dot_product_attention`` sends only 4-D inputs to the device op, but the op
    itself takes 3-D ``(H, L, E)`` as well (PyTorch's meta kernel: batch 1, logsumexp
    ``(1, H, L)``): shapes as the meta kernel gives them, values and gradients as the CPU's."""
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    torch.manual_seed(0)
    q, k, v = _qkv((4, 64, 64), (kv_heads, 64, 64), torch.float16)
    leaves = [t.to("rbln").requires_grad_() for t in (q, k, v)]
    with Events() as ev:
        out = op(*leaves, None, 0.0, causal, False)
    assert ev.count("cpu_fallback", SDPA) == 0
    meta = op(*(t.to("meta") for t in (q, k, v)), None, 0.0, causal, False)
    assert [out[0].shape, out[1].shape] == [meta[0].shape, meta[1].shape]
    _loss(out[0]).backward()
    refs = [t.float().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, is_causal=causal, enable_gqa=True)
    _loss(ref).backward()
    torch.testing.assert_close(out[0].cpu().float(), ref, **TOL[torch.float16])
    for d, r in zip(leaves, refs):
        torch.testing.assert_close(d.grad.cpu().float(), r.grad, **TOL[torch.float16])
