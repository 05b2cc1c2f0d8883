"""rbln-ccl between the NPUs of one host: shared memory instead of sockets.

The NPUs of one host exchange collective data over the host's own memory, not its network
stack; so do the virtual NPUs here, which are processes of one machine. When every rank of a
group runs on one host, the group maps one segment of shared memory (``/dev/shm``), as vLLM's
CPU platform does for its all-reduce, and its collectives (all_reduce, all_gather,
reduce_scatter, broadcast, barrier) move their bytes through it: no socket, no transport thread,
and the ranks' agreement on each collective (``agreement.py``) travels in the same round instead
of a gloo all-gather of its own. Point-to-point transfers, collectives larger than a slot, groups
spanning hosts, and floating-point sums and products over more than two ranks (whose last bits
depend on the order gloo combines the ranks' values in) keep gloo.

Layout: per rank, a flag (its own cache line) counting the rounds it has posted; per round parity
(two rounds in flight: a rank cannot post round ``n + 2`` before every rank posted ``n + 1``,
which each does only after reading round ``n``) and per rank, a fingerprint and a data slot.
A round: write the fingerprint and the data into this rank's slot, publish the round number in
the flag, wait until every rank's flag reached it, check the fingerprints, read the slots. x86
keeps stores in program order and loads in program order, so a flag seen means its slot's bytes
are there. Reductions add in fp32 for half-precision tensors and round once, in rank order on
every rank, so every rank gets the same bits.

The segment is created by rank 0 under a name unique to the group, opened by the others, and
unlinked as soon as every rank mapped it (it lives as long as the mappings). A wait gives up
after the group's timeout, or as soon as a peer process is gone.
"""

from __future__ import annotations

import array
import mmap
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import agreement

LINE = 64                       # a rank's flag: one cache line each
SLOT_BYTES = 8 << 20            # data slot per rank and round parity
_FP = agreement.LENGTH * 8
_FP_SPACE = (_FP + LINE - 1) // LINE * LINE


def code(reduce_op) -> int:
    """A reduce op's number (``ReduceOp``, its ``RedOpType``, or a number)."""
    op = getattr(reduce_op, "op", reduce_op)
    return int(op.value) if hasattr(op, "value") else int(op)


# reductions the channel computes (the rest go to gloo)
_SUM, _PRODUCT, _MIN, _MAX = (code(dist.ReduceOp.SUM), code(dist.ReduceOp.PRODUCT),
                              code(dist.ReduceOp.MIN), code(dist.ReduceOp.MAX))
REDUCTIONS = frozenset({_SUM, _PRODUCT, _MIN, _MAX})
ORDERLESS = frozenset({_MIN, _MAX})     # exact in any order, for floats too
_HALF = (torch.float16, torch.bfloat16)


def same_host(members: list[dict]) -> bool:
    return len({m["host"] for m in members}) == 1


class PeerGone(RuntimeError):
    """A rank's process exited while the others waited for it."""


class Channel:
    """The shared segment of one group, mapped by this rank."""

    def __init__(self, store, rank: int, size: int, uid: str, members: list[dict],
                 timeout: timedelta):
        self.rank, self.size = rank, size
        self.timeout = timeout.total_seconds()
        self._pids = [m["pid"] for m in members]
        self._slot0 = size * LINE
        self._stride = _FP_SPACE + SLOT_BYTES
        nbytes = self._slot0 + 2 * size * self._stride
        path = f"/dev/shm/rbln_ccl_{uid}"
        key = f"rbln_ccl_shm/{uid}"
        if rank == 0:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, nbytes)
            store.set(key, path)
        else:
            store.wait([key], timeout)
            fd = os.open(store.get(key).decode(), os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        store.set(f"{key}/rank{rank}", "mapped")
        if rank == 0:       # every rank holds a mapping: the name is no longer needed
            try:
                store.wait([f"{key}/rank{r}" for r in range(size)], timeout)
            finally:
                os.unlink(path)
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._flags = memoryview(self._mm).cast("q")     # every 8-byte word, flags included
        self._line = LINE // 8
        self.round = 0

    def close(self) -> None:
        self._flags.release()
        del self._bytes
        self._mm.close()

    # the slots ---------------------------------------------------------------------------------
    def _base(self, parity: int, r: int) -> int:
        return self._slot0 + (parity * self.size + r) * self._stride

    def _fingerprint(self, parity: int, r: int) -> list[int]:
        w = self._base(parity, r) // 8
        return self._flags[w:w + agreement.LENGTH].tolist()

    def slot(self, parity: int, r: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        b = self._base(parity, r) + _FP_SPACE
        return self._bytes[b:b + numel * dtype.itemsize].view(dtype)

    @staticmethod
    def fits(nbytes: int) -> bool:
        return nbytes <= SLOT_BYTES

    # one round ---------------------------------------------------------------------------------
    def exchange(self, fingerprint: list[int], data: torch.Tensor | None, seq: int,
                 root_name: str = "root") -> int:
        """Post this rank's fingerprint (``agreement.fingerprint_values``) and ``data``
        (contiguous, may be None), wait for every rank's, check that they agree; returns the
        round's parity (where the slots are)."""
        self.round += 1
        n = self.round
        parity = n & 1
        w = self._base(parity, self.rank) // 8
        self._flags[w:w + agreement.LENGTH] = memoryview(array.array("q", fingerprint))
        if data is not None and data.numel():
            self.slot(parity, self.rank, data.dtype, data.numel()).view(data.shape).copy_(data)
        flags, line, size = self._flags, self._line, self.size
        flags[self.rank * line] = n
        spins = 0
        deadline = None
        while True:
            if all(flags[r * line] >= n for r in range(size)):
                break
            spins += 1
            if spins < 32:
                continue
            os.sched_yield()
            if spins % 256 == 0:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.timeout
                elif now > deadline:
                    late = [r for r in range(size) if flags[r * line] < n]
                    raise TimeoutError(f"timed out waiting for rank(s) {late} (group timeout "
                                       f"{self.timeout:g} s)")
                self._check_peers(n)
        rows = [self._fingerprint(parity, r) for r in range(size)]
        if any(row != fingerprint for row in rows):
            agreement.compare(torch.tensor(rows, dtype=torch.int64), seq, root_name)
        return parity

    def _check_peers(self, n: int) -> None:
        for r, pid in enumerate(self._pids):
            if self._flags[r * self._line] >= n:
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise PeerGone(f"rank {r} (pid {pid}) exited: closed by peer") from None
            except PermissionError:
                pass

    def slots(self, parity: int, dtype: torch.dtype, numel: int) -> list[torch.Tensor]:
        return [self.slot(parity, r, dtype, numel) for r in range(self.size)]

    # what the collectives compute from the round's slots -------------------------------------
    def reduce(self, parity: int, dtype: torch.dtype, numel: int, op: int,
               part: slice = slice(None)) -> torch.Tensor:
        """The reduction of every rank's slot (its elements ``part``), in rank order; half
        precision accumulates in fp32 and rounds once."""
        parts = [s[part] for s in self.slots(parity, dtype, numel)]
        acc = parts[0].to(torch.float32) if dtype in _HALF else parts[0].clone()
        for p in parts[1:]:
            if op == _SUM:
                acc += p
            elif op == _PRODUCT:
                acc *= p
            elif op == _MIN:
                torch.minimum(acc, p, out=acc)
            else:
                torch.maximum(acc, p, out=acc)
        return acc
