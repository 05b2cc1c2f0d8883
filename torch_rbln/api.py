"""The ``torch.rbln`` namespace: device, streams and events, memory, RNG, explain, compare,
guard, compiled programs (docs/torch-rbln.md ("torch.rbln API"))."""

from .device_api import *  # noqa: F401,F403
from .device_api import (_exchange_device, _get_device_index, _is_compiled,  # noqa: F401
                         _lazy_init, _maybe_exchange_device)
from .memory import *  # noqa: F401,F403
from .npu_limits import *  # noqa: F401,F403
from .random import *  # noqa: F401,F403
from .random import _get_generator, _is_in_bad_fork  # noqa: F401
from .streams import *  # noqa: F401,F403
from .streams import _sleep  # noqa: F401


def __getattr__(name):
    if name == "_initialized":
        # read by torch.utils.checkpoint (and others) the way torch.cuda._initialized is: live,
        # since the runtime initializes itself on first use
        from .runtime import devices
        return devices.is_committed()
    if name == "default_generators":
        # a tuple in torch.cuda; read live here (the device count is known at first use)
        from .random import default_generators
        return default_generators()
    # the explain family and program capture load on first use (keeps `import torch` light)
    if name in ("explain", "explain_steady", "RBLNExplain", "RBLNDiff", "profile", "RBLNProfile"):
        from . import explain as _explain
        return getattr(_explain, name)
    if name in ("compare", "RBLNCompare"):
        from . import compare as _compare
        return getattr(_compare, name)
    if name in ("guard", "GuardError"):
        from . import guard as _guard
        return getattr(_guard, name)
    if name in ("capture_programs", "CompiledProgram", "InputSpec", "OutputSpec"):
        from .graph import programs as _programs
        return getattr(_programs, name)
    raise AttributeError(f"module 'torch.rbln' has no attribute '{name}'")
