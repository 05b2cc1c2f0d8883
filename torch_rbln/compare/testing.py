"""Test only: make one device op compute a wrong result, to see compare find it.

``with fault("aten::silu", nth=2, amount=0.5):`` sets ``TORCH_RBLN_TEST_FAULT``
(``runtime/faults.py``) for the block, with the program caches dropped on the way in and out
so the op's programs are compiled with the fault inside it and without it after. A child
process started inside the block inherits the variable (the minifier's launcher does). Never
use it outside tests and demonstrations: the results are wrong on purpose.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..runtime import faults

VAR = "TORCH_RBLN_TEST_FAULT"


def spec(op: str, nth: int | None = None, amount: float = 1.0, where: str = "both") -> str:
    """The variable's value for this fault."""
    return ("" if where == "both" else f"{where}:") + op + (f"@{nth}" if nth else "") + (
        f"+{amount:g}" if amount != 1.0 else "")


@contextlib.contextmanager
def fault(op: str, nth: int | None = None, amount: float = 1.0, where: str = "both"):
    """Within the block, device op ``op`` (``aten::silu``, or ``aten::mul.Tensor``) adds
    ``amount`` to each element of its result: in eager programs (only its ``nth`` run from the
    block's start when given) and in graphs compiled inside the block, or only ``where``
    (``"eager"``, ``"graph"``)."""
    if where not in ("both", "eager", "graph"):
        raise ValueError(f"where={where!r}: one of 'both', 'eager', 'graph'")
    before = os.environ.get(VAR)
    os.environ[VAR] = spec(op, nth, amount, where)
    faults.release()
    torch.rbln.empty_cache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VAR, None)
        else:
            os.environ[VAR] = before
        torch.rbln.empty_cache()
        faults.release()
