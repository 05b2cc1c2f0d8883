"""The device op table: which aten overloads the virtual NPU runs, and under which rules.

This is data. Adding a device op is one entry here (plus a lowering in
``runtime/lowering.py`` when the op is not a plain call of its functional twin).

Fields of :class:`OpEntry`:

* ``name``      aten overload registered on PrivateUse1 (reports name it ``aten::<name>``)
* ``fn``        the functional aten overload the program computes (``out`` excluded)
* ``align64``   the 64-alignment rule applies to directly passed tensors
* ``skip_dtype`` positional indices excluded from the dtype check (``where``'s condition)
* ``fast_path`` the host runs this op through a CPU fast-path handler when it falls back
  (explain lists fallback ops *without* one as optimization candidates)
* ``out``       how the result reaches the caller: ``"out"`` (an ``out=`` tensor), ``"inplace"``
  (argument 0 is written), ``"functional"`` (a new tensor is returned)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class OpEntry:
    name: str
    fn: str
    out: str = "out"
    align64: bool = True
    skip_dtype: tuple = ()
    fast_path: bool = False
    bool_out: bool = False
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _binary(n, fn=None, **kw):
    return OpEntry(f"{n}.out", fn or f"{n}.Tensor", **kw)


DEVICE_OPS: tuple[OpEntry, ...] = (
    # elementwise binary (broadcasting); `alpha` and scalar operands are baked into the program
    _binary("add"), _binary("sub"), _binary("mul", fast_path=True), _binary("div"),
    OpEntry("div.out_mode", "div.Tensor_mode", notes="fp16 with rounding_mode trunc/floor -> CPU"),
    OpEntry("maximum.out", "maximum.default"), OpEntry("minimum.out", "minimum.default"),
    OpEntry("pow.Tensor_Scalar_out", "pow.Tensor_Scalar", fast_path=True),
    # unary
    OpEntry("abs.out", "abs.default"), OpEntry("neg.out", "neg.default"),
    OpEntry("rsqrt.out", "rsqrt.default", fast_path=True), OpEntry("log.out", "log.default"),
    OpEntry("ceil.out", "ceil.default"), OpEntry("floor.out", "floor.default"),
    OpEntry("silu.out", "silu.default"), OpEntry("sigmoid.out", "sigmoid.default"),
    OpEntry("clamp.out", "clamp.default", notes="scalar bounds only"),
    OpEntry("logical_not.out", "logical_not.default", bool_out=True),
    # comparisons (bool outputs)
    *(OpEntry(f"{c}.{k}_out", f"{c}.{k}", bool_out=True)
      for c in ("eq", "ne", "gt", "ge", "lt", "le") for k in ("Tensor", "Scalar")),
    # reductions
    OpEntry("mean.out", "mean.dim", fast_path=True),
    OpEntry("max.unary_out", "max.default"), OpEntry("min.unary_out", "min.default"),
    OpEntry("max", "max.default", out="functional"), OpEntry("min", "min.default", out="functional"),
    # matrix
    OpEntry("mm.out", "mm.default"), OpEntry("bmm.out", "bmm.default"),
    OpEntry("addmm.out", "addmm.default"),
    OpEntry("linear", "linear.default", out="functional"),
    # softmax and selection
    OpEntry("_softmax.out", "_softmax.default"),
    OpEntry("where.self_out", "where.self", skip_dtype=(0,)),
    OpEntry("where.self", "where.self", out="functional", skip_dtype=(0,)),
    OpEntry("masked_fill_.Scalar", "masked_fill.Scalar", out="inplace", skip_dtype=(1,)),
    OpEntry("masked_fill_.Tensor", "masked_fill.Tensor", out="inplace", skip_dtype=(1,)),
    # backward kernels
    OpEntry("silu_backward.grad_input", "silu_backward.default"),
    OpEntry("_softmax_backward_data.out", "_softmax_backward_data.default"),
)

BY_NAME = {e.name: e for e in DEVICE_OPS}

# Ops the reference deliberately runs on the host (they reach the boxed CPU fallback, logged).
HOST_OPS = (
    "max.dim_max", "min.dim_min", "sum.IntList_out", "argmax.out", "topk.values", "all.all_out",
    "all.out", "any.all_out", "any.out", "count_nonzero.dim_IntList", "flip", "cumsum.out",
    "clamp.Tensor_out", "trunc.out", "equal", "native_dropout", "normal_", "uniform_",
    "random_.from", "randperm.generator_out", "masked_select", "masked_scatter_",
    "_index_put_impl_", "index_add.out", "gather.out", "scatter.src_out", "nonzero",
    "cos.out", "sin.out", "exp.out", "sign.out", "pow.Tensor_Tensor_out", "pow.Scalar_out",
    "addcmul.out", "isnan", "tril.out", "triu.out", "relu", "native_batch_norm",
    "sigmoid_backward.grad_input", "tanh_backward.grad_input",
)
