"""Registration: PrivateUse1 becomes ``rbln``, ``torch.rbln`` the device module, and every
dispatch route (views, copies, factories, device ops, the boxed CPU fallback) is registered."""

from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

_libs: list = []


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        from .runtime import devices
        return devices.count() > 0

    def has_primary_context(self, dev_id) -> bool:
        from .runtime import devices
        return devices.is_committed()

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def setup() -> None:
    from . import api, config, log
    from .dispatch import checks, copy, device_op, factories, fallback, views

    log.setup()
    checks.configure()
    fallback.configure()
    _setup_privateuseone_for_python_backend("rbln", backend_module=api, hook=_Hooks(),
                                            device_guard=_Guard())
    aten = torch.library.Library("aten", "IMPL")
    _libs.append(aten)
    for table in (views.kernels(), factories.KERNELS, copy.KERNELS, device_op.kernels()):
        for name, fn in table.items():
            aten.impl(name, fn, "PrivateUse1")
    catch_all = torch.library.Library("_", "IMPL")
    _libs.append(catch_all)
    catch_all.fallback(fallback.boxed_fallback, "PrivateUse1")
    _patch_storage_to()
    _patch_module_apply()
    # backward on rbln:1+ needs single-threaded autograd (the Python device guard reports one
    # device); see README "Several devices"
    del config


def _patch_storage_to() -> None:
    """``UntypedStorage.to("rbln")`` (used by ``torch.load``) would allocate through the C++
    PrivateUse1 allocator, which a Python backend cannot provide: route it through our
    ``empty`` kernel instead."""
    import torch._utils
    import torch.storage
    orig = torch._utils._to

    def _to(self, device, non_blocking=False):
        if device.type == "rbln" and self.device != device:
            st = torch.empty(self.nbytes(), dtype=torch.uint8, device=device).untyped_storage()
            st.copy_(self, non_blocking)
            return st
        return orig(self, device, non_blocking)

    _to.__wrapped__ = orig
    torch._utils._to = _to
    torch.storage._to = _to


def _patch_module_apply() -> None:
    """Keep tied parameters tied when modules move to or from rbln.

    PyTorch moves a parameter in place (``param.data = new``, same object) only between
    backends whose TensorImpls it knows to be interchangeable (CPU, CUDA, ...), not
    PrivateUse1; otherwise each module gets a fresh Parameter, which unties shared weights.
    After the outermost ``Module._apply`` (``to``, ``cpu``, ``half``, ...), every module slot that
    held one shared parameter points at one object again, as a move to CUDA leaves them."""
    import threading
    orig_apply = torch.nn.Module._apply
    tls = threading.local()

    def _apply(self, fn, recurse=True):
        if getattr(tls, "busy", False):
            return orig_apply(self, fn, recurse)
        shared: dict[int, list] = {}
        for mod in self.modules():
            for name, p in mod._parameters.items():
                if p is not None:
                    shared.setdefault(id(p), []).append((mod, name))
        tls.busy = True
        try:
            out = orig_apply(self, fn, recurse)
        finally:
            tls.busy = False
        for slots in shared.values():
            if len(slots) > 1:
                first = slots[0][0]._parameters[slots[0][1]]
                for mod, name in slots[1:]:
                    mod._parameters[name] = first
        return out

    torch.nn.Module._apply = _apply
