"""The NPU's numeric tolerances: how far an rbln result may be from its reference (data).

One table, read by three readers: docs/eager.md ("NPU numerics and tolerances") shows it
(:func:`markdown`; a test keeps the page equal to it), ``torch.rbln.compare`` takes its
per-dtype rows as the default tolerance of a device result against its golden, and the tests
compare device ops with the CPU under the same numbers. An element is within tolerance when
``|actual - reference| <= atol + rtol * |reference|`` (``torch.isclose``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    comparison: str            # what is compared, as the docs table names it
    atol: float
    rtol: float
    dtype: str = ""            # the result dtype the row is the default for ("" for none)
    note: str = ""


ROWS: tuple[Tolerance, ...] = (
    Tolerance("fp16 device op vs CPU fp16", 1e-2, 1e-2, "float16", "single-kernel ops are exact"),
    Tolerance("bf16 device op vs CPU bf16", 5e-2, 5e-2, "bfloat16"),
    Tolerance("fp16 SDPA vs fp32 reference", 2e-3, 2e-3),
    Tolerance("fp32 (runs on the host)", 1e-4, 1e-4, "float32"),
    Tolerance("fp64 (runs on the host)", 1e-7, 1e-7, "float64"),
    Tolerance("Llama logits (fp16, 2 layers)", 1e-2, 1e-2, note="greedy tokens identical"),
)

# result dtype -> (atol, rtol): the rows that are a dtype's default
BY_DTYPE: dict[torch.dtype, tuple[float, float]] = {
    getattr(torch, r.dtype): (r.atol, r.rtol) for r in ROWS if r.dtype}


def for_dtype(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` of a result of ``dtype`` (a floating dtype of the table)."""
    try:
        return BY_DTYPE[dtype]
    except KeyError:
        raise KeyError(f"no tolerance for {dtype}: the table has "
                       f"{', '.join(str(d) for d in BY_DTYPE)}") from None


def _num(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-")


def markdown() -> str:
    """The table as docs/eager.md shows it."""
    lines = ["| comparison | tolerance used in the tests |", "|---|---|"]
    for r in ROWS:
        note = f"; {r.note}" if r.note and not r.dtype else f" ({r.note})" if r.note else ""
        lines.append(f"| {r.comparison} | atol {_num(r.atol)}, rtol {_num(r.rtol)}{note} |")
    return "\n".join(lines)
