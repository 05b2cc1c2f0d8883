"""Eager mode on rbln vs CPU eager, side by side, in one run.

    python bench/bench_eager.py [--quick]

1. warm per-op latency (add, mul, linear, softmax; small and large), rbln and CPU, with the
   NaN/Inf scan on (default) and off (``TORCH_RBLN_DEPLOY=ON``, read live);
2. HF Llama forward in fp16 (small: hidden 256, 2 layers, seq 64; medium: hidden 1024,
   4 layers, seq 256), rbln vs CPU eager, both modes;
3. cold compile time per op (the ``recompile`` events' own timing).

Goals printed next to the figures: warm small device op <= 10 us, small Llama <= 1.5x CPU,
medium Llama <= 1.15x CPU, median cold compile <= 5 ms.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.nn.functional as F

from torch_rbln import events

H = torch.float16


def _calls_for(fn, budget_s: float) -> int:
    fn()
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s:
        fn()
        n += 1
    return max(n, 1)


def _interleaved(variants, rounds=7, budget_s=0.03):
    """Median per-call time (us) of each ``(fn, setup)`` variant, the variants measured in
    alternation so that a machine whose load changes affects all of them alike."""
    counts = []
    for fn, setup in variants:
        setup()
        counts.append(_calls_for(fn, budget_s))
    samples = [[] for _ in variants]
    for _ in range(rounds):
        for k, (fn, setup) in enumerate(variants):
            setup()
            t = time.perf_counter()
            for _ in range(counts[k]):
                fn()
            samples[k].append((time.perf_counter() - t) / counts[k] * 1e6)
    _deploy(False)
    return [statistics.median(x) for x in samples]


def _deploy(on: bool) -> None:
    if on:
        os.environ["TORCH_RBLN_DEPLOY"] = "ON"
    else:
        os.environ.pop("TORCH_RBLN_DEPLOY", None)


def op_cases():
    def mk(*s):
        return torch.randn(*s).to(H)
    small_x, large_x = mk(4, 64), mk(256, 1024)
    ws, bs, wl, bl = mk(64, 64), mk(64), mk(1024, 1024), mk(1024)
    return [
        ("add small (4x64)", lambda a, b: a + b, (small_x, small_x)),
        ("add large (256x1024)", lambda a, b: a + b, (large_x, large_x)),
        ("mul small (4x64)", lambda a, b: a * b, (small_x, small_x)),
        ("mul large (256x1024)", lambda a, b: a * b, (large_x, large_x)),
        ("linear small (4x64 @ 64x64)", F.linear, (small_x, ws, bs)),
        ("linear large (256x1024 @ 1024x1024)", F.linear, (large_x, wl, bl)),
        ("softmax small (4x64)", lambda a: torch.softmax(a, -1), (small_x,)),
        ("softmax large (256x1024)", lambda a: torch.softmax(a, -1), (large_x,)),
    ]


def _nothing():
    pass


def bench_ops(rows):
    with torch.inference_mode():
        for name, fn, args in op_cases():
            dargs = [a.to("rbln") for a in args]
            cpu, scan, deploy = _interleaved([
                (lambda: fn(*args), _nothing),
                (lambda: fn(*dargs), lambda: _deploy(False)),
                (lambda: fn(*dargs), lambda: _deploy(True)),
            ])
            rows.append((name, cpu, scan, deploy))


def _llama(hidden, layers, seq, heads):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 11 // 4 // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads // 2, max_position_embeddings=max(512, seq))
    cpu = LlamaForCausalLM(cfg).to(H).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    return cpu, copy.deepcopy(cpu).to("rbln"), ids


def bench_llama(rows, quick):
    specs = [("small (h256, 2 layers, seq 64)", 256, 2, 64, 4, 1.5)]
    if not quick:
        specs.append(("medium (h1024, 4 layers, seq 256)", 1024, 4, 256, 16, 1.15))
    for name, hidden, layers, seq, heads, goal in specs:
        cpu, dev, ids = _llama(hidden, layers, seq, heads)
        dids = ids.to("rbln")
        rounds = 7 if hidden <= 256 else 3
        with torch.inference_mode():
            c, s, d = _interleaved([
                (lambda: cpu(ids), _nothing),
                (lambda: dev(dids), lambda: _deploy(False)),
                (lambda: dev(dids), lambda: _deploy(True)),
            ], rounds=rounds, budget_s=0.0)
        rows.append((name, c / 1e3, s / 1e3, d / 1e3, goal))


def bench_cold_compile():
    """Compile each op for shapes nothing has used yet; the recompile events carry the time."""
    out = {}
    cases = [
        ("add", lambda x: x + x), ("mul", lambda x: x * x), ("sub", lambda x: x - x),
        ("div", lambda x: x / x), ("neg", torch.neg), ("rsqrt", lambda x: x.abs().rsqrt()),
        ("silu", F.silu), ("sigmoid", torch.sigmoid), ("softmax", lambda x: x.softmax(-1)),
        ("mean", lambda x: x.mean(-1)), ("max", torch.max), ("pow", lambda x: x.pow(2)),
        ("gt", lambda x: x > 0), ("where", lambda x: torch.where(x > 0, x, x)),
        ("mm", lambda x: torch.mm(x, x.t()[:, :64].contiguous())),
        ("linear", lambda x: F.linear(x, x)),
        ("sdpa", lambda x: F.scaled_dot_product_attention(*(x.view(1, 1, *x.shape),) * 3)),
    ]
    with torch.inference_mode():
        for i, (name, fn) in enumerate(cases):
            x = torch.randn(32 + 32 * (i % 3), 64 * (i + 3)).to(H).to("rbln")
            before = events.snapshot()["recompile"]
            fn(x)
            after = events.snapshot()["recompile"]
            ns = [v[1] - before.get(k, [0, 0])[1] for k, v in after.items()
                  if v[0] != before.get(k, [0, 0])[0]]
            out[name] = sum(ns) / 1e6
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the medium Llama")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads for both sides (default 1: on a shared machine, "
                         "OpenMP barriers with descheduled threads dominate small ops)")
    opts = ap.parse_args()
    quick = opts.quick
    torch.set_num_threads(opts.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")

    compile_ms = bench_cold_compile()
    rows = []
    bench_ops(rows)
    print(f"{'warm per-op latency (us)':40s} {'CPU':>9s} {'rbln':>9s} {'ratio':>7s} "
          f"{'rbln DEPLOY=ON':>15s} {'ratio':>7s}")
    for name, c, s, d in rows:
        print(f"{name:40s} {c:9.1f} {s:9.1f} {s / c:6.1f}x {d:15.1f} {d / c:6.1f}x")
    print("  goal: warm small device op <= 10 us\n")

    lrows = []
    bench_llama(lrows, quick)
    print(f"{'Llama fp16 forward (ms)':40s} {'CPU':>9s} {'rbln':>9s} {'ratio':>7s} "
          f"{'rbln DEPLOY=ON':>15s} {'ratio':>7s} {'goal':>6s}")
    for name, c, s, d, goal in lrows:
        print(f"{name:40s} {c:9.2f} {s:9.2f} {s / c:6.2f}x {d:15.2f} {d / c:6.2f}x {goal:5.2f}x")

    print(f"\n{'cold compile (ms)':40s}")
    for name, ms in compile_ms.items():
        print(f"  {name:38s} {ms:8.2f}")
    print(f"  {'median':38s} {statistics.median(compile_ms.values()):8.2f}   (goal <= 5 ms)")


if __name__ == "__main__":
    main()
