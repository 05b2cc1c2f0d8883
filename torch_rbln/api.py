"""The ``torch.rbln`` namespace: device, streams and events, memory, RNG, explain, guard,
compiled programs (README "torch.rbln API")."""

from .device_api import *  # noqa: F401,F403
from .device_api import _get_device_index  # noqa: F401
from .memory import *  # noqa: F401,F403
from .random import *  # noqa: F401,F403
from .random import _is_in_bad_fork  # noqa: F401
from .streams import *  # noqa: F401,F403


def __getattr__(name):
    # the explain family and program capture load on first use (keeps `import torch` light)
    if name in ("explain", "explain_steady", "RBLNExplain", "RBLNDiff", "profile", "RBLNProfile"):
        from . import explain as _explain
        return getattr(_explain, name)
    if name in ("guard", "GuardError"):
        from . import guard as _guard
        return getattr(_guard, name)
    if name in ("capture_programs", "CompiledProgram", "InputSpec", "OutputSpec"):
        from .graph import programs as _programs
        return getattr(_programs, name)
    raise AttributeError(f"module 'torch.rbln' has no attribute '{name}'")
