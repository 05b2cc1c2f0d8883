"""A Hugging Face Llama (small LlamaConfig, random weights, fp16) on rbln vs the CPU."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from conftest import run_code
from torch_rbln.dispatch.optable import BY_NAME, HOST_OPS

transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _models():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIG)
    cpu = transformers.LlamaForCausalLM(cfg).to(torch.float16).eval()
    return cpu, copy.deepcopy(cpu).to("rbln")


def test_logits_and_greedy_tokens_match_cpu():
    cpu, dev = _models()
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 64))
    with torch.inference_mode():
        want = cpu(ids).logits
        got = dev(ids.to("rbln")).logits
        torch.testing.assert_close(got.cpu(), want, atol=1e-2, rtol=1e-2)
        g_cpu = cpu.generate(ids[:, :32], max_new_tokens=8, do_sample=False)
        g_dev = dev.generate(ids[:, :32].to("rbln"), max_new_tokens=8, do_sample=False)
    assert torch.equal(g_dev.cpu(), g_cpu)


# ops without a device kernel that the reference leaves to the boxed catch-all (not in HOST_OPS)
CATCH_ALL_HOST_OPS = {"cos", "sin", "exp"}


def _runs_on_host(op: str) -> bool:
    """Whether ``aten::<op>`` (any overload) is one the reference runs on the host."""
    packet = op.removeprefix("aten::").split(".", 1)[0]
    return packet in CATCH_ALL_HOST_OPS or any(n.split(".", 1)[0] == packet for n in HOST_OPS)


# pre-dispatch reasons that are by design for this model: RMSNorm and RoPE compute in fp32,
# and rotate_half works on half a head (32 elements)
EXPECTED_REASONS = {"dtype-not-fp16", "last-dim-not-64-aligned"}


def test_only_host_ops_and_checked_fallbacks_run_on_cpu():
    code = (
        "import copy, torch, transformers\n"
        "from torch_rbln import events\n"
        f"cfg = transformers.LlamaConfig(**{CONFIG!r})\n"
        "m = transformers.LlamaForCausalLM(cfg).to(torch.float16).eval().to('rbln')\n"
        "ids = torch.randint(0, 512, (1, 64)).to('rbln')\n"
        "with torch.inference_mode():\n"
        "    m(ids)\n"
        "print(sorted(events.counters['cpu_fallback_reason']))\n")
    r = run_code(code, env={"TORCH_RBLN_LOG_LEVEL": "INFO"})
    assert r.returncode == 0, r.stderr
    ran_on_cpu = set(re.findall(r"\]\[I\] `(aten::[\w.]+)` op ran on CPU instead of RBLN", r.stderr))
    assert ran_on_cpu
    for op in ran_on_cpu:
        device_op = any(n.split(".")[0] == op[6:] for n in BY_NAME)
        assert device_op or _runs_on_host(op), f"{op} ran on the CPU but has no host route"
    reasons = set(eval(r.stdout.strip().splitlines()[-1]))
    assert reasons <= EXPECTED_REASONS, reasons
