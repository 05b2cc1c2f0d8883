"""vLLM on rbln: offline greedy generation with vLLM's own Llama, then explain one decode step.

    pip install -e '.[vllm]'                 # see the docs/vllm.md ("vLLM on rbln")
    python examples/vllm_offline.py          # builds a small local Llama first (no download)
    python examples/vllm_offline.py --model /path/to/Llama-3.2-1B --compile
    TORCH_RBLN_VIRTUAL_NPUS=2 python examples/vllm_offline.py --tensor-parallel-size 2

The rbln platform plugin is picked up by vLLM through its entry point; nothing in this script
names the device. ``VLLM_TARGET_DEVICE=cpu python examples/vllm_offline.py`` runs the same
script on vLLM's CPU platform.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# one process: the engine core (and, at TP=1, the worker) run here, so explain() sees the
# device work; with tensor parallelism each worker is a process of its own, and the script asks
# the workers for their memory and explain reports through LLM.collective_rpc
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = ["the quick device reads the cache", "a small model runs on the host",
           "the kernel moves the tensor into", "one question has two answers and"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a local model directory (default: build a small Llama)")
    p.add_argument("--compile", action="store_true",
                   help="let vLLM compile the model (torch.compile with the rbln backend)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="one worker per rbln device (TORCH_RBLN_VIRTUAL_NPUS emulates several)")
    a = p.parse_args()

    model = a.model
    if model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from tiny_llm import make_model
        model = str(make_model(Path(tempfile.gettempdir()) / "torch-rbln-tiny-llama"))

    import torch
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float16", max_model_len=512, seed=0,
              kv_cache_memory_bytes=64 << 20, enforce_eager=not a.compile,
              tensor_parallel_size=a.tensor_parallel_size)
    print(f"platform: {type(current_platform).__name__} (device {current_platform.device_type}); "
          f"engine ready in {time.perf_counter() - t0:.1f} s")

    greedy = SamplingParams(temperature=0, max_tokens=a.max_tokens)
    t0 = time.perf_counter()
    outs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    dt = time.perf_counter() - t0
    print(f"generated {len(outs)} x {a.max_tokens} tokens in {dt:.2f} s "
          f"({len(outs) * a.max_tokens / dt:.1f} tokens/s)")
    for o in outs:
        print(f"  {o.prompt!r} -> {o.outputs[0].text!r} {list(o.outputs[0].token_ids)}")

    if current_platform.device_type != "rbln":
        return
    # one decode step of a batch of two requests, after their prefill and a first decode step
    eng = llm.llm_engine
    for i, prompt in enumerate(PROMPTS[:2]):
        eng.add_request(f"explain-{i}", prompt, greedy)
    eng.step()
    eng.step()
    for m in llm.collective_rpc("rbln_memory"):     # asks each worker (one per NPU)
        print(f"rank {m['rank']}: {m['device']} = NPU {m['npus']}, "
              f"{m['allocated'] / 2**20:.2f} MiB allocated")
    if a.tensor_parallel_size == 1:
        with torch.rbln.explain() as report:
            eng.step()
        reports = [report.report()]
    else:
        llm.collective_rpc("rbln_explain_start")      # the step runs in the workers
        eng.step()
        reports = [r["report"] for r in llm.collective_rpc("rbln_explain_stop")]
    while eng.has_unfinished_requests():
        eng.step()
    print("\nexplain, one decode step (batch 2):")
    for i, r in enumerate(reports):
        if len(reports) > 1:
            print(f"rank {i}:")
        print(r)


if __name__ == "__main__":
    main()
