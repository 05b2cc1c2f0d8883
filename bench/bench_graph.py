"""Graph mode vs eager, side by side: a small Hugging Face Llama forward (fp16, random weights).

    .venv/bin/python bench/bench_graph.py [--seq 64] [--iters 20] [--threads N]

Prints the first-call compile time of ``torch.compile(model, backend="rbln")`` and the median
forward time of CPU eager, rbln eager and rbln graph mode, measured in interleaved rounds so
that a busy machine slows all three alike. Goal: graph mode at most 0.8x CPU eager.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

# Idle OpenMP workers sleep instead of spinning: on a machine shared with other jobs, spinning
# threads slow every side by several times (set before torch loads its OpenMP runtime).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def llama(hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                      vocab_size=512, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).half().eval()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0,
                    help="host threads (default: PyTorch's); set before the graph compiles, "
                         "since Inductor bakes the thread count into its kernels")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cpu_model = llama(args.hidden, args.layers)
    rbln_model = copy.deepcopy(cpu_model).to("rbln")
    ids = torch.randint(0, 512, (1, args.seq))
    ids_r = ids.to("rbln")
    compiled = torch.compile(rbln_model, backend="rbln", fullgraph=True)

    def cpu_eager():
        cpu_model(ids, use_cache=False)

    def rbln_eager():
        rbln_model(ids_r, use_cache=False).logits.cpu()

    def graph():
        compiled(ids_r, use_cache=False).logits.cpu()

    with torch.no_grad():
        with torch.rbln.capture_programs() as programs:
            compile_s = timed(graph)
        for fn in (cpu_eager, rbln_eager, graph):      # warm caches
            fn()
        times = {"cpu eager": [], "rbln eager": [], "rbln graph": []}
        for _ in range(args.iters):
            times["cpu eager"].append(timed(cpu_eager))
            times["rbln eager"].append(timed(rbln_eager))
            times["rbln graph"].append(timed(graph))

    p = programs[0]
    print(f"Llama forward: hidden {args.hidden}, {args.layers} layers, seq {args.seq}, fp16, "
          f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    print(f"graph compile (first call): {compile_s:.2f} s; {p.device_partitions} device "
          f"partitions, {p.host_partitions} host partitions, {len(p.host_ops)} host ops, "
          f"{len(p.in_program_ops)} in-program ops")
    base = statistics.median(times["cpu eager"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<11} {med * 1e3:9.2f} ms  {med / base:5.2f}x cpu eager")


if __name__ == "__main__":
    main()
