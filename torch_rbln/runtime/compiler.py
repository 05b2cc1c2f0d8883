"""The virtual NPU compiler and its in-process program cache.

Compiling one op instance means:

1. *lower* it: run the op on host stand-ins of its arguments under a recording dispatch mode that replaces every
   op outside the NPU's primitive set by its PyTorch decomposition (recursively), so what is
   recorded is the primitive sequence the NPU would execute;
2. *check* each primitive against :data:`NPU_PRIMITIVES` and its constraints; a miss raises
   :class:`CompileError` (the ``compile_error`` fallback category);
3. *build* a :class:`Program` specialised to the cache key (see ``dispatch/device_op.py``): the
   output's shape, dtype and strides are fixed from the meta trace, scalars are baked in, and
   the executor (``runtime/executors.py``) picks the kernel form for that key.

The cache lives in the process only. ``torch.rbln.empty_cache()`` and ``torch._dynamo.reset()``
drop it (the latter through a patch in ``torch_rbln/patches.py``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _C, events
from . import caches, faults

_record = events.record


class CompileError(RuntimeError):
    """The NPU compiler cannot build a program for this op instance."""


# Primitives the virtual NPU executes natively (aten packet names).
NPU_PRIMITIVES = frozenset({
    # elementwise
    "add", "sub", "mul", "div", "neg", "abs", "rsqrt", "sqrt", "log", "exp", "ceil", "floor",
    "pow", "sigmoid", "silu", "tanh", "reciprocal", "maximum", "minimum", "clamp", "where",
    "eq", "ne", "gt", "ge", "lt", "le", "logical_not", "masked_fill", "fill", "full",
    "scalar_tensor", "_to_copy", "copy", "clone", "lift_fresh", "alias", "detach",
    # reductions and matrix units
    "mean", "sum", "amax", "amin", "max", "min", "mm", "bmm", "addmm", "_softmax",
    "_softmax_backward_data", "silu_backward", "linear", "logsumexp",
    # fused attention (the host's flash kernel computes the NPU's attention unit)
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    # data movement (the copy engine)
    "cat", "index_select", "index_copy", "repeat_interleave", "arange", "zero", "zeros",
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "zeros_like",
    "full_like",
    # layout (free: fused into the program's addressing)
    "expand", "view", "reshape", "permute", "t", "transpose", "unsqueeze", "squeeze", "slice",
    "select", "_unsafe_view", "as_strided", "sym_size", "split", "split_with_sizes", "unbind",
    "narrow", "contiguous", "flatten", "_reshape_alias",
})

# exponents `pow.Tensor_Scalar` lowers to (mul chains, sqrt, rsqrt); others do not compile
_POW_EXPONENTS = frozenset({-2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0, 4.0})


@dataclass(slots=True, eq=False)
class Program:
    """A compiled op instance.

    ``run(*device_args, **kwargs)`` computes on CPU tensors over device buffers with NPU
    numerics and returns the result; ``out_meta`` describes that result (shape, dtype, stride
    per output) as the trace fixed it. A ``widened`` program takes its fp16/bf16 operands in
    fp32 (``runtime/executors.py``)."""

    op: str
    key: Any
    primitives: tuple
    out_meta: Any
    run: Callable
    compile_ns: int = 0
    widened: bool = False   # run takes its half-precision operands in fp32 (executors)
    packed: bool = False    # run takes a 2-D weight (argument 1) in its packed layout

    def __repr__(self):
        return f"Program({self.op}, prims={list(self.primitives)})"


_cache: dict = {}
# op -> its keys in _cache, oldest first: what a recompile of the op is compared against
_keys_by_op: dict[str, list] = {}
_lock = threading.Lock()


@caches.register
def clear_cache() -> None:
    with _lock:
        _cache.clear()
        _keys_by_op.clear()
        _C.warm_clear()     # the native warm path's keys stand for programs of this cache


def cache_size() -> int:
    return len(_cache)


def keys_of(op_name: str, last: int | None = None) -> list:
    """The keys ``op_name`` has programs for, oldest first (a copy; the ``last`` ones only)."""
    with _lock:
        keys = _keys_by_op.get(op_name, ())
        return list(keys[-last:] if last else keys)


# -------------------------------------------------------------------------------------------
# lowering

class _Lowering(TorchDispatchMode):
    """Records the primitive sequence of whatever runs under it, decomposing non-primitives."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch would wrap __torch_dispatch__ in torch._disable_dynamo, whose first call
        # imports Dynamo (seconds); a compile runs inside an eager kernel, never under Dynamo
        return False

    def __init__(self):
        super().__init__()
        self.prims: list[str] = []
        self.missing: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._opname
        if name in NPU_PRIMITIVES:
            self.prims.append(name)
            if name == "pow":
                _check_pow(args)
            if name in _MATRIX_UNIT and "out" not in kwargs:
                a = args[1] if name == "addmm" else args[0]
                return torch.empty(_matmul_shape(name, args), dtype=a.dtype)
            return func(*args, **kwargs)
        decomp = decomposition_table.get(func)
        if decomp is not None:
            with self:
                return decomp(*args, **kwargs)
        if _is_composite(func):
            # reached here when dispatch runs below autograd (inside a kernel)
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        self.missing.append(func.__name__)
        return func(*args, **kwargs)


_COMPOSITE: dict = {}


def _is_composite(func) -> bool:
    c = _COMPOSITE.get(func)
    if c is None:
        c = _COMPOSITE[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd")
    return c


def _check_pow(args) -> None:
    exp = args[1] if len(args) > 1 else None
    if isinstance(exp, (int, float)) and float(exp) not in _POW_EXPONENTS:
        raise CompileError(f"pow with exponent {exp!r} has no NPU lowering "
                           f"(supported: {sorted(_POW_EXPONENTS)})")


def _sample(x):
    """A host stand-in for one argument, to trace the lowering on.

    Meta tensors would be the natural choice, but PyTorch's meta kernels for elementwise ops
    are Python references whose first call imports Dynamo (seconds). Uninitialised host
    tensors run the C++ kernels instead; integer and bool tensors are zeros so that index
    operands stay in range; matrix-unit primitives are not computed at all (see below)."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "cpu" and x.dim() == 0:
            return x                      # a wrapped Python scalar stays a CPU scalar
        if x.is_floating_point() or x.is_complex():
            return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
        return torch.zeros(x.size(), dtype=x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_sample(v) for v in x)
    if isinstance(x, torch.device) and x.type != "cpu":
        return torch.device("cpu")
    return x


def _matmul_shape(name, args):
    """Output shape of a matrix-unit primitive (traced without computing it)."""
    if name == "mm":
        return (args[0].shape[0], args[1].shape[1])
    if name == "bmm":
        return (args[0].shape[0], args[0].shape[1], args[1].shape[2])
    return (args[1].shape[0], args[2].shape[1])        # addmm(bias, a, b)


_MATRIX_UNIT = frozenset({"mm", "bmm", "addmm"})


def _describe(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, tuple(x.stride()))
    if isinstance(x, (list, tuple)):
        return tuple(_describe(v) for v in x)
    return None


def lower(fn, args, kwargs) -> tuple[tuple, object]:
    """The primitives ``fn(*args, **kwargs)`` lowers to and the meta of its result. ``fn`` is
    an aten overload or the body of a custom program.

    Raises :class:`CompileError` if the op cannot be traced or a primitive is outside the
    NPU's set."""
    margs = _sample(args)
    mkwargs = {k: _sample(v) for k, v in kwargs.items()} if kwargs else {}
    mode = _Lowering()
    name = fn.name() if isinstance(fn, torch._ops.OpOverload) else fn.__name__
    try:
        with mode:
            decomp = None
            if isinstance(fn, torch._ops.OpOverload) and fn._opname not in NPU_PRIMITIVES:
                decomp = decomposition_table.get(fn)
            if decomp is not None:
                out = decomp(*margs, **mkwargs)
            else:
                out = fn(*margs, **mkwargs)
    except CompileError:
        raise
    except Exception as e:  # a lowering that cannot even be traced is a compile error
        raise CompileError(f"cannot lower {name}: {type(e).__name__}: {e}") from e
    if mode.missing:
        raise CompileError(f"{name} lowers to {sorted(set(mode.missing))}, which the NPU "
                           f"does not implement")
    return tuple(dict.fromkeys(mode.prims)), _describe(out)


def compile_op(op_name: str, body, key, args, kwargs, build) -> Program:
    """Compile (and cache under ``key``) one op instance whose computation is ``body`` (an aten
    overload or a custom program body); ``build(out_meta)`` returns the run callable
    specialised to it. Records a ``recompile`` event."""
    t0 = time.perf_counter_ns()
    prims, out_meta = lower(body, args, kwargs)
    run = faults.wrap(op_name, build(out_meta))
    prog = Program(op_name, key, prims, out_meta, run, widened=getattr(run, "widened", False),
                   packed=getattr(run, "packed", False))
    prog.compile_ns = time.perf_counter_ns() - t0
    with _lock:
        if key not in _cache:
            _keys_by_op.setdefault(op_name, []).append(key)
        _cache[key] = prog
    _record("recompile", op_name, prog.compile_ns)
    return prog
