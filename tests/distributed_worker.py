"""One rank of a tests/test_distributed.py scenario, started by torchrun.

``python -m torch.distributed.run ... tests/distributed_worker.py SCENARIO``; each rank writes
what it observed as JSON to ``$DIST_OUT/rank<R>.json`` (the test asserts on it) and exits 0
unless something unexpected happened. Checks against the reference run here, where the
tensors are, and come back as data: which case, whether it matched, by how much.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
OUT = os.environ["DIST_OUT"]
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("DIST_TIMEOUT", "120")))
result: dict = {"rank": RANK, "world": WORLD}


def write() -> None:
    with open(os.path.join(OUT, f"rank{RANK}.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(OUT, f"rank{RANK}.json.tmp"), os.path.join(OUT, f"rank{RANK}.json"))


def tutorial_init(**kw) -> None:
    """The multi-NPU tutorial's pattern: keep only this rank's NPU, then init rbln-ccl."""
    os.environ["RBLN_VISIBLE_DEVICES"] = os.environ["RBLN_VISIBLE_DEVICES"].split(",")[LOCAL_RANK]
    dist.init_process_group(backend="rbln-ccl", **kw)


def error_of(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the error is the observation
        return {"type": type(e).__name__, "msg": str(e), "s": time.monotonic() - t0}
    return {"type": None, "msg": "", "s": time.monotonic() - t0}


# ---------------------------------------------------------------------------------------------
# every collective vs gloo on the CPU

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "int64": torch.int64}
ROWS, COLS = 2, 64          # a 64-wide last dim, so float16/bfloat16 device ops qualify


def values(dtype, salt: int, rank: int = RANK, rows: int = ROWS) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, (rows, COLS), generator=g)
    return torch.randn(rows, COLS, generator=g).to(dtype)


def residency_name(t) -> str:
    from torch_rbln.runtime.storage import state_of
    return ("host-latest", "device-latest", "synced")[state_of(t).residency]


def make(v: torch.Tensor, state: str) -> torch.Tensor:
    """An rbln tensor holding ``v``: host-latest, device-latest, a view at an offset into a
    larger tensor, or a strided (non-contiguous) view."""
    if state == "host":
        return v.to("rbln")
    if state == "device":
        # gathered by a one-rank group: written by the NPU, so the device holds the latest data
        d = torch.empty_like(v, device="rbln")
        dist.all_gather_into_tensor(d, v.to("rbln"), group=SELF[RANK])
        return d
    if state == "view":
        base = torch.full((3, *v.shape), 7, dtype=v.dtype).to("rbln")
        base[1].copy_(v)
        return base[1]
    if state == "strided":
        base = torch.full((*v.shape, 2), 7, dtype=v.dtype).to("rbln")
        base[..., 1].copy_(v)
        return base[..., 1]
    raise ValueError(state)


def out_like(v: torch.Tensor, state: str) -> torch.Tensor:
    """An rbln output buffer of ``v``'s shape in ``state`` (its content is overwritten)."""
    return make(torch.full_like(v, 5), state)


SELF: dict = {}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def op_cases(gloo):
    """(name, fn(dtype, state) -> (rbln results, reference results)) for every collective."""
    W = WORLD

    def broadcast(dtype, st):
        v = values(dtype, 1)
        x = make(v, st)
        dist.broadcast(x, src=W - 1)
        r = v.clone()
        dist.broadcast(r, src=W - 1, group=gloo)
        return [x], [r]

    def all_reduce(dtype, st):
        v = values(dtype, 2)
        x = make(v, st)
        dist.all_reduce(x)
        r = v.clone()
        dist.all_reduce(r, group=gloo)
        return [x], [r]

    def all_gather(dtype, st):
        v = values(dtype, 3)
        outs = [out_like(v, st) for _ in range(W)]
        dist.all_gather(outs, make(v, st))
        refs = [torch.empty_like(v) for _ in range(W)]
        dist.all_gather(refs, v.clone(), group=gloo)
        return outs, refs

    def all_gather_into_tensor(dtype, st):
        v = values(dtype, 4)
        out = out_like(values(dtype, 0, rows=ROWS * W), st)
        dist.all_gather_into_tensor(out, make(v, st))
        ref = torch.empty(ROWS * W, COLS, dtype=dtype)
        dist.all_gather_into_tensor(ref, v.clone(), group=gloo)
        return [out], [ref]

    def all_gather_into_tensor_coalesced(dtype, st):
        v1, v2 = values(dtype, 5), values(dtype, 6)
        o1 = out_like(values(dtype, 0, rows=ROWS * W), st)
        o2 = out_like(values(dtype, 0, rows=ROWS * W), st)
        x1, x2 = make(v1, st), make(v2, st)
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(o1, x1)
            dist.all_gather_into_tensor(o2, x2)
        cm.wait()
        refs = []
        for v in (v1, v2):
            ref = torch.empty(ROWS * W, COLS, dtype=dtype)
            dist.all_gather_into_tensor(ref, v.clone(), group=gloo)
            refs.append(ref)
        return [o1, o2], refs

    def all_gather_coalesced(dtype, st):
        v1, v2 = values(dtype, 7), values(dtype, 8)
        outs = [[out_like(v1, st), out_like(v2, st)] for _ in range(W)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)    # deprecated API, still served
            dist.all_gather_coalesced(outs, [make(v1, st), make(v2, st)])
        refs = [[torch.empty_like(v1), torch.empty_like(v2)] for _ in range(W)]
        for i, v in enumerate((v1, v2)):
            col = [torch.empty_like(v) for _ in range(W)]
            dist.all_gather(col, v.clone(), group=gloo)
            for r in range(W):
                refs[r][i] = col[r]
        return [t for l in outs for t in l], [t for l in refs for t in l]

    def reduce_scatter(dtype, st):
        vs = [values(dtype, 10 + i) for i in range(W)]
        out = out_like(vs[0], st)
        dist.reduce_scatter(out, [make(v, st) for v in vs])
        ref = torch.empty_like(vs[0])
        dist.reduce_scatter(ref, [v.clone() for v in vs], group=gloo)
        return [out], [ref]

    def reduce_scatter_tensor(dtype, st):
        v = values(dtype, 20, rows=ROWS * W)
        out = out_like(values(dtype, 0), st)
        dist.reduce_scatter_tensor(out, make(v, st))
        ref = torch.empty(ROWS, COLS, dtype=dtype)
        dist.reduce_scatter_tensor(ref, v.clone(), group=gloo)
        return [out], [ref]

    def scatter(dtype, st):
        vs = [values(dtype, 30 + i) for i in range(W)]
        out = out_like(vs[0], st)
        dist.scatter(out, [make(v, st) for v in vs] if RANK == 0 else None, src=0)
        ref = torch.empty_like(vs[0])
        dist.scatter(ref, [v.clone() for v in vs] if RANK == 0 else None, src=0, group=gloo)
        return [out], [ref]

    def send_recv(dtype, st):
        # a ring; even ranks send first, odd ranks receive first, so blocking calls pair up
        v = values(dtype, 40)
        nxt, prv = (RANK + 1) % W, (RANK - 1) % W
        x, got = make(v, st), out_like(v, st)
        ref = torch.empty_like(v)

        def ring(send_t, recv_t, group):
            if RANK % 2 == 0:
                dist.send(send_t, nxt, group=group)
                dist.recv(recv_t, prv, group=group)
            else:
                dist.recv(recv_t, prv, group=group)
                dist.send(send_t, nxt, group=group)
        ring(x, got, None)
        ring(v.clone(), ref, gloo)
        return [got], [ref]

    def isend_irecv_back_to_back(dtype, st):
        # two tensors of different sizes in flight from one peer (as vLLM's pipeline stages send
        # hidden states and residual): both receives posted before either is waited on, and
        # waited in reverse order; then the sends
        a, b = values(dtype, 41), values(dtype, 42, rows=2 * ROWS)
        nxt, prv = (RANK + 1) % W, (RANK - 1) % W

        def ring(xs, outs, group):
            recvs = [dist.irecv(o, prv, group=group) for o in outs]
            sends = [dist.isend(x, nxt, group=group) for x in xs]
            for w in reversed(recvs):
                w.wait()
            for w in sends:
                w.wait()
        got = [out_like(a, st), out_like(b, st)]
        ring([make(a, st), make(b, st)], got, None)
        ref = [torch.empty_like(a), torch.empty_like(b)]
        ring([a.clone(), b.clone()], ref, gloo)
        return got, ref

    return [broadcast, all_reduce, all_gather, all_gather_into_tensor,
            all_gather_into_tensor_coalesced, all_gather_coalesced, reduce_scatter,
            reduce_scatter_tensor, scatter, send_recv, isend_irecv_back_to_back]


def check_ops(gloo, states, dtypes) -> list:
    cases = []
    for fn in op_cases(gloo):
        for dname in dtypes:
            dtype = DTYPES[dname]
            for st in states:
                case = {"op": fn.__name__, "dtype": dname, "state": st}
                try:
                    got, ref = fn(dtype, st)
                    case["states"] = sorted({residency_name(t) for t in got})   # before reading
                    case["ok"] = len(got) == len(ref) and all(map(same, got, ref))
                    if not case["ok"]:
                        case["got"] = [t.cpu().float().flatten()[:8].tolist() for t in got]
                        case["ref"] = [t.float().flatten()[:8].tolist() for t in ref]
                except Exception:  # noqa: BLE001
                    case["ok"] = False
                    case["error"] = traceback.format_exc()[-1500:]
                cases.append(case)
    return cases


def check_views_keep_neighbours() -> dict:
    """Writing into a view leaves the rest of its storage alone (device and host routes)."""
    out = {}
    for dname in ("float16", "float32"):
        dtype = DTYPES[dname]
        base = torch.full((3, ROWS, COLS), 7, dtype=dtype).to("rbln")
        dist.all_reduce(base[1])
        expect = torch.full((3, ROWS, COLS), 7, dtype=dtype)
        expect[1] *= WORLD
        out[dname] = same(base, expect)
    return out


def check_explain() -> dict:
    """A collective on device-latest fp16 data moves device memory: no d2h, its own report
    line; a bf16 all_reduce takes rbln-ccl's gloo fallback through the host."""
    x = make(values(torch.float16, 50), "device")
    y = make(values(torch.bfloat16, 51), "device")
    with torch.rbln.explain() as p:
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
    with torch.rbln.explain() as q:
        dist.all_reduce(y)
    return {"device": p.dump(), "device_report": p.report(), "host": q.dump(),
            "host_report": q.report(), "x_state": residency_name(x), "y_state": residency_name(y)}


def check_async() -> dict:
    out = {}
    for mode in ("0", "1"):
        os.environ["TORCH_RBLN_C10D_ASYNC"] = mode
        x = make(values(torch.float16, 60), "host")
        ref = values(torch.float16, 60).float()
        for r in range(WORLD):
            if r != RANK:
                ref += values(torch.float16, 60, rank=r).float()
        w = dist.all_reduce(x, async_op=True)
        waited = w.wait()
        fut = w.get_future().wait()
        out[mode] = {"wait": waited, "completed": w.is_completed(), "success": w.is_success(),
                     "future_is_tensor": fut[0] is x,
                     "close": bool(torch.allclose(x.cpu().float(), ref, atol=0.05, rtol=0.01))}
    os.environ["TORCH_RBLN_C10D_ASYNC"] = "0"
    return out


def check_sequence_numbers() -> dict:
    pg = dist.group.WORLD
    s0 = pg._get_sequence_number_for_group()
    x = torch.ones(4, dtype=torch.float16, device="rbln")
    dist.all_reduce(x)
    dist.barrier()
    s1 = pg._get_sequence_number_for_group()
    seqs = [None] * WORLD
    dist.all_gather_object(seqs, s1)
    return {"delta": s1 - s0, "all_equal": len(set(seqs)) == 1}


def check_mismatches(gloo_needed=True) -> dict:
    out = {}
    f16 = dict(dtype=torch.float16, device="rbln")
    out["shape"] = error_of(lambda: dist.all_reduce(torch.ones(4 + RANK, **f16)))
    out["dtype"] = error_of(lambda: dist.all_reduce(torch.ones(
        4, dtype=torch.float16 if RANK == 0 else torch.float32, device="rbln")))
    out["op"] = error_of(lambda: dist.broadcast(torch.ones(4, **f16), src=0) if RANK == 0
                         else dist.all_reduce(torch.ones(4, **f16)))
    out["root"] = error_of(lambda: dist.broadcast(torch.ones(4, **f16), src=RANK % 2))
    if RANK < 2:   # the first two ranks: a send and a recv that disagree
        out["p2p"] = error_of(lambda: dist.send(torch.ones(8, dtype=torch.float32,
                                                           device="rbln"), 1)
                              if RANK == 0 else dist.recv(torch.empty(8, **f16), 0))
    out["cpu_input"] = error_of(lambda: dist.all_gather_into_tensor(
        torch.empty(4 * WORLD, **f16), torch.ones(4, dtype=torch.float16)))
    out["unsupported"] = error_of(lambda: dist.reduce(torch.ones(4, **f16), dst=0))
    x = torch.full((4,), float(RANK), **f16)
    dist.all_reduce(x)          # the group still works after every error above
    out["after"] = x.cpu().tolist()
    return out


def scenario_ops() -> None:
    if os.environ.get("DIST_DUPLICATE"):
        # the tutorial's narrowing step skipped: every rank would drive NPU 0
        result["duplicate"] = error_of(lambda: dist.init_process_group("rbln-ccl",
                                                                       timeout=TIMEOUT))
    tutorial_init(timeout=TIMEOUT)
    for r in range(WORLD):      # one-rank groups: a collective on the own rank only
        g = dist.new_group([r], backend="rbln-ccl")
        if r == RANK:
            SELF[RANK] = g
    gloo = dist.new_group(backend="gloo")
    states = os.environ.get("DIST_STATES", "host,device,view,strided").split(",")
    dtypes = os.environ.get("DIST_DTYPES", ",".join(DTYPES)).split(",")
    result["cases"] = check_ops(gloo, states, dtypes)
    result["views"] = check_views_keep_neighbours()
    result["explain"] = check_explain()
    result["async"] = check_async()
    result["seq"] = check_sequence_numbers()
    result["mismatch"] = check_mismatches()
    result["committed"] = __import__("torch_rbln.runtime.devices", fromlist=["x"]).is_committed()
    result["backend"] = dist.get_backend()
    # every rank on this host: the group's collectives move through a shared memory segment
    # (distributed/shm.py), mapped here and unlinked once every rank mapped it
    with open("/proc/self/maps") as f:
        result["shm_mapped"] = any("/rbln_ccl_" in line for line in f)
    if os.environ.get("DIST_DDP"):
        check_ddp(gloo)
    write()
    if os.environ.get("DIST_CRASH") and WORLD > 1:
        # a rank that never calls the collective: the others give up after the group's timeout
        short = dist.new_group(backend="rbln-ccl", timeout=datetime.timedelta(seconds=3))
        if RANK == 0:
            result["no_show"] = error_of(lambda: dist.all_reduce(
                torch.ones(4, dtype=torch.float16, device="rbln"), group=short))
        dist.barrier()
        write()
        # the last rank leaves mid-run; the others' next collective must fail, not hang
        dist.barrier()
        if RANK == WORLD - 1:
            os._exit(0)
        result["peer_left"] = error_of(lambda: [dist.all_reduce(torch.ones(4, dtype=torch.float16,
                                                                            device="rbln"))
                                                for _ in range(50)])
        write()
        os._exit(0)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# DDP

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(rank: int):
    g = torch.Generator().manual_seed(77 + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train(m, xs, ys, steps=3):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(xs), ys).backward()
        opt.step()
    return [p.detach().cpu() for p in m.parameters()]


def check_ddp(gloo) -> None:
    """DDP of an rbln module over rbln-ccl and over gloo, 3 SGD steps each, against one CPU
    process training on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    # the reference: one CPU process, the whole batch
    parts = [batch(r) for r in range(WORLD)]
    ref = train(model(), torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    x, y = batch(RANK)
    diffs = {}
    with torch.rbln.explain() as p:
        got = train(DDP(model().to("rbln")), x.to("rbln"), y.to("rbln"))
    diffs["rbln-ccl"] = max(float((a - b).abs().max()) for a, b in zip(got, ref))
    result["ddp_collectives"] = p.dump().get("collectives", {})
    with torch.rbln.explain() as q:
        got = train(DDP(model().to("rbln"), process_group=gloo), x.to("rbln"), y.to("rbln"))
    diffs["gloo"] = max(float((a - b).abs().max()) for a, b in zip(got, ref))
    result["gloo_collectives"] = q.dump().get("collectives", {})
    # plain collectives of a gloo group on rbln tensors: staged through the host
    t = torch.full((2, 64), float(RANK + 1), dtype=torch.float16, device="rbln")
    dist.all_reduce(t, group=gloo)
    outs = [torch.empty(3, dtype=torch.float32, device="rbln") for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((3,), float(RANK), device="rbln"), group=gloo)
    result["gloo_ops"] = {"all_reduce": t.cpu().unique().tolist(),
                          "all_gather": [o.cpu().tolist() for o in outs]}
    result["diffs"] = diffs


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
