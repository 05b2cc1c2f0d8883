"""The kernel every device-table op runs: checks -> program cache -> execute, or CPU fallback.

Per call: one ``dispatch`` event, the pre-dispatch checks (``checks.py``), a cache key built
from the arguments' metadata, a dict lookup (``warm_hit``) or a compile (``recompile``), the
program on device buffers, and the result's residency: the program's output becomes the
output tensor's device buffer, so nothing is copied.

A failed check sends the op to the CPU (``cpu_fallback`` with its reason): through the host
fast path for ops that have one (compute on the host views directly), else through the boxed
CPU fallback.
"""

from __future__ import annotations

import time
import warnings

import torch

from .. import config, events
from ..log import user_stacklevel
from ..runtime import compiler, devices, lowering
from ..runtime.storage import buffer_of, new_device_tensor, wrap_host
from . import checks, cuda_dtypes, factories, fallback
from .copy import covers
from .optable import OpEntry

_record = events.record
_perf_ns = time.perf_counter_ns
_Tensor = torch.Tensor
_lookup = compiler._cache.get
_tls = checks._tls


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
            b = buffer_of(a)
            b.host_read()
            a = b.host_alias(a)
        out.append(a)
    return out


def _owned_nbytes(x: torch.Tensor) -> int | None:
    """The size of ``x``'s storage if ``x`` spans exactly all of it (dense, offset 0, so it
    can become a buffer as is), else None."""
    n = x.untyped_storage().nbytes()
    if (x.storage_offset() == 0 and n == x.numel() * x.itemsize
            and (x.is_contiguous() or 0 not in x.stride())):
        return n
    return None


def _wrap_result(x, index):
    """A fresh CPU result (host memory) as an rbln tensor, host-latest, no copy."""
    if isinstance(x, _Tensor):
        if _owned_nbytes(x) is None:
            x = x.clone(memory_format=torch.contiguous_format)
        return wrap_host(x, index)
    if isinstance(x, (list, tuple)):
        return type(x)(_wrap_result(v, index) for v in x)
    return x


def _resize_out(out, shape) -> None:
    """Resize an ``out=`` tensor to the result's shape, warning as PyTorch's kernels do."""
    if out.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
            f"This behavior is deprecated, and in a future PyTorch release outputs will not be "
            f"resized unless they have zero elements. You can explicitly reuse an out tensor t "
            f"by resizing it, inplace, to zero elements with t.resize_(0).", UserWarning,
            stacklevel=user_stacklevel())
    factories.resize_(out, shape)


def _deliver_host(result, out, index):
    if out is None:
        return _wrap_result(result, index)
    if out.shape != result.shape:
        _resize_out(out, result.shape)
    ob = buffer_of(out)
    ob.host_write(whole=covers(out, ob))
    ob.host_alias(out).copy_(result)
    return out


def _deliver_device(result, out, index: int):
    """Make ``result`` (computed in device memory) the data of ``out`` or of a new rbln tensor."""
    if out is None:
        if isinstance(result, _Tensor):
            # a fresh kernel output owns its storage (dense, offset 0); anything else is copied
            nbytes = _owned_nbytes(result) if result._base is None else None
            if nbytes is None:
                result = result.clone(memory_format=torch.contiguous_format)
                nbytes = result.numel() * result.itemsize
            return new_device_tensor(result, nbytes, index)
        if isinstance(result, (list, tuple)):
            return type(result)(_deliver_device(r, None, index) for r in result)
        return result
    if out.shape != result.shape:
        _resize_out(out, result.shape)
    ob = buffer_of(out)
    if (result.dtype == out.dtype and result.storage_offset() == 0 and result.is_contiguous()
            and covers(out, ob) and result.untyped_storage().nbytes() == ob.nbytes):
        ob.adopt_device(result)
    else:
        ob.device_write(whole=covers(out, ob))
        ob.device_alias(out).copy_(result)
    return out


def _resolve(name: str) -> torch._ops.OpOverload:
    packet, _, ov = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), ov or "default")


def make_kernel(entry: OpEntry, registered_name: str):
    """The PrivateUse1 kernel of ``registered_name`` (the entry's own overload or an alias)."""
    op_name = "aten::" + entry.name
    registered = _resolve(registered_name)
    fn = _resolve(entry.fn)
    mode = entry.out if registered_name == entry.name else "functional"
    # the kwarg-only output (`out`, or `grad_input` for backward kernels)
    out_name = next((a.name for a in registered._schema.arguments if a.kwarg_only and a.alias_info
                     and a.alias_info.is_write), "out")
    custom = lowering.CUSTOM.get(entry.kernel)
    body = custom if custom is not None else fn          # what the compiler lowers
    kernel_form = entry.kernel
    skip = entry.skip_dtype
    # positional slots that hold tensors (the schema's Tensor / Tensor? arguments)
    slots = entry.operands or tuple(
        i for i, a in enumerate(registered._schema.arguments) if not a.kwarg_only
        and "Tensor" in str(a.type) and "[]" not in str(a.type))
    gate = GATES.get(entry.name)
    fast = entry.fast_path or custom is not None         # custom programs run on host views too

    def build(out_meta):
        return lowering.build(kernel_form, fn, out_meta)

    def run_fallback(reason, args, kwargs, out, index):
        _record("cpu_fallback_reason", reason)
        t0 = _perf_ns()
        try:
            if fast:
                res = _deliver_host(cuda_dtypes.run(body, _host_args(args), kwargs), out, index)
            else:
                full = dict(kwargs)
                if out is not None and mode == "out":
                    full[out_name] = out
                res = fallback.run_on_cpu(registered, args, full)
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
                return _deliver_host(body(*_host_args(args), **kwargs), out, index)
            full = dict(kwargs)
            if out is not None and mode == "out":
                full[out_name] = out
            return fallback.run_on_cpu(registered, args, full)
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
            try:
                prog = compiler.compile_op(op_name, body, key, args, kwargs, build)
            except compiler.CompileError:
                if "compile_error" in config.live("TORCH_RBLN_DISABLE_FALLBACK"):
                    raise
                return run_fallback("compile-error", args, kwargs, out, index)
        else:
            _record("warm_hit", op_name)

        dev_args = []
        for a in args:
            if isinstance(a, _Tensor) and a.get_device() >= 0:
                b = buffer_of(a)
                b.device_read()
                a = b.device_input(a)
            dev_args.append(a)
        # inside a device program: the `reentrant` check sees it
        depth = getattr(_tls, "depth", 0)
        _tls.depth = depth + 1
        try:
            result = prog.run(*dev_args, **kwargs)
        finally:
            _tls.depth = depth
        for a in dev_args:
            if result is a:     # the program returned an operand's device memory (see
                result = result.clone()     # device_input): the output needs its own
                break
        return _deliver_device(result, out, index)

    kernel.__name__ = "rbln_" + registered_name.replace(".", "_")
    return kernel


# -------------------------------------------------------------------------------------------
# op-specific gates, evaluated before the generic checks (the reference's kernel-level checks)

_SDPA_DTYPES = (torch.float16, torch.bfloat16)


def sdpa_unsupported(q, k, v, attn_bias) -> str | None:
    """Why the device attention kernel cannot take these inputs (``can_use_rbln_sdpa``)."""
    if q.dim() < 3:
        return "dim < 3 not supported"
    if q.dim() > 4:
        return "dim > 4 not supported"
    if q.is_nested:
        return "nested tensors not supported"
    if q.dtype not in _SDPA_DTYPES:
        return f"dtype {q.dtype} not supported"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return "q/k/v dtypes differ"
    if q.shape[-3] % k.shape[-3] or k.shape[-3] != v.shape[-3]:
        return "GQA head counts not divisible"
    if q.numel() == 0 or k.numel() == 0:
        return "empty input"
    if attn_bias is not None and attn_bias.dim() not in (2, 3, 4):
        return f"mask dim {attn_bias.dim()} not supported"
    if q.shape[-1] % 32:
        return f"head_dim {q.shape[-1]} not aligned to 32"
    if q.shape[-2] % 32:
        return f"query sequence length {q.shape[-2]} not aligned to 32"
    if k.shape[-2] % 32:
        return f"key sequence length {k.shape[-2]} not aligned to 32"
    return None


def _sdpa_gate(args, kwargs):
    q, k, v = args[:3]
    bias = args[3] if len(args) > 3 else kwargs.get("attn_bias")
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    if dropout and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, bias)):
        raise NotImplementedError("RBLN SDPA does not support dropout_p > 0 with autograd")
    why = sdpa_unsupported(q, k, v, bias)
    return None if why is None else f"sdpa: {why}"


def _sdpa_backward_gate(args, kwargs):
    why = sdpa_unsupported(args[1], args[2], args[3], args[4])
    return None if why is None else f"sdpa_backward: {why}"


GATES = {
    "_scaled_dot_product_fused_attention_overrideable": _sdpa_gate,
    "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward_gate,
}


def kernels() -> dict:
    from .optable import DEVICE_OPS
    out = {}
    for e in DEVICE_OPS:
        for name in (e.name, *e.aliases):
            out[name] = make_kernel(e, name)
    return out
