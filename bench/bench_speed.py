"""The speed table: rbln and CPU eager side by side in one process, with the goals.

    python bench/bench_speed.py [--quick] [--threads N] [--rounds N]

Rows (docs/performance.md, "Speed on every CPU"):

1. warm ``a + a`` on 64 fp16 elements, us per op (the native warm path);
2. HF Llama forward, hidden 256, 2 layers, seq 64, fp16, ms (rbln eager vs CPU eager);
3. HF Llama forward, hidden 1024, 4 layers, seq 256, fp16, ms (skipped with ``--quick``);
4. the small Llama of row 2 under ``torch.compile(backend="rbln")`` vs CPU eager;
5. an ``explain()`` region around the small forward: the time it adds to the forward.

Each row's variants are timed in alternation (one call of each per round) and the medians
printed, so a change of load on a shared machine hits both sides alike. The header names the
CPU, PyTorch's kernel capability and the oneDNN ISA limit in use: force the AVX2 kernel paths
of an AVX-512/AMX host with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``. Rows 2-5 need
``transformers`` (in the test extras); without it they are skipped, saying so.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

# idle OpenMP workers sleep instead of spinning (a shared machine); set before torch loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from bench_runtime import cpu_name  # noqa: E402

H = torch.float16


def interleaved(fns, rounds: int, calls: int = 1) -> list[float]:
    """Median seconds per call of each function, the functions timed in alternation."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[k].append((time.perf_counter() - t0) / calls)
    return [statistics.median(s) for s in samples]


def row(name: str, rbln: float | None, cpu: float | None, unit: str, goal: str,
        ratio: str | None = None) -> None:
    if ratio is None:
        ratio = f"{rbln / cpu:.2f}x" if rbln and cpu else ""
    cells = [f"{v:.2f} {unit}" if v is not None else "" for v in (rbln, cpu)]
    print(f"| {name} | {cells[0]} | {cells[1]} | {ratio} | {goal} |", flush=True)


def llama(hidden: int, layers: int, seq: int, heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden,
                      intermediate_size=hidden * 11 // 4 // 64 * 64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads // 2,
                      max_position_embeddings=max(512, seq))
    cpu = LlamaForCausalLM(cfg).to(H).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    return cpu, copy.deepcopy(cpu).to("rbln"), ids


def warm_add(rounds: int) -> None:
    a = torch.arange(64, dtype=H, device="rbln")
    ac = a.cpu()
    for _ in range(200):
        a + a
    from torch_rbln import _C

    on = _C.warm_path_enabled()      # TORCH_RBLN_NATIVE_WARM_PATH

    def python_kernel():
        _C.set_warm_path(False)
        a + a
        _C.set_warm_path(on)

    rb, py, cp = interleaved([lambda: a + a, python_kernel, lambda: ac + ac], rounds=rounds * 3,
                             calls=5000)
    row("warm `a + a`, 64 fp16", rb * 1e6, cp * 1e6, "us", "<= 10 us")
    row("(the same through the Python kernel, for comparison)", py * 1e6, cp * 1e6, "us", "")


def forward_rows(quick: bool, rounds: int) -> None:
    specs = [("HF Llama h256, 2 layers, seq 64, forward", 256, 2, 64, 4, "<= 1.5x")]
    if not quick:
        specs.append(("HF Llama h1024, 4 layers, seq 256, forward", 1024, 4, 256, 16, "<= 1.15x"))
    small = None
    for name, hidden, layers, seq, heads, goal in specs:
        cpu, dev, ids = llama(hidden, layers, seq, heads)
        dids = ids.to("rbln")
        with torch.inference_mode():
            rb, cp = interleaved([lambda: dev(dids).logits.cpu(), lambda: cpu(ids).logits],
                                 rounds=rounds if hidden <= 256 else max(3, rounds // 2))
        row(name, rb * 1e3, cp * 1e3, "ms", goal)
        if small is None:
            small = (cpu, dev, ids, dids)
    cpu, dev, ids, dids = small

    compiled = torch.compile(dev, backend="rbln", fullgraph=True)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(dids, use_cache=False)
        compile_s = time.perf_counter() - t0
        rb, cp = interleaved([lambda: compiled(dids, use_cache=False).logits.cpu(),
                              lambda: cpu(ids, use_cache=False).logits], rounds=rounds)
    row(f"same small Llama, `torch.compile(backend=\"rbln\")` (compile {compile_s:.1f} s)",
        rb * 1e3, cp * 1e3, "ms", "<= 0.8x (stretch 0.6x)")

    def plain():
        with torch.inference_mode():
            dev(dids).logits.cpu()

    def region():
        with torch.rbln.explain():
            plain()

    # CPU time of the process: less disturbed than wall time by other work on the machine
    samples = {plain: [], region: []}
    for fn in (plain, region):
        fn()
    for _ in range(rounds * 3):
        for fn in (plain, region):
            c0 = time.process_time()
            fn()
            samples[fn].append(time.process_time() - c0)
    p, r = statistics.median(samples[plain]), statistics.median(samples[region])
    row("explain() region around the small forward", r * 1e3, None, "ms",
        "<= 5%", ratio=f"{(r / p - 1) * 100:+.1f}% (vs {p * 1e3:.2f} ms cpu time)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the h1024 Llama")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads for both sides (default 1: on a shared machine, "
                         "OpenMP barriers with descheduled threads dominate)")
    ap.add_argument("--rounds", type=int, default=7)
    opts = ap.parse_args()
    torch.set_num_threads(opts.threads)
    isa = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                   if k in os.environ)
    from torch_rbln.runtime import executors
    print(f"torch {torch.__version__}; CPU: {cpu_name()}; capability "
          f"{torch.backends.cpu.get_cpu_capability()}{' (' + isa + ')' if isa else ''}; "
          f"half-precision matmuls: {executors.matmul_precision().summary}; "
          f"{torch.get_num_threads()} thread(s); medians of {opts.rounds}+ interleaved rounds")
    print()
    print("| measurement | rbln | CPU eager | ratio | goal |")
    print("|---|---|---|---|---|")
    warm_add(opts.rounds)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("(rows 2-5 skipped: they need `transformers`; pip install -e '.[test]')")
        return
    forward_rows(opts.quick, opts.rounds)


if __name__ == "__main__":
    sys.exit(main())
