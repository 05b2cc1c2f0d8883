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
    # backward on rbln:1+ needs single-threaded autograd (the Python device guard reports one
    # device); see README "Several devices"
    del config
