"""What an explain() region costs around a small Hugging Face Llama forward.

Three variants of the same warmed-up forward, interleaved so that machine noise hits them
alike: no region, a plain region, a with_stack=True region. Prints, side by side, the median
wall time and the median process CPU time of each (CPU time is less disturbed by other
processes on a shared machine) and the overhead relative to no region (targets: plain <= 5%,
with_stack <= 25%).

    python bench/bench_explain.py [--reps 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model(hidden: int = 256, layers: int = 2, seq: int = 64):
    """A Llama with random weights in fp16 on rbln (heads of 64), and ``seq`` token ids."""
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 43 // 16,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, vocab_size=1024,
                      max_position_embeddings=max(128, seq))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float16).to("rbln").eval()
    ids = torch.randint(0, cfg.vocab_size, (1, seq)).to("rbln")
    return model, ids


def interleave(variants: dict, reps: int) -> tuple[dict, dict]:
    """Run each variant once per round, ``reps`` rounds: ``(wall, cpu)`` seconds per variant."""
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: keep)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, ids = build_model()

    def forward():
        with torch.inference_mode():
            return model(ids).logits

    for _ in range(args.warmup):
        forward()

    def plain():
        forward()

    def region():
        with torch.rbln.explain():
            forward()

    def stacked():
        with torch.rbln.explain(with_stack=True):
            forward()

    variants = {"no region": plain, "explain()": region, "explain(with_stack=True)": stacked}
    wall, cpu = interleave(variants, args.reps)

    with torch.rbln.explain(with_stack=True) as p:
        forward()
    print(p.report())
    print()

    columns = {"wall median": (wall, statistics.median), "cpu median": (cpu, statistics.median),
               "cpu min": (cpu, min)}
    print(f"{'variant':<26}" + "".join(f"{c:>22}" for c in columns))
    for name in variants:
        cells = []
        for series, stat in columns.values():
            v, base = stat(series[name]), stat(series["no region"])
            cells.append(f"{v * 1e3:>12.2f}ms {(v / base - 1) * 100:>+6.1f}%")
        print(f"{name:<26}" + "".join(cells))
    cpu_base = statistics.median(cpu["no region"])
    print(f"(medians of {args.reps} interleaved forwards each; Llama hidden 256, 2 layers, "
          f"seq 64, fp16, {torch.get_num_threads()} torch thread(s))")

    # the region's own fixed cost (two stream snapshots and the dump), measured without the
    # forward's noise: what a region adds per use, whatever it wraps
    n = 200
    for with_stack in (False, True):
        c0 = time.process_time()
        for _ in range(n):
            with torch.rbln.explain(with_stack=with_stack):
                pass
        per = (time.process_time() - c0) / n
        print(f"empty explain(with_stack={with_stack}) region: {per * 1e6:.0f}us cpu "
              f"= {per / cpu_base * 100:.2f}% of one forward")


if __name__ == "__main__":
    main()
