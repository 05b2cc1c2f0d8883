"""Make a small causal LM directory that vLLM and transformers load like a Hub checkpoint.

Nothing is downloaded: the weights are seeded random fp16 tensors and the tokenizer is a
byte-level BPE trained here with the `tokenizers` library on a built-in text. The directory
holds what `from_pretrained` / `vllm serve` expect: config.json, model.safetensors,
tokenizer.json, tokenizer_config.json (with a chat template), generation_config.json.

    python examples/tiny_llm.py /tmp/tiny-llama                 # Llama (Llama-3.2 layout)
    python examples/tiny_llm.py /tmp/tiny-qwen2 --arch qwen2    # Qwen2 (q/k/v biases)

The shapes keep every matmul's last dimension a multiple of 64 (the NPU's alignment rule):
hidden 256, 4 heads of 64, 2 KV heads, MLP 512, vocabulary 512.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
VOCAB = 512

# A simple chat template (role headers as in Llama 3) so /v1/chat/completions works.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SPECIAL = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

_WORDS = ("the a an one two small large quick slow red blue green device memory tensor model token "
          "layer head cache block query key value answer question river mountain city music "
          "light night morning code kernel graph compile run test host copy step time world "
          "is was are were has had will can may runs reads writes moves finds makes keeps "
          "and or but so then because while after before under over into from with of to in on").split()


def _corpus(n_lines: int = 4000):
    import random
    rnd = random.Random(0)
    for _ in range(n_lines):
        yield " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(6, 18))) + "."


def make_tokenizer(path: Path):
    """Train a byte-level BPE tokenizer and save it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   pad_token=EOS, chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(path)
    return fast


def make_config(arch: str, layers: int, vocab: int):
    import transformers
    common = dict(vocab_size=vocab, hidden_size=256, intermediate_size=512,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  dtype="float16")
    if arch == "llama":
        return transformers.LlamaConfig(
            **common, head_dim=64, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=1000000.0)
    raise ValueError(f"unknown arch {arch!r}: use 'llama' or 'qwen2'")


def make_model(path: str | os.PathLike, arch: str = "llama", layers: int = 2, seed: int = 0) -> Path:
    """Write a ready-to-load model directory at ``path`` (skipped if it is already complete)."""
    import torch
    import transformers

    path = Path(path)
    if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(path)
    cfg = make_config(arch, layers, len(tok))
    cfg.bos_token_id, cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
    torch.manual_seed(seed)
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[arch]
    model = cls(cfg).to(torch.float16).eval()
    with torch.no_grad():
        # Wider logits than the default 0.02 init: greedy choices of a random model then rarely
        # hinge on a near-tie, so fp16 rounding differences between backends do not flip them.
        # (An untied head: a tied one this wide would just repeat the last input token.)
        model.get_output_embeddings().weight.normal_(0.0, 0.5)
    model.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    print(make_model(a.path, a.arch, a.layers))


if __name__ == "__main__":
    main()
