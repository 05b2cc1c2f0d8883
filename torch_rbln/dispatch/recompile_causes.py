"""Why an op compiled again: its new cache key against the closest key it already has programs for.

Computed only on a compile of an op that already has programs (a warm hit never gets here), and
recorded on the event stream as one ``recompile_cause`` event per differing part, keyed
``op <TAB> argument <TAB> part <TAB> before <TAB> after``; explain, the INFO log and the pytest
plugin read them there. The key is the one ``device_op.py`` builds:
``(op, device index, argument signatures, keyword signatures)``, where a signature is

* a tensor:               ``(shape, dtype, is_contiguous, alias ordinal)``
* a CPU scalar operand:   ``("scalar", dtype, value, alias ordinal)`` -- its value is baked into
  the program (part ``baked value``)
* a Python value:         ``(type, value)``
* a list or tuple:        a tuple of signatures
* anything else:          the object itself (dtype, device) or its ``repr``.
"""

from __future__ import annotations

from .. import events

SEP = "\t"
# the closest key is searched among the op's most recent programs only, so a recompile in a
# loop that already made thousands of shapes costs a bounded diff, not one per program
RECENT = 64


def _is_tensor(s) -> bool:
    return (isinstance(s, tuple) and len(s) == 4 and isinstance(s[3], int)
            and not isinstance(s[0], type))


def _is_scalar(s) -> bool:
    return _is_tensor(s) and s[0] == "scalar"


def _is_value(s) -> bool:
    return isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], type)


def _label(s, where: str) -> str:
    if _is_scalar(s):
        return f"scalar operand {where}"
    if _is_tensor(s):
        return f"input {where}"
    return f"argument {where}"


def _kind(s) -> str:
    if _is_scalar(s):
        return "CPU scalar"
    if _is_tensor(s):
        return "tensor"
    if _is_value(s):
        return "None" if s[0] is type(None) else s[0].__name__
    if isinstance(s, tuple):
        return f"sequence of {len(s)}"
    return type(s).__name__


def _show(v) -> str:
    return str(tuple(v)) if isinstance(v, tuple) else str(v)


class _Walk:
    """Compares two signatures part by part; ``parts`` collects (argument, part, before, after).
    Alias ordinals are mapped to the argument that first held the tensor, per key."""

    def __init__(self):
        self.parts: list[tuple[str, str, str, str]] = []
        self.owner_a: dict[int, str] = {}
        self.owner_b: dict[int, str] = {}

    def _alias(self, ordinal: int, where: str, owners: dict[int, str]) -> str:
        first = owners.setdefault(ordinal, where)
        return "distinct" if first == where else f"same tensor as {first}"

    def sig(self, a, b, where: str) -> None:
        if _is_tensor(a) and _is_tensor(b) and _is_scalar(a) == _is_scalar(b):
            label = _label(b, where)
            alias_a = self._alias(a[3], label, self.owner_a)
            alias_b = self._alias(b[3], label, self.owner_b)
            if _is_scalar(b):
                if a[1] != b[1]:
                    self.parts.append((label, "dtype", str(a[1]), str(b[1])))
                if a[2] != b[2]:
                    self.parts.append((label, "baked value", str(a[2]), str(b[2])))
            else:
                sa, sb = tuple(a[0]), tuple(b[0])
                if len(sa) != len(sb):
                    self.parts.append((label, "shape", _show(sa), _show(sb)))
                else:
                    for d, (x, y) in enumerate(zip(sa, sb)):
                        if x != y:
                            self.parts.append((label, f"dim {d}", str(x), str(y)))
                if a[1] != b[1]:
                    self.parts.append((label, "dtype", str(a[1]), str(b[1])))
                if a[2] != b[2]:
                    show = {True: "contiguous", False: "non-contiguous"}
                    self.parts.append((label, "contiguity", show[a[2]], show[b[2]]))
            if alias_a != alias_b:
                self.parts.append((label, "alias", alias_a, alias_b))
            return
        if _is_value(a) and _is_value(b) and a[0] is b[0]:
            if a[1] != b[1]:
                self.parts.append((_label(b, where), "value", str(a[1]), str(b[1])))
            return
        if (isinstance(a, tuple) and isinstance(b, tuple) and not _is_tensor(a) and not _is_tensor(b)
                and not _is_value(a) and not _is_value(b) and len(a) == len(b)):
            for j, (x, y) in enumerate(zip(a, b)):
                self.sig(x, y, f"{where}[{j}]")
            return
        if a == b:
            return
        if _kind(a) != _kind(b):
            self.parts.append((_label(b, where), "kind", _kind(a), _kind(b)))
        else:
            self.parts.append((_label(b, where), "value", str(a), str(b)))


def diff(a, b) -> list[tuple[str, str, str, str]]:
    """What differs from key ``a`` to key ``b`` of the same op: (argument, part, before, after)."""
    w = _Walk()
    if a[1] != b[1]:
        w.parts.append(("device", "index", f"rbln:{a[1]}", f"rbln:{b[1]}"))
    args_a, args_b = a[2], b[2]
    if len(args_a) != len(args_b):
        w.parts.append(("arguments", "count", str(len(args_a)), str(len(args_b))))
    for i, (x, y) in enumerate(zip(args_a, args_b)):
        w.sig(x, y, str(i))
    kw_a, kw_b = dict(a[3]), dict(b[3])
    for name in list(kw_a) + [n for n in kw_b if n not in kw_a]:
        if name not in kw_b or name not in kw_a:
            w.parts.append((f"argument {name}", "kind", _kind(kw_a.get(name, (type(None), None))),
                            _kind(kw_b.get(name, (type(None), None)))))
        else:
            w.sig(kw_a[name], kw_b[name], name)
    return w.parts


# a different call form (a tensor where a scalar was, another rank, more arguments) is further
# away than a changed size or dtype: the closest key is the same call with other metadata
_FORM_PARTS = {"kind": 3, "shape": 3, "count": 3}


def _distance(parts) -> int:
    return sum(_FORM_PARTS.get(part, 1) for _, part, _, _ in parts)


def closest(key, earlier) -> list[tuple[str, str, str, str]]:
    """The differences from the closest of ``earlier`` (the fewest differing parts, a changed
    call form weighing more; the most recent on a tie) to ``key``. The caller passes the op's
    most recent :data:`RECENT` keys."""
    best, best_d = None, 0
    for k in reversed(earlier):
        parts = diff(k, key)
        d = _distance(parts)
        if best is None or d < best_d:
            best, best_d = parts, d
            if d <= 1:
                break
    return best or []


def record(op: str, key, earlier) -> None:
    """Record the cause of compiling ``key`` for ``op``, which already has programs for the keys
    ``earlier`` (oldest first)."""
    for argument, part, before, after in closest(key, earlier):
        events.record("recompile_cause", SEP.join((op, argument, part, before, after)))


def parse(event_key: str) -> tuple[str, str, str, str, str]:
    """``(op, argument, part, before, after)`` of a ``recompile_cause`` event key."""
    op, argument, part, before, after = event_key.split(SEP)
    return op, argument, part, before, after
