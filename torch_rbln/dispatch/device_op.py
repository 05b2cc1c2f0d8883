"""The kernel every device-table op runs: checks -> program cache -> execute, or CPU fallback.

Per call: one ``dispatch`` event, the pre-dispatch checks (``checks.py``), a cache key built
from the arguments' metadata, a dict lookup (``warm_hit``) or a compile (``recompile``, and for
an op that already has programs its ``recompile_cause``: ``recompile_causes.py``), the
program on device buffers (``device_program``), and the result's residency: the program's
output becomes the output tensor's device buffer, so nothing is copied.

A failed check sends the op to the CPU (``cpu_fallback`` with its reason): through the host
fast path for ops that have one (compute on the host views directly), else through the boxed
CPU fallback. docs/eager.md ("Eager execution").
"""

from __future__ import annotations

import time

import torch

from .. import _C, config, events
from ..runtime import compiler, devices, executors
from ..runtime.storage import (device_input, device_input_packed, device_input_widened,
                               host_input)
from . import checks, cuda_dtypes, fallback, recompile_causes, results, rules
from .attention_dropout import DROPOUT_AT, with_attention_dropout
from .optable import OpEntry, overload

_record = events.record
_span_start = events.span_start
_record_program = events.record_program
_perf_ns = time.perf_counter_ns
_HALF = executors.HALF
_Tensor = torch.Tensor
_can_cast = torch.can_cast
_internal_overlap = torch._debug_has_internal_overlap     # 1: yes (0: no, 2: too hard to say)
_lookup = compiler._cache.get
_enter_program = _C.enter_program
_leave_program = _C.leave_program
_fallback_decided = _C.fallback_decided

# Fallback reasons that follow from the native warm path's key alone, once that path has found
# no trace, dispatch mode, listener, profiler, rule skipping, reentrancy, storage offset or
# NaN/Inf operand (its own scan, the rule before the alignment rule): the dtype rule and the
# 64-alignment rule. A call sent to the host for one of them in the plain host form (the
# functional op on the host views) tells the warm path, which replays the decision for the
# next call with that key (same events, same result). docs/eager.md ("Eager execution").
REPLAYED = frozenset({"dtype-not-fp16", "last-dim-not-64-aligned"})


def _sig(v, ids: dict):
    """Cache-key signature of one argument: tensor metadata, typed scalars, alias pattern."""
    if isinstance(v, _Tensor):
        first = ids.setdefault(id(v), len(ids))
        if v.is_cpu and v.dim() == 0:                     # a scalar operand: baked in
            return ("scalar", v.dtype, v.item(), first)
        return (v.shape, v.dtype, v.is_contiguous(), first)
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v), v)
    if isinstance(v, (list, tuple)):
        return tuple(_sig(x, ids) for x in v)
    return v if isinstance(v, (torch.dtype, torch.device)) else repr(v)


def _host_args(args):
    """Host views of the rbln arguments (a physical d2h for device-latest data)."""
    out = []
    for a in args:
        if isinstance(a, _Tensor) and a.get_device() >= 0:     # rbln (CPU and meta: -1)
            a = host_input(a)
        out.append(a)
    return out


def _overlaps_itself(out) -> bool:
    """Elements of ``out`` share memory (an expanded tensor): what the op does then is its CPU
    kernel's to say (``add_`` refuses, ``masked_fill_`` warns and writes); a copy of a result
    into it would always refuse."""
    return not out.is_contiguous() and _internal_overlap(out) == 1


def _fits(result, out, args, in_place: bool) -> bool:
    """The functional op's ``result`` computed on the host views, written into ``out``, is what
    the op's out= kernel gives: PyTorch's casting rule holds (an in-place call, such as
    ``x.add_(y)`` reaching ``add.out`` with ``out=x``: the result has ``x``'s dtype and shape),
    no other operand shares ``out``'s memory (PyTorch refuses partly overlapping operands),
    and ``out`` does not overlap itself."""
    if in_place:
        if result.dtype != out.dtype or result.shape != out.shape:
            return False
    elif not _can_cast(result.dtype, out.dtype):
        return False
    return not fallback.shares_memory(out, args) and not _overlaps_itself(out)


def make_kernel(entry: OpEntry, registered_name: str):
    """The PrivateUse1 kernel of ``registered_name`` (the entry's own overload or an alias)."""
    op_name = "aten::" + entry.name
    registered = overload(registered_name)
    fn = overload(entry.fn)
    mode = entry.out if registered_name == entry.name else "functional"
    # the kwarg-only output (`out`, or `grad_input` for backward kernels)
    out_name = next((a.name for a in registered._schema.arguments if a.kwarg_only and a.alias_info
                     and a.alias_info.is_write), "out")
    custom = executors.CUSTOM.get(entry.kernel)
    body = custom if custom is not None else fn          # what the compiler lowers
    kernel_form = entry.kernel
    skip = entry.skip_dtype
    slots = rules.tensor_slots(entry, registered)
    gate = rules.GATES.get(entry.name)
    fast = bool(entry.fast_path) or custom is not None         # custom programs run on host views too

    def build(out_meta):
        return executors.build(kernel_form, fn, out_meta)

    def run_fallback(reason, args, kwargs, out, index):
        _record("cpu_fallback_reason", reason)
        if events._tap_on:      # a profile records: its trace names the host run and why
            with torch.profiler.record_function(f"rbln::cpu_fallback({reason})"):
                return _fallback(reason, args, kwargs, out, index)
        return _fallback(reason, args, kwargs, out, index)

    def _fallback(reason, args, kwargs, out, index):
        t0 = _perf_ns()
        try:
            # a functional call needs no out= semantics: the op itself on the host views
            # (what the boxed fallback would run, without its generic argument walk); nor
            # does an in-place one (out= is its first operand) whose result fits in place
            in_place = mode == "out" and out is not None and out is args[0]
            # (a host fast path takes numbers as they come: no need to look for them)
            number = not fast and fallback.number_in_tensor_slot(registered, args)
            if fast or ((out is None or in_place) and not number):
                host_args = _host_args(args)
                res = cuda_dtypes.run(body, host_args, kwargs)
                if out is None or _fits(res, out, args, in_place):
                    if (reason in REPLAYED and custom is None
                            and cuda_dtypes.unchanged(body, host_args, kwargs)):
                        _fallback_decided(reason)
                    return results.deliver_host(res, out, index)
                # else PyTorch's own rules for this out= or in-place call (casting,
                # broadcasting, overlap): the general route runs the out= kernel itself
            full = dict(kwargs)
            if out is not None and mode == "out":
                full[out_name] = out
            res = fallback.run_on_cpu(registered, args, full)
            if reason in REPLAYED and number and (
                    fallback.plain_functional(registered, args, kwargs, res) if out is None
                    else in_place and fallback.plain_in_place(registered, args, kwargs)):
                # a Python number in a tensor slot: the warm path passes it wrapped, which
                # gives the same type promotion
                _fallback_decided(reason)
        finally:
            _record("cpu_fallback", op_name, _perf_ns() - t0)
        return res

    def kernel(*args, **kwargs):
        _record("dispatch", op_name)
        if mode == "out":
            out = kwargs.pop(out_name, None)
        elif mode == "inplace":
            out = args[0]
        else:
            out = None
        # rules.classify, inlined together with the device index and the empty-tensor check
        tensors, dtype_tensors, scalars = [], [], []
        index = None
        empty = False
        n = len(args)
        for i in slots:
            if i >= n:
                break
            a = args[i]
            if not isinstance(a, _Tensor):
                continue
            d = a.get_device()      # an rbln tensor's index; -1 for CPU (and meta) tensors
            if d >= 0:
                tensors.append(a)
                if index is None:
                    index = d
                elif d != index:
                    raise devices.mixed_devices(index, d)
            elif a.dim() == 0:
                scalars.append(a)     # a wrapped Python scalar
                continue
            if i not in skip:
                dtype_tensors.append(a)
            if a.numel() == 0:
                empty = True
        if index is None:
            index = out.device.index if out is not None else 0
        if empty:
            # empty tensors are handled on the host; nothing reaches the device
            if custom is not None:
                return results.deliver_host(body(*_host_args(args), **kwargs), out, index)
            full = dict(kwargs)
            if out is not None and mode == "out":
                full[out_name] = out
            return fallback.run_on_cpu(registered, args, full)
        if out is not None and _overlaps_itself(out):
            return run_fallback("overlapping-output", args, kwargs, out, index)
        reason = gate(args, kwargs) if gate is not None else None
        if reason is None:
            reason = checks.check(entry, tensors, dtype_tensors, scalars, args, kwargs)
        if reason is not None:
            return run_fallback(reason, args, kwargs, out, index)

        ids: dict = {}
        key = (op_name, index, tuple([_sig(a, ids) for a in args]),
               tuple([(k, _sig(v, ids)) for k, v in kwargs.items()]) if kwargs else ())
        prog = _lookup(key)
        if prog is None:
            earlier = compiler.keys_of(op_name, recompile_causes.RECENT)
            try:
                prog = compiler.compile_op(op_name, body, key, args, kwargs, build)
            except compiler.CompileError:
                if "compile_error" in config.live("TORCH_RBLN_DISABLE_FALLBACK"):
                    raise
                return run_fallback("compile-error", args, kwargs, out, index)
            if earlier:     # a recompile: say what differs from the closest program
                recompile_causes.record(op_name, key, earlier)
        else:
            _record("warm_hit", op_name)

        dev_args = []
        widened = prog.widened
        packed = prog.packed
        for i, a in enumerate(args):
            if isinstance(a, _Tensor) and a.get_device() >= 0:
                # a widening program's half-precision operands in fp32, kept for a weight; a
                # packing program's weight in its packed layout, kept too
                if widened and a.dtype in _HALF:
                    a = device_input_widened(a)
                elif packed and i == 1 and a.dim() == 2:
                    a = device_input_packed(a)
                else:
                    a = device_input(a)
            dev_args.append(a)
        # inside a device program: the `reentrant` check sees it (and the native warm path
        # learns that this key ran as a device program)
        depth = _enter_program()
        t0 = _span_start()
        try:
            result = prog.run(*dev_args, **kwargs)
        finally:
            _leave_program(depth)
        for a in dev_args:
            if result is a:     # the program returned an operand's device memory (see
                result = result.clone()     # device_input): the output needs its own
                break
        _record_program(op_name, index, t0)
        return results.deliver_device(result, out, index)

    kernel.__name__ = "rbln_" + registered_name.replace(".", "_")
    return kernel


# The native warm path (csrc/WarmPath.cpp) serves a program-cache hit of these ops without
# Python; their Python kernels above stay the reference for everything else (cold compiles,
# fallbacks, listeners). It runs the program forms it knows: the functional aten op itself, and
# the matrix units' (that op, widened to fp32 for the dtypes executors.matmul_precision widens).
_WARM_FORMS = {"direct": 0, "matmul": 1}
_MODES = {"out": 0, "inplace": 1, "functional": 2}
# the attention program without mask or dropout (executors.sdpa_forward's fused form): its
# gate decides on shapes and dtypes alone, which the key holds, and a key enters the native
# cache only once the Python kernel ran a device program for it
_SDPA_FORM = 2
# aten::linear_backward's program (executors.linear_backward), on the same terms
_LINEAR_BACKWARD_FORM = 3
_CUSTOM_FORMS = {"sdpa": _SDPA_FORM, "linear_backward": _LINEAR_BACKWARD_FORM}


def _warm_form(entry: OpEntry) -> int | None:
    if entry.kernel in _CUSTOM_FORMS:
        return _CUSTOM_FORMS[entry.kernel]
    if entry.name in rules.GATES or entry.operands or entry.name == "div.out_mode":
        return None     # decisions the native path does not repeat: the gate, rounding modes
    return _WARM_FORMS.get(entry.kernel)


def register_warm_path() -> set:
    """Put the native warm path in front of every device op it can serve; returns the names
    whose Python kernel the caller registers on PrivateUse2 (where the warm path calls it)."""
    from .optable import DEVICE_OPS
    widened = [d for d in executors.HALF if d not in executors.matmul_precision().native]
    _C.warm_configure(sorted(rules.DISPATCH_DTYPES, key=str), sorted(rules.STRICT_DTYPES, key=str),
                      widened, executors.WIDEN_MIN_ROWS, results.deliver_device,
                      sorted(executors.packed_dtypes(), key=str))
    _C.set_warm_path(config.latched("TORCH_RBLN_NATIVE_WARM_PATH"))
    served = set()
    for e in DEVICE_OPS:
        form = _warm_form(e)
        if form is None:
            continue
        for name in (e.name, *e.aliases):
            registered = overload(name)
            if len(registered._schema.returns) != 1 and form not in (_SDPA_FORM,
                                                                     _LINEAR_BACKWARD_FORM):
                continue
            mode = e.out if name == e.name else "functional"
            # a matmul's left operand (its rows decide widening) and whether it is batched
            left = 1 if e.fn.startswith("addmm") else 0
            _C.warm_register(name, "aten::" + e.name, e.fn, _MODES[mode],
                             list(rules.tensor_slots(e, registered)), list(e.skip_dtype),
                             e.align64, form, left, e.fn.startswith("bmm"))
            served.add(name)
    return served


def kernels() -> dict:
    from .optable import DEVICE_OPS
    out = {}
    for e in DEVICE_OPS:
        for name in (e.name, *e.aliases):
            k = make_kernel(e, name)
            out[name] = with_attention_dropout(e.name, k) if e.name in DROPOUT_AT else k
    return out
