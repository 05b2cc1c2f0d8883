"""The RBLN compiler's op table: what graph mode (``torch.compile(backend="rbln")``) runs where.

This is data, beside the eager table (``optable.py``): the vendor's "Supported OPs - PyTorch"
table (v0.12.0, columns *Supported* / *Accelerated*), as condensed in the reference
(``rbln-pytorch-spec.md`` §6.4). Each row keeps its source. Graph placement
(``graph/placement.py``) reads it; eager dispatch does not (eager keeps its own table).

Fields of :class:`Row`:

* ``name``        the table's row, a public torch name (``torch.cumsum``)
* ``aten``        the aten overload packets a traced graph shows for it (our mapping: the table
  names public functions, a graph holds aten ops)
* ``accelerated`` the *Accelerated* column: the node runs in a device partition. ``False``:
  *Supported* only; the node stays inside the compiled program, on the host side of it (no
  partition of its own, no transfer around it)
* ``condition``   a row's note restricting acceleration (``"last-dim-64"``: cumsum's "when input
  last dim is multiple of 64"); when it fails, the row is *Supported* only
* ``source``      where the row comes from

What the reference does not say, and what placement does then:

* **Rows after ``torch.full_like``** (alphabetically) were not retrieved for v0.12.0
  (:data:`RETRIEVED_THROUGH`). An op without a row keeps the eager placement rules (the eager
  device table and its checks), except the 64-alignment rule, which the compiler handles by
  padding (:data:`LAST_DIM`). ``torch.mul``, ``torch.sub``, ``torch.rsqrt``, ``torch.sin``,
  ``torch.sum`` ... are in that range: eager device ops stay device nodes, the others host nodes.
* **dtypes**: the table has no dtype column, and the reference does not say how the compiler
  treats fp32 in a graph. Graph mode keeps the eager dtype rule (:data:`DTYPE_RULE`): an op
  whose operands are not one dispatch dtype (fp16/bf16) is a host node, with the eager reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Row:
    name: str
    aten: tuple
    accelerated: bool
    condition: str = ""
    source: str = ""


# the reference's provenance of each block of rows (spec §6.4)
V0_12 = "v0.12.0 supported_ops_pytorch (spec 6.4)"
LATER = "unversioned and v0.7.4 pages of the same table (spec 6.4)"
RETRIEVED_THROUGH = "torch.full_like"

# the eager dtype rule is kept in graphs: the reference has no dtype column for the compiler
DTYPE_RULE = "eager (spec 6.4 gives no dtype column; 3.2's fp16/bf16 rule kept)"
# the compiler pads an unaligned last dim on the device (spec 6.4, the op-adding guide) instead
# of the eager 64-rule's CPU route: counted once per partition boundary, not per op
LAST_DIM = "padded at the partition boundary (spec 6.4: graph mode pads unaligned last dims)"


def _acc(name, *aten, source=V0_12, condition=""):
    return Row(f"torch.{name}", aten or (name,), True, condition, source)


def _sup(name, *aten, source=V0_12):
    return Row(f"torch.{name}", aten or (name,), False, "", source)


ROWS: tuple[Row, ...] = (
    _acc("abs"), _sup("acos"), _acc("add"), _acc("addcdiv"), _acc("addcmul"), _acc("addmm"),
    _acc("amax"), _acc("amin"), _acc("arange"), _sup("argmax"), _sup("argmin"),
    _sup("argsort", "argsort", "sort"),     # torch.argsort traces as aten.sort (indices)
    _acc("as_tensor", "lift_fresh_copy"), _sup("asin"), _sup("atan"), _acc("baddbmm"),
    _sup("bitwise_and"), _sup("bitwise_not"), _sup("bitwise_xor"), _acc("bmm"),
    _acc("broadcast_shapes", "expand"), _acc("broadcast_tensors", "expand"),
    _acc("broadcast_to", "expand"), _sup("bucketize"), _acc("cat"), _acc("ceil"),
    _acc("chunk", "split", "split_with_sizes"),
    # torch.clamp with one bound traces as clamp_min / clamp_max
    _acc("clamp", "clamp", "clamp_min", "clamp_max"), _acc("clone"), _acc("cos"),
    _sup("cosh"), _acc("cross", "linalg_cross"),
    _acc("cumsum", condition="last-dim-64"), _acc("div"), _acc("dot"),
    _acc("empty", "empty", "empty_strided"), _acc("empty_like"), _acc("eq"), _sup("erf"),
    _acc("exp"), _acc("flatten", "view", "_unsafe_view"),
    _acc("flip", source=LATER), _acc("floor", source=LATER), _sup("floor_divide", source=LATER),
    _sup("fmod", source=LATER), _acc("full", source=LATER), _acc("full_like", source=LATER),
)

BY_ATEN: dict[str, Row] = {a: r for r in ROWS for a in r.aten}

# Composite aten ops decomposed before placement (PyTorch's decomposition table), so that they
# reach the compiler as the primitives its table or the eager device table cover. Each has no
# row and no eager kernel of its own; the comment names what it becomes (a test checks that
# every op of each decomposition is covered). PyTorch's decompositions of most activations
# (relu, gelu, hardswish, leaky_relu ...) and of sigmoid/tanh backward compute in fp32 inside
# (type promotion): with the eager dtype rule kept in graphs they would be host nodes, so they
# are not listed.
DECOMPOSE = (
    "threshold_backward",       # le, where             (relu's backward)
    "rsub",                     # sub                   (``1 - x``)
    "native_dropout_backward",  # mul                   (the mask cast to the grad's dtype)
)


def decompositions() -> dict:
    """overload -> decomposition, from PyTorch's table, for the packets of :data:`DECOMPOSE`."""
    from torch._decomp import decomposition_table
    packets = {getattr(torch.ops.aten, n) for n in DECOMPOSE}
    return {op: fn for op, fn in decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload) and op.overloadpacket in packets}


def row_of(op: torch._ops.OpOverload) -> Row | None:
    """The compiler table's row for a traced aten overload, or None (no row, or not retrieved)."""
    return BY_ATEN.get(op.overloadpacket.__name__)


def accelerates(name: str) -> bool | None:
    """Does the compiler accelerate the op reported as ``name`` (``"aten::cos"``,
    ``"aten::mul.out"``)? True, False (a *Supported*-only row), or None (no row retrieved)."""
    packet = name.split("::", 1)[-1].split(".", 1)[0]
    r = BY_ATEN.get(packet)
    return None if r is None else r.accelerated


def describe(r: Row) -> str:
    """The row as reports quote it."""
    cols = "supported, accelerated" if r.accelerated else "supported, not accelerated"
    cond = " when the input's last dim is a multiple of 64" if r.condition == "last-dim-64" else ""
    return f"{r.name}: {cols}{cond}"
