"""Llama-3.2-1B with Hugging Face transformers on rbln: the same code as on the CPU or a GPU,
only ``device="rbln"``.

    python examples/llama.py                      # builds the local checkpoint once, then runs
    python examples/llama.py --layers 2           # a 2-layer model of the same shape (faster)
    python examples/llama.py --graph              # the decode step also in graph mode
    python examples/llama.py --model ~/models/Llama-3.2-1B     # a real checkpoint: unchanged

Without ``--model``, the checkpoint is the real Llama-3.2-1B configuration with seeded random
fp16 weights and a tokenizer trained locally (``examples/make_llama.py``), so nothing is
downloaded; the text it writes has no meaning, the shapes and ops are the real model's.

The script generates greedily on rbln, does the same on the CPU and says whether the new tokens
agree, then runs one more decode step inside ``torch.rbln.explain()`` and prints the report.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StaticCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_llama  # noqa: E402

PROMPTS = [
    "Returns a new tensor with the sine of the elements of",
    "Applies a linear transformation to the incoming data",
    "The module is moved to the device",
    "A",
]


def load(path, device, attn):
    """The vendor flow: fp16 weights, the attention implementation asked for, then ``.to()``."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, attn_implementation=attn)
    return model.to(device)


def generate(model, inputs, new_tokens):
    t0 = time.perf_counter()
    out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
    return out, time.perf_counter() - t0


def decode_inputs(ids, mask, cache=None):
    """Keyword arguments of one forward over ``ids`` (the whole text, or one new token per row),
    with position ids from the mask as ``generate`` makes them for left padding."""
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
    return dict(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                use_cache=True)


def greedy_static(model, step, inputs, new_tokens):
    """Greedy decoding written out over a static KV cache, so that every decode step has the
    same shapes (what graph mode wants): ``model`` runs the prompt, ``step`` (the model itself,
    or its compiled form) each new token. Returns the new tokens and each step's wall time."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    batch, length = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=length + new_tokens)
    # one mask of the final length: 1 for the prompt, then for each token once it is written
    mask = torch.cat([mask, mask.new_zeros(batch, new_tokens)], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos[:, :length],
                    past_key_values=cache, cache_position=torch.arange(length, device=ids.device))
        tokens, times = [out.logits[:, -1:].argmax(-1)], []
        for i in range(length, length + new_tokens - 1):
            mask[:, i] = 1
            t0 = time.perf_counter()
            out = step(input_ids=tokens[-1], attention_mask=mask,
                       position_ids=(mask[:, : i + 1].sum(-1, keepdim=True) - 1),
                       past_key_values=cache, cache_position=torch.tensor([i], device=ids.device))
            tokens.append(out.logits[:, -1:].argmax(-1))
            times.append(time.perf_counter() - t0)
    return torch.cat(tokens, dim=1), times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="checkpoint directory (default: the local random-weight Llama-3.2-1B, "
                         "built on first use)")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers of the local checkpoint (default 16, the real model)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=32, help="prompts are left-padded to this length")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--graph", action="store_true",
                    help="also run the decode step with torch.compile(model, backend='rbln')")
    args = ap.parse_args(argv)

    path = args.model or make_llama.ensure(layers=args.layers)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token
    prompts = (PROMPTS * args.batch)[: args.batch]

    # --- rbln: the user's code, with device="rbln" ------------------------------------------
    t0 = time.perf_counter()
    model = load(path, "rbln", args.attn)
    t_load = time.perf_counter() - t0
    inputs = tokenizer(prompts, padding="max_length", max_length=args.length,
                       return_tensors="pt").to(model.device)
    out, t_rbln = generate(model, inputs, args.new_tokens)
    cfg = model.config
    print(f"model: {path} ({cfg.model_type}, {cfg.num_hidden_layers} layers, hidden "
          f"{cfg.hidden_size}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, "
          f"fp16, attn {args.attn}), on {model.device}")
    print(f"batch {args.batch}, prompts left-padded to {args.length} tokens, "
          f"{args.new_tokens} new tokens, greedy")
    # (the local tokenizer spells 8192 of the model's 128256 ids; the others decode to nothing)
    for row in out[:, args.length:].tolist():
        print(f"  rbln> {row} {tokenizer.decode(row, skip_special_tokens=True)!r}")

    # --- the same on the CPU ----------------------------------------------------------------
    cpu_model = load(path, "cpu", args.attn)
    cpu_inputs = {k: v.cpu() for k, v in inputs.items()}  # (BatchEncoding.to() moves in place)
    out_cpu, t_cpu = generate(cpu_model, cpu_inputs, args.new_tokens)
    del cpu_model
    new, new_cpu = out[:, args.length:].cpu(), out_cpu[:, args.length:]
    print(f"new tokens on rbln and on the CPU agree: {torch.equal(new, new_cpu)}")
    print(f"generate: rbln {t_rbln:.1f} s (load {t_load:.1f} s), CPU {t_cpu:.1f} s; rbln device "
          f"memory peak {torch.rbln.max_memory_reserved() / 2**30:.2f} GiB, process peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")

    if args.graph:
        graph_mode(model, inputs, args.new_tokens)

    # --- one decode step under explain() ----------------------------------------------------
    # The generated text is the prompt of one more decode step. empty_cache() drops the compiled
    # programs (a fresh process has none), so the region shows what a first decode step compiles.
    torch.rbln.empty_cache()
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(out[:, args.length:])], dim=1)
    with torch.inference_mode():
        step = model(**decode_inputs(out, mask))                        # prefill
        for i in range(3):
            nxt = step.logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            kwargs = decode_inputs(nxt, mask, step.past_key_values)
            if i == 0:
                with torch.rbln.explain() as p:
                    step = model(**kwargs)
                print(f"\none decode step (KV length {mask.shape[1]}), first call:")
                print(p.report())
                continue
            # the next steps: the KV length grows by one each time; the last in deploy mode
            deploy = i == 2
            if deploy:
                os.environ["TORCH_RBLN_DEPLOY"] = "ON"      # read on every dispatch
            with torch.rbln.explain() as q:
                step = model(**kwargs)
            os.environ.pop("TORCH_RBLN_DEPLOY", None)
            d = q.dump()
            print(f"next decode step (KV length {mask.shape[1]}"
                  f"{', TORCH_RBLN_DEPLOY=ON' if deploy else ''}): "
                  f"{d['dispatch']['recompile_miss']} compiles, "
                  f"{d['dispatch']['cpu_fallback']} device ops on the CPU, "
                  f"{d['runtime_residency']['real_host_sync_d2h']['count']} physical d2h")


def graph_mode(model, inputs, new_tokens):
    """The decode step compiled with torch.compile(backend="rbln"); the prefill stays eager."""
    compiled = torch.compile(model, backend="rbln")
    eager_tokens, eager_times = greedy_static(model, model, inputs, new_tokens)
    t0 = time.perf_counter()
    graph_tokens, graph_times = greedy_static(model, compiled, inputs, new_tokens)
    t_first = time.perf_counter() - t0
    e, g = statistics.median(eager_times[1:]), statistics.median(graph_times[1:])
    print(f"graph mode: decode tokens equal to eager: {torch.equal(graph_tokens, eager_tokens)}")
    print(f"decode step (median of {len(graph_times) - 1}): eager {e * 1e3:.1f} ms, "
          f"graph {g * 1e3:.1f} ms ({e / g:.2f}x); first graph run incl. compile "
          f"{t_first:.1f} s")


if __name__ == "__main__":
    main()
