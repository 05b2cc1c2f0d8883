"""Call-site capture for ``explain(with_stack=True)``.

A listener on the event stream, attached only while such a region is open (so a plain region
and code outside regions pay nothing). The first time an op falls back or compiles, the
first time each bounce site fires and each recompile cause is seen, it records the user's call site: the innermost user frames
(``user_frames.py``).
"""

from __future__ import annotations

from ..user_frames import call_site

# event kinds whose key gets a call site (op names for the first two, bounce site keys, and
# each distinct recompile cause)
TRACED = frozenset(("cpu_fallback", "recompile", "bounce", "recompile_cause"))
DEPTH = 3   # user frames per site, innermost first


class Recorder:
    """Collects the first call site per op / bounce site while attached to the stream."""

    def __init__(self):
        self.sites: dict[str, str] = {}

    def __call__(self, kind: str, key: str, amount: int) -> None:
        if kind in TRACED and key not in self.sites:
            site = call_site(DEPTH)
            if site is not None:
                self.sites.setdefault(key, site)
