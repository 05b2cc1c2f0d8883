"""Build a local Hugging Face checkpoint with a real architecture and random weights.

Nothing is downloaded: the configuration is Llama-3.2-1B's (or Qwen2.5-1.5B's), the weights
are seeded random fp16 saved with ``save_pretrained``, and the tokenizer is a byte-level BPE
trained here with the ``tokenizers`` library on the docstrings of the installed torch.

    python examples/make_llama.py                    # the full 16-layer Llama-3.2-1B, ~2.5 GB
    python examples/make_llama.py --layers 2         # the same model with 2 decoder layers
    python examples/make_llama.py --arch qwen2.5-1.5b --layers 1 --out /tmp/qwen

The directory it writes loads like a downloaded checkpoint:
``AutoModelForCausalLM.from_pretrained(path)``, ``AutoTokenizer.from_pretrained(path)``.
Random weights give text without meaning; the point is the shapes, the ops and the flow.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
from pathlib import Path

import torch
from transformers.initialization import no_init_weights

# The architecture fields of the published config.json files. bos/eos/pad ids come from the
# local tokenizer (a real checkpoint's tokenizer has its own ids; the embedding size is the same).
ARCHS = {
    "llama-3.2-1b": dict(
        model_type="llama", architectures=["LlamaForCausalLM"],
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192),
        attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
        initializer_range=0.02),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"],
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        use_sliding_window=False, sliding_window=None, max_window_layers=28,
        tie_word_embeddings=True, initializer_range=0.02),
}

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TOKENIZER_VOCAB = 8192


def default_path(arch: str = "llama-3.2-1b", layers: int | None = None) -> Path:
    """Where the example keeps the checkpoint it builds (``$TORCH_RBLN_MODELS`` or ~/.cache)."""
    layers = layers or ARCHS[arch]["num_hidden_layers"]
    root = os.environ.get("TORCH_RBLN_MODELS") or Path.home() / ".cache" / "torch-rbln" / "models"
    return Path(root) / f"{arch}-random-{layers}l"


def corpus():
    """English text that is the same on every machine with this torch: the docstrings of the
    public classes and functions of ``torch.nn`` and ``torch``, in a fixed order."""
    import torch.nn as nn

    for mod in (nn, torch):
        for name in sorted(dir(mod)):
            doc = inspect.getdoc(getattr(mod, name, None))
            if doc and not name.startswith("_"):
                yield doc


@functools.lru_cache(maxsize=None)
def train_tokenizer(vocab_size: int = TOKENIZER_VOCAB):
    """A byte-level BPE like Llama 3's (no normalizer, so decode(encode(text)) == text),
    with a begin-of-text token added in front of every sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                      special_tokens=[(BOS, bos)]),
    ])
    return tok


def randomize(model, std: float, seed: int) -> None:
    """Seeded weights as the library initialises them: matrices and embeddings N(0, std),
    norm weights 1, biases 0. Tied weights (the embedding and the LM head) are drawn once."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():       # a tied parameter is listed once
            if p.dim() > 1:
                p.normal_(0.0, std, generator=g)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()


def build(out: Path, arch: str = "llama-3.2-1b", layers: int | None = None, seed: int = 0) -> Path:
    """Write the checkpoint (config, fp16 safetensors, tokenizer) to ``out``; returns ``out``."""
    import transformers

    tok = train_tokenizer()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS,
                                                eos_token=EOS)
    fields = dict(ARCHS[arch])
    model_type = fields.pop("model_type")
    if layers:
        fields["num_hidden_layers"] = layers
        if "max_window_layers" in fields:
            fields["max_window_layers"] = layers
    fields.update(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    config = transformers.AutoConfig.for_model(model_type, **fields)
    # built in fp16 directly (the full model is 2.5 GB in fp16, 5 GB in fp32), without the
    # library's initialisation: one seeded pass below draws every weight once
    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    model.tie_weights()     # part of the initialisation skipped above
    randomize(model, config.initializer_range, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def ensure(path: Path | str | None = None, arch: str = "llama-3.2-1b",
           layers: int | None = None) -> Path:
    """``path`` if it already holds a checkpoint, else build one there (the default path when
    ``path`` is None)."""
    path = Path(path) if path else default_path(arch, layers)
    if not (path / "config.json").is_file():
        print(f"building {arch} ({layers or ARCHS[arch]['num_hidden_layers']} layers, random "
              f"fp16 weights, local tokenizer) in {path}", flush=True)
        build(path, arch, layers)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="llama-3.2-1b")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers (default: the architecture's own, 16 for Llama-3.2-1B)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default: %s)" % default_path())
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = build(args.out or default_path(args.arch, args.layers), args.arch, args.layers,
                args.seed)
    cfg = json.loads((out / "config.json").read_text())
    print(f"wrote {out}: {cfg['model_type']}, {cfg['num_hidden_layers']} layers, "
          f"hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']}")


if __name__ == "__main__":
    main()
