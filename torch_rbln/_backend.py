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
    from . import api, log
    from .dispatch import checks, copy, device_op, factories, fallback, native, special, views
    from .runtime import compiler

    log.setup()
    checks.configure()
    fallback.configure()
    _setup_privateuseone_for_python_backend("rbln", backend_module=api, hook=_Hooks(),
                                            device_guard=_Guard())
    aten = torch.library.Library("aten", "IMPL")
    _libs.append(aten)
    for table in (views.kernels(), factories.KERNELS, copy.KERNELS, device_op.kernels(),
                  native.KERNELS, special.KERNELS, fallback.host_kernels()):
        for name, fn in table.items():
            aten.impl(name, fn, "PrivateUse1")
    for name, fn in special.AUTOGRAD_KERNELS.items():
        aten.impl(name, fn, "AutogradPrivateUse1")
    compiler.install_dynamo_reset_hook()
    catch_all = torch.library.Library("_", "IMPL")
    _libs.append(catch_all)
    catch_all.fallback(fallback.boxed_fallback, "PrivateUse1")
    _patch_storage_new()
    _patch_module_apply()
    _patch_accelerator()
    # backward on rbln:1+ needs single-threaded autograd (the Python device guard reports one
    # device); see backward.py and README "Backward on rbln:1 and up"
    from . import backward
    backward.install()
    from . import distributed
    distributed.register()      # torch.distributed: the rbln-ccl backend, rbln tensors on gloo


def _patch_storage_new() -> None:
    """``torch.UntypedStorage(n, device="rbln")`` (behind ``storage.clone()``, ``deepcopy``,
    ``storage.to("rbln")`` and ``torch.load``) would allocate through the C++ PrivateUse1
    allocator, which a Python backend cannot provide: serve it from our ``empty`` kernel."""
    cls = torch.UntypedStorage
    orig_new = cls.__new__

    def __new__(klass, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "rbln":
            if len(args) != 1 or not isinstance(args[0], int) or kwargs:
                raise TypeError("an rbln UntypedStorage can only be created by size: "
                                "torch.UntypedStorage(nbytes, device='rbln')")
            return torch.empty(args[0], dtype=torch.uint8, device=device).untyped_storage()
        if device is not None:
            kwargs["device"] = device
        return orig_new(klass, *args, **kwargs)

    cls.__new__ = __new__


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


def _patch_accelerator() -> None:
    """``torch.accelerator`` routes memory statistics and synchronize through C++ hooks a Python
    backend cannot install; for rbln, answer them from ``torch.rbln``."""
    import collections
    import torch.accelerator as acc
    import torch.accelerator.memory as accmem
    from . import api

    def _is_rbln(device_index) -> bool:
        if isinstance(device_index, (str, torch.device)):
            return torch.device(device_index).type == "rbln"
        cur = torch.accelerator.current_accelerator()
        return cur is not None and cur.type == "rbln"

    def _idx(device_index):
        if isinstance(device_index, (str, torch.device)):
            d = torch.device(device_index)
            return d.index
        return device_index

    def _wrap(name, ours):
        orig = getattr(acc, name)

        def fn(device_index=None, /):
            if _is_rbln(device_index):
                return ours(_idx(device_index))
            return orig(device_index)

        fn.__doc__ = orig.__doc__
        fn.__name__ = name
        setattr(acc, name, fn)
        if hasattr(accmem, name):
            setattr(accmem, name, fn)

    def memory_stats(idx):
        s = api.memory_stats(idx)
        out = collections.OrderedDict()
        for ours, theirs in (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"),
                             ("active", "active_bytes")):
            out[f"{theirs}.all.current"] = s.get(f"{ours}.current", 0)
            out[f"{theirs}.all.peak"] = s.get(f"{ours}.peak", 0)
            out[f"{theirs}.all.allocated"] = s.get(f"{ours}.total_allocated", 0)
            out[f"{theirs}.all.freed"] = s.get(f"{ours}.total_freed", 0)
        out["inactive_split_bytes.all.current"] = s.get("cached.current", 0)
        out["num_alloc_retries"] = s.get("num_alloc_retries", 0)
        out["num_ooms"] = s.get("num_ooms", 0)
        out["num_device_alloc"] = s.get("num_device_alloc", 0)
        out["num_device_free"] = s.get("num_device_free", 0)
        return out

    _wrap("memory_stats", memory_stats)
    _wrap("empty_cache", lambda idx: api.empty_cache(idx))
    _wrap("reset_peak_memory_stats", lambda idx: api.reset_peak_memory_stats(idx))
    _wrap("reset_accumulated_memory_stats", lambda idx: api.reset_accumulated_memory_stats(idx))
    _wrap("get_memory_info", lambda idx: api.mem_get_info(idx))
    _wrap("synchronize", lambda idx: api.synchronize(idx))
