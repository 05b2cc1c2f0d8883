"""rbln tensors on a C++ process group (gloo): staged through host memory, as CUDA tensors are.

PyTorch routes a collective of a C++ process group through the ``c10d::*`` operators, whose
kernel for a PrivateUse1 tensor asks the group for an ``rbln`` backend; gloo has none, so
``init_process_group("gloo")`` followed by DDP of an rbln module stopped with "No backend type
associated with device type rbln". These kernels replace PyTorch's PrivateUse1 ones: each rbln
tensor becomes a CPU tensor over its host memory (a physical ``d2h`` first when the device holds
the latest data; results leave the tensor host-latest), and the operator is re-dispatched to
its CPU kernel, which hands the CPU tensors to the group's CPU backend. Each call records a
``collective`` event (where: ``host``).

``rbln-ccl`` groups never come here: they are Python process groups and PyTorch calls their
methods directly.
"""

from __future__ import annotations

import warnings

import torch

from . import staging
from .staging import HOST, INOUT, READ, WRITE, Staging

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# c10d operator -> (name users know, {argument index: role}, argument whose bytes are the
# collective's size)
OPS = {
    "broadcast_": ("broadcast", {0: INOUT}, 0),
    "allreduce_": ("all_reduce", {0: INOUT}, 0),
    "allreduce_coalesced_": ("all_reduce_coalesced", {0: INOUT}, 0),
    "allgather_": ("all_gather", {1: READ, 0: WRITE}, 0),
    "_allgather_base_": ("all_gather_into_tensor", {1: READ, 0: WRITE}, 0),
    "allgather_coalesced_": ("all_gather_coalesced", {1: READ, 0: WRITE}, 0),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced",
                                         {1: READ, 0: WRITE}, 0),
    "reduce_scatter_": ("reduce_scatter", {1: READ, 0: WRITE}, 1),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", {1: READ, 0: WRITE}, 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced",
                                         {1: READ, 0: WRITE}, 1),
    "reduce_": ("reduce", {0: INOUT}, 0),
    "gather_": ("gather", {1: READ, 0: WRITE}, 1),
    "scatter_": ("scatter", {1: READ, 0: WRITE}, 0),
    "alltoall_": ("all_to_all", {1: READ, 0: WRITE}, 1),
    "alltoall_base_": ("all_to_all_single", {1: READ, 0: WRITE}, 1),
    "barrier": ("barrier", {0: READ}, None),
    "monitored_barrier_": ("monitored_barrier", {0: READ}, None),
    "send": ("send", {0: READ}, 0),
    "recv_": ("recv", {0: WRITE}, 0),
    "recv_any_source_": ("recv", {0: WRITE}, 0),
}


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return [_map(v, fn) for v in x]
    return x


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def _kernel(name: str):
    public, roles, size_arg = OPS[name]
    overload = getattr(torch.ops.c10d, name).default

    def kernel(*args, **kwargs):
        first = args[0]
        args = list(args)
        st = Staging(HOST)
        staged = []

        def stage(t, role):
            if t.device.type != "rbln":
                return t
            staged.append(t)
            return st(t, role)

        for i, role in roles.items():
            args[i] = _map(args[i], lambda t, role=role: stage(t, role))
        if staged:
            size = 0 if size_arg is None else staging.nbytes(*_tensors(args[size_arg]))
            staging.record(public, HOST, size)
        out = overload.redispatch(_CPU, *args, **kwargs)
        if st.finish:
            # a tensor that was not contiguous went through a contiguous copy: wait for the
            # transfer, then scatter the result back
            work = out[1] if isinstance(out, tuple) else out
            torch.distributed.Work.unbox(work).wait()
            st.done()
        if isinstance(out, tuple) and len(out) == 2:
            return first, out[1]       # the operator echoes its first argument: the caller's
        return out
    return kernel


_lib = None


def install() -> None:
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": replacing PyTorch's is the point
        warnings.simplefilter("ignore", UserWarning)
        for name in OPS:
            lib.impl(name, _kernel(name), "PrivateUse1")
    _lib = lib
