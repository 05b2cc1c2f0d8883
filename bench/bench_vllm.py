"""Serving speed: vLLM on rbln against vLLM's own CPU platform on the same host.

    .venv-vllm/bin/python bench/bench_vllm.py [--rounds N] [--threads N] [--dtype D]
                                              [--engines a,b,...] [--no-profile]

The virtual NPU computes on the host, so vLLM's CPU platform on the same host is its physical
limit. One run starts every engine in a process of its own, one after the other, and repeats
the whole sequence ``--rounds`` times (the engines alternate, so a load change on a shared
machine hits both sides alike); the table gives each engine's median and spread and the rbln
rows' ratio to vLLM CPU in the same mode (per round, then the median). Engines (``--engines``):

* ``cpu-eager``, ``rbln-eager``: ``enforce_eager=True``;
* ``cpu-compiled``, ``rbln-compiled``: vLLM's default compiled mode (on the CPU platform
  Dynamo + Inductor, on rbln Dynamo + the ``rbln`` graph backend);
* ``cpu-tp2``, ``rbln-tp2``: eager, ``tensor_parallel_size=2`` (rbln on a virtual host of 4
  NPUs, one worker process per NPU).

The model is a random Llama (Llama-3.2 layout, hidden 512, 4 layers, 8 heads of 64, 4 KV heads,
MLP 1536, vocabulary 2048, untied head with wide logits so greedy choices rarely tie), written
once under the temp directory. Per engine: 16 prompts of 32 random tokens, 48 new tokens each,
greedy; the first ``generate`` warms up, the next ``--gens`` are timed (tokens/s: generated
tokens / wall, the median); time to first token is the wall of a ``generate`` of one token for
the same 16 prompts (their prefill and first sample; median of 3); engine start is the wall of
``LLM(...)``; peak RSS is VmHWM of the engine process plus its worker processes. Prefix caching
is off (every generate computes the same work) and the engine core runs in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); each process gets ``--threads`` intra-op threads. The
CPU platform runs without torch_rbln loaded (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) and without
thread pinning (``VLLM_CPU_OMP_THREADS_BIND=nobind``, as rbln's workers run).

Token ids: each rbln engine's greedy sequences (with top-5 log-probabilities, a separate
generate after the timed ones) against vLLM CPU's in the same mode, by the rule of vLLM's
cross-device tests (tests/test_vllm.py): equal ids with log-probabilities within 0.1, up to a
near-tie between the two best tokens.

Decode-step breakdown (first round; ``--no-profile`` skips it): 16 requests in decode,
torch.profiler over 8 engine steps, in every worker; each engine phase is a ``record_function``
range the bench puts around vLLM's own methods (engine step, the worker's execute_model and
sample_tokens, attention metadata, the model forward and LM head, the attention backend, the
sampler, the tensor-parallel communicator), each counted exclusive of the ranges nested in it;
host<->device copies (the profiler's rbln copy slices) are taken out of the range they ran in.
Inside the model: device programs (rbln's program slices), host ops (CPU fallbacks: the ops the
NPU runs on the host), and the rest (dispatch). Next to each phase's wall time, the CPU time
its thread spent in it (``time.thread_time``): on a shared machine a wall time includes what
other processes took, the CPU time does not. With tensor parallelism the engine runs in this
process and its workers in theirs: the engine's row is its CPU time. ``--ops N`` adds each
worker's N costliest ops of the profiled steps.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = {
    "cpu-eager": dict(device="cpu", eager=True, tp=1),
    "rbln-eager": dict(device="rbln", eager=True, tp=1),
    "cpu-compiled": dict(device="cpu", eager=False, tp=1),
    "rbln-compiled": dict(device="rbln", eager=False, tp=1),
    "cpu-tp2": dict(device="cpu", eager=True, tp=2),
    "rbln-tp2": dict(device="rbln", eager=True, tp=2),
}
MODEL = dict(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64)
BATCH, PROMPT, NEW = 16, 32, 48
KV_BYTES = 64 << 20
PROFILE_STEPS = 8
TP_NPUS = 4
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
MARK = "bench::"


# ------------------------------------------------------------------------------------------
# the model

def make_model(dtype: str) -> Path:
    """A random Llama directory vLLM loads (no tokenizer: the engines take token ids)."""
    path = Path(tempfile.gettempdir()) / f"bench_vllm_llama_h512_l4_{dtype}"
    if (path / "model.safetensors").exists():
        return path
    import torch
    import transformers
    cfg = transformers.LlamaConfig(**MODEL, max_position_embeddings=2048, rms_norm_eps=1e-5,
                                   rope_theta=500000.0, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2, dtype=dtype)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        # wide logits: a random model's greedy choices then rarely hinge on a near-tie
        model.get_output_embeddings().weight.normal_(0.0, 0.5)
    tmp = path.with_suffix(".tmp")
    model.save_pretrained(tmp)
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 1,
                                                            "eos_token_id": 2}))
    tmp.rename(path)
    return path


def prompts() -> list[dict]:
    rnd = random.Random(0)
    return [{"prompt_token_ids": [rnd.randrange(5, MODEL["vocab_size"]) for _ in range(PROMPT)]}
            for _ in range(BATCH)]


# ------------------------------------------------------------------------------------------
# the decode-step breakdown: markers around vLLM's own methods, in each worker

def _state():
    """Thread CPU time per phase, exclusive of the phases inside it (on a shared machine the
    wall times of a profile include the time other processes took; this does not). Kept in a
    module of its own: the functions the workers run arrive pickled by value, each call with
    globals of its own."""
    import types
    st = sys.modules.get("_bench_vllm_cpu")
    if st is None:
        st = sys.modules["_bench_vllm_cpu"] = types.ModuleType("_bench_vllm_cpu")
        st.cpu, st.stack = {}, []
    return st


def _wrap(owner, name: str, label: str) -> None:
    from torch.autograd.profiler import record_function
    f = getattr(owner, name, None)
    if f is None or getattr(f, "_bench_label", None):
        return
    clock = time.thread_time_ns
    st = _state()
    cpu, stack = st.cpu, st.stack

    @functools.wraps(f)
    def marked(*args, **kwargs):
        frame = [clock(), 0]            # start, CPU time of the phases inside
        stack.append(frame)
        try:
            with record_function(MARK + label):
                return f(*args, **kwargs)
        finally:
            stack.pop()
            spent = clock() - frame[0]
            cpu[label] = cpu.get(label, 0) + spent - frame[1]
            if stack:
                stack[-1][1] += spent
    marked._bench_label = label
    setattr(owner, name, marked)


def install_markers(worker) -> None:
    """Ranges around the phases of a step (on the worker, its runner, the model's attention
    and communicator classes)."""
    from vllm.distributed import parallel_state
    runner = worker.model_runner
    _wrap(worker, "execute_model", "runner")
    _wrap(worker, "sample_tokens", "runner")
    _wrap(runner, "_build_attention_metadata", "attn metadata")
    _wrap(runner, "_model_forward", "model")
    _wrap(runner.model, "compute_logits", "lm head")
    _wrap(runner.sampler, "forward", "sampler")
    seen = set()
    for m in runner.model.modules():
        impl = getattr(m, "impl", None)
        if impl is not None and type(impl) not in seen and hasattr(impl, "forward"):
            seen.add(type(impl))
            _wrap(type(impl), "forward", "attention")
            _wrap(type(impl), "do_kv_cache_update", "attention")
    groups = getattr(parallel_state, "_groups", {})
    for ref in list(groups.values()):
        g = ref()
        comm = getattr(g, "device_communicator", None) if g is not None else None
        if comm is not None:
            for n in ("all_reduce", "all_gather", "gather", "reduce_scatter", "broadcast",
                      "send", "recv"):
                _wrap(type(comm), n, "collectives")


def profile_start(worker) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU]
    if hasattr(torch, "rbln"):
        acts.append(ProfilerActivity.PrivateUse1)
    worker._bench_prof = profile(activities=acts)
    _state().cpu.clear()
    worker._bench_prof.__enter__()


def profile_stop(worker, ops: int = 0) -> dict:
    prof = worker._bench_prof
    prof.__exit__(None, None, None)
    out = summarize(prof.events())
    out["cpu"] = {k: v / 1e6 for k, v in _state().cpu.items()}
    if ops:
        out["ops"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ops)
    return out


def summarize(events) -> dict:
    """Exclusive milliseconds per phase (the innermost bench range holds each instant), the
    model's device programs and host ops, copies taken out of the range they ran in, and how
    many model forwards ran."""
    host = [e for e in events if e.device_type.name == "CPU"]
    dev = [e for e in events if e.device_type.name != "CPU"]
    marks = sorted((e for e in host if e.name.startswith(MARK)),
                   key=lambda e: (e.time_range.start, -e.time_range.end))
    by_thread: dict = {}
    for e in marks:
        by_thread.setdefault(e.thread, []).append(e)
    excl: dict[str, float] = {}
    spans = []          # (start, end, label) of each range's own (exclusive) pieces
    for evs in by_thread.values():
        stack = []
        for e in evs:
            while stack and stack[-1].time_range.end <= e.time_range.start:
                stack.pop()
            stack.append(e)
        for e in evs:
            label = e.name[len(MARK):]
            inner = [c for c in evs if c is not e and c.time_range.start >= e.time_range.start
                     and c.time_range.end <= e.time_range.end]
            # direct children only: not inside another child
            direct = [c for c in inner if not any(
                o is not c and o.time_range.start <= c.time_range.start and
                o.time_range.end >= c.time_range.end for o in inner)]
            own = e.time_range.elapsed_us() - sum(c.time_range.elapsed_us() for c in direct)
            excl[label] = excl.get(label, 0.0) + own
            spans.append((e.time_range.start, e.time_range.end, label,
                          [(c.time_range.start, c.time_range.end) for c in direct]))

    def owner(t):
        for s, end, label, holes in spans:
            if s <= t < end and not any(a <= t < b for a, b in holes):
                return label
        return None

    copies = programs = 0.0
    for e in dev:
        us = e.time_range.elapsed_us()
        if e.name.startswith("Memcpy"):
            label = owner(e.time_range.start)
            if label is not None:
                excl[label] -= us
            copies += us
        elif e.name.startswith("program"):
            if owner(e.time_range.start) == "model":
                programs += us
    host_ops = sum(e.time_range.elapsed_us() for e in host
                   if e.name.startswith("rbln::cpu_fallback") and owner(e.time_range.start)
                   == "model")
    forwards = sum(1 for e in marks if e.name == MARK + "model"
                   and not any(o is not e and o.name == MARK + "model" and
                               o.time_range.start <= e.time_range.start and
                               o.time_range.end >= e.time_range.end for o in marks))
    out = {k: v / 1e3 for k, v in excl.items()}
    out["host transfers"] = copies / 1e3
    out["model: device programs"] = programs / 1e3
    out["model: host ops"] = host_ops / 1e3
    out["forwards"] = forwards
    return out


def _wrap_call(fn, label: str):
    class Holder:
        pass
    h = Holder()
    h.fn = fn
    _wrap(h, "fn", label)
    return h.fn


def breakdown(llm, ops: int = 0) -> dict:
    """Per decode step at batch 16: the engine's wall per step and each worker's phases."""
    from vllm import SamplingParams
    eng = llm.llm_engine
    llm.collective_rpc(install_markers)
    sp = SamplingParams(temperature=0, max_tokens=PROFILE_STEPS + 8, ignore_eos=True,
                        detokenize=False)
    for i, p in enumerate(prompts()):
        eng.add_request(f"profile-{i}", p, sp)
    for _ in range(4):              # the prefill and the first decode steps
        eng.step()
    in_process = not hasattr(eng.engine_core.engine_core.model_executor, "workers")
    llm.collective_rpc(profile_start)
    _state().cpu.clear()
    t0 = time.perf_counter()
    step = _wrap_call(eng.step, "engine")
    for _ in range(PROFILE_STEPS):
        step()
    wall = time.perf_counter() - t0
    ranks = llm.collective_rpc(profile_stop, kwargs={"ops": ops})
    while eng.has_unfinished_requests():
        eng.step()
    out = {"step_ms": wall * 1e3 / PROFILE_STEPS, "ranks": []}
    for r in ranks:
        if "ops" in r:
            out.setdefault("ops", []).append(r.pop("ops"))
        n = max(r.pop("forwards"), 1)
        cpu = r.pop("cpu")
        if not in_process:      # the engine ran here (its CPU time), its workers elsewhere
            cpu["engine"] = _state().cpu.get("engine", 0) / 1e6
            r.pop("engine", None)
        per = {k: v / n for k, v in r.items()}
        per["cpu"] = {k: v / n for k, v in cpu.items()}
        out["ranks"].append(per)
    return out


# ------------------------------------------------------------------------------------------
# one engine, in its own process

def _peak_rss(pid="self") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child(spec: dict) -> dict:
    import torch
    torch.set_num_threads(spec["threads"])
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=512, seed=0,
              enforce_eager=spec["eager"], tensor_parallel_size=spec["tp"],
              kv_cache_memory_bytes=KV_BYTES, enable_prefix_caching=False,
              skip_tokenizer_init=True)
    ready = time.perf_counter() - t0
    ps = prompts()
    sp = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, detokenize=False)
    llm.generate(ps, sp, use_tqdm=False)             # warm-up
    walls = []
    for _ in range(spec["gens"]):
        t = time.perf_counter()
        outs = llm.generate(ps, sp, use_tqdm=False)
        walls.append(time.perf_counter() - t)
    assert all(len(o.outputs[0].token_ids) == NEW for o in outs)
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)
    ttft = []
    for _ in range(3):
        t = time.perf_counter()
        llm.generate(ps, first, use_tqdm=False)
        ttft.append(time.perf_counter() - t)
    lp = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, detokenize=False,
                        logprobs=5)
    seqs = [{"tokens": list(o.outputs[0].token_ids),
             "top": [{t: v.logprob for t, v in step.items()} for step in o.outputs[0].logprobs]}
            for o in llm.generate(ps, lp, use_tqdm=False)]
    res = {"ready_s": ready, "tok_s": BATCH * NEW / statistics.median(walls),
           "ttft_ms": statistics.median(ttft) * 1e3, "seqs": seqs}
    if spec["profile"]:
        res["breakdown"] = breakdown(llm, spec["ops"])
    rss = _peak_rss()
    ex = llm.llm_engine.engine_core.engine_core.model_executor
    for w in getattr(ex, "workers", ()):
        rss += _peak_rss(w.proc.pid)
    res["rss"] = rss
    return res


def child_env(name: str, threads: int) -> dict:
    e = ENGINES[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_RBLN_", "RBLN_"))}
    env.update(OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="0",
               TOKENIZERS_PARALLELISM="false", VLLM_LOGGING_LEVEL="WARNING",
               OMP_WAIT_POLICY="PASSIVE")
    if e["device"] == "cpu":
        # no thread pinning (rbln's workers are not pinned either; vLLM's automatic binding
        # wants a NUMA node per tensor-parallel worker)
        env.update(VLLM_TARGET_DEVICE="cpu", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
                   VLLM_CPU_OMP_THREADS_BIND="nobind")
    elif e["tp"] > 1:
        env["TORCH_RBLN_VIRTUAL_NPUS"] = str(TP_NPUS)
    return env


def run_engine(name: str, opts, model: Path, profile: bool) -> dict | str:
    e = ENGINES[name]
    spec = dict(model=str(model), dtype=opts.dtype, eager=e["eager"], tp=e["tp"],
                threads=opts.threads, gens=opts.gens, profile=profile, ops=opts.ops)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        r = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec), str(out)],
                           env=child_env(name, opts.threads), cwd=d, capture_output=True,
                           text=True, timeout=opts.timeout)
        if r.returncode or not out.exists():
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            return f"failed ({r.returncode}): {' | '.join(tail)}"
        return json.loads(out.read_text())


# ------------------------------------------------------------------------------------------
# comparison and tables

def agreement(got: list[dict], want: list[dict]) -> str:
    """rbln's greedy sequences against vLLM CPU's by the rule of vLLM's cross-device tests
    (``check_logprobs_close``): equal ids, up to a step where they differ and each side's pick
    is among the other's top 5 (a near-tie; the sequence is compared no further); with the
    largest log-probability difference of an equal token."""
    ties, dev = 0, 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        for step, (gt, wt, gtop, wtop) in enumerate(zip(g["tokens"], w["tokens"], g["top"],
                                                        w["top"])):
            gtop = {int(k): v for k, v in gtop.items()}
            wtop = {int(k): v for k, v in wtop.items()}
            if gt == wt:
                dev = max(dev, abs(gtop[gt] - wtop[wt]))
                continue
            if gt in wtop and wt in gtop:
                ties += 1
                break
            return f"DIFFERS: sequence {i} step {step}: token {gt} vs {wt}"
    what = "equal" if not ties else f"equal up to near-ties ({ties}/{len(got)} sequences)"
    return f"{what}; log-prob within {dev:.3f}"


def spread(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    if len(xs) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


REFERENCE = {"rbln-eager": "cpu-eager", "rbln-compiled": "cpu-compiled",
             "rbln-tp2": "cpu-tp2"}
PHASES = ("engine", "runner", "attn metadata", "model", "lm head", "attention", "sampler",
          "host transfers", "collectives")


def print_table(names: list[str], runs: list[dict]) -> None:
    print("| engine | tokens/s | vs vLLM CPU | time to first token (ms) | engine start (s) | "
          "peak RSS (MB) | token ids vs vLLM CPU |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        rs = [r[name] for r in runs if isinstance(r.get(name), dict)]
        fails = [r[name] for r in runs if isinstance(r.get(name), str)]
        if not rs:
            print(f"| {name} | {fails[0] if fails else '-'} | | | | | |")
            continue
        ref = REFERENCE.get(name)
        ratios = [r[name]["tok_s"] / r[ref]["tok_s"] for r in runs
                  if isinstance(r.get(name), dict) and isinstance(r.get(ref), dict)]
        if name == "rbln-tp2":
            ratios_tp = [r[name]["tok_s"] / r["rbln-eager"]["tok_s"] for r in runs
                         if isinstance(r.get(name), dict) and isinstance(r.get("rbln-eager"),
                                                                         dict)]
        agree = "-"
        if ref and isinstance(runs[0].get(ref), dict) and isinstance(runs[0].get(name), dict):
            agree = agreement(runs[0][name]["seqs"], runs[0][ref]["seqs"])
        vs = spread(ratios, "{:.2f}x") if ratios else "-"
        if name == "rbln-tp2" and ratios_tp:
            vs += f"; {spread(ratios_tp, '{:.2f}x')} of rbln TP=1"
        print(f"| {name} | {spread([r['tok_s'] for r in rs], '{:.0f}')} | {vs} | "
              f"{spread([r['ttft_ms'] for r in rs], '{:.0f}')} | "
              f"{spread([r['ready_s'] for r in rs], '{:.1f}')} | "
              f"{spread([r['rss'] / 2**20 for r in rs], '{:.0f}')} | {agree} |")


def print_breakdown(names: list[str], run: dict) -> None:
    cols = []
    for name in names:
        r = run.get(name)
        if not isinstance(r, dict) or "breakdown" not in r:
            continue
        for i, rank in enumerate(r["breakdown"]["ranks"]):
            label = name if len(r["breakdown"]["ranks"]) == 1 else f"{name} rank {i}"
            cols.append((label, rank, r["breakdown"]["step_ms"]))
    if not cols:
        return
    print(f"\nper decode step, batch {BATCH}, ms: wall from torch.profiler (CPU time of the "
          f"thread in parentheses), {PROFILE_STEPS} steps, each phase exclusive of the phases "
          "inside it:\n")
    print("| phase | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    subs = {"model: device programs", "model: host ops"}
    keys = list(PHASES) + sorted({k for _, r, _ in cols for k in r} - set(PHASES) - subs
                                 - {"cpu"})

    def cell(r, k):
        wall, cpu = r.get(k), r.get("cpu", {}).get(k)
        if wall is None and cpu is None:
            return "-"
        return f"{wall or 0.0:.2f}" + (f" ({cpu:.2f})" if cpu is not None else "")

    for k in keys:
        if not any(k in r or k in r.get("cpu", {}) for _, r, _ in cols):
            continue
        print(f"| {k} | " + " | ".join(cell(r, k) for _, r, _ in cols) + " |")
        if k == "model":
            for sub in sorted(subs):
                if any(r.get(sub) for _, r, _ in cols):
                    print(f"| &nbsp; of which {sub[7:]} | " + " | ".join(
                        f"{r.get(sub, 0.0):.2f}" for _, r, _ in cols) + " |")
    print("| step (engine wall; sum of CPU) | " + " | ".join(
        f"{s:.2f} ({sum(r.get('cpu', {}).values()):.2f})" for _, r, s in cols) + " |")


def header(opts) -> str:
    import platform as pf
    name, flags = pf.processor() or pf.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = " ".join(f"{f}{'+' if f in flags else '-'}" for f in FLAGS)
    try:
        from importlib.metadata import version
        vv = version("vllm-cpu")
    except Exception:
        vv = "?"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"CPU: {name} ({os.cpu_count()} logical CPUs; {have}); vllm-cpu {vv}; "
            f"{opts.dtype}; {opts.threads} intra-op thread(s) per process; "
            f"{opts.rounds} round(s); load average at start {load:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gens", type=int, default=3, help="timed generates per engine")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--ops", type=int, default=0,
                    help="also print each engine's N slowest ops of the profiled steps")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--json", help="write every measurement to this file")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        spec, out = opts.child
        res = child(json.loads(spec))
        Path(out).write_text(json.dumps(res))
        os._exit(0)     # vLLM's engine and worker shutdown is slow and adds nothing here
    names = [n.strip() for n in opts.engines.split(",") if n.strip()]
    unknown = set(names) - set(ENGINES)
    if unknown:
        ap.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    print(header(opts), flush=True)
    model = make_model(opts.dtype)
    runs = []
    for k in range(opts.rounds):
        run = {}
        for name in names:
            run[name] = run_engine(name, opts, model, profile=k == 0 and not opts.no_profile)
            r = run[name]
            print(f"  round {k + 1} {name}: " + (r if isinstance(r, str) else
                  f"{r['tok_s']:.0f} tok/s, ready {r['ready_s']:.1f} s"), flush=True)
        runs.append(run)
    print()
    print_table(names, runs)
    print_breakdown(names, runs[0])
    for name in names:
        r = runs[0].get(name)
        for i, table in enumerate(r.get("breakdown", {}).get("ops", []) if isinstance(r, dict)
                                  else []):
            print(f"\n{name} rank {i}, {PROFILE_STEPS} decode steps:\n{table}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
