"""One process of offline vLLM generation for tests/test_vllm.py (rbln, or the CPU reference
with VLLM_TARGET_DEVICE=cpu): several engines one after another, all cases of each in one go.

    python vllm_offline_job.py SPEC.json OUT.json

SPEC: {"engines": [{"name", "model", "eager", "tp", "pp", "explain_decode", "runner_info",
"tp_info", "expect_error", "kill_worker"}], "cases": [[batch, prompt_len]], "max_tokens",
"top_logprobs", "vocab"}. OUT: {engine name: {"B x L": [{"tokens": [ids], "top": [{id:
log-probability}] per step} per prompt]}, "<engine>.explain": report, "<engine>.runner": streams,
events, generators, "<engine>.tp": per-worker memory and explain}; an ``expect_error`` engine
gives {"type", "message"} of the error its construction raised (None if none), a
``kill_worker`` engine, under "<engine>.kill", what generate raised after that worker was
killed (the engine's last use).
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys


def sequence(out) -> dict:
    """{"tokens": [id], "top": [{id: log-probability} per step]} of one vLLM completion."""
    return {"tokens": list(out.token_ids),
            "top": [{t: lp.logprob for t, lp in step.items()} for step in out.logprobs]}


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    rnd = random.Random(batch * 1000 + length)
    return [[rnd.randrange(5, vocab) for _ in range(length)] for _ in range(batch)]


def main(spec_path: str, out_path: str) -> None:
    import torch
    from vllm import LLM, SamplingParams

    from vllm.platforms import current_platform as platform

    spec = json.load(open(spec_path))
    # greedy, with each step's top log-probabilities: a near-tie between the two best tokens
    # may fall either way on two devices, and the test tells such a tie from a wrong answer
    sp = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True,
                        logprobs=spec["top_logprobs"])
    out = {"platform": [type(platform).__name__, platform.device_type, platform.dispatch_key]}
    for e in spec["engines"]:
        if e.get("expect_error"):
            # a configuration the engine must refuse: the error's type and message
            saved = {k: os.environ.get(k) for k in e.get("env", {})}
            os.environ.update(e.get("env", {}))
            try:
                LLM(model=e["model"], dtype="float16", max_model_len=512, seed=0,
                    kv_cache_memory_bytes=32 << 20, enforce_eager=True,
                    tensor_parallel_size=e.get("tp", 1), pipeline_parallel_size=e.get("pp", 1))
                out[e["name"]] = None
            except Exception as err:
                out[e["name"]] = {"type": type(err).__name__, "message": str(err)}
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            continue
        llm = LLM(model=e["model"], dtype="float16", max_model_len=512, seed=0,
                  kv_cache_memory_bytes=32 << 20, enforce_eager=e["eager"],
                  tensor_parallel_size=e.get("tp", 1), pipeline_parallel_size=e.get("pp", 1))
        res = out[e["name"]] = {}
        for batch, length in spec["cases"]:
            got = llm.generate([{"prompt_token_ids": p}
                                for p in prompts(batch, length, spec["vocab"])], sp,
                               use_tqdm=False)
            res[f"{batch}x{length}"] = [sequence(o.outputs[0]) for o in got]
        if e.get("runner_info"):
            out[e["name"] + ".runner"] = runner_info(llm, spec)
        if e.get("tp_info"):
            out[e["name"] + ".tp"] = tp_info(llm, spec)
        if e.get("explain_decode") and hasattr(torch, "rbln"):
            # one decode step of a batch of 2, after its prefill and a first decode step
            eng = llm.llm_engine
            _decode_batch(eng, spec)
            from torch_rbln import events
            before = events.snapshot()
            with torch.rbln.explain() as p:
                eng.step()
            after = events.snapshot()
            out[e["name"] + ".ops"] = {
                kind: {k: v[0] - before[kind].get(k, [0, 0])[0] for k, v in after[kind].items()
                       if v[0] != before[kind].get(k, [0, 0])[0]}
                for kind in ("dispatch", "cpu_fallback", "cpu_fallback_reason")}
            while eng.has_unfinished_requests():
                eng.step()
            out[e["name"] + ".explain"] = p.dump()
            out[e["name"] + ".report"] = p.report()
        if e.get("kill_worker") is not None:
            out[e["name"] + ".kill"] = kill_worker(llm, e["kill_worker"], spec)
        del llm
        gc.collect()
    json.dump(out, open(out_path, "w"), default=str)


def _decode_batch(eng, spec: dict) -> None:
    """A batch of 2 requests through its prefill and a first decode step."""
    from vllm import SamplingParams
    for i in range(2):
        eng.add_request(f"x{i}", {"prompt_token_ids": prompts(2, 64, spec["vocab"])[i]},
                        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    eng.step()
    eng.step()


def tp_info(llm, spec: dict) -> dict:
    """Per worker (one per rank and NPU): its device, NPUs and memory, and the explain report of
    one decode step of a batch of 2, taken in the worker (the step runs there)."""
    eng = llm.llm_engine
    _decode_batch(eng, spec)
    llm.collective_rpc("rbln_explain_start")
    eng.step()
    explains = llm.collective_rpc("rbln_explain_stop")
    while eng.has_unfinished_requests():
        eng.step()
    ex = eng.engine_core.engine_core.model_executor
    return {"memory": llm.collective_rpc("rbln_memory"),
            "explain": [{"rank": x["rank"], "report": x["report"],
                         "collectives": x["dump"].get("collectives", {})} for x in explains],
            "worker_pids": [w.proc.pid for w in ex.workers], "pid": os.getpid()}


def kill_worker(llm, rank: int, spec: dict) -> dict:
    """Generate once, SIGKILL the worker of ``rank``, generate again: the error that second call
    raises (the engine must not wait forever for the dead worker) and how long it took."""
    import signal
    import time
    from vllm import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ps = [{"prompt_token_ids": p} for p in prompts(2, 16, spec["vocab"])]
    first = [list(o.outputs[0].token_ids) for o in llm.generate(ps, sp, use_tqdm=False)]
    workers = llm.llm_engine.engine_core.engine_core.model_executor.workers
    os.kill(workers[rank].proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    try:
        llm.generate(ps, sp, use_tqdm=False)
        err = None
    except Exception as e:
        err = {"type": type(e).__name__, "message": str(e)}
    return {"first": first, "error": err, "seconds": time.monotonic() - t0}


def runner_info(llm, spec: dict) -> dict:
    """What the model runner made its streams, events and per-request generators of, and two
    runs of the same seeded sampling (one engine process: the runner is in this process)."""
    import torch
    from vllm import SamplingParams

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=spec["max_tokens"],
                            ignore_eos=True)
    ps = [{"prompt_token_ids": p} for p in prompts(2, 16, spec["vocab"])]
    runs = [[list(o.outputs[0].token_ids) for o in llm.generate(ps, seeded, use_tqdm=False)]
            for _ in range(2)]
    eng = llm.llm_engine
    eng.add_request("seeded", ps[0], seeded)
    eng.step()
    generators = [str(g.device) for g in runner.input_batch.generators.values()]
    while eng.has_unfinished_requests():
        eng.step()
    return dict(async_scheduling=runner.use_async_scheduling,
                copy_stream=type(runner.async_output_copy_stream).__module__ + "." +
                type(runner.async_output_copy_stream).__name__,
                prepare_inputs_event=type(runner.prepare_inputs_event).__name__,
                transfer_event=runner.transfer_event.device.type,
                generators=generators, seeded_runs=runs,
                cuda_stream_outside=torch.cuda.Stream.__module__)


if __name__ == "__main__":
    main(*sys.argv[1:])
