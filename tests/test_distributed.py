"""torch.distributed on rbln: the rbln-ccl backend, DDP, rbln tensors on gloo, errors.

Multi-process scenarios run under torchrun (``tests/distributed_worker.py``), two or four
ranks on a virtual host with one NPU per rank, each launch bounded in time: a launch that runs
past its limit has its whole process tree killed and the test fails. Every rank reports what it
saw as JSON; the checks against gloo on the CPU run inside the ranks, case by case.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from conftest import EXAMPLES, clean_env, run_code

WORKER = Path(__file__).with_name("distributed_worker.py")
OPS = ["broadcast", "all_reduce", "all_gather", "all_gather_into_tensor",
       "all_gather_into_tensor_coalesced", "all_gather_coalesced", "reduce_scatter",
       "reduce_scatter_tensor", "scatter", "send_recv", "isend_irecv_back_to_back"]
DTYPES = ["float16", "bfloat16", "float32", "int64"]
STATES = ["host", "device", "view", "strided"]
REDUCTIONS = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor"}


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def torchrun(target, nprocs: int, env: dict | None = None, timeout: int = 300,
             args=()) -> tuple[list[dict], str]:
    """Run ``target`` (a worker scenario name, or a script path) on ``nprocs`` ranks under
    torchrun; returns each rank's JSON report (scenarios only) and the combined output."""
    out = tempfile.mkdtemp(prefix="rbln-dist-")
    script = [str(WORKER), target] if isinstance(target, str) else [str(target)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nprocs}", "--monitor-interval=0.5", *script, *args]
    full = clean_env({"DIST_OUT": out, "OMP_NUM_THREADS": "1",
                      "TORCH_RBLN_VIRTUAL_NPUS": str(nprocs),
                      "RBLN_VISIBLE_DEVICES": ",".join(map(str, range(nprocs))), **(env or {})})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=full, cwd=str(EXAMPLES.parent))
    try:
        output, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(p.pid)
        output, _ = p.communicate()
        pytest.fail(f"{target}: ran past its {timeout} s limit; process tree killed\n"
                    f"{output[-6000:]}")
    assert p.returncode == 0, output[-6000:]
    if not isinstance(target, str):
        return [], output
    reports = []
    for r in range(nprocs):
        path = os.path.join(out, f"rank{r}.json")
        assert os.path.exists(path), f"rank {r} wrote no report\n{output[-6000:]}"
        with open(path) as f:
            reports.append(json.load(f))
    return reports, output


# --------------------------------------------------------------------------------------------
# in-process: registration, a one-rank group, claims

def test_rbln_ccl_registered_at_import():
    assert "rbln-ccl" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["rbln-ccl"] == ["rbln", "cpu"]
    # init_process_group() without a backend picks rbln-ccl for rbln, as nccl for cuda
    assert dist.Backend.default_device_backend_map["rbln"] == "rbln-ccl"
    assert dist.Backend._plugins["RBLN-CCL"].extended_api
    from torch_rbln import distributed
    distributed.register()         # a second registration is ignored
    assert dist.Backend.backend_capability["rbln-ccl"] == ["rbln", "cpu"]


@pytest.fixture
def solo():
    from torch_rbln.distributed.process_group import ProcessGroupRBLN
    return ProcessGroupRBLN(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60), "solo")


def _opts(cls, **kw):
    o = getattr(dist.distributed_c10d, cls)()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_one_rank_group_moves_device_memory_and_reports_it(solo):
    from torch_rbln.runtime.storage import DEVICE, HOST, state_of
    x = torch.arange(128, dtype=torch.float16, device="rbln").reshape(2, 64) + 0  # device-latest
    assert state_of(x).residency == DEVICE
    out = torch.empty_like(x)
    f32 = torch.ones(4, device="rbln")
    with torch.rbln.explain() as p:
        solo.allreduce([x], _opts("AllreduceOptions")).wait()
        solo.allgather([[out]], [x], _opts("AllgatherOptions")).wait()
        solo.allreduce([f32], _opts("AllreduceOptions")).wait()
    d = p.dump()
    assert d["collectives"]["device"] == {"count": 2, "bytes": 512,
                                          "by_op": {"all_gather": 1, "all_reduce": 1}}
    assert d["collectives"]["host"] == {"count": 1, "bytes": 16, "by_op": {"all_reduce": 1}}
    assert d["runtime_residency"]["real_host_sync_d2h"]["count"] == 0   # nothing device-latest
    assert d["runtime_residency"]["real_host_sync_h2d"]["count"] == 0   # left the device
    assert state_of(out).residency == DEVICE and state_of(f32).residency == HOST
    assert torch.equal(out.cpu(), x.cpu())
    report = p.report()
    assert "collectives on device: 2, 512 B (all_gather 1, all_reduce 1)" in report
    assert "collectives via host (gloo): 1, 16 B (all_reduce 1)" in report
    assert solo.name() == "rbln-ccl"


def test_one_rank_group_errors_name_the_problem(solo):
    x = torch.ones(4, dtype=torch.float16, device="rbln")
    with pytest.raises(RuntimeError, match=r"input is on cpu but output is on rbln.*\.to\('rbln'\)"):
        solo.all_gather_single(x, torch.ones(4, dtype=torch.float16),
                               _opts("AllgatherOptions"))
    with pytest.raises(ValueError, match=r"the output is torch.float16\[4\] but must be "
                                         r"torch.float16\[8\]"):
        solo.all_gather_single(x, torch.ones(8, dtype=torch.float16, device="rbln"),
                               _opts("AllgatherOptions"))
    with pytest.raises(RuntimeError, match="rbln-ccl does not support reduce; it runs "):
        solo.reduce([x], _opts("ReduceOptions"))
    w = solo.allreduce([x], _opts("AllreduceOptions"))     # the group still works
    assert w.wait() and w.is_completed() and w.get_future().wait()[0] is x


def test_a_collective_commits_the_device_mapping():
    r = run_code("""
import json, os, torch, torch.distributed as dist
from torch_rbln.runtime import devices
dist.init_process_group("rbln-ccl", store=dist.HashStore(), rank=0, world_size=1)
assert dist.group.WORLD._timeout == dist.default_pg_timeout   # what the 5 s join default keys on
created = devices.is_committed()
os.environ["RBLN_VISIBLE_DEVICES"] = "1"      # not used yet: still changes the mapping
dist.all_reduce(torch.ones(2))                # a collective, even of CPU tensors, commits
committed = devices.is_committed()
os.environ["RBLN_VISIBLE_DEVICES"] = "0"      # committed: ignored
print(json.dumps([created, committed, list(devices.plan().visible)]))
""", env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [False, True, [1]]


def test_a_subgroup_is_destroyed_by_name():
    # c10d names each group at creation and unregisters it by that name when it is destroyed
    # (vLLM destroys its tensor-parallel groups one by one at shutdown)
    r = run_code("""
import torch, torch.distributed as dist
dist.init_process_group("rbln-ccl", store=dist.HashStore(), rank=0, world_size=1)
g = dist.new_group([0], backend="rbln-ccl")
x = torch.ones(4, dtype=torch.float16, device="rbln")
dist.all_reduce(x, group=g)
name = g.group_name
dist.destroy_process_group(g)
dist.destroy_process_group()
print(name)
""")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "1"          # c10d's name of the first group after WORLD


def test_a_second_process_on_a_claimed_npu_is_warned():
    torch.ones(1, device="rbln")               # this process holds NPU 0
    r = run_code("""
import warnings, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    torch.ones(1, device="rbln")
print([str(x.message) for x in w if "already in use" in str(x.message)])
""", env={"XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"]})    # this process's claims
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"physical NPU 0 is already in use by pid {os.getpid()} (" in r.stdout
    assert r.stdout.count("already in use") == 1


def test_claimed_npu_warns_naming_the_holder(tmp_path, monkeypatch):
    import fcntl
    from torch_rbln.runtime import claims
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = tmp_path / "torch-rbln" / "npu7.lock"
    path.parent.mkdir()
    with open(path, "w") as other:            # another process's claim, as the file records it
        other.write("pid 4242 (python train.py)")
        other.flush()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert claims.claim([7, 8]) == [7]
        msgs = [str(x.message) for x in w]
        assert len(msgs) == 1 and "physical NPU 7 is already in use by pid 4242 (python " \
            "train.py)" in msgs[0] and "RBLN_VISIBLE_DEVICES" in msgs[0]
    assert 8 in claims.held()
    assert f"pid {os.getpid()}" in claims.holder(8)


# --------------------------------------------------------------------------------------------
# under torchrun

def test_tutorial_pattern_under_torchrun():
    _, out = torchrun(EXAMPLES / "multi_npu.py", 2)
    for r in range(2):
        assert (f"rank {r}/2 (NPU {r}): all_gather [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], "
                "all_reduce of rank+1 [3.0, 3.0, 3.0, 3.0]") in out
    assert "[clean]  RBLN EXPLAIN" in out
    assert "collectives on device: 2, 24 B (all_gather 1, all_reduce 1)" in out


def _expected_where(op: str, dtype: str) -> str:
    """rbln-ccl runs fp16 natively; other reductions take its gloo fallback through the host."""
    return "host-latest" if op in REDUCTIONS and dtype != "float16" else "device-latest"


def _check_ops_reports(reports, world: int, states, dtypes) -> None:
    for rep in reports:
        cases = rep["cases"]
        assert len(cases) == len(OPS) * len(dtypes) * len(states)
        bad = [c for c in cases if not c["ok"]]
        assert not bad, (sorted({(c["op"], c["dtype"], c["state"]) for c in bad}),
                         json.dumps(bad[:2], indent=1)[:4000])
        for c in cases:
            if c["op"] == "broadcast" and rep["rank"] == world - 1:
                # the source only sends: its tensor is pushed to the device, not rewritten
                expect = "device-latest" if c["state"] == "device" else "synced"
            else:
                expect = _expected_where(c["op"], c["dtype"])
            assert c["states"] == [expect], c
        assert rep["views"] == {"float16": True, "float32": True}
        assert rep["backend"] == "rbln-ccl" and rep["committed"]
        # the ranks share one host: the results above came through shared memory, equal to
        # gloo's bit for bit
        assert rep["shm_mapped"]
        # explain: device-latest fp16 data never leaves the device; bf16 is staged
        ex = rep["explain"]
        dev, host = ex["device"], ex["host"]
        assert dev["collectives"] == {"device": {"count": 2, "bytes": 512,
                                                 "by_op": {"all_reduce": 1, "broadcast": 1}}}
        assert dev["runtime_residency"]["real_host_sync_d2h"]["count"] == 0
        assert dev["hidden_host_bounce"]["total_count"] == 0
        assert "collectives on device: 2, 512 B (all_reduce 1, broadcast 1)" in ex["device_report"]
        assert host["collectives"] == {"host": {"count": 1, "bytes": 256,
                                                "by_op": {"all_reduce": 1}}}
        assert host["runtime_residency"]["real_host_sync_d2h"] == {"count": 1, "bytes": 256}
        assert "collectives via host (gloo): 1, 256 B (all_reduce 1)" in ex["host_report"]
        assert (ex["x_state"], ex["y_state"]) == ("device-latest", "host-latest")
        for mode in ("0", "1"):
            assert rep["async"][mode] == {"wait": True, "completed": True, "success": True,
                                          "future_is_tensor": True, "close": True}
        assert rep["seq"] == {"delta": 2, "all_equal": True}
        _check_mismatches(rep["mismatch"], rep["rank"], world)


def _check_mismatches(m: dict, rank: int, world: int) -> None:
    def raised(key, pattern):
        assert m[key]["type"] is not None, (key, m[key])
        assert re.search(pattern, m[key]["msg"]), (key, m[key]["msg"])

    sizes = ", ".join(f"rank {r} passed float16\\[{4 + r}\\]" for r in range(world))
    raised("shape", rf"all_reduce: the ranks passed tensors of different dtypes or sizes "
                    rf"\(collective #\d+ of this group\): {sizes}")
    raised("dtype", r"rank 0 passed float16\[4\], rank 1 passed float32\[4\]")
    raised("op", r"the ranks called different collectives .*rank 0 called broadcast, "
                 r"rank 1 called all_reduce")
    raised("root", r"broadcast: the ranks named different src ranks .*rank 0: src=0, "
                   r"rank 1: src=1")
    if rank == 1:
        raised("p2p", r"recv on rank 1: rank 0 sent float32\[8\] but the receiving tensor is "
                      r"float16\[8\]")
    elif rank == 0:
        assert m["p2p"]["type"] is None          # the send itself went through
    raised("cpu_input", r"all_gather_into_tensor: input is on cpu but output is on rbln")
    raised("unsupported", r"rbln-ccl does not support reduce")
    assert m["after"] == [float(sum(range(world)))] * 4


def test_collectives_and_ddp_two_ranks():
    """Every collective vs gloo on the CPU, DDP against the single-process reference, then a
    rank that leaves mid-run."""
    reports, _ = torchrun("ops", 2, {"DIST_CRASH": "1", "DIST_DDP": "1", "DIST_DUPLICATE": "1"})
    for rep in reports:
        dup = rep["duplicate"]
        assert dup["type"] == "RuntimeError", dup
        assert "ranks 0 and 1 both use physical NPU 0" in dup["msg"]
        assert "RBLN_VISIBLE_DEVICES" in dup["msg"] and "LOCAL_RANK" in dup["msg"]
    _check_ops_reports(reports, 2, STATES, DTYPES)
    _check_ddp_reports(reports)
    no_show = reports[0]["no_show"]
    assert no_show["type"] == "DistBackendError", no_show
    assert ("rbln-ccl all_reduce on rank 0: timed out waiting for the other ranks (group timeout "
            "3 s): a rank never called all_reduce") in no_show["msg"], no_show
    # the last rank left: the survivor's next collective fails at once, naming the cause
    left = reports[0]["peer_left"]
    assert left["type"] == "DistBackendError", left
    assert "rbln-ccl" in left["msg"] and "a peer rank left the group" in left["msg"], left


def test_collectives_four_ranks_device_latest():
    states, dtypes = ["device"], DTYPES
    reports, _ = torchrun("ops", 4, {"DIST_STATES": ",".join(states),
                                     "DIST_DTYPES": ",".join(dtypes)})
    _check_ops_reports(reports, 4, states, dtypes)


@pytest.mark.slow
def test_collectives_four_ranks_every_state():
    reports, _ = torchrun("ops", 4, {"DIST_DDP": "1"})
    _check_ops_reports(reports, 4, STATES, DTYPES)
    _check_ddp_reports(reports)


def _check_ddp_reports(reports) -> None:
    for rep in reports:
        assert rep["diffs"]["rbln-ccl"] < 1e-4 and rep["diffs"]["gloo"] < 1e-4, rep["diffs"]
        # fp32 gradients: rbln-ccl's gloo fallback; DDP's initial broadcast runs on the device
        coll = rep["ddp_collectives"]
        assert coll["host"]["by_op"] == {"all_reduce": 3}, coll
        assert coll["device"]["by_op"]["broadcast"] >= 1, coll
        # a gloo group stages rbln tensors through the host
        assert set(rep["gloo_collectives"]) == {"host"}, rep["gloo_collectives"]
        assert rep["gloo_collectives"]["host"]["by_op"]["all_reduce"] == 3
        world = rep["world"]
        assert rep["gloo_ops"] == {
            "all_reduce": [float(sum(range(1, world + 1)))],
            "all_gather": [[float(r)] * 3 for r in range(world)]}


def _ranks_in_threads(ranks, size: int, timeout, group: str) -> list:
    """Create rank ``r`` of a ``size``-rank group for each ``r`` in ``ranks``, one thread each,
    in this process; the error of each (or None)."""
    import threading
    from torch_rbln.distributed.process_group import ProcessGroupRBLN
    store, errors = dist.HashStore(), [None] * size

    def rank(r):
        try:
            ProcessGroupRBLN(store, r, size, timeout, group)
        except Exception as e:  # noqa: BLE001
            errors[r] = e
    ts = [threading.Thread(target=rank, args=(r,)) for r in ranks]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
        assert not t.is_alive()
    return errors


def test_a_rank_that_never_joins():
    """No timeout given to init_process_group: c10d hands the backend its default, and
    rbln-ccl waits the reference's 5 s for every rank."""
    import time
    t0 = time.monotonic()
    err = _ranks_in_threads([0], 2, dist.default_pg_timeout, "lonely")[0]
    waited = time.monotonic() - t0
    assert isinstance(err, dist.DistStoreError), err
    assert ("rbln-ccl: rank(s) [1] of 2 did not join process group 'lonely' within 5 s "
            "(store key rbln_rccl_uid_lonely)") in str(err)
    assert "init_process_group(..., timeout=" in str(err)
    assert waited >= 4.5
    err = _ranks_in_threads([0], 2, datetime.timedelta(seconds=1), "lonely2")[0]
    assert "did not join process group 'lonely2' within 1 s" in str(err)   # timeout= wins


def test_more_ranks_than_npus_on_the_host():
    """Two ranks in this process (threads), on a virtual host with one NPU."""
    from torch_rbln.runtime import devices
    errors = _ranks_in_threads([0, 1], 2, datetime.timedelta(seconds=60), "many")
    assert devices.host().npus == 1
    for e in errors:
        assert isinstance(e, RuntimeError), e
        assert "world size larger than the NPUs: 2 ranks run on host" in str(e)
        assert "which has 1 NPU(s)" in str(e) and "TORCH_RBLN_VIRTUAL_NPUS" in str(e)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
