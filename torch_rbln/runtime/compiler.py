"""The virtual NPU compiler and its in-process program cache.

Compiling one op instance means: lower the op to the NPU's primitive set (PyTorch's core-aten
decompositions, traced on meta tensors), reject it if a primitive is missing
(``CompileError``, the ``compile_error`` fallback category), and build a :class:`Program`
specialised to the cache key: the device, each tensor's shape/dtype/layout, typed scalar
arguments (``1``, ``1.0`` and ``True`` differ) and the aliasing pattern of the arguments.

A program executes on device buffers with NPU numerics: fp16/bf16 storage, fp32 accumulation
inside the kernel, rounding to the output dtype at the op boundary.
"""

from __future__ import annotations

import threading
import time

import torch

from .. import events

_record = events.record


class CompileError(RuntimeError):
    """The NPU compiler cannot build a program for this op instance."""


# Core aten primitives the virtual NPU executes natively.
NPU_PRIMITIVES = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "rsqrt", "sqrt", "log", "exp", "ceil", "floor",
    "pow", "sigmoid", "maximum", "minimum", "clamp", "where", "eq", "ne", "gt", "ge", "lt", "le",
    "logical_not", "mean", "sum", "amax", "amin", "max", "min", "mm", "bmm", "addmm",
    "expand", "view", "reshape", "permute", "t", "transpose", "unsqueeze", "squeeze", "clone",
    "_to_copy", "convert_element_type", "full", "scalar_tensor", "masked_fill", "_softmax",
    "_softmax_backward_data", "silu", "silu_backward", "linear", "alias", "fill", "copy",
    "empty", "empty_strided", "slice", "select", "cat", "tanh", "reciprocal", "mul_", "add_",
    "sym_size", "lift_fresh", "detach", "_unsafe_view", "as_strided", "max_dim", "min_dim",
})


class Program:
    """A compiled op instance: ``run(*device_args)`` computes on CPU tensors over device
    buffers and returns the result (a fresh tensor, or the ``out`` it was given)."""

    __slots__ = ("op", "key", "primitives", "run", "compile_ns")

    def __init__(self, op: str, key, primitives: tuple, run, compile_ns: int):
        self.op = op
        self.key = key
        self.primitives = primitives
        self.run = run
        self.compile_ns = compile_ns

    def __repr__(self):
        return f"Program({self.op}, prims={list(self.primitives)})"


_cache: dict = {}
_lock = threading.Lock()


def lookup(key):
    return _cache.get(key)


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def cache_size() -> int:
    return len(_cache)


class _PrimRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.prims = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.prims.append(func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func))
        return func(*args, **(kwargs or {}))


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(v) for v in x)
    return x


def lower(fn: torch._ops.OpOverload, args, kwargs) -> tuple:
    """The primitive ops ``fn`` lowers to, traced on meta tensors through the core-aten
    decompositions. Raises :class:`CompileError` if one is outside the NPU's set."""
    from torch._decomp import core_aten_decompositions
    decomp = core_aten_decompositions().get(fn)
    margs, mkwargs = _meta(args), {k: _meta(v) for k, v in kwargs.items()}
    rec = _PrimRecorder()
    try:
        with rec:
            if decomp is not None:
                decomp(*margs, **mkwargs)
            else:
                fn(*margs, **mkwargs)
    except Exception as e:  # a lowering that cannot even be traced is a compile error
        raise CompileError(f"cannot lower {fn.name()}: {type(e).__name__}: {e}") from e
    prims = tuple(dict.fromkeys(rec.prims))
    missing = [p for p in prims if p not in NPU_PRIMITIVES]
    if missing:
        raise CompileError(f"{fn.name()} lowers to {missing}, which the NPU does not implement")
    return prims


def compile_op(op_name: str, fn: torch._ops.OpOverload, key, args, kwargs, make_run) -> Program:
    """Build (and cache under ``key``) the program for one op instance."""
    t0 = time.perf_counter_ns()
    prims = lower(fn, args, kwargs)
    prog = Program(op_name, key, prims, make_run(), 0)
    prog.compile_ns = time.perf_counter_ns() - t0
    with _lock:
        _cache[key] = prog
    _record("recompile", op_name, prog.compile_ns)
    return prog
