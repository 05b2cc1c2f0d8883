"""Dtypes that CUDA kernels accept and the CPU kernels lack: rbln accepts them too.

Library code branches on ``device.type == "cpu"`` and treats every other device like CUDA
(transformers' mixture-of-experts layer calls ``torch.histc`` on ``int32`` everywhere but on
the CPU, whose kernel takes floating dtypes only). So an op that runs on the host for rbln
accepts the union of both lists: PyTorch's OpInfo database names the difference
(``op.supported_dtypes("cuda") - op.supported_dtypes("cpu")``). Three kinds of entries, all data:

* ``WIDEN``: aten op -> the dtypes its CPU kernel lacks. Those tensors are computed in
  ``WIDER[dtype]`` (what CUDA's kernels compute in: ``float`` for half types, ``complex<float>``
  for ``complex32``) and the results come back in the dtype CUDA returns: the input's dtype or
  its complex/real counterpart (``fft`` of ``float16`` is ``complex32``). Written arguments
  (``out=``, in-place ``self``, ``rrelu``'s noise) receive the values in their own dtype.
* ``EXACT``: ops whose CUDA definition a wider dtype would change get that definition, small and
  on the host (``histc`` on integers bins in integer arithmetic after casting ``min``/``max`` to
  integers; ``nansum`` on complex zeroes an element whose real or imaginary part is NaN).
* ``KERNELS``: ``fft_*``. PyTorch's composite rejects ``float16`` before any backend kernel runs
  unless the device is CUDA, so the composite is registered for rbln and widens there.

``run`` is what the CPU fallback calls in place of ``op(*args, **kwargs)``; an op without an
entry, or without a listed dtype among its tensors, runs unchanged.
"""

from __future__ import annotations

import torch

_F16, _BF16, _C32, _F32, _C64 = (torch.float16, torch.bfloat16, torch.complex32, torch.float32,
                                 torch.complex64)
_HALF = frozenset({_F16, _BF16})
_INTS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})

# the dtype CUDA's kernels compute a narrow dtype in; bool is counted as 0/1 (uint8 keeps
# ``abs`` a bool after narrowing and leaves ``trace``'s int64 alone)
WIDER = {_F16: _F32, _BF16: _F32, _C32: _C64, torch.bool: torch.uint8}

# results in a computing dtype go back to the narrow one; half types also map their complex /
# real counterparts (fft of float16 is complex32, irfft of complex32 is float16)
_BACK = {
    _F16: {_F32: _F16, _C64: _C32},
    _BF16: {_F32: _BF16},
    _C32: {_C64: _C32, _F32: _F16},
    torch.bool: {torch.uint8: torch.bool},
}

# elementwise and reduction ops that CUDA runs on complex32 (``chalf``) and the CPU does not
_CHALF_OPS = (
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan",
    "tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "angle", "div", "logaddexp", "pow",
    "lerp", "prod", "sum", "diag", "diag_embed",
)

WIDEN: dict[str, frozenset] = {
    "aten::abs": frozenset({torch.bool}),
    "aten::abs_": frozenset({torch.bool}),
    "aten::trace": frozenset({torch.bool, _C32}),
    "aten::avg_pool3d": _HALF,
    "aten::avg_pool3d_backward": _HALF,
    "aten::_upsample_bilinear2d_aa": _HALF,
    "aten::_upsample_bilinear2d_aa_backward": _HALF,
    "aten::multi_margin_loss": _HALF,
    "aten::multi_margin_loss_backward": _HALF,
    "aten::multilabel_margin_loss_forward": _HALF,
    "aten::multilabel_margin_loss_backward": _HALF,
    "aten::rrelu_with_noise": frozenset({_F16}),
    "aten::rrelu_with_noise_": frozenset({_F16}),
    "aten::rrelu_with_noise_functional": frozenset({_F16}),
    "aten::_fft_r2c": frozenset({_F16}),
    "aten::_fft_c2c": frozenset({_C32}),
    "aten::_fft_c2r": frozenset({_C32}),
    **{f"aten::{n}": frozenset({_C32}) for n in _CHALF_OPS},
    "aten::div_": frozenset({_C32}),
}


def _histc_integer(op, args, kwargs):
    """CUDA's ``histc`` for integer inputs: ``min``/``max`` truncated to integers (both 0, or
    equal: the data's range; still equal: widened by one), bin ``(x - min) * bins // (max - min)``
    with the top edge in the last bin, counts in the input's dtype."""
    a = _bind(op, args, kwargs)
    x, bins = a["self"], a["bins"]
    if bins <= 0:
        raise RuntimeError("bins must be > 0")
    lo, hi = int(a["min"]), int(a["max"])
    if lo == hi and x.numel():
        lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not lo < hi:
        raise RuntimeError("max must be larger than min")
    v = x.reshape(-1).to(torch.int64)
    v = v[(v >= lo) & (v <= hi)]
    idx = torch.div((v - lo) * bins, hi - lo, rounding_mode="floor").clamp_(max=bins - 1)
    return _deliver(torch.bincount(idx, minlength=bins).to(x.dtype), a.get("out"))


def _nansum_complex(op, args, kwargs):
    """CUDA's ``nansum`` on complex: an element whose real or imaginary part is NaN counts 0."""
    a = _bind(op, args, kwargs)
    x = a["self"]
    w = x.to(_C64) if x.dtype == _C32 else x        # complex32 sums in complex<float>
    res = torch.ops.aten.sum.dim_IntList(torch.where(torch.isnan(w), 0, w), a["dim"],
                                         a["keepdim"], dtype=a["dtype"])
    if x.dtype == _C32 and a["dtype"] is None:
        res = res.to(_C32)
    return _deliver(res, a.get("out"))


# ops whose float16 operands a complex Python number promotes to complex32 (``h ** 1j``,
# ``1j ** h``): CUDA computes them in complex<float>, the CPU kernel rejects ComplexHalf
BY_COMPLEX_SCALAR = frozenset({"aten::pow", "aten::div"})


EXACT: dict[str, tuple] = {
    "aten::histc": (_INTS, _histc_integer),
    "aten::nansum": (frozenset({_C32, _C64, torch.complex128}), _nansum_complex),
}


# ------------------------------------------------------------------------------------------
# the mechanism

_RULES: dict = {}     # OpOverload -> (dtypes, compute) or None


def _rule(op):
    r = _RULES.get(op, 0)
    if r == 0:
        # an overload packet (a Python number in a tensor slot picks its overload by type), or
        # a host kernel of the device op table (no name: runs unchanged)
        schema = getattr(op, "_schema", None)
        name = schema.name if schema is not None else getattr(op, "_qualified_op_name", "")
        if name in EXACT:
            r = EXACT[name]
        elif name in BY_COMPLEX_SCALAR:
            r = (WIDEN[name] | {_F16}, _widened_if_complex)
        elif name in WIDEN:
            r = (WIDEN[name], _widened)
        else:
            r = None
        _RULES[op] = r
    return r


def _first(x, dtypes):
    if isinstance(x, torch.Tensor):
        return x.dtype if x.dtype in dtypes else None
    if isinstance(x, (list, tuple)):
        for v in x:
            d = _first(v, dtypes)
            if d is not None:
                return d
    return None


def run(op, args, kwargs):
    """``op(*args, **kwargs)`` on host tensors, in a dtype the CPU kernel has (``op``: an aten
    overload, or a host kernel of the device op table, which runs unchanged)."""
    rule = _rule(op)
    if rule is not None and _applies(rule, args, kwargs):
        return rule[1](op, args, kwargs)
    return op(*args, **kwargs)


def _applies(rule, args, kwargs) -> bool:
    """An operand of ``args`` / ``kwargs`` has one of the rule's dtypes."""
    return (_first(args, rule[0]) is not None
            or _first(tuple(kwargs.values()), rule[0]) is not None)


def changes(op, args, kwargs) -> bool:
    """Whether :func:`run` computes ``op`` on these arguments (tensors or traced values) other
    than as ``op(*args, **kwargs)``."""
    rule = _rule(op)
    if rule is None or not _applies(rule, args, kwargs):
        return False
    if rule[1] is _widened_if_complex:
        vals = (*args, *kwargs.values())
        return _first(vals, (_C32,)) is not None or any(isinstance(v, complex) for v in vals)
    return True


def unchanged(op, args, kwargs) -> bool:
    """:func:`run` is ``op(*args, **kwargs)`` for these arguments: no entry widens or redefines
    it (the native warm path may then replay the call as the plain op)."""
    rule = _rule(op)
    return rule is None or not _applies(rule, args, kwargs)


def host_kernel(op):
    """``op`` as a host function that widens as :func:`run` does (for the host nodes of a
    compiled graph), or None when no entry names ``op``."""
    if _rule(op) is None:
        return None

    def kernel(*args, **kwargs):
        return run(op, args, kwargs)
    kernel.__name__ = "rbln_host_" + op.name().split("::")[1].replace(".", "_")
    return kernel


def _written(op) -> frozenset:
    """Positions and names of the arguments the schema marks as written."""
    out = set()
    schema = getattr(op, "_schema", None)       # an overload packet: functional uses only
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if a.alias_info is not None and a.alias_info.is_write:
            out.add(a.name)
            if not a.kwarg_only:
                out.add(i)
    return frozenset(out)


def _widened(op, args, kwargs):
    dtypes = _rule(op)[0]
    narrow = _first(args, dtypes) or _first(tuple(kwargs.values()), dtypes)
    written = _written(op)
    pairs = []      # (written argument, its widened stand-in)

    def widen(x, is_written):
        if isinstance(x, torch.Tensor):
            if x.dtype not in dtypes:
                return x
            w = x.to(WIDER[x.dtype])
            if is_written:
                pairs.append((x, w))
            return w
        if isinstance(x, (list, tuple)):
            return type(x)(widen(v, is_written) for v in x)
        if isinstance(x, torch.dtype) and x in dtypes:     # a `dtype=` argument
            return WIDER[x]
        return x

    wargs = [widen(v, i in written) for i, v in enumerate(args)]
    wkwargs = {k: widen(v, k in written) for k, v in kwargs.items()}
    res = op(*wargs, **wkwargs)
    for orig, w in pairs:
        if orig.shape != w.shape:
            orig.resize_(w.shape)
        orig.copy_(w)
    back = _BACK[narrow]

    def narrow_result(r):
        if isinstance(r, torch.Tensor):
            for orig, w in pairs:
                if r is w:
                    return orig
            d = back.get(r.dtype)
            return r.to(d) if d is not None else r
        if isinstance(r, (list, tuple)):
            return type(r)(narrow_result(v) for v in r)
        return r

    return narrow_result(res)


def _widened_if_complex(op, args, kwargs):
    """``_widened`` for a complex32 tensor, or a float16 one with a complex Python number
    among the arguments (which makes the op compute in complex32); else the op as it is."""
    vals = (*args, *kwargs.values())
    if _first(vals, (_C32,)) is not None or any(isinstance(v, complex) for v in vals):
        return _widened(op, args, kwargs)
    return op(*args, **kwargs)


def _bind(op, args, kwargs) -> dict:
    """Argument name -> value, defaults filled in from the schema."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        if not a.kwarg_only and i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _deliver(res, out):
    if out is None:
        return res
    if out.shape != res.shape:
        out.resize_(res.shape)
    return out.copy_(res)


# ------------------------------------------------------------------------------------------
# fft_*: the composite rejects float16 off CUDA before dispatch reaches a backend kernel

_FFT_NAMES = tuple(f"fft_{k}{s}" for s in ("", "2", "n")
                   for k in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"))


def _fft_kernel(op):
    def kernel(*args, **kwargs):
        x = args[0]
        if x.dtype not in (_F16, _C32):
            return op.decompose(*args, **kwargs)
        out = kwargs.pop("out", None)
        res = op.overloadpacket.default.decompose(x.to(WIDER[x.dtype]), *args[1:], **kwargs)
        res = res.to(_BACK[x.dtype][res.dtype])
        return _deliver(res, out)
    kernel.__name__ = "rbln_" + op.name().split("::")[1].replace(".", "_")
    return kernel


def _fft_kernels() -> dict:
    out = {}
    for n in _FFT_NAMES:
        packet = getattr(torch.ops.aten, n)
        for ov in ("default", "out"):
            out[n if ov == "default" else f"{n}.out"] = _fft_kernel(getattr(packet, ov))
    return out


# registered on PrivateUse1 and AutogradPrivateUse1 (the decomposition records autograd)
KERNELS = _fft_kernels()
