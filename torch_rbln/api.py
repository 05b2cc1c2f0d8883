"""The ``torch.rbln`` namespace: device, streams and events, memory, RNG, explain, compiled
programs (README "torch.rbln API")."""

from .device_api import *  # noqa: F401,F403
from .device_api import _get_device_index, _lazy_init  # noqa: F401
from .memory import *  # noqa: F401,F403
from .random import *  # noqa: F401,F403
from .random import _is_in_bad_fork  # noqa: F401
from .streams import *  # noqa: F401,F403


def __getattr__(name):
    if name == "_initialized":
        # read by torch.utils.checkpoint (and others) the way torch.cuda._initialized is: live,
        # since the runtime initializes itself on first use
        from .runtime import devices
        return devices.is_committed()
    # the explain family and program capture load on first use (keeps `import torch` light)
    if name in ("explain", "explain_steady", "RBLNExplain", "RBLNDiff", "profile", "RBLNProfile"):
        from . import explain as _explain
        return getattr(_explain, name)
    if name in ("capture_programs", "CompiledProgram", "InputSpec", "OutputSpec"):
        from .graph import programs as _programs
        return getattr(_programs, name)
    raise AttributeError(f"module 'torch.rbln' has no attribute '{name}'")
