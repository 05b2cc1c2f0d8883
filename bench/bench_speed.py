"""The speed table: rbln against the host doing the same math the fastest way it can.

    python bench/bench_speed.py [--quick] [--threads N] [--rounds N] [--profile]

The virtual NPU's kernels run on the host CPU, so its limit is the host computing the same model
the fastest way it can. On a CPU without native fp16/bf16 GEMMs (AVX2 only) that is fp32:
PyTorch's own half-precision CPU path is several times slower there. Each row therefore times
three variants, in alternation (one call of each per round, ten for the small model's rows;
medians of the process's CPU time per call, or of wall time with ``--clock wall``), in one
process:

* **rbln**: the model in fp16/bf16 on ``device="rbln"``;
* **CPU same dtype**: the same model in fp16/bf16 on the CPU (PyTorch's half-precision path);
* **CPU fp32**: the same weights in fp32 on the CPU;

and prints ``rbln / best``, the ratio to the faster CPU variant, with the goal of this host
kind (:data:`GOALS`: a CPU with native fp16 GEMMs, AVX512-FP16 or AMX, has tighter ones, since
its own fastest path is the one rbln's programs take). The header names the load average at
the start and the end (the rows are only as steady as the machine). Rows:

1. warm ``a + a`` on 64 fp16 elements, us per op (the native warm path);
2. HF Llama forward, hidden 256, 2 layers, seq 64, fp16;
3. HF Llama forward, hidden 1024, 4 layers, seq 256, fp16;
4. the same, bf16, batch 2, seq 128;
5. HF Llama training step (loss, backward, ``AdamW(fused=True)``: on rbln one device program
   per step, on the CPU its fused kernel), hidden 512, 2 layers, seq 128, bf16;
6. the training step of row 5 with the model in fp32 under bf16 autocast: on rbln under
   ``torch.autocast("rbln")`` (its matmuls device programs), on the CPU under its own autocast
   (the "same dtype" column) and in fp32 without it;
7. the small Llama of row 2 under ``torch.compile(backend="rbln")`` against CPU eager, and (7b)
   against the host's own compiled path: the same model under plain ``torch.compile``
   (Inductor) on the CPU, in fp16 and in fp32, timed in the same rounds;
8. a Llama-3.2-1B-geometry model (hidden 2048, 32 heads, 8 kv heads, 2 layers, seq 128)
   forward, bf16: how the ratio moves with size;
9. peak RSS of the medium bf16 forward (row 4), each variant in a fresh process, against the
   CPU runs and the size of the weights;
10. an ``explain()`` region around the small forward: the time it adds.

``--quick`` keeps rows 1, 2, 5, 6 (small), 7 and 10; ``--only warm,small,...`` names the rows to
run (``ROWS``). ``--profile`` prints, after the table, where
the medium fp16 forward's time goes on rbln (torch.profiler, CPU activity). The header names the
CPU, PyTorch's kernel capability and the matmul choice: force the AVX2 kernel paths of an
AVX-512/AMX host with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``. Rows 2-9 need
``transformers`` (in the test extras).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

# idle OpenMP workers sleep instead of spinning (a shared machine); set before torch loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Inductor's on-disk cache does not tell kernels built under a forced ATEN_CPU_CAPABILITY from
# the host's own: one cache per capability, or the graph row may run a mismatched kernel
if "ATEN_CPU_CAPABILITY" in os.environ and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_"
                               f"{os.environ['ATEN_CPU_CAPABILITY'].lower()}")

import torch  # noqa: E402

from bench_runtime import cpu_name  # noqa: E402

H, B = torch.float16, torch.bfloat16

# The goals per host kind: where the CPU has native fp16 GEMMs (AVX512-FP16, AMX) its own
# half-precision path is the one rbln's programs take, so little may lie around it; elsewhere
# fp16 widens (fp32 GEMMs plus the conversions the fp32 run has not). "warm" is the warm op's
# ratio to the CPU's op (or its time in us), "graph" the rbln graph against plain Inductor on
# the CPU (or against CPU eager).
GOALS = {
    "native fp16": dict(warm="<= 1.5x", small="<= 1.15x", medium="<= 1.05x", train="<= 1.15x",
                        graph_eager="", graph_inductor="<= 1.0x"),
    "widened fp16": dict(warm="<= 3 us", small="<= 1.3x", medium="<= 1.10x", train="<= 1.3x",
                         graph_eager="<= 0.8x", graph_inductor=""),
}


def host_kind() -> str:
    from torch_rbln.runtime import executors
    return "native fp16" if H in executors.matmul_precision().native else "widened fp16"
# calls per round of the small model's rows: one 5 ms call per round left their medians at the
# machine's noise (up to +-5% between runs of the same code)
SMALL_CALLS = 10


# what a call costs: the process's CPU time (default; every variant computes on this process's
# threads, so time spent descheduled by other jobs on a shared machine is not counted) or wall
# time (--clock wall)
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def interleaved(fns, rounds: int, calls: int = 1) -> list[float]:
    """Median seconds per call of each function, the functions timed in alternation."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = clock()
            for _ in range(calls):
                fn()
            samples[k].append((clock() - t0) / calls)
    return [statistics.median(s) for s in samples]


def row(name: str, rbln, same, fp32, unit: str, goal: str, scale: float = 1e3) -> None:
    """One table row; times in seconds (printed in ``unit`` after ``scale``)."""
    best = min(v for v in (same, fp32) if v is not None)
    cells = [f"{v * scale:.2f} {unit}" if v is not None else "-" for v in (rbln, same, fp32)]
    print(f"| {name} | {' | '.join(cells)} | {rbln / best:.2f}x | {goal} |", flush=True)


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, seq: int):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=1024, hidden_size=hidden,
                       intermediate_size=hidden * 11 // 4 // 64 * 64, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max(512, seq))


def models(cfg, dtype, train: bool = False):
    """(fp32 CPU model, ``dtype`` CPU model, ``dtype`` rbln model), the same weights."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    m32 = LlamaForCausalLM(cfg)
    m32.train(train)
    same = copy.deepcopy(m32).to(dtype)
    return m32, same, copy.deepcopy(same).to("rbln")


def warm_add(rounds: int, goal: str) -> None:
    a = torch.arange(64, dtype=H, device="rbln")
    ac, a32 = a.cpu(), a.cpu().float()
    for _ in range(200):
        a + a
    rb, cp, c32 = interleaved([lambda: a + a, lambda: ac + ac, lambda: a32 + a32],
                              rounds=rounds * 3, calls=5000)
    row("warm `a + a`, 64 fp16", rb, cp, c32, "us", goal, scale=1e6)


def forward(name, cfg, dtype, batch, seq, goal, rounds, calls: int = 1) -> None:
    m32, same, dev = models(cfg, dtype)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    dids = ids.to("rbln")
    with torch.inference_mode():
        rb, cp, c32 = interleaved([lambda: dev(dids).logits.cpu(), lambda: same(ids).logits,
                                   lambda: m32(ids).logits], rounds=rounds, calls=calls)
    row(name, rb, cp, c32, "ms", goal)


def training(name, cfg, dtype, seq, goal, rounds) -> None:
    variants = models(cfg, dtype, train=True)
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    steps = []
    for m in (variants[2], variants[1], variants[0]):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)   # the fastest path, each side
        x = ids.to(next(m.parameters()).device)

        def step(m=m, opt=opt, x=x):
            opt.zero_grad(set_to_none=True)
            m(x, labels=x).loss.backward()
            opt.step()
        steps.append(step)
    rb, cp, c32 = interleaved(steps, rounds=rounds)
    row(name, rb, cp, c32, "ms", goal)


def autocast_training(name, cfg, seq, goal, rounds) -> None:
    """Row 5's step for a float32 model under bf16 autocast, each side its own autocast."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    m32 = LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    steps = []
    for device, autocast in (("rbln", True), ("cpu", True), ("cpu", False)):
        m = copy.deepcopy(m32).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        x = ids.to(device)

        def step(m=m, opt=opt, x=x, device=device, autocast=autocast):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=B, enabled=autocast):
                loss = m(x, labels=x).loss
            loss.backward()
            opt.step()
        steps.append(step)
    rb, cp, c32 = interleaved(steps, rounds=rounds)
    row(name, rb, cp, c32, "ms", goal)


def graph(cfg, rounds, goals) -> None:
    m32, same, dev = models(cfg, H)
    ids = torch.randint(0, cfg.vocab_size, (1, 64))
    dids = ids.to("rbln")
    compiled = torch.compile(dev, backend="rbln", fullgraph=True)
    # the host's own compiled path: plain Inductor on the CPU, the same model in each dtype
    ind_same = torch.compile(same, fullgraph=True)
    ind32 = torch.compile(m32, fullgraph=True)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(dids, use_cache=False)
        compile_s = time.perf_counter() - t0
        ind_same(ids, use_cache=False)
        ind32(ids, use_cache=False)
        rb, cp, c32, icp, ic32 = interleaved(
            [lambda: compiled(dids, use_cache=False).logits.cpu(),
             lambda: same(ids, use_cache=False).logits,
             lambda: m32(ids, use_cache=False).logits,
             lambda: ind_same(ids, use_cache=False).logits,
             lambda: ind32(ids, use_cache=False).logits], rounds=rounds, calls=SMALL_CALLS)
    row(f"same small Llama, `torch.compile(backend=\"rbln\")` vs CPU eager (compile "
        f"{compile_s:.1f} s)", rb, cp, c32, "ms", goals["graph_eager"])
    row("the same rbln graph vs plain `torch.compile` (Inductor) on the CPU", rb, icp, ic32,
        "ms", goals["graph_inductor"])


def explain_overhead(cfg, rounds) -> None:
    _, _, dev = models(cfg, H)
    dids = torch.randint(0, cfg.vocab_size, (1, 64)).to("rbln")

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
    for _ in range(max(rounds * 3, 60)):     # 15 pairs left the median at +-3% of noise
        for fn in (plain, region):
            c0 = time.process_time()
            fn()
            samples[fn].append(time.process_time() - c0)
    p, r = statistics.median(samples[plain]), statistics.median(samples[region])
    print(f"\nexplain() region around the small forward: {(r / p - 1) * 100:+.1f}% "
          f"({r * 1e3:.2f} ms vs {p * 1e3:.2f} ms process time; goal <= 5%)")


# ------------------------------------------------------------------------------------------
# peak RSS, one fresh process per variant

MEDIUM = dict(hidden=1024, layers=4, heads=16, kv_heads=8, seq=128)


def _rss_child(variant: str, threads: int) -> None:
    torch.set_num_threads(threads)
    cfg = llama_config(**MEDIUM)
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    weights = sum(p.numel() for p in m.parameters())
    if variant != "cpu-fp32":
        m = m.to(B)
    if variant == "rbln":
        m = m.to("rbln")
    ids = torch.randint(0, cfg.vocab_size, (2, MEDIUM["seq"])).to(next(m.parameters()).device)
    with torch.inference_mode():
        for _ in range(3):
            m(ids).logits.cpu()
    print(json.dumps({"peak": _peak_rss(), "weights_bf16": weights * 2}))


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM: ru_maxrss would include the parent's
    peak, which Linux carries across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_rows(threads: int) -> None:
    got = {}
    for v in ("rbln", "cpu-bf16", "cpu-fp32"):
        r = subprocess.run([sys.executable, __file__, "--rss-child", v, "--threads", str(threads)],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"(peak RSS of {v} failed: {r.stderr.strip().splitlines()[-1:]})")
            return
        got[v] = json.loads(r.stdout.strip().splitlines()[-1])
    mb = 1 << 20
    w = got["rbln"]["weights_bf16"]
    rb, cb, c32 = (got[v]["peak"] for v in ("rbln", "cpu-bf16", "cpu-fp32"))
    print(f"\npeak RSS, medium bf16 forward (h1024, 4 layers, batch 2, seq 128; bf16 weights "
          f"{w / mb:.0f} MB), a fresh process each: rbln {rb / mb:.0f} MB, CPU bf16 "
          f"{cb / mb:.0f} MB, CPU fp32 {c32 / mb:.0f} MB; rbln - CPU fp32 = "
          f"{(rb - c32) / w:.2f}x the bf16 weights, rbln - CPU bf16 = {(rb - cb) / w:.2f}x "
          f"(goal: <= the CPU run's + 1x the weights)")


def profile_medium() -> None:
    from torch.profiler import ProfilerActivity, profile
    cfg = llama_config(hidden=1024, layers=4, heads=16, kv_heads=8, seq=256)
    m32, _, dev = models(cfg, H)
    ids = torch.randint(0, cfg.vocab_size, (1, 256))
    dids = ids.to("rbln")
    with torch.inference_mode():
        for label, fn in (("rbln fp16", lambda: dev(dids).logits.cpu()),
                          ("CPU fp32", lambda: m32(ids).logits)):
            fn()
            with profile(activities=[ProfilerActivity.CPU]) as p:
                for _ in range(3):
                    fn()
            print(f"\nwhere the medium forward's time goes, {label}, 3 forwards:")
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the small rows")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads for every variant (default 1: on a shared machine, "
                         "OpenMP barriers with descheduled threads dominate)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="profile the medium forward")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: the process's CPU time per call (default: steadier on a shared "
                         "machine); wall: elapsed time")
    ap.add_argument("--only", help=f"comma-separated rows to run, of: {', '.join(ROWS)}")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.rss_child:
        return _rss_child(opts.rss_child, opts.threads)
    torch.set_num_threads(opts.threads)
    global clock
    clock = CLOCKS[opts.clock]
    isa = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                   if k in os.environ)
    from torch_rbln.runtime import executors
    kind = host_kind()
    goals = GOALS[kind]
    print(f"torch {torch.__version__}; CPU: {cpu_name()}; capability "
          f"{torch.backends.cpu.get_cpu_capability()}{' (' + isa + ')' if isa else ''}; "
          f"half-precision matmuls: {executors.matmul_precision().summary}; goals of a host "
          f"with {kind} GEMMs; {torch.get_num_threads()} thread(s); medians of {opts.rounds} "
          f"interleaved rounds, {opts.clock} time; load average {_load()} at the start")
    print()
    print("| measurement | rbln | CPU same dtype | CPU fp32 | rbln / best | goal |")
    print("|---|---|---|---|---|---|")
    try:
        _rows(opts, goals)
    finally:
        print(f"\nload average {_load()} at the end")


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


ROWS = ("warm", "small", "medium", "bf16", "train", "autocast", "graph", "big", "rss", "explain")
QUICK = ("warm", "small", "train", "autocast", "graph", "explain")


def _rows(opts, goals) -> None:
    want = set(opts.only.split(",")) if opts.only else set(QUICK if opts.quick else ROWS)
    if "warm" in want:
        warm_add(opts.rounds, goals["warm"])
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("(the model rows are skipped: they need `transformers`; pip install -e '.[test]')")
        return
    r = opts.rounds
    small = llama_config(hidden=256, layers=2, heads=4, kv_heads=2, seq=64)
    if "small" in want:
        forward("HF Llama h256, 2 layers, seq 64, fp16 forward", small, H, 1, 64, goals["small"],
                r, calls=SMALL_CALLS)
    medium = llama_config(hidden=1024, layers=4, heads=16, kv_heads=8, seq=256)
    if "medium" in want:
        forward("HF Llama h1024, 4 layers, seq 256, fp16 forward", medium, H, 1, 256,
                goals["medium"], max(5, r))
    if "bf16" in want:
        forward("same, bf16, batch 2, seq 128", medium, B, 2, 128, goals["medium"], max(5, r))
    train = llama_config(hidden=512, layers=2, heads=8, kv_heads=4, seq=128)
    if "train" in want:
        training("HF Llama h512, 2 layers, seq 128, bf16 training step (AdamW)", train, B, 128,
                 goals["train"], r)
    if "autocast" in want:
        autocast_training("same, fp32 model under bf16 autocast (CPU: its own autocast, and "
                          "fp32)", train, 128, goals["train"], r)
    if "graph" in want:
        graph(small, r, goals)
    if "big" in want:
        big = llama_config(hidden=2048, layers=2, heads=32, kv_heads=8, seq=128)
        forward("Llama-3.2-1B geometry (h2048, 2 layers), seq 128, bf16 forward", big, B, 1,
                128, "", 3)
    if "rss" in want:
        rss_rows(opts.threads)
    if "explain" in want:
        explain_overhead(small, r)
    if opts.profile:
        profile_medium()

if __name__ == "__main__":
    sys.exit(main())
