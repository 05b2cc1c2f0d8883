"""The `torch_rbln` logger and the CPU-fallback log.

The level comes from ``TORCH_RBLN_LOG_LEVEL`` (deprecated alias ``TORCH_RBLN_LOG``), read when
the extension loads. At INFO every op that ran on the CPU logs

    [2026-09-14 19:49:00.145][I] `aten::sin` op ran on CPU instead of RBLN

followed by ``UserWarning("TRACE")`` attributed to the user's own source line, so Python's
warning machinery prints ``file.py:N`` and the code line. The log is a listener on the event
stream; it keeps no counts of its own. docs/debugging.md ("CPU fallback").

An op compiled again for a new cache key logs what differs from its closest earlier program,
one line per differing part (``dispatch/recompile_causes.py``):

    [2026-09-14 19:49:00.150][I] `aten::mul.out` compiled again: input 0 dim 1: 16 -> 17
"""

from __future__ import annotations

import linecache
import logging
import os
import sys
import time
import warnings

from . import config, events
from .user_frames import first_user_frame

logger = logging.getLogger("torch_rbln")

_LETTER = {"DEBUG": "D", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "C"}


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        ms = int(record.msecs)
        return (f"[{time.strftime('%Y-%m-%d %H:%M:%S', t)}.{ms:03d}]"
                f"[{_LETTER.get(record.levelname, '?')}] {record.getMessage()}")


def setup() -> None:
    """Configure the logger from the environment (called once when the extension loads)."""
    level = config.log_level()
    logger.setLevel(getattr(logging, level))
    logger.propagate = False
    if not any(getattr(h, "_rbln", False) for h in logger.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(_Formatter())
        h._rbln = True
        logger.addHandler(h)
        path = config.latched("TORCH_RBLN_LOG_PATH")
        if path:
            try:
                fh = logging.FileHandler(path)
            except OSError as e:            # `import torch` still works; first use raises
                config.defer("TORCH_RBLN_LOG_PATH", config.EnvError(
                    f"Invalid TORCH_RBLN_LOG_PATH value `{path}` ({e.strerror or e}), expected "
                    f"a path to a file in a writable directory"))
            else:
                fh.setFormatter(_Formatter())
                fh._rbln = True
                logger.addHandler(fh)
    events.unlisten(_on_event)
    if logger.isEnabledFor(logging.INFO):
        events.listen(_on_event)


def _schema_name(op: str) -> str:
    # `aten::add.out` -> `aten::add`: the log names the operator, as the reference does
    ns, _, rest = op.partition("::")
    return f"{ns}::{rest.split('.', 1)[0]}" if rest else op


def _warn_trace() -> None:
    """``UserWarning("TRACE")`` attributed to the user's line, named relative to the working
    directory when it lies below it (``sin_demo.py:5``, as the reference prints it)."""
    f, _ = first_user_frame(sys._getframe(1))
    if f is None:
        warnings.warn("TRACE", UserWarning, stacklevel=2)
        return
    path = f.f_code.co_filename
    if os.path.isabs(path):
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    g = f.f_globals
    # Not ``module_globals=g``: warn_explicit then asks the module's loader for its source
    # unguarded, and under ``python -c`` that loader is BuiltinImporter, which raises.
    # linecache's lazy entry offers the same loader fallback with the errors caught.
    linecache.lazycache(path, g)
    warnings.warn_explicit("TRACE", UserWarning, path, f.f_lineno, module=g.get("__name__"),
                           registry=g.setdefault("__warningregistry__", {}))


def _on_event(kind: str, key: str, amount: int) -> None:
    if kind == "recompile_cause":
        op, argument, part, before, after = key.split("\t")
        logger.info("`%s` compiled again: %s %s: %s -> %s", op, argument, part, before, after)
        return
    if kind not in ("cpu_fallback", "host_op"):
        return
    logger.info("`%s` op ran on CPU instead of RBLN", _schema_name(key))
    # the TRACE warning is also written to the log at WARNING, like the reference
    logger.warning("TRACE")
    _warn_trace()
