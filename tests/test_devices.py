"""Logical devices on a virtual NPU host: mapping, plan/commit, tensors on rbln:N, backward.

The RBLN_* variables are read when the mapping is planned or committed, so every test runs a
fresh process. One process can try several mappings: before the first real device use each
query re-plans from the current environment.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import run_code

PRELUDE = """
import json, os, warnings
import torch
import torch_rbln
from torch_rbln.runtime import devices
def summary():
    import io, contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        torch.rbln.device_summary()
    return buf.getvalue()
def groups():
    return [list(g) for g in devices.plan().groups]
"""


def probe(body: str, env: dict, helpers: str = "") -> dict:
    """Run ``body`` after PRELUDE (and ``helpers``) in a fresh process; it must
    ``print(json.dumps(...))`` last."""
    r = run_code(PRELUDE + helpers + textwrap.dedent(body), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_npus_per_device_leaves_leftovers_unused_with_warning():
    out = probe("""
        n, phys, g = torch.rbln.device_count(), torch.rbln.physical_device_count(), groups()
        unused = list(devices.plan().unused)
        committed_by_queries = devices.is_committed()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.ones(2, device="rbln:0")
        props = torch.rbln.get_device_properties(0)
        print(json.dumps(dict(n=n, phys=phys, groups=g, unused=unused, table=summary(),
                              committed_by_queries=committed_by_queries,
                              committed=devices.is_committed(),
                              warnings=[str(x.message) for x in w],
                              mem=props.total_memory, npus=props.npu_count)))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "6", "RBLN_NPUS_PER_DEVICE": "4"})
    assert (out["n"], out["phys"]) == (1, 6)
    assert out["groups"] == [[0, 1, 2, 3]] and out["unused"] == [4, 5]
    assert not out["committed_by_queries"] and out["committed"]
    assert any("2 physical NPU(s) are unused due to grouping constraints" in m
               for m in out["warnings"])
    assert "| rbln:0         | [ 0, 1, 2, 3 ]   | Active (Aggregated) |" in out["table"]
    assert "| -              | [ 4, 5 ]         | Unused              |" in out["table"]
    assert out["table"].rstrip().endswith(
        "[Warning] 2 physical NPU(s) are unused due to grouping constraints.")
    assert (out["mem"], out["npus"]) == (4 * (16 << 30), 4)


def test_device_map_groups_and_precedence():
    out = probe("""
        res = {"map": groups(), "n": torch.rbln.device_count(),
               "mem": [torch.rbln.get_device_properties(i).total_memory for i in range(2)],
               "npus": [torch.rbln.get_device_properties(i).npu_count for i in range(2)],
               "table": summary()}
        os.environ["RBLN_NPUS_PER_DEVICE"] = "2"          # the map still wins
        res["map_over_k"] = groups()
        del os.environ["RBLN_DEVICE_MAP"]
        res["k_only"] = groups()
        print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "6", "RBLN_DEVICE_MAP": "[0,1],[2,3,4,5]"})
    assert out["map"] == [[0, 1], [2, 3, 4, 5]] and out["n"] == 2
    assert out["mem"] == [2 * (16 << 30), 4 * (16 << 30)] and out["npus"] == [2, 4]
    assert out["map_over_k"] == [[0, 1], [2, 3, 4, 5]]
    assert out["k_only"] == [[0, 1], [2, 3], [4, 5]]
    assert "| rbln:1         | [ 2, 3, 4, 5 ]   | Active (Aggregated) |" in out["table"]
    assert "Unused" not in out["table"]


def test_summary_table_matches_the_reference_layout():
    out = probe("""
        print(json.dumps({"table": summary()}))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "6", "RBLN_DEVICE_MAP": "[0,1],[2,3]"})
    assert out["table"] == (
        "[RBLN] Device Topology Initialized:\n"
        "+----------------+------------------+---------------------+\n"
        "| Logical Device | Physical NPU IDs | Status              |\n"
        "+----------------+------------------+---------------------+\n"
        "| rbln:0         | [ 0, 1 ]         | Active (Aggregated) |\n"
        "| rbln:1         | [ 2, 3 ]         | Active (Aggregated) |\n"
        "| -              | [ 4, 5 ]         | Unused              |\n"
        "+----------------+------------------+---------------------+\n"
        "[Warning] 2 physical NPU(s) are unused due to grouping constraints.\n")


def test_rbln_devices_selects_the_pool_that_mapping_indexes():
    out = probe("""
        res = {"groups": groups(), "n": torch.rbln.device_count(),
               "phys": torch.rbln.physical_device_count(), "table": summary()}
        os.environ["RBLN_DEVICE_MAP"] = "[0,1],[2,3]"     # ids index the visible pool
        res["mapped"] = groups()
        del os.environ["RBLN_DEVICE_MAP"]
        os.environ["RBLN_VISIBLE_DEVICES"] = "0,1"        # the alias loses to RBLN_DEVICES
        res["both"] = groups()
        del os.environ["RBLN_DEVICES"]
        res["alias"] = groups()
        print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "8", "RBLN_DEVICES": "4,5,6,7"})
    assert out["groups"] == [[4], [5], [6], [7]]
    assert (out["n"], out["phys"]) == (4, 4)
    assert "| rbln:0         | [ 4 ]            | Active              |" in out["table"]
    assert out["mapped"] == [[4, 5], [6, 7]]
    assert out["both"] == [[4], [5], [6], [7]]
    assert out["alias"] == [[0], [1]]


BAD_CONFIGS = [  # (environment, message, physical_device_count())
    ({"RBLN_NPUS_PER_DEVICE": "3"}, "Invalid RBLN_NPUS_PER_DEVICE", 4),
    ({"RBLN_DEVICE_MAP": "[0,1],[2]x"}, "Expected ',' at position", 4),
    ({"RBLN_DEVICE_MAP": "0,1"}, "Expected '[' at position 0", 4),
    ({"RBLN_DEVICE_MAP": "[0,1,2]"}, "has 3 NPUs", 4),
    ({"RBLN_DEVICE_MAP": "[0,1],[1,2]"}, "NPU 1 appears in more than one group", 4),
    ({"RBLN_DEVICE_MAP": "[0,1],[2,3]", "RBLN_DEVICES": "0,1"}, "only 2 NPU(s) are visible", 2),
    ({"RBLN_DEVICES": "0,9"}, "names physical NPU 9", 0),
    ({"RBLN_DEVICES": "0,x"}, "Invalid RBLN_DEVICES", 0),
    ({"RBLN_DEVICES": "1,1"}, "must not repeat", 0),
    ({"RBLN_VISIBLE_DEVICES": "0;1"}, "Invalid RBLN_VISIBLE_DEVICES", 0),
]


@pytest.mark.parametrize("env,message,phys", BAD_CONFIGS, ids=[c[1] for c in BAD_CONFIGS])
def test_malformed_mapping(env, message, phys):
    """device_count() warns and returns 0; current_device() and tensor creation raise the
    detailed error; is_available() is False; a bad grouping leaves the physical count alone."""
    out = probe("""
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            n = torch.rbln.device_count()
        errors = []
        for fn in (torch.rbln.current_device, lambda: torch.ones(1, device="rbln")):
            try:
                fn()
                errors.append(None)
            except Exception as e:
                errors.append(str(e))
        print(json.dumps(dict(n=n, available=torch.rbln.is_available(),
                              phys=torch.rbln.physical_device_count(),
                              warnings=[str(x.message) for x in w], errors=errors)))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "4", **env})
    assert out["n"] == 0 and out["available"] is False and out["phys"] == phys
    assert any(message in m for m in out["warnings"]), out["warnings"]
    assert all(e is not None and message in e for e in out["errors"]), out["errors"]


def test_grouping_that_leaves_no_device():
    out = probe("""
        n = torch.rbln.device_count()
        try:
            torch.ones(1, device="rbln")
            err = None
        except RuntimeError as e:
            err = str(e)
        print(json.dumps(dict(n=n, phys=torch.rbln.physical_device_count(), err=err)))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "1", "RBLN_NPUS_PER_DEVICE": "2"})
    assert (out["n"], out["phys"]) == (0, 1)
    assert "No RBLN device is available" in out["err"]


def test_plan_commit_lifecycle():
    """Queries and set_device() plan; the first tensor commits; later edits are ignored."""
    out = probe("""
        res = {"before": torch.rbln.device_count()}
        os.environ["RBLN_DEVICES"] = "2,3"                # a launcher after `import torch`
        res["planned"] = groups()
        torch.rbln.set_device(1)
        res["after_set_device"] = devices.is_committed()
        with torch.rbln.device(0):
            pass
        torch.rbln.get_device_properties(1)
        torch.rbln.device_summary()
        res["after_queries"] = devices.is_committed()
        t = torch.ones(2, device="rbln")
        res["tensor_device"] = str(t.device)
        res["committed"] = devices.is_committed()
        os.environ["RBLN_DEVICES"] = "0"
        os.environ["RBLN_NPUS_PER_DEVICE"] = "bogus"      # not even parsed any more
        res["frozen"] = groups()
        del os.environ["RBLN_DEVICES"]
        res["unset"] = [torch.rbln.device_count(), torch.rbln.physical_device_count()]
        print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "4"})
    assert out["before"] == 4
    assert out["planned"] == [[2], [3]]
    assert out["after_set_device"] is False and out["after_queries"] is False
    assert out["tensor_device"] == "rbln:1" and out["committed"] is True
    assert out["frozen"] == [[2], [3]]
    assert out["unset"] == [2, 2]


def test_synchronize_commits():
    out = probe("""
        before = devices.is_committed()
        torch.rbln.synchronize()
        print(json.dumps([before, devices.is_committed()]))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert out == [False, True]


def test_tensors_copies_contexts_and_mixed_devices():
    out = probe("""
        from torch_rbln import events
        res = {}
        a = torch.arange(128, dtype=torch.float32).reshape(2, 64)
        x0 = a.to("rbln:0")
        bounce0 = events.total("bounce")[1]
        x1 = x0.to("rbln:1")                              # device to device, other index
        res["bounced_bytes"] = events.total("bounce")[1] - bounce0
        res["devices"] = [str(x0.device), str(x1.device), str((x1 * 2).device)]
        res["equal"] = torch.equal(x1.cpu(), a)
        with torch.rbln.device(1):
            res["inside"] = [torch.rbln.current_device(), str(torch.empty(3, device="rbln").device)]
        res["outside"] = torch.rbln.current_device()
        with torch.rbln.device_of(x1):
            res["device_of"] = torch.rbln.current_device()
        errors = []
        h0, h1 = x0.half(), x1.half()
        res["sum1"] = str((h1 + h1).device)               # a device op: memory on rbln:1's arena
        res["mem1"] = torch.rbln.memory_allocated(1) > 0
        for f in (lambda: h0 + h1,                        # device-op kernel (fp16)
                  lambda: x0 + x1,                        # fp32: CPU fallback of a device op
                  lambda: torch.atan2(x0, x1),            # boxed CPU fallback
                  lambda: torch.mm(x0, x1.t()),
                  lambda: torch.cat([x0, x1])):            # a native kernel
            try:
                f()
                errors.append(None)
            except RuntimeError as e:
                errors.append(str(e))
        res["errors"] = errors
        print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert out["devices"] == ["rbln:0", "rbln:1", "rbln:1"]
    assert out["equal"] and out["bounced_bytes"] == 128 * 4
    assert out["inside"] == [1, "rbln:1"] and out["outside"] == 0 and out["device_of"] == 1
    assert out["sum1"] == "rbln:1" and out["mem1"]
    for e in out["errors"]:
        assert e is not None and "Expected all tensors to be on the same device" in e, e


TRAIN = """
    import threading
    torch.manual_seed(0)
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    def step(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    x, y = torch.randn(16, 64), torch.randn(16, 8)
    cpu = make()
    ref_loss = step(cpu, x, y)
    dev = make().to("rbln:1")
    loss = step(dev, x.to("rbln:1"), y.to("rbln:1"))
    res = {"loss_device": str(loss.device),
           "loss_close": torch.allclose(loss.cpu(), ref_loss, rtol=1e-4, atol=1e-5),
           "params_close": all(torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
                               for p, q in zip(dev.parameters(), cpu.parameters())),
           "grad_devices": sorted({str(p.grad.device) for p in dev.parameters()})}
    # rbln:1's part of a backward pass runs on the calling thread (patches: no device thread),
    # under rbln:1's stream guard, so rbln:1 is current there
    seen = {}
    w = torch.ones(8, device="rbln:1", requires_grad=True)
    w.register_hook(lambda g: seen.update(device=torch.rbln.current_device(),
                                          other_thread=threading.get_ident() != threading.main_thread().ident))
    (w * 2).sum().backward()
    res["hook"] = [seen.get("device"), seen.get("other_thread"), torch.rbln.current_device()]
    # backward started from another thread works as well
    box = {}
    def worker():
        w = torch.ones(64, device="rbln:1", requires_grad=True)
        box["g"] = torch.autograd.grad((w * 3).sum(), w)[0].cpu().tolist()
    t = threading.Thread(target=worker)
    t.start(); t.join()
    res["thread_grad"] = box.get("g") == [3.0] * 64
    print(json.dumps(res))
"""


def test_training_step_on_rbln1_matches_cpu():
    out = probe(TRAIN, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert out["loss_device"] == "rbln:1"
    assert out["loss_close"] and out["params_close"]
    assert out["grad_devices"] == ["rbln:1"]
    assert out["thread_grad"]
    assert out["hook"] == [1, False, 0]


def test_device_properties_per_logical_device():
    out = probe("""
        p = [torch.rbln.get_device_properties(i) for i in range(torch.rbln.device_count())]
        try:
            torch.rbln.get_device_properties(2)
            err = None
        except ValueError as e:
            err = str(e)
        print(json.dumps(dict(props=[[x.name, x.total_memory, x.npu_count, x.num_chiplet,
                                      x.memory_per_chiplet] for x in p],
                              name=torch.rbln.get_device_name(1), err=err)))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "3", "RBLN_DEVICE_MAP": "[0],[1,2]",
          "RBLN_FORCE_NPU_NAME": "RBLN-CR13"})
    gib = 1 << 30
    assert out["props"] == [["RBLN-CR13", 144 * gib, 1, 4, 36 * gib],
                            ["RBLN-CR13", 288 * gib, 2, 4, 36 * gib]]
    assert out["name"] == "RBLN-CR13"
    assert "out of range" in out["err"]


def test_commit_logs_the_table_at_debug():
    r = run_code("import torch\n"
                 "torch.rbln.device_count()\n"
                 "torch.ones(1, device='rbln:1')\n",
                 env={"TORCH_RBLN_VIRTUAL_NPUS": "2", "TORCH_RBLN_LOG_LEVEL": "DEBUG"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("Device configuration complete:") == 1
    assert "| rbln:1         | [ 1 ]            | Active              |" in r.stderr
