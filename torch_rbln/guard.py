"""``torch.rbln.guard``: a scope that raises (or logs) at the op doing what the scope forbids.

In the spirit of JAX's transfer guard: ``with torch.rbln.guard(fallback="disallow", d2h="log"):``
raises :class:`GuardError` at the first CPU fallback in the block, naming the op, the reason and
the user's line, and logs every device->host transfer. A listener on the event stream, attached
only while a guard is open; a guard covers the thread that opened it, and nested guards override
the signals they name. ``TORCH_RBLN_DISABLE_FALLBACK`` (process-wide, per fallback category) is
independent of it. docs/debugging.md ("torch.rbln.guard").
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from . import events
from .explain import fmt
from .log import logger
from .user_frames import call_site

POLICIES = ("allow", "log", "disallow")

# signal -> (event kind -> what happened), the events a guard watches
SIGNALS = {
    "fallback": {"cpu_fallback": "ran on the CPU", "host_op": "ran on the CPU"},
    "recompile": {"recompile": "compiled a program"},
    "d2h": {"d2h": "moved device->host"},
    "bounce": {"bounce": "went through host memory"},
}
_SIGNAL_OF = {kind: signal for signal, kinds in SIGNALS.items() for kind in kinds}

__all__ = ["guard", "GuardError"]


class GuardError(RuntimeError):
    """An op did what an enclosing ``torch.rbln.guard`` disallows."""


_local = threading.local()       # .scopes: [{signal: policy}], .reason: the last fallback reason
_open = 0
_open_lock = threading.Lock()


def _on_event(kind: str, key: str, amount: int) -> None:
    scopes = getattr(_local, "scopes", None)
    if not scopes:
        return
    if kind == "cpu_fallback_reason":     # recorded just before the op's `cpu_fallback`
        _local.reason = key
        return
    signal = _SIGNAL_OF.get(kind)
    if signal is None:
        return
    policy = next((s[signal] for s in reversed(scopes) if signal in s), "allow")
    if policy == "allow":
        return
    what = SIGNALS[signal][kind]
    if kind == "cpu_fallback":
        subject, why = f"`{key}`", getattr(_local, "reason", None)
        _local.reason = None
    elif kind == "host_op":
        subject, why = f"`{key}`", "no rbln kernel"
    elif kind == "d2h":
        subject, why = "data", f"{amount} bytes"
    elif kind == "bounce":
        subject, why = "a copy", key
    else:
        subject, why = f"`{key}`", "a new cache key"
    site = call_site(1)
    where = fmt.short_stack(site) if site else "an unknown line"
    text = f"{subject} {what} ({why}) at {where}"
    if policy == "log":
        logger.warning("torch.rbln.guard: %s", text)
        return
    raise GuardError(f"{text}, inside torch.rbln.guard({signal}=\"disallow\")")


@contextmanager
def guard(fallback: str | None = None, recompile: str | None = None, d2h: str | None = None,
          bounce: str | None = None):
    """Raise (``"disallow"``) or log (``"log"``) at each op in the block that falls back to the
    CPU, compiles a program, moves data device->host or bounces a copy through host memory;
    ``"allow"`` lifts an outer guard's rule, ``None`` keeps it."""
    given = {"fallback": fallback, "recompile": recompile, "d2h": d2h, "bounce": bounce}
    scope = {}
    for signal, policy in given.items():
        if policy is None:
            continue
        if policy not in POLICIES:
            raise ValueError(f"torch.rbln.guard({signal}={policy!r}): expected one of {POLICIES}")
        scope[signal] = policy
    global _open
    with _open_lock:
        if _open == 0:
            events.listen(_on_event)
        _open += 1
    scopes = getattr(_local, "scopes", None)
    if scopes is None:
        scopes = _local.scopes = []
    scopes.append(scope)
    try:
        yield
    finally:
        scopes.pop()
        with _open_lock:
            _open -= 1
            if _open == 0:
                events.unlisten(_on_event)
