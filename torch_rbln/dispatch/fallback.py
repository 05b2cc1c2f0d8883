"""The boxed CPU fallback: run any aten op on the host views of its rbln arguments.

Correct for functional, in-place and ``out=`` ops (with resize), ops returning views of their
inputs, several outputs, TensorList arguments and results, optional tensors, mixed cpu/rbln
arguments, 0-dim tensors and Python scalars. Each rbln argument is read on the host (a physical
``d2h`` only if its latest data is on the device); arguments the op writes become host-latest;
fresh results become rbln tensors on the first rbln argument's device without a copy (their
host view is the CPU result's memory).
"""

from __future__ import annotations

import torch

from .. import config, events
from ..runtime import devices
from ..runtime.storage import CPU_KEYSET, buffer_of, wrap_host
from . import cuda_dtypes, factories, layouts

_record = events.record
_as_strided = torch.ops.aten.as_strided.default._handle

# PrivateUse1 entry points that have no CPU kernel: the host runs their generic twin instead.
_HOST_TWIN = ("aten::convolution_overrideable", "aten::convolution_backward_overrideable")


class _Ctx:
    __slots__ = ("index", "by_ptr", "aliases", "outs")

    def __init__(self):
        self.index = None
        self.by_ptr = {}      # host storage ptr -> rbln tensor (an input that owns it)
        self.aliases = []     # (cpu alias, rbln tensor)
        self.outs = []        # (cpu stand-in for an out= argument, rbln tensor)


def _to_cpu(x, ctx: _Ctx):
    if isinstance(x, torch.Tensor):
        if x.device.type != "rbln":
            return x
        buf = buffer_of(x)
        buf.host_read()
        if ctx.index is None:
            ctx.index = buf.index
        a = buf.host_alias(x)
        ctx.by_ptr.setdefault(a.untyped_storage().data_ptr(), x)
        ctx.aliases.append((a, x))
        return a
    if isinstance(x, (list, tuple)):
        if not x:
            return x
        return type(x)(_to_cpu(v, ctx) for v in x)
    if isinstance(x, torch.device) and x.type == "rbln":
        if ctx.index is None:
            ctx.index = x.index if x.index is not None else devices.current()
        return torch.device("cpu")
    return x


def _mark_written(op: torch._ops.OpOverload, args, kwargs, ctx: _Ctx) -> None:
    """Arguments the schema marks as written: their host view now holds the latest data."""
    schema = op._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
        if v is None:
            continue
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor) and t.device.type == "rbln":
                _sync_back(t, ctx)


def _sync_back(t: torch.Tensor, ctx: _Ctx) -> None:
    buf = buffer_of(t)
    a = next((a for a, r in ctx.outs if r is t), None)
    if a is not None:
        # an out= stand-in: bring its data (and any resize the kernel did) into the rbln tensor
        if a.shape != t.shape:
            factories.resize_(t, a.shape)
            buf = buffer_of(t)
        buf.host_write(whole=False)
        buf.host_alias(t).copy_(a)
        return
    buf.host_write(whole=False)


_GEN_OPS: dict = {}


def _wants_generator(op, kwargs) -> bool:
    """RNG ops without an explicit generator draw from the rbln device's generator."""
    has = _GEN_OPS.get(op)
    if has is None:
        has = _GEN_OPS[op] = any(a.name == "generator" and a.kwarg_only for a in op._schema.arguments)
    return has and kwargs.get("generator") is None


def _to_rbln(x, ctx: _Ctx):
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            return x
        if x.is_conj() or x.is_neg():
            # lazy conjugate/negative views cannot cross into an rbln tensor: materialise
            x = x.resolve_conj().resolve_neg()
        for a, r in ctx.outs + ctx.aliases:
            if x is a:
                return r
        owner = ctx.by_ptr.get(x.untyped_storage().data_ptr()) if x.untyped_storage().nbytes() else None
        if owner is not None:
            # a view of an rbln input: the same view on the rbln storage
            v = _as_strided.redispatch_boxed(CPU_KEYSET, owner, x.size(), x.stride(), x.storage_offset())
            return v
        if x.storage_offset() != 0 or x.untyped_storage().nbytes() != x.numel() * x.element_size():
            x = x.clone(memory_format=torch.contiguous_format) if not x.is_contiguous() else x.clone()
        return wrap_host(x, ctx.index if ctx.index is not None else devices.current())
    if isinstance(x, (list, tuple)):
        return type(x)(_to_rbln(v, ctx) for v in x)
    return x


def _out_names(op: torch._ops.OpOverload) -> tuple:
    names = _OUT_NAMES.get(op)
    if names is None:
        names = _OUT_NAMES[op] = tuple(a.name for a in op._schema.arguments if a.kwarg_only
                                       and a.alias_info is not None and a.alias_info.is_write)
    return names


_OUT_NAMES: dict = {}


def _fresh_out(x, ctx: _Ctx):
    """A CPU stand-in for an ``out=`` rbln tensor: the kernel may resize it freely; the result
    is copied back (and the rbln tensor resized) afterwards."""
    if isinstance(x, torch.Tensor) and x.device.type == "rbln":
        if ctx.index is None:
            ctx.index = buffer_of(x).index
        f = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
        ctx.outs.append((f, x))
        return f
    if isinstance(x, (list, tuple)):
        return type(x)(_fresh_out(v, ctx) for v in x)
    return x


def run_on_cpu(op: torch._ops.OpOverload, args, kwargs):
    """Run ``op`` on the host views of its rbln arguments; results come back as rbln tensors."""
    ctx = _Ctx()
    cpu_args = _to_cpu(args, ctx)
    outs = _out_names(op) if kwargs else ()
    cpu_kwargs = {k: (_fresh_out(v, ctx) if k in outs else _to_cpu(v, ctx))
                  for k, v in kwargs.items()} if kwargs else {}
    if _wants_generator(op, kwargs):
        from ..random import default_generator
        cpu_kwargs["generator"] = default_generator(ctx.index if ctx.index is not None else devices.current())
    name = op.name()
    if name in _HOST_TWIN:
        out = _run_twin(name, cpu_args, cpu_kwargs)
    elif _number_in_tensor_slot(op, cpu_args):
        # a wrapped Python scalar reached us as a plain number: let the overload packet pick
        # the Scalar overload, which gives it the same (wrapped-number) type promotion
        out = op.overloadpacket(*cpu_args, **cpu_kwargs)
    else:
        out = cuda_dtypes.run(op, cpu_args, cpu_kwargs)   # op(...), widening dtypes CUDA has
    if op._schema.is_mutable:
        _mark_written(op, args, kwargs, ctx)
    return _to_rbln(layouts.checked(out, name), ctx)


_TENSOR_SLOTS: dict = {}


def _number_in_tensor_slot(op, args) -> bool:
    slots = _TENSOR_SLOTS.get(op)
    if slots is None:
        slots = _TENSOR_SLOTS[op] = tuple(
            i for i, a in enumerate(op._schema.arguments)
            if not a.kwarg_only and isinstance(a.type, torch._C.TensorType))
    for i in slots:
        if i < len(args) and isinstance(args[i], (int, float, bool, complex)):
            return True
    return False


def _run_twin(name, args, kwargs):
    if name == "aten::convolution_overrideable":
        return torch.ops.aten.convolution.default(*args, **kwargs)
    # convolution_backward_overrideable(grad, input, weight, stride, padding, dilation,
    #   transposed, output_padding, groups, output_mask)
    grad, inp, weight, stride, padding, dilation, transposed, output_padding, groups, mask = args
    return torch.ops.aten.convolution_backward.default(
        grad, inp, weight, [weight.shape[0]] if not transposed else [weight.shape[1] * groups],
        stride, padding, dilation, transposed, output_padding, groups, mask)


_unsupported_disabled = None


def boxed_fallback(op: torch._ops.OpOverload, *args, **kwargs):
    """Every op without an rbln kernel lands here (the PrivateUse1 boxed fallback)."""
    name = op.name()
    if _unsupported_disabled:
        raise NotImplementedError(
            f"The operator `{name}` is not implemented for RBLN devices. To request this op, "
            f"please contact client_support@rebellions.ai. To enable fallback to CPU operation, "
            f"remove 'unsupported_op' from `TORCH_RBLN_DISABLE_FALLBACK`.")
    _record("host_op", name)
    return run_on_cpu(op, args, kwargs)


def host_kernels() -> dict:
    """Kernels for the ops the op table routes to the host on purpose (``optable.HOST_OPS``):
    the same CPU run as the boxed fallback, but registered explicitly, so they keep working
    with ``TORCH_RBLN_DISABLE_FALLBACK=unsupported_op``."""
    from .optable import HOST_OPS

    def make(op):
        name = op.name()

        def kernel(*args, **kwargs):
            _record("host_op", name)
            return run_on_cpu(op, args, kwargs)
        return kernel

    out = {}
    for n in HOST_OPS:
        packet, _, ov = n.partition(".")
        out[n] = make(getattr(getattr(torch.ops.aten, packet), ov or "default"))
    # entry points whose CompositeExplicit kernel only raises for a non-CPU/CUDA backend: they
    # must be registered to reach the catch-all's behaviour (unsupported_op applies)
    for name in _HOST_TWIN:
        op = getattr(torch.ops.aten, name.split("::")[1]).default
        out[name.split("::")[1]] = (lambda op: lambda *a, **k: boxed_fallback(op, *a, **k))(op)
    return out


def configure() -> None:
    """Read ``TORCH_RBLN_DISABLE_FALLBACK`` for the ``unsupported_op`` category (fixed at load)."""
    global _unsupported_disabled
    _unsupported_disabled = "unsupported_op" in config.parse("TORCH_RBLN_DISABLE_FALLBACK")
