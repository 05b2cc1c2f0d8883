"""The explain report of a whole run, printed when the process exits.

Started by ``python -m torch_rbln.explain SCRIPT`` (``__main__.py``) or, for a program started
any other way, by ``TORCH_RBLN_EXPLAIN_AT_EXIT=1`` when the backend loads. The region is not
exclusive, so the program's own ``explain()`` regions still work. Under torchrun each worker
reports its own run, its rank in the header. The report goes to stderr, so the program's own
output stays as it was.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

from . import report
from .region import RBLNExplain

# the report's hints, as they read for a run that has no region object to call
_HINTS = {report.WHERE_HINT: "  where? -> rerun with python -m torch_rbln.explain --with-stack",
          report.FOOTER: "  (raw: python -m torch_rbln.explain --json PATH)"}

_region: RBLNExplain | None = None
_json_path: str | None = None


def rank_label() -> str | None:
    """``rank R/W`` under torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None:
        return None
    return f"rank {rank}/{world}" if world else f"rank {rank}"


def start(with_stack: bool = False, json_path: str | None = None, what: str | None = None) -> None:
    """Open the whole-run region (once per process) and report it at exit."""
    global _region, _json_path
    if _region is not None:
        return
    label = ", ".join(p for p in (f"whole run{': ' + what if what else ''}", rank_label()) if p)
    _region = RBLNExplain(with_stack, exclusive=False, label=label).start()
    _json_path = json_path
    atexit.register(finish)


def finish() -> None:
    """Close the region, print its report to stderr and write ``dump()`` where asked; once."""
    global _region
    region, _region = _region, None
    if region is None:
        return
    atexit.unregister(finish)
    region.stop()
    sys.stdout.flush()
    text = "\n".join(_HINTS.get(line, line) for line in region.report().splitlines())
    print(text, file=sys.stderr, flush=True)
    if _json_path:
        with open(_json_path, "w") as f:
            json.dump(region.dump(), f, indent=1, default=str)
