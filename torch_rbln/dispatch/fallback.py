"""The boxed CPU fallback: run any aten op on the host views of its rbln arguments.

Correct for functional, in-place and ``out=`` ops (with resize), ops returning views of their
inputs, several outputs, TensorList arguments and results, optional tensors, mixed cpu/rbln
arguments, 0-dim tensors, Python scalars and nested tensors (a CPU nested tensor over the
buffer's host view, ``nested.py``). Each rbln argument is read on the host (a physical
``d2h`` only if its latest data is on the device); arguments the op writes become host-latest;
fresh results become rbln tensors on the first rbln argument's device without a copy (their
host view is the CPU result's memory). docs/debugging.md ("CPU fallback").
"""

from __future__ import annotations

import warnings

import torch

from .. import config, events
from ..runtime import devices, generators
from ..runtime.storage import (CPU_KEYSET, HOST, host_input, make_writable, shared_states,
                               state_of)
from . import cuda_dtypes, factories, layouts, nested
from .layout import spans_storage
from .results import wrap_result

_record = events.record
_as_strided = torch.ops.aten.as_strided.default._handle
_internal_overlap = torch._debug_has_internal_overlap   # 0: no, 1: yes, 2: too hard to say
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

# Ops PyTorch gives the CPU (and CUDA) a kernel of their own and every other backend a generic
# CompositeExplicitAutograd one: registered for rbln, they run the CPU kernel, with its argument
# checks (``addr``'s "Boolean beta only supported for Boolean results", which the composite
# skips) and its numerics (``native_layer_norm``'s mean and rstd in the input's dtype).
# tests/test_cpu_parity.py holds this list equal to what the dispatcher says.
CPU_OVER_COMPOSITE = ("addr", "addr.out", "all.dims", "all.dims_out", "any.dims", "any.dims_out",
                      "_stack", "_stack.out", "native_layer_norm", "linalg__powsum")


class _Ctx:
    __slots__ = ("index", "by_ptr", "aliases", "outs", "real")

    def __init__(self):
        self.index = None
        self.by_ptr = {}      # host storage ptr -> rbln tensor (an input that owns it)
        self.aliases = []     # (cpu alias, rbln tensor)
        self.outs = []        # (cpu stand-in for an out= argument, rbln tensor)
        self.real = []        # (host alias given as an out= argument, rbln tensor)


def _to_cpu(x, ctx: _Ctx):
    if isinstance(x, torch.Tensor):
        if x.device.type != "rbln":
            return x
        state = state_of(x)
        state.host_read()
        if ctx.index is None:
            ctx.index = state.index
        a = nested.host_view(x, state) if x.is_nested else state.host_alias(x)
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
    if a is None:
        a = next((a for a, r in ctx.real if r is t), None)
        if a is None or (a.shape == t.shape and a.stride() == t.stride()
                         and a.storage_offset() == t.storage_offset()):
            state.host_write(whole=False)    # written in place, on the host view
            return
        # an out= host alias the kernel resized within the storage's memory: its data, then
        # the new shape for the rbln tensor, as a stand-in's
        a = a.clone()
    # an out= stand-in: bring its data (and any resize the kernel did) into the rbln tensor.
    # It holds every element (a kernel sizing an output writes all of it; a stand-in of a kernel
    # that may read its output started with its contents): old ones on the device are not
    # fetched unless the tensor leaves some of its storage out
    if a.shape != t.shape:
        factories.resize_like(t, a)
        state = state_of(t)
    state.host_write(whole=state.residency != HOST and spans_storage(t, state.nbytes))
    state.host_alias(t).copy_(a)


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
        st = x.untyped_storage()
        if x.is_nested:
            owner = ctx.by_ptr.get(st.data_ptr()) if st.nbytes() else None
            if owner is not None:
                return nested.view_of(x, owner)
            r = nested.to_rbln(x, _index(ctx))
            if st.nbytes():     # another result over the same buffer: a view of this one
                ctx.by_ptr[st.data_ptr()] = r
            return r
        if not st.nbytes():
            owner = None
        elif not x.data_ptr():
            # a storage without data: a ZeroTensor (``_efficientzerotensor``, which autograd
            # formulas return for a gradient known to be zero, e.g. ``sgn``'s of a real input).
            # No rbln input owns it and it holds no bytes to wrap: the rbln result is real zeros
            return wrap_result(torch.zeros(x.shape, dtype=x.dtype), _index(ctx))
        else:
            owner = ctx.by_ptr.get(st.data_ptr())
        if owner is not None:
            if owner.is_nested:
                return nested.view_of(x, owner)
            # a view of an rbln input: the same view on the rbln storage, with the same lazy
            # conjugate / negative bits, so that writes through it reach the input
            v = _as_strided.redispatch_boxed(CPU_KEYSET, owner, x.size(), x.stride(), x.storage_offset())
            if v.is_conj() != x.is_conj():
                v = v.conj()
            if v.is_neg() != x.is_neg():
                v = v._neg_view()
            return v
        return wrap_result(x, _index(ctx))
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


def _fresh_out(x, ctx: _Ctx, shaped: bool = True, real: bool = False):
    """A CPU stand-in for an ``out=`` rbln tensor: the kernel may resize it freely; the result
    is copied back (and the rbln tensor resized) afterwards. ``shaped``: with the rbln tensor's
    shape and strides (the kernel sees what the caller passed); else with no elements (the
    kernel sizes it without a word). ``real``: a tensor with elements is given as its host
    alias instead (see :func:`_real_outs`)."""
    if isinstance(x, torch.Tensor) and x.device.type == "rbln":
        if x.is_nested:
            # no stand-in: the kernel writes the host view, read first, as an in-place op's
            return _to_cpu(x, ctx)
        if ctx.index is None:
            ctx.index = x.device.index
        if real and x.numel():
            # an input that is also the output: the very alias it has, as PyTorch sees one
            # tensor (``is_same``) where the caller passed one
            a = next((a for a, r in ctx.aliases if r is x), None)
            if a is None:
                a = _to_cpu(x, ctx)
            ctx.real.append((a, x))
            return a
        f = (torch.empty_strided(x.size(), x.stride(), dtype=x.dtype) if shaped
             else torch.empty(0, dtype=x.dtype))
        ctx.outs.append((f, x))
        return f
    if isinstance(x, (list, tuple)):
        return type(x)(_fresh_out(v, ctx, shaped, real) for v in x)
    return x


def _real_outs(structured: bool, outs, args, kwargs) -> bool:
    """The kernel gets the ``out=`` tensors themselves (their host aliases, contents and all)
    rather than stand-ins: unless it is a structured op's out= form (which writes its outputs
    and reads nothing of them) whose outputs neither overlap themselves nor share memory with
    another rbln operand. Then PyTorch's own kernel sees what a CPU caller's would: the data it
    accumulates into (``_compute_linear_combination``), the overlap it refuses (``cross(x, y,
    out=x)``) or allows (``threshold_`` of an expanded tensor)."""
    if not structured:
        return True
    operands = (*args, *(v for k, v in kwargs.items() if k not in outs))
    for k in outs:
        for t in _tensors(kwargs.get(k)):
            if t.get_device() >= 0 and t.numel() and (
                    _not_dense(t) or shares_memory(t, operands, itself=True)):
                return True
    return False


def _tensors(v) -> tuple:
    if isinstance(v, torch.Tensor):
        return (v,)
    if isinstance(v, (list, tuple)):
        return tuple(x for x in v if isinstance(x, torch.Tensor))
    return ()


def _not_dense(t: torch.Tensor) -> bool:
    """``t`` may overlap itself or have gaps (PyTorch's ``has_internal_overlap`` is not NO)."""
    return not t.is_contiguous() and _internal_overlap(t) != 0


def _holding(a: torch.Tensor) -> torch.Tensor:
    """A stand-in holding the contents of the host alias ``a`` (with its layout when dense)."""
    if not _not_dense(a):
        return torch.empty_strided(a.size(), a.stride(), dtype=a.dtype).copy_(a)
    return a.clone(memory_format=torch.contiguous_format)


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

    ``out=`` arguments with elements are the rbln tensors' host aliases (:func:`_real_outs`),
    except those of a structured op that neither overlap themselves nor share memory with
    another operand: these are CPU stand-ins, copied into the rbln tensors afterwards (exactly
    the elements of a view; a resized one takes the stand-in's layout). Such a structured op
    gets stand-ins without elements: its out= kernel may warn about resizing an output of the
    very shape its functional form allocated (``mse_loss`` does), which a CPU caller of the
    functional form never sees. Only when the result's shape differs from an ``out=`` tensor
    that holds elements does the kernel run again on stand-ins shaped like the caller's,
    drawing the same random numbers: then its own rule applies (PyTorch's resize warning, or
    an error)."""
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
    real = bool(outs) and _real_outs(sized, outs, args, kwargs)
    sized = sized and not real
    cpu_kwargs = {k: (_fresh_out(v, ctx, not sized, real) if k in outs else _to_cpu(v, ctx))
                  for k, v in kwargs.items()} if kwargs else {}
    cpu_args, cpu_kwargs, gen = _device_generator(op, cpu_args, cpu_kwargs, ctx)
    index = _index(ctx)
    state = gen.get_state() if (sized or real) and gen is not None else None
    try:
        out = _call(op, cpu_args, cpu_kwargs, index)
    except RuntimeError as e:
        if not (ctx.real and _NOT_RESIZABLE in str(e)):
            raise
        # an out= tensor the kernel grows past its memory (PyTorch moves it to new memory; a
        # host alias cannot move): again on stand-ins that hold its contents, its warnings
        # given once already (the kernel resizes before it writes)
        if state is not None:
            gen.set_state(state)
        stand_in = {id(a): _holding(a) for a, _ in ctx.real}
        ctx.outs.extend((stand_in[id(a)], r) for a, r in ctx.real)
        ctx.real.clear()
        cpu_kwargs.update({k: _replace(cpu_kwargs[k], stand_in) for k in outs if k in cpu_kwargs})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
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


# PyTorch's message for a resize of a host alias past its memory (its storage cannot move)
_NOT_RESIZABLE = "Trying to resize storage that is not resizable"


def _replace(v, by_id: dict):
    if isinstance(v, (list, tuple)):
        return type(v)(_replace(x, by_id) for x in v)
    return by_id.get(id(v), v)


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
    if o.numel() and (_not_dense(o) or shares_memory(o, args, itself=True)):
        return None     # the kernel must see the output itself (_real_outs)
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


def shares_memory(t: torch.Tensor, args, itself: bool = False) -> bool:
    """An rbln operand among ``args``, other than ``t`` itself (unless ``itself``), uses
    ``t``'s memory. (Read without ``data_ptr()``, which would give a lazy clone memory of its
    own.)"""
    ptr = _data_address(t)
    for a in args:
        if (isinstance(a, torch.Tensor) and (itself or a is not t) and a.get_device() >= 0
                and _data_address(a) == ptr):
            return True
    return False



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
    try:
        if events._tap_on:
            with torch.profiler.record_function("rbln::cpu_fallback(no-device-kernel)"):
                return run_on_cpu(op, args, kwargs)
        return run_on_cpu(op, args, kwargs)
    except NotImplementedError:
        if _cpu_runs(op):
            raise
        raise NotImplementedError(_no_cpu_kernel(op)) from None


_CPU_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
             "CompositeImplicitAutograd")


def _has_kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:        # no such operator
        return False


def _cpu_runs(op) -> bool:
    """The CPU can run ``op``: a CPU kernel, or a composite one every backend gets."""
    return any(_has_kernel(op.name(), k) for k in _CPU_KEYS)


def _no_cpu_kernel(op) -> str:
    """Why an op without a device kernel fails on rbln: the host run has no CPU kernel
    (``_convert_weight_to_int4pack``: PyTorch packs int4 weights for CUDA and MPS only)."""
    name = op.name()
    msg = (f"The operator `{name}` cannot run on RBLN devices: an op without an rbln kernel "
           f"runs on the host's CPU kernel, and PyTorch has none for this one (it implements "
           f"it for accelerators such as CUDA only).")
    if _has_kernel(name + "_for_cpu", "CPU"):
        msg += (f" PyTorch's CPU form of it is `{name}_for_cpu` (with its own input layout): "
                f"call that on CPU tensors instead.")
    return msg


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
    for name in _FUNCTIONAL_AS_IS + _DEVICE_CHECKED + CPU_OVER_COMPOSITE:
        out[name] = (lambda op: lambda *a, **k: boxed_fallback(op, *a, **k))(overload(name))
    return out


def configure() -> None:
    """Read ``TORCH_RBLN_DISABLE_FALLBACK`` for the ``unsupported_op`` category (fixed at load)."""
    global _unsupported_disabled
    _unsupported_disabled = "unsupported_op" in config.latched("TORCH_RBLN_DISABLE_FALLBACK")
