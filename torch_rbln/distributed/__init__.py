"""``torch.distributed`` on rbln: the ``rbln-ccl`` backend, and rbln tensors on gloo.

``register()`` runs when the backend loads (``import torch``):

* ``rbln-ccl`` is registered as the reference does it,
  ``dist.Backend.register_backend("rbln-ccl", factory, extended_api=True,
  devices=["rbln", "cpu"])`` (an "already registered" error is ignored), so
  ``init_process_group(backend="rbln-ccl")`` creates a :class:`ProcessGroupRBLN`, and
  ``init_process_group()`` without a backend picks it for rbln like ``nccl`` for cuda;
* rbln tensors given to a C++ process group (gloo) are staged through host memory
  (``host_staged``), so DDP of an rbln module over gloo works like CUDA over gloo.

Layout: ``process_group`` (the group and its collectives), ``rendezvous`` (joining, NPU layout
checks), ``agreement`` (ranks agree on each collective), ``staging`` (which memory moves,
residency), ``work`` (the handle a collective returns), ``host_staged`` (C++ groups).
"""

from __future__ import annotations

import os

BACKEND = "rbln-ccl"

__all__ = ["BACKEND", "ProcessGroupRBLN", "register"]


def __getattr__(name):
    if name == "ProcessGroupRBLN":
        from .process_group import ProcessGroupRBLN
        return ProcessGroupRBLN
    raise AttributeError(name)


def _factory(opts, backend_options=None):
    # the reference's control-plane defaults; its control plane here is the c10d store
    from .. import config
    if config.parse("RBLN_FORCE_LOOPBACK_CONTROL_PLANE"):
        os.environ["RBLN_LOCAL_IP"] = os.environ["RBLN_ROOT_IP"] = "127.0.0.1"
    else:
        os.environ.setdefault("RBLN_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("RBLN_ROOT_IP", "127.0.0.1")
    from .process_group import create
    return create(opts, backend_options)


def register() -> None:
    import torch.distributed as dist
    if not dist.is_available():
        return
    try:
        dist.Backend.register_backend(BACKEND, _factory, extended_api=True,
                                      devices=["rbln", "cpu"])
    except (RuntimeError, ValueError) as e:
        if "already registered" not in str(e):
            raise
    from . import host_staged
    host_staged.install()
