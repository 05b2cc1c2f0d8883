"""The boxed CPU fallback: run any aten op on the host views of its rbln arguments.

Correct for functional, in-place and ``out=`` ops (with resize), ops returning views of their
inputs, several outputs, TensorList arguments and results, optional tensors, mixed cpu/rbln
arguments, 0-dim tensors and Python scalars. Each rbln argument is read on the host (a physical
``d2h`` only if its latest data is on the device); arguments the op writes become host-latest;
fresh results become rbln tensors on the first rbln argument's device without a copy (their
host view is the CPU result's memory). docs/debugging.md ("CPU fallback").
"""

from __future__ import annotations

import torch

from .. import config, events
from ..runtime import devices, generators
from ..runtime.storage import CPU_KEYSET, host_input, make_writable, shared_states, state_of
from . import cuda_dtypes, factories, layouts
from .results import wrap_result

_record = events.record
_as_strided = torch.ops.aten.as_strided.default._handle
_data_address = torch._C._data_address   # a storage's data pointer, as data_ptr() without a write

# PrivateUse1 entry points that have no CPU kernel: the host runs their generic twin instead.
_HOST_TWIN = ("aten::convolution_overrideable", "aten::convolution_backward_overrideable")

# Structured functional ops routed to the catch-all as they are, instead of through PyTorch's
# structured wrapper, which would run the op's checks once on rbln and again inside the CPU's
# out= kernel: each warning of those checks (indexing with a uint8 mask is deprecated) would
# then appear twice, where the CPU gives it once. Likewise the padding ops whose CPU kernel
# gives a channels-last result for a channels-last input: the wrapper would allocate a
# contiguous output first, and the result would lose the input's memory format.
_FUNCTIONAL_AS_IS = ("index.Tensor", "reflection_pad3d", "reflection_pad3d_backward",
                     "replication_pad2d", "replication_pad3d")

# out= forms whose CompositeExplicit kernel checks the device type before any backend kernel
# runs ("mode only supports CPU, CUDA and XPU device type"): registered for rbln, they run the
# CPU kernel as CUDA runs its own.
_DEVICE_CHECKED = ("mode.values",)


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
        state = state_of(x)
        state.host_read()
        if ctx.index is None:
            ctx.index = state.index
        a = state.host_alias(x)
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
    if isinstance(x, torch.Generator) and x.device.type == "rbln":
        return generators.host(x)         # CPU kernels take CPU generators: the one it owns
    return x


_WRITTEN: dict = {}


def _written_args(op: torch._ops.OpOverload) -> tuple:
    """(position, name, kwarg-only) of each argument ``op``'s schema marks as written."""
    w = _WRITTEN.get(op)
    if w is None:
        w = _WRITTEN[op] = tuple((i, a.name, a.kwarg_only)
                                 for i, a in enumerate(op._schema.arguments)
                                 if a.alias_info is not None and a.alias_info.is_write)
    return w


def _written(op: torch._ops.OpOverload, args, kwargs):
    """The rbln tensors among the arguments the schema marks as written."""
    for i, name, kwarg_only in _written_args(op):
        v = kwargs.get(name) if kwarg_only or i >= len(args) else args[i]
        if v is None:
            continue
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor) and t.device.type == "rbln":
                yield t


def _mark_written(op: torch._ops.OpOverload, args, kwargs, ctx: _Ctx) -> None:
    """Arguments the schema marks as written: their host view now holds the latest data."""
    for t in _written(op, args, kwargs):
        _sync_back(t, ctx)


def _sync_back(t: torch.Tensor, ctx: _Ctx) -> None:
    state = state_of(t)
    a = next((a for a, r in ctx.outs if r is t), None)
    if a is not None:
        # an out= stand-in: bring its data (and any resize the kernel did) into the rbln tensor
        if a.shape != t.shape:
            factories.resize_(t, a.shape)
            state = state_of(t)
        state.host_write(whole=False)
        state.host_alias(t).copy_(a)
        return
    state.host_write(whole=False)


_GEN_SLOT: dict = {}


def _generator_slot(op) -> int | None:
    """Position of a random op's ``generator`` argument (None: the op takes none)."""
    slot = _GEN_SLOT.get(op, False)
    if slot is False:
        slot = _GEN_SLOT[op] = next((i for i, a in enumerate(op._schema.arguments)
                                     if a.name == "generator"), None)
    return slot


_CPU_DEFAULT: dict = {}


def _draws_from_cpu_default(op) -> bool:
    """A random op without a ``generator`` argument (``native_dropout``, ...): its CPU kernel
    draws from the CPU default generator, which must stand in for the device's."""
    v = _CPU_DEFAULT.get(op)
    if v is None:
        v = _CPU_DEFAULT[op] = (_generator_slot(op) is None
                                and torch.Tag.nondeterministic_seeded in op.tags)
    return v


def _index(ctx: _Ctx) -> int:
    return ctx.index if ctx.index is not None else devices.current()


def _device_generator(op, args, kwargs, ctx: _Ctx):
    """RNG ops without an explicit generator draw from the rbln device's generator. Returns
    the arguments and the CPU generator the kernel will draw from (None: no random draw)."""
    slot = _generator_slot(op)
    if slot is None:
        return args, kwargs, (generators.default_host(_index(ctx))
                              if _draws_from_cpu_default(op) else None)
    if slot < len(args):
        if args[slot] is None:
            args = (*args[:slot], generators.default_host(_index(ctx)), *args[slot + 1:])
        return args, kwargs, args[slot]
    if kwargs.get("generator") is None:
        kwargs["generator"] = generators.default_host(_index(ctx))
    return args, kwargs, kwargs["generator"]


def _to_rbln(x, ctx: _Ctx):
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            return x
        for a, r in ctx.outs + ctx.aliases:
            if x is a:
                return r
        if not x.untyped_storage().nbytes():
            owner = None
        elif not x.data_ptr():
            # a storage without data: a ZeroTensor (``_efficientzerotensor``, which autograd
            # formulas return for a gradient known to be zero, e.g. ``sgn``'s of a real input).
            # No rbln input owns it and it holds no bytes to wrap: the rbln result is real zeros
            return wrap_result(torch.zeros(x.shape, dtype=x.dtype), _index(ctx))
        else:
            owner = ctx.by_ptr.get(x.untyped_storage().data_ptr())
        if owner is not None:
            # a view of an rbln input: the same view on the rbln storage, with the same lazy
            # conjugate / negative bits, so that writes through it reach the input
            v = _as_strided.redispatch_boxed(CPU_KEYSET, owner, x.size(), x.stride(), x.storage_offset())
            if v.is_conj() != x.is_conj():
                v = v.conj()
            if v.is_neg() != x.is_neg():
                v = v._neg_view()
            return v
        return wrap_result(x, ctx.index if ctx.index is not None else devices.current())
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
_STRUCTURED: dict = {}


def _structured_out(op: torch._ops.OpOverload) -> bool:
    """``op`` is the out= form of a structured op (its functional twin's kernel for a backend
    like ours allocates the outputs and calls ``op``). Its CPU kernel sizes every output itself
    (resizing as ``resize_output`` does) and writes nothing else of its arguments."""
    res = _STRUCTURED.get(op)
    if res is None:
        outs = _out_names(op)
        schema = op._schema
        res = False
        if outs and not any(isinstance(a.type, torch.ListType) for a in schema.arguments
                            if a.name in outs) and not any(
                a.alias_info is not None and a.alias_info.is_write and a.name not in outs
                for a in schema.arguments):
            want = [(a.name, str(a.type)) for a in schema.arguments if a.name not in outs]
            packet = op.overloadpacket
            for ov in packet.overloads():
                twin = getattr(packet, ov)
                if (not twin._schema.is_mutable and want == [
                        (a.name, str(a.type)) for a in twin._schema.arguments]):
                    res = torch._C._dispatch_has_kernel_for_dispatch_key(
                        twin.name(), "CompositeExplicitAutogradNonFunctional")
                    break
        _STRUCTURED[op] = res
    return res


def _fresh_out(x, ctx: _Ctx, shaped: bool = True):
    """A CPU stand-in for an ``out=`` rbln tensor: the kernel may resize it freely; the result
    is copied back (and the rbln tensor resized) afterwards. ``shaped``: with the rbln tensor's
    shape and strides (the kernel sees what the caller passed); else with no elements (the
    kernel sizes it without a word)."""
    if isinstance(x, torch.Tensor) and x.device.type == "rbln":
        if ctx.index is None:
            ctx.index = x.device.index
        f = (torch.empty_strided(x.size(), x.stride(), dtype=x.dtype) if shaped
             else torch.empty(0, dtype=x.dtype))
        ctx.outs.append((f, x))
        return f
    if isinstance(x, (list, tuple)):
        return type(x)(_fresh_out(v, ctx, shaped) for v in x)
    return x


def _call(op, args, kwargs, index: int):
    name = op.name()
    if name in _HOST_TWIN:
        return _run_twin(name, args, kwargs)
    if number_in_tensor_slot(op, args):
        # a wrapped Python scalar reached us as a plain number: let the overload packet pick
        # the Scalar overload, which gives it the same (wrapped-number) type promotion
        return cuda_dtypes.run(op.overloadpacket, args, kwargs)
    if _draws_from_cpu_default(op):
        with generators.cpu_default_from(index):
            return cuda_dtypes.run(op, args, kwargs)
    return cuda_dtypes.run(op, args, kwargs)   # op(...), widening dtypes CUDA has


def run_on_cpu(op: torch._ops.OpOverload, args, kwargs):
    """Run ``op`` on the host views of its rbln arguments; results come back as rbln tensors.

    ``out=`` arguments are CPU stand-ins, copied into the rbln tensors afterwards (exactly the
    elements of a view). A structured op gets stand-ins without elements: its out= kernel may
    warn about resizing an output of the very shape its functional form allocated (``mse_loss``
    does), which a CPU caller of the functional form never sees. Only when the result's shape
    differs from an ``out=`` tensor that holds elements does the kernel run again on stand-ins
    shaped like the caller's, drawing the same random numbers: then its own rule applies
    (PyTorch's resize warning, or an error)."""
    plain = _PLAIN_OUT.get(op)
    if plain is None:
        plain = _PLAIN_OUT[op] = _plain_structured_out(op)
    if plain and kwargs:
        res = _run_plain_out(op, plain, args, kwargs)
        if res is not None:
            return res
    mutable = op._schema.is_mutable
    if mutable and shared_states():
        # the kernel writes through the host aliases taken below: a lazy clone among the
        # written arguments gets memory of its own first, as a CPU kernel's mutable_data_ptr()
        # gives it (while no lazy clone shares memory, there is nothing to do)
        for i, name, kwarg_only in _written_args(op):
            v = kwargs.get(name) if kwarg_only or i >= len(args) else args[i]
            if isinstance(v, torch.Tensor):
                make_writable(v)
            elif isinstance(v, (list, tuple)):
                for t in v:
                    if isinstance(t, torch.Tensor):
                        make_writable(t)
    ctx = _Ctx()
    cpu_args = _to_cpu(args, ctx)
    outs = _out_names(op) if kwargs else ()
    sized = bool(outs) and _structured_out(op)
    cpu_kwargs = {k: (_fresh_out(v, ctx, not sized) if k in outs else _to_cpu(v, ctx))
                  for k, v in kwargs.items()} if kwargs else {}
    cpu_args, cpu_kwargs, gen = _device_generator(op, cpu_args, cpu_kwargs, ctx)
    index = _index(ctx)
    state = gen.get_state() if sized and gen is not None else None
    out = _call(op, cpu_args, cpu_kwargs, index)
    if sized and any(a.shape != r.shape and r.numel() for a, r in ctx.outs):
        if state is not None:
            gen.set_state(state)
        ctx.outs.clear()
        cpu_kwargs.update({k: _fresh_out(kwargs[k], ctx) for k in outs if k in kwargs})
        out = _call(op, cpu_args, cpu_kwargs, index)
    if mutable:
        _mark_written(op, args, kwargs, ctx)
    return _to_rbln(layouts.checked(out, op.name()), ctx)


_PLAIN_OUT: dict = {}


def _plain_structured_out(op: torch._ops.OpOverload) -> str:
    """The out= argument's name when ``op`` is a structured op's out= form whose CPU run
    needs none of :func:`run_on_cpu`'s general machinery: one output, no generator, no host
    twin, no list arguments (``cos.out``, ``sin.out``: what the structured functional op calls
    with the output it allocated). '' otherwise."""
    outs = _out_names(op)
    if (len(outs) != 1 or not _structured_out(op) or _generator_slot(op) is not None
            or _draws_from_cpu_default(op) or op.name() in _HOST_TWIN
            or len(op._schema.returns) != 1):
        return ""
    for a in op._schema.arguments:
        if isinstance(a.type, (torch.ListType, torch.OptionalType)) or a.name in (
                "device", "generator", "memory_format", "layout", "pin_memory"):
            return ""
    return outs[0]


def _run_plain_out(op, out_name: str, args, kwargs):
    """:func:`run_on_cpu` for a :func:`_plain_structured_out` op, with the same reads, writes
    and result: the inputs' host views, the kernel on a stand-in sized by the kernel, the
    stand-in copied into the rbln output. None (nothing done) for any call it does not cover:
    another keyword, a non-tensor device argument, a Python number in a tensor slot, an output
    whose shape the kernel's differs from (the general path's resize rules apply)."""
    o = kwargs.get(out_name)
    if (len(kwargs) != 1 or not isinstance(o, torch.Tensor) or o.device.type != "rbln"
            or number_in_tensor_slot(op, args)):
        return None
    for a in args:
        if isinstance(a, (list, tuple, torch.device, torch.Generator)):
            return None
    cpu_args = [host_input(a) if isinstance(a, torch.Tensor) and a.device.type == "rbln" else a
                for a in args]
    f = torch.empty(0, dtype=o.dtype)
    res = cuda_dtypes.run(op, cpu_args, {out_name: f})
    if res is not f or f.shape != o.shape:
        # a resize (or a kernel returning something else): the general path, from the
        # arguments' host views it now reads without a transfer (the op is pure)
        return None
    ctx = _Ctx()
    ctx.outs.append((f, o))
    _sync_back(o, ctx)          # the stand-in's data into the rbln output, as the general path
    layouts.checked(f, op.name())
    return o


def plain_functional(op: torch._ops.OpOverload, args, kwargs, result) -> bool:
    """:func:`run_on_cpu` gave ``result`` as the op itself gives it on the host views of
    ``args``: nothing written, no generator, no host twin, no widening, a fresh result tensor
    (the native warm path may then replay the call as the plain op)."""
    if op._schema.is_mutable or not isinstance(result, torch.Tensor):
        return False
    return _plain_op(op, args, kwargs) and not shares_memory(result, args)


def plain_in_place(op: torch._ops.OpOverload, args, kwargs) -> bool:
    """:func:`run_on_cpu` just ran the in-place call ``op(*args, out=args[0])`` (no error), as
    the functional op on the host views with its result copied into ``args[0]`` gives it: no
    generator, no host twin, no widening, and no other operand sharing the written memory."""
    return _plain_op(op, args, kwargs) and not shares_memory(args[0], args)


def _plain_op(op: torch._ops.OpOverload, args, kwargs) -> bool:
    """:func:`run_on_cpu` runs ``op`` itself on these arguments: no host twin, no generator,
    no widening."""
    return (op.name() not in _HOST_TWIN and _generator_slot(op) is None
            and not _draws_from_cpu_default(op)
            and cuda_dtypes.unchanged(op.overloadpacket, args, kwargs))


def shares_memory(t: torch.Tensor, args) -> bool:
    """An rbln operand among ``args``, other than ``t`` itself, uses ``t``'s memory. (Read
    without ``data_ptr()``, which would give a lazy clone memory of its own.)"""
    ptr = _data_address(t)
    return any(isinstance(a, torch.Tensor) and a is not t and a.device.type == "rbln"
               and _data_address(a) == ptr for a in args)



_TENSOR_SLOTS: dict = {}


def number_in_tensor_slot(op, args) -> bool:
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
    return _host_op(op, args, kwargs)


def _host_op(op, args, kwargs):
    """An op without a device kernel, run on the CPU; a profile's trace names the host run as
    a device op's fallback is named (``rbln::cpu_fallback(<reason>)``)."""
    if events._tap_on:
        with torch.profiler.record_function("rbln::cpu_fallback(no-device-kernel)"):
            return run_on_cpu(op, args, kwargs)
    return run_on_cpu(op, args, kwargs)


def host_kernels() -> dict:
    """Kernels for the ops the op table routes to the host on purpose (``optable.HOST_OPS``):
    the same CPU run as the boxed fallback, but registered explicitly, so they keep working
    with ``TORCH_RBLN_DISABLE_FALLBACK=unsupported_op``."""
    from .optable import HOST_OPS, overload

    def make(op):
        name = op.name()

        def kernel(*args, **kwargs):
            _record("host_op", name)
            return _host_op(op, args, kwargs)
        return kernel

    out = {n: make(overload(n)) for n in HOST_OPS}
    # entry points whose CompositeExplicit kernel only raises for a non-CPU/CUDA backend: they
    # must be registered to reach the catch-all's behaviour (unsupported_op applies)
    for name in _HOST_TWIN:
        n = name.split("::")[1]
        out[n] = (lambda op: lambda *a, **k: boxed_fallback(op, *a, **k))(overload(n))
    for name in _FUNCTIONAL_AS_IS + _DEVICE_CHECKED:
        out[name] = (lambda op: lambda *a, **k: boxed_fallback(op, *a, **k))(overload(name))
    return out


def configure() -> None:
    """Read ``TORCH_RBLN_DISABLE_FALLBACK`` for the ``unsupported_op`` category (fixed at load)."""
    global _unsupported_disabled
    _unsupported_disabled = "unsupported_op" in config.latched("TORCH_RBLN_DISABLE_FALLBACK")
