"""``torch.rbln.explain``: what the backend did in a region that the user did not ask for.

Not a timing profiler. A region counts hidden host overhead -- CPU fallbacks, compiles, host
round trips of copies, slow device copies -- from the one event stream (``torch_rbln.events``),
names the cause and the change to make, and renders it as a table. docs/debugging.md ("torch.rbln.explain").
"""

from .diff import RBLNDiff
from .region import RBLNExplain, explain, explain_steady

profile = explain            # earlier name, kept for old scripts
RBLNProfile = RBLNExplain

__all__ = ["explain", "explain_steady", "RBLNExplain", "RBLNDiff", "profile", "RBLNProfile"]
