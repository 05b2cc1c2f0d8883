"""Creating an rbln-ccl group: every rank announces itself through the c10d store.

Rank 0 publishes the group's unique id under ``rbln_rccl_uid_<group>`` (the key the reference
uses) and each rank adds what it drives: host, process, logical device and its physical NPUs.
Every rank waits for all of them, then checks the layout the collectives will run on:

* a rank that never joins: the wait ends after the join timeout and names the missing ranks
  (default 5 s, the reference's; ``init_process_group(timeout=...)`` sets it);
* more ranks on one host than it has NPUs, or two ranks on one NPU: each rank needs an NPU of
  its own (set ``RBLN_VISIBLE_DEVICES`` per ``LOCAL_RANK`` before the first device use).

Each rank raises the same error, so no rank is left waiting for one that gave up.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import socket

import torch.distributed as dist

from ..runtime import devices

DEFAULT_JOIN_TIMEOUT = datetime.timedelta(milliseconds=5000)
FIX = ("give each rank its own NPU before its first device use, as the multi-NPU tutorial "
       "does: os.environ['RBLN_VISIBLE_DEVICES'] = "
       "os.environ['RBLN_VISIBLE_DEVICES'].split(',')[int(os.environ['LOCAL_RANK'])]")


def join_timeout(timeout: datetime.timedelta) -> datetime.timedelta:
    """The group's timeout when the caller chose one, else the reference's 5 s (c10d hands
    every backend ``default_pg_timeout`` when ``init_process_group`` got none)."""
    return DEFAULT_JOIN_TIMEOUT if timeout == dist.default_pg_timeout else timeout


def _me(rank: int) -> dict:
    info = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid()}
    try:
        plan = devices.plan()
        index = devices.current()
        if not 0 <= index < len(plan.groups):
            raise RuntimeError(f"its current device rbln:{index} does not exist: it sees "
                               f"{len(plan.groups)} logical device(s)")
        info.update(device=index, npus=list(plan.groups[index]), visible=list(plan.visible),
                    host_npus=devices.host().npus)
    except Exception as e:  # a bad RBLN_* configuration: every rank reports it
        info["error"] = str(e)
    return info


def join(store, rank: int, size: int, group: str, timeout: datetime.timedelta) -> list[dict]:
    """Announce this rank, wait for the others, check the NPU layout; the members in rank
    order."""
    uid_key = f"rbln_rccl_uid_{group}"
    keys = [f"{uid_key}/rank{r}" for r in range(size)]
    if rank == 0:
        store.set(uid_key, secrets.token_hex(16))
    store.set(keys[rank], json.dumps(_me(rank)))
    wait = join_timeout(timeout)
    try:
        store.wait([uid_key, *keys], wait)
    except (dist.DistError, RuntimeError) as e:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        who = (f"rank(s) {missing} of {size}" if missing else "rank 0 (the group's unique id)")
        raise dist.DistStoreError(
            f"rbln-ccl: {who} did not join process group '{group}' within "
            f"{wait.total_seconds():g} s (store key {uid_key}). Start every rank (torchrun "
            "--nproc-per-node=<world size>), or give slow starters more time with "
            "init_process_group(..., timeout=datetime.timedelta(seconds=...)).") from e
    members = [json.loads(store.get(k)) for k in keys]
    check_layout(members)
    return members


def check_layout(members: list[dict]) -> None:
    for m in members:
        if "error" in m:
            raise RuntimeError(f"rbln-ccl: rank {m['rank']} has no usable RBLN device: "
                               f"{m['error']}")
    by_host: dict[str, list[dict]] = {}
    for m in members:
        by_host.setdefault(m["host"], []).append(m)
    for host, ms in by_host.items():
        npus = ms[0]["host_npus"]
        if len(ms) > npus:
            raise RuntimeError(
                f"rbln-ccl: world size larger than the NPUs: {len(ms)} ranks run on host "
                f"'{host}', which has {npus} NPU(s) (TORCH_RBLN_VIRTUAL_NPUS sets the virtual "
                "host's count); rbln-ccl needs one NPU per rank. Start fewer ranks per host "
                "(torchrun --nproc-per-node) or emulate more NPUs.")
        owner: dict[int, dict] = {}
        for m in ms:
            for npu in m["npus"]:
                other = owner.setdefault(npu, m)
                if other is not m:
                    raise RuntimeError(
                        f"rbln-ccl: ranks {other['rank']} and {m['rank']} both use physical NPU "
                        f"{npu} on host '{host}' (rank {other['rank']}: rbln:{other['device']} "
                        f"= NPU {other['npus']} of visible {other['visible']}; rank {m['rank']}: "
                        f"rbln:{m['device']} = NPU {m['npus']} of visible {m['visible']}); "
                        f"{FIX}")
