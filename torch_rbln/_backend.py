"""Registration: PrivateUse1 becomes ``rbln``, ``torch.rbln`` the device module, and every
dispatch route (views, copies, factories, device ops, the boxed CPU fallback) is registered.
The layers it wires together: docs/architecture.md."""

from __future__ import annotations

import torch

_libs: list = []


def _native():
    """The native core (``torch_rbln._C``): the device guard, hooks, streams, generators and
    pinned memory, which PyTorch accepts from C++ only."""
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "torch-rbln's native core (torch_rbln._C) is missing or does not load: "
            f"{e}. It is built from source when the package is installed; reinstall it "
            "(`pip install -e .` in a checkout) with g++ and torch==2.13.0 available") from e
    return _C


def setup() -> None:
    from . import api, config, log, patches
    from .dispatch import (composites, copy, cuda_dtypes, data_movement, device_op, factories,
                           fallback, fused_optimizers, layouts, nested, paged_attention,
                           rnn_cells, rules, views)
    from .runtime import devices

    log.setup()
    rules.configure()
    fallback.configure()
    # importing the native core registers the C++ device guard and hooks for PrivateUse1
    devices.bind_native(_native())
    torch.utils.rename_privateuse1_backend("rbln")
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("rbln", api)
    aten = torch.library.Library("aten", "IMPL")
    _libs.append(aten)
    # the device ops the native warm path serves: it hands every call it does not take itself
    # to their Python kernels, registered on PrivateUse2 for that
    warm = device_op.register_warm_path()
    for name, fn in device_op.kernels().items():
        aten.impl(name, fn, "PrivateUse2" if name in warm else "PrivateUse1")
    views.register()
    paged_attention.register(_libs)
    # data movements served natively in their common case: their Python kernels take the rest
    # from PrivateUse2
    native = data_movement.register_native() | copy.register_native()
    for table in (factories.KERNELS, copy.KERNELS, data_movement.KERNELS,
                  composites.KERNELS, rnn_cells.KERNELS, fused_optimizers.KERNELS,
                  fallback.host_kernels(), cuda_dtypes.KERNELS):
        for name, fn in table.items():
            aten.impl(name, fn, "PrivateUse2" if name in native else "PrivateUse1")
    for name, fn in (*composites.AUTOGRAD_KERNELS.items(), *cuda_dtypes.KERNELS.items()):
        aten.impl(name, fn, "AutogradPrivateUse1")
    for name in copy.MATH_BIT_PASSTHROUGH:
        for key in ("Conjugate", "Negative"):
            aten.impl(name, torch.library.fallthrough_kernel, key)
    catch_all = torch.library.Library("_", "IMPL")
    _libs.append(catch_all)
    catch_all.fallback(fallback.boxed_fallback, "PrivateUse1")
    for key in layouts.KEYS:
        catch_all.fallback(layouts.fallback_for(key), key)
    # nested tensors: metadata ops and copies run PyTorch's nested kernels on the rbln tensor,
    # every other op the CPU's, through the same CPU fallback (dispatch/nested.py)
    for name, fn in nested.kernels(fallback.boxed_fallback).items():
        aten.impl(name, fn, "NestedTensorPrivateUse1")
    catch_all.fallback(fallback.boxed_fallback, "NestedTensorPrivateUse1")
    # torch.autocast("rbln"): CUDA's casting kernels, from C++ (amp.py)
    _native().register_autocast()
    patches.apply_all()
    from . import distributed
    distributed.register()      # torch.distributed: the rbln-ccl backend, rbln tensors on gloo
    from . import integrations
    integrations.install()      # transformers, accelerate, safetensors: when the user imports them
    if config.latched("TORCH_RBLN_EXPLAIN_AT_EXIT"):
        from .explain import whole_run
        whole_run.start()
