"""A mixture-of-experts model (Hugging Face Mixtral, random weights) on rbln vs the CPU.

Its default experts path (grouped experts) takes the CUDA branch on any device that is not the
CPU: ``torch.histc`` on ``int32`` expert ids, which the CPU kernel lacks; rbln computes what CUDA
computes, so forward, backward and ``generate`` agree with the CPU (whose branch uses float ids).
"""

from __future__ import annotations

import copy

import pytest
import torch

from torch_rbln import events

transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
              num_experts_per_tok=2, max_position_embeddings=64)


def _models(dtype):
    torch.manual_seed(0)
    cpu = transformers.MixtralForCausalLM(transformers.MixtralConfig(**CONFIG)).to(dtype)
    assert cpu.config._experts_implementation == "grouped_mm"
    return cpu, copy.deepcopy(cpu).to("rbln")


def _histc_runs() -> int:
    return events.snapshot().get("host_op", {}).get("aten::histc", [0])[0]


def test_forward_backward_generate_match_cpu():
    cpu, dev = _models(torch.float32)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 12))
    before = _histc_runs()
    want = cpu(ids, labels=ids)
    got = dev(ids.to("rbln"), labels=ids.to("rbln"))
    assert _histc_runs() > before       # the integer histc path ran (once per MoE layer)
    torch.testing.assert_close(got.logits.cpu(), want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss.cpu(), want.loss, atol=1e-5, rtol=1e-5)
    want.loss.backward()
    got.loss.backward()
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=name)
    cpu.eval()
    dev.eval()
    mask = torch.ones_like(ids)
    g_cpu = cpu.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    g_dev = dev.generate(ids.to("rbln"), attention_mask=mask.to("rbln"), max_new_tokens=6,
                         do_sample=False)
    assert torch.equal(g_dev.cpu(), g_cpu)


def test_half_precision_forward_matches_cpu():
    cpu, dev = _models(torch.float16)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 12))
    with torch.inference_mode():
        torch.testing.assert_close(dev(ids.to("rbln")).logits.cpu(), cpu(ids).logits,
                                   atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64])
def test_histc_on_integers_is_cudas(dtype):
    # CUDA truncates min/max to integers and bins in integer arithmetic; the top edge falls
    # in the last bin; min == max takes the data's range
    x = torch.tensor([0, 1, 2, 3, 3, 5, 7, 9, 9, 9], dtype=dtype)
    r = x.to("rbln")
    assert torch.equal(torch.histc(r, bins=4, min=0, max=9).cpu(),
                       torch.tensor([3, 2, 1, 4], dtype=dtype))
    # bounds 2.9 / 7.5 become [2, 7] (float bounds would give [2, 1, 1]: 2 drops out)
    assert torch.equal(torch.histc(r, bins=3, min=2.9, max=7.5).cpu(),
                       torch.tensor([3, 1, 1], dtype=dtype))
    assert torch.equal(torch.histc(r, bins=3).cpu(), torch.tensor([3, 3, 4], dtype=dtype))
    out = torch.empty(0, dtype=dtype, device="rbln")
    torch.histc(r, bins=2, min=0, max=9, out=out)
    assert torch.equal(out.cpu(), torch.tensor([5, 5], dtype=dtype))
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(r, bins=0)


def test_cuda_dtypes_in_a_compiled_graph():
    # the graph's host nodes compute as eager's fallback does
    def f(ids, x):
        counts = torch.histc(ids, bins=4, min=0, max=3)
        return counts, torch.nn.functional.avg_pool3d(x, 2), torch.fft.rfft(x.flatten())
    ids = torch.tensor([0, 1, 2, 3, 3, 1], dtype=torch.int32)
    x = torch.randn(1, 1, 4, 4, 4, dtype=torch.float16)
    torch._dynamo.reset()
    got = torch.compile(f, backend="rbln")(ids.to("rbln"), x.to("rbln"))
    want = f(ids.to("rbln"), x.to("rbln"))
    assert torch.equal(got[0].cpu(), torch.tensor([1, 2, 1, 2], dtype=torch.int32))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g.cpu().to(torch.complex64) if g.is_complex() else g.cpu(),
                                   w.cpu().to(torch.complex64) if w.is_complex() else w.cpu(),
                                   atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got[1].cpu(), torch.nn.functional.avg_pool3d(x.float(), 2).half(),
                               atol=1e-3, rtol=1e-3)
