"""Test only: a deliberate error in one op's device result (``TORCH_RBLN_TEST_FAULT``).

The tests of ``torch.rbln.compare`` and of the accuracy minifier need a device that computes
one op wrong, at a known place. The variable names the op (``aten::silu``, or one overload,
``aten::mul.Tensor``), optionally where (``eager:`` programs or ``graph:`` partitions only: the
minifier compares a compiled graph with eager, so its fault is in the graph alone), its Nth
eager run (``@3``) and the amount added to each element of its result (``+0.5``; default 1).
It is read where programs are built, never on a warm call: an eager program compiled for the op
while it is set adds the amount to its result (``compiler.compile_op``), a device partition of
a compiled graph gets an ``add`` after each node of the op (``graph/rewrite.py``). While such a program exists every op takes its Python
kernel: an acting listener on the event stream keeps the native warm path, which computes the
op itself, out of the way. Unset the variable and drop the programs
(``torch.rbln.empty_cache()``) to end it; ``torch_rbln.compare.testing.fault`` does both.
"""

from __future__ import annotations

import torch

from .. import config, events

_runs: dict[tuple, int] = {}     # fault -> runs of its faulty programs so far
_held = False                    # the acting listener is attached


def _hold(kind: str, key: str, amount: int) -> None:
    """The acting listener: it reads nothing; attached, every op takes its Python kernel."""


def spec(where: str) -> tuple | None:
    """``(op, nth or None, amount)`` of the fault set now for ``where`` (``eager`` programs or
    ``graph`` partitions), or None."""
    fault = config.live("TORCH_RBLN_TEST_FAULT")
    if fault is None or fault[0] not in (where, "both"):
        return None
    return fault[1:]


def matches(op: str, name: str) -> bool:
    """Does the fault's ``op`` (``aten::mul`` or ``aten::mul.Tensor``) name ``name``?"""
    return name == op or ("." not in op and name.split(".", 1)[0] == op)


def _perturbed(out, amount: float):
    if isinstance(out, torch.Tensor):
        if not out.is_floating_point():
            return out
        res = out.clone()           # the program's output may be an operand's memory
        res.add_(amount)
        return res
    if isinstance(out, (tuple, list)):      # the first floating output
        outs = list(out)
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                outs[i] = _perturbed(o, amount)
                return type(out)(outs)
    return out


def wrap(op_name: str, run):
    """``run`` (a program's callable for ``op_name``), with the fault set now if it names the
    op. Called once per compile."""
    fault = spec("eager")
    if fault is None or not matches(fault[0], op_name):
        return run
    _hold_python_path()
    _, nth, amount = fault

    def faulty(*args, **kwargs):
        out = run(*args, **kwargs)
        n = _runs[fault] = _runs.get(fault, 0) + 1
        return out if nth is not None and n != nth else _perturbed(out, amount)

    faulty.widened = getattr(run, "widened", False)
    faulty.packed = getattr(run, "packed", False)
    return faulty


def _hold_python_path() -> None:
    global _held
    if not _held:
        events.listen(_hold)
        _held = True


def release() -> None:
    """Detach the acting listener and forget the run counts (the fault's end)."""
    global _held
    if _held:
        events.unlisten(_hold)
        _held = False
    _runs.clear()
