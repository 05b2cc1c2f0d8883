"""Every rank must call the same collective with matching tensors: check it before moving data.

The transport counts bytes, not shapes: two ranks that pass tensors of different sizes or
dtypes to one collective would exchange garbage, or one of them would fail while the other
waits. So before each collective the ranks swap a small fingerprint (which collective, dtype,
shape, root) and every rank raises the same error, naming each rank's side, when they differ.
Point-to-point transfers send the fingerprint ahead of the data and the receiver checks it.
"""

from __future__ import annotations

import torch

# Codes on the wire: indexes into these tuples (append only).
OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "scatter",
       "reduce_scatter", "reduce_scatter_tensor", "barrier", "send", "all_gather_coalesced")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
          torch.complex128)
MAX_DIMS = 8
# op, dtype, numel, ndim, dims..., root (a send: its byte count), reduce op
LENGTH = 6 + MAX_DIMS
NONE = -1


class MismatchError(RuntimeError):
    """The ranks of a group called different collectives, or passed mismatched tensors."""


def fingerprint_values(op: str, t: torch.Tensor | None = None, root: int = NONE,
                       reduce_op: int = NONE) -> list[int]:
    """The fingerprint as numbers (what :func:`fingerprint` holds)."""
    f = [NONE] * LENGTH
    f[0] = OPS.index(op)
    f[4 + MAX_DIMS] = root
    f[5 + MAX_DIMS] = reduce_op
    if t is not None:
        f[1] = DTYPES.index(t.dtype) if t.dtype in DTYPES else len(DTYPES)
        f[2] = t.numel()
        f[3] = t.dim()
        for i, s in enumerate(t.shape[:MAX_DIMS]):
            f[4 + i] = s
    return f


def fingerprint(op: str, t: torch.Tensor | None = None, root: int = NONE,
                reduce_op: int = NONE) -> torch.Tensor:
    return torch.tensor(fingerprint_values(op, t, root, reduce_op), dtype=torch.int64)


def describe(row) -> str:
    """``float16[4, 8]`` from a fingerprint row."""
    r = [int(x) for x in row]
    if r[1] == NONE:
        return "no tensor"
    dtype = str(DTYPES[r[1]]).replace("torch.", "") if r[1] < len(DTYPES) else "other dtype"
    ndim = r[3]
    dims = r[4:4 + min(ndim, MAX_DIMS)]
    shape = ", ".join(map(str, dims)) + (", ..." if ndim > MAX_DIMS else "")
    return f"{dtype}[{shape}]"


def _op(row) -> str:
    i = int(row[0])
    return OPS[i] if 0 <= i < len(OPS) else f"collective #{i}"


def compare(rows: torch.Tensor, seq: int, root_name: str = "root") -> None:
    """Raise :class:`MismatchError` unless every rank's fingerprint agrees (``rows``: one
    fingerprint per rank, in rank order)."""
    ref = rows[0]
    if bool((rows == ref).all()):
        return
    ops = [_op(r) for r in rows]
    where = f"collective #{seq} of this group"
    if len(set(ops)) > 1:
        sides = ", ".join(f"rank {i} called {o}" for i, o in enumerate(ops))
        raise MismatchError(f"rbln-ccl: the ranks called different collectives ({where}): "
                            f"{sides}. Every rank of a group must issue the same collectives "
                            "in the same order.")
    op = ops[0]
    dt_numel = rows[:, 1:3]
    if not bool((dt_numel == dt_numel[0]).all()):
        sides = ", ".join(f"rank {i} passed {describe(r)}" for i, r in enumerate(rows))
        raise MismatchError(f"rbln-ccl {op}: the ranks passed tensors of different dtypes or "
                            f"sizes ({where}): {sides}. Every rank must pass the same dtype and "
                            "number of elements.")
    roots = rows[:, 4 + MAX_DIMS]
    if not bool((roots == roots[0]).all()):
        sides = ", ".join(f"rank {i}: {root_name}={int(r)}" for i, r in enumerate(roots))
        raise MismatchError(f"rbln-ccl {op}: the ranks named different {root_name} ranks "
                            f"({where}): {sides}.")
    ops_r = rows[:, 5 + MAX_DIMS]
    if not bool((ops_r == ops_r[0]).all()):
        sides = ", ".join(f"rank {i}: op={int(r)}" for i, r in enumerate(ops_r))
        raise MismatchError(f"rbln-ccl {op}: the ranks asked for different reduce ops "
                            f"({where}): {sides}.")
    # equal dtype and element count but different shapes: the transport only needs the former


def compare_p2p(expected: torch.Tensor, got: torch.Tensor, src: int, me: int) -> None:
    """The receiver's check of a sender's fingerprint."""
    if int(got[0]) != OPS.index("send"):
        raise MismatchError(f"rbln-ccl recv on rank {me}: rank {src} did not send (it called "
                            f"{_op(got)}); send/recv must pair up in the same order on both "
                            "ranks.")
    if int(got[1]) != int(expected[1]) or int(got[2]) != int(expected[2]):
        raise MismatchError(f"rbln-ccl recv on rank {me}: rank {src} sent {describe(got)} but "
                            f"the receiving tensor is {describe(expected)}; send and recv must "
                            "use the same dtype and number of elements.")
