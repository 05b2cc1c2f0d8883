"""The ABI handshake: does the installed torch give the backend every private hook it uses?

The backend is pure Python on torch's *private* extension points (the Python PrivateUse1 hooks,
dispatcher redispatch, DLPack and storage constructors). They carry no compatibility promise,
so the backend pins ``torch==2.13.0`` and lists every private name it touches here, in one
place. The handshake checks three things, the way the reference checks ``librbln.so``:

1. torch is the pinned version;
2. every hook in :data:`HOOKS` resolves on it;
3. the virtual NPU runtime's ABI window (``runtime.devices.RUNTIME_ABI_MIN_SUPPORTED ..
   RUNTIME_ABI_CURRENT``) accepts :data:`BUILT_ABI`, the runtime interface this backend was
   written against.

``check()`` runs when the extension loads, before anything is registered, and raises
``ImportError("RBLN ABI mismatch: ...")`` on failure; ``python -m torch_rbln.diagnose`` prints
the same verdict. ``TORCH_RBLN_SKIP_ABI_CHECK`` skips the import-time check only.

Nothing here imports torch at module level: diagnose uses it where ``import torch`` fails.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

__all__ = ["BUILT_ABI", "TORCH_VERSION", "HOOKS", "Hook", "Result", "handshake", "check"]

# Runtime interface (storage Buffer / arena / DLPack device encoding) this backend targets.
# Bump together with the runtime window when that interface changes incompatibly.
BUILT_ABI = 1
TORCH_VERSION = "2.13.0"


@dataclass(frozen=True)
class Hook:
    path: str              # dotted attribute path starting at ``torch``
    used_for: str
    at_import: bool = True  # False: only needed later (e.g. graph mode); diagnose still checks it


HOOKS: tuple[Hook, ...] = (
    # registration (_backend.py)
    Hook("torch.utils.backend_registration._setup_privateuseone_for_python_backend",
         "register rbln as a Python PrivateUse1 backend"),
    Hook("torch.utils.rename_privateuse1_backend", "rename PrivateUse1 to rbln"),
    Hook("torch.utils.generate_methods_for_privateuse1_backend", "Tensor.rbln() and friends"),
    Hook("torch._register_device_module", "make torch.rbln the device module"),
    Hook("torch._C._acc.register_python_privateuseone_hook", "PrivateUse1 hooks from Python"),
    Hook("torch._C._acc.register_python_privateuseone_device_guard", "device guard from Python"),
    Hook("torch._C._acc.PrivateUse1Hooks", "base class of the backend hooks"),
    Hook("torch._C._acc.DeviceGuard", "base class of the device guard"),
    Hook("torch._C._autograd.DeviceType.PrivateUse1", "device type reported by the guard"),
    Hook("torch.library.Library.impl", "per-op PrivateUse1 kernels"),
    Hook("torch.library.Library.fallback", "the boxed CPU fallback"),
    # dispatch (dispatch/*)
    Hook("torch._C.DispatchKeySet", "redispatch below PrivateUse1 to the CPU key"),
    Hook("torch._C.DispatchKey.CPU", "redispatch below PrivateUse1 to the CPU key"),
    Hook("torch._ops.OpOverload.redispatch", "view/metadata ops on rbln tensors (set_, ...)"),
    Hook("torch._ops.OpOverload._handle", "boxed redispatch handle of an operator"),
    Hook("torch.ops.aten.as_strided.default._handle", "views of fallback outputs"),
    Hook("torch._C._DispatchOperatorHandle.redispatch_boxed", "boxed redispatch of view ops"),
    Hook("torch._C._len_torch_dispatch_stack", "dispatch-mode pre-dispatch check"),
    Hook("torch._C.TensorType", "reading operator schemas in the CPU fallback"),
    Hook("torch._C._AutoDispatchBelowAutograd", "device kernels that bypass autograd"),
    Hook("torch._C._InferenceMode", "cached host/device views made outside inference mode"),
    Hook("torch.nn.Module._apply", "Module.to(rbln) keeps tied parameters tied"),
    Hook("torch.UntypedStorage.__new__", "UntypedStorage(n, device=rbln): clone, deepcopy, torch.load"),
    Hook("torch.utils._python_dispatch.TorchDispatchMode", "op lowering in the compiler"),
    Hook("torch._decomp.decomposition_table", "op lowering in the compiler"),
    # runtime (runtime/storage.py)
    Hook("torch._C._construct_storage_from_data_pointer", "host/device aliases of rbln memory"),
    Hook("torch._C._to_dlpack", "rbln tensors on any device index (DLPack route)"),
    Hook("torch._C._from_dlpack", "rbln tensors on any device index (DLPack route)"),
    # graph mode (graph/backend.py): needed by the first torch.compile(backend="rbln")
    Hook("torch._C._dispatch_has_kernel_for_dispatch_key", "graph partitioning", at_import=False),
    Hook("torch._guards.detect_fake_mode", "graph-mode example inputs", at_import=False),
    Hook("torch._guards.tracing", "graph-mode compile of a subgraph", at_import=False),
    Hook("torch._guards.TracingContext", "graph-mode compile of a subgraph", at_import=False),
    Hook("torch._guards.CompileContext.current_compile_id", "graph-mode program names",
         at_import=False),
    Hook("torch._dynamo.backends.common.aot_autograd", "graph-mode training", at_import=False),
    Hook("torch._dynamo.reset", "dropping the program cache", at_import=False),
    Hook("torch._higher_order_ops.auto_functionalize.auto_functionalized",
         "graph-mode: mutating operators with their own rbln kernel", at_import=False),
    Hook("torch._higher_order_ops.auto_functionalize.auto_functionalized_v2",
         "graph-mode: mutating operators with their own rbln kernel", at_import=False),
    Hook("torch._inductor.compile_fx.compile_fx", "graph-mode kernels", at_import=False),
    # autograd on several devices (backward.py)
    Hook("torch.autograd.variable.Variable._execution_engine", "backward on rbln:1 and up"),
    Hook("torch._C._set_multithreading_enabled", "backward on rbln:1 and up"),
    Hook("torch._C._is_multithreading_enabled", "backward on rbln:1 and up"),
)


@dataclass
class Result:
    ok: bool
    reasons: list[str] = field(default_factory=list)
    missing: list[Hook] = field(default_factory=list)
    torch_version: str | None = None
    window: tuple[int, int] | None = None

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def verdict(self) -> str:
        return "OK" if self.ok else f"MISMATCH -- {self.reason}"


_MISSING = object()


def resolve(path: str, root=None):
    """The object at ``path`` (``torch.a.b``), importing submodules as needed; ``_MISSING`` if
    any step does not exist. ``root``: the torch module to start from (tests pass a stand-in)."""
    parts = path.split(".")
    obj = root if root is not None else sys.modules.get("torch")
    if obj is None:
        obj = importlib.import_module("torch")
    name = parts[0]
    for part in parts[1:]:
        name = f"{name}.{part}"
        nxt = getattr(obj, part, _MISSING)
        if nxt is _MISSING and root is None and isinstance(obj, type(sys)):
            try:  # a submodule that is not imported yet
                nxt = importlib.import_module(name)
            except ImportError:
                nxt = _MISSING
        if nxt is _MISSING:
            return _MISSING
        obj = nxt
    return obj


def runtime_window() -> tuple[int, int]:
    from .runtime import devices
    return devices.RUNTIME_ABI_MIN_SUPPORTED, devices.RUNTIME_ABI_CURRENT


def _window_reason(built: int, lo: int, hi: int) -> str | None:
    # the reference's three reasons, with the virtual NPU runtime in the place of librbln.so
    if lo > hi:
        return (f"the virtual NPU runtime reports an inconsistent ABI window: it accepts "
                f"consumers from {lo} but only implements {hi}, so its two ABI entry points "
                f"disagree")
    if built < lo:
        return (f"this torch-rbln was built against rebel ABI {built}, and the virtual NPU "
                f"runtime no longer accepts consumers below ABI {lo} (it implements {hi})")
    if built > hi:
        return (f"this torch-rbln was built against rebel ABI {built}, but the virtual NPU "
                f"runtime only implements ABI {hi} (accepting {lo} and up)")
    return None


def handshake(at_import: bool = False, torch_module=None) -> Result:
    """Run the checks on the imported torch (``torch_module`` overrides it, for tests).
    ``at_import``: only the hooks needed to load the extension."""
    torch = torch_module if torch_module is not None else importlib.import_module("torch")
    res = Result(ok=True, torch_version=getattr(torch, "__version__", None))
    base = (res.torch_version or "unknown").split("+", 1)[0]
    if base != TORCH_VERSION:
        res.reasons.append(f"torch {res.torch_version} is installed, but this torch-rbln "
                           f"needs torch=={TORCH_VERSION}")
    for hook in HOOKS:
        if at_import and not hook.at_import:
            continue
        if resolve(hook.path, torch_module) is _MISSING:
            res.missing.append(hook)
    if res.missing:
        res.reasons.append(f"torch lacks {len(res.missing)} private hook(s) the backend depends "
                           "on: " + ", ".join(h.path for h in res.missing))
    res.window = runtime_window()
    why = _window_reason(BUILT_ABI, *res.window)
    if why:
        res.reasons.append(why)
    res.ok = not res.reasons
    return res


def mismatch_message(res: Result) -> str:
    from . import __version__
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None) or "?"
    lo, hi = res.window or (None, None)
    return (f"RBLN ABI mismatch: {res.reason}\n"
            f"  runtime:        virtual NPU (accepts rebel ABI {lo}..{hi})\n"
            f"  torch-rbln:     {__version__} (built against rebel ABI {BUILT_ABI}, "
            f"torch=={TORCH_VERSION})\n"
            f"  torch:          {res.torch_version} ({where})\n"
            "Run `python -m torch_rbln.diagnose` for the full environment report.")


def check() -> str:
    """The import-time handshake: ``"ok"``, ``"skipped:disabled"``, or ``ImportError``."""
    from . import config
    if config.latched("TORCH_RBLN_SKIP_ABI_CHECK"):
        return "skipped:disabled"
    res = handshake(at_import=True)
    if not res.ok:
        raise ImportError(mismatch_message(res))
    return "ok"
