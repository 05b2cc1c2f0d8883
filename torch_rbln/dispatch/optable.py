"""The device op table: which aten overloads the virtual NPU runs, and under which rules.

This is data. Adding a device op is one entry here, plus a kernel in ``runtime/executors.py``
when the op is not computed by its functional aten twin.

Fields of :class:`OpEntry`:

* ``name``       aten overload registered on PrivateUse1; reports name it ``aten::<name>``
* ``fn``         the functional aten overload the program computes (``out`` excluded)
* ``out``        how the result reaches the caller: ``"out"`` (an ``out=`` tensor),
  ``"inplace"`` (argument 0 is written), ``"functional"`` (new tensors are returned)
* ``aliases``    more overloads routed to this entry (functional forms such as ``add.Tensor``:
  PyTorch would reach ``add.out`` through a generic wrapper after allocating ``out``; serving
  the functional form directly skips that second trip through the dispatcher, and the op is
  still reported under ``name``)
* ``align64``    the 64-alignment rule applies to directly passed tensors
* ``skip_dtype`` positional indices excluded from the dtype check (``where``'s condition)
* ``fast_path``  the reference's CPU fast-path handler this op reproduces (``fast_paths/*.cpp``
  there: int elementwise, fp32 last-dim mean, fp32 square-pow, fp32 rsqrt), or ``""``. A
  fallback of such an op computes on the host views directly, and explain does not list it
  among the optimization candidates (fallback ops without a handler)
* ``kernel``     the executor form (``runtime/executors.py``): ``"direct"`` (the functional op on
  device memory; its CPU kernel already accumulates in fp32 and rounds once), ``"fp32"``
  (inputs widened to fp32, one rounding at the end), ``"matmul"`` (``direct`` where the CPU has
  native half-precision GEMMs, else ``fp32``), or the name of a custom kernel
* ``operands``   positional indices the checks look at (empty: every tensor argument)
* ``autograd``   an AutogradPrivateUse1 kernel for a CompositeImplicit op (``"linear"``: a
  Function whose backward is ``aten::linear_backward``), so autograd records it

docs/eager.md ("Eager execution") (the routes and the device ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OpEntry:
    name: str
    fn: str
    out: str = "out"
    aliases: tuple = ()
    align64: bool = True
    skip_dtype: tuple = ()
    fast_path: str = ""
    kernel: str = "direct"
    operands: tuple = ()
    autograd: str = ""
    notes: str = ""


def overload(name: str) -> torch._ops.OpOverload:
    """The aten overload a name of this table means: ``"add.out"``, or ``"mm"`` (the default)."""
    packet, _, ov = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), ov or "default")


def _binary(n, **kw):
    return OpEntry(f"{n}.out", f"{n}.Tensor", aliases=(f"{n}.Tensor",), **kw)


def _unary(n, **kw):
    return OpEntry(f"{n}.out", f"{n}.default", aliases=(n,), **kw)


def _compare(c, k):
    return OpEntry(f"{c}.{k}_out", f"{c}.{k}", aliases=(f"{c}.{k}",),
                   notes="bool output")


DEVICE_OPS: tuple[OpEntry, ...] = (
    # elementwise binary (broadcasting); `alpha` and scalar operands are baked into the program
    _binary("add"), _binary("sub"), _binary("mul", fast_path="int elementwise"), _binary("div"),
    OpEntry("div.out_mode", "div.Tensor_mode", aliases=("div.Tensor_mode",),
            notes="fp16/bf16 with rounding_mode trunc/floor -> CPU"),
    OpEntry("maximum.out", "maximum.default", aliases=("maximum",)),
    OpEntry("minimum.out", "minimum.default", aliases=("minimum",)),
    OpEntry("pow.Tensor_Scalar_out", "pow.Tensor_Scalar", aliases=("pow.Tensor_Scalar",),
            fast_path="fp32 square-pow",
            notes="integer and +-0.5 exponents; others: compile_error"),
    # unary
    _unary("abs"), _unary("neg"), _unary("rsqrt", fast_path="fp32 rsqrt"), _unary("log"),
    _unary("ceil"), _unary("floor"), _unary("silu"), _unary("sigmoid"),
    OpEntry("clamp.out", "clamp.default", aliases=("clamp",),
            notes="scalar bounds only (clamp.Tensor_out runs on the host)"),
    _unary("logical_not", notes="bool output"),
    # comparisons (bool outputs)
    *(_compare(c, k) for c in ("eq", "ne", "gt", "ge", "lt", "le") for k in ("Tensor", "Scalar")),
    # reductions
    OpEntry("mean.out", "mean.dim", aliases=("mean.dim",), fast_path="fp32 last-dim mean"),
    OpEntry("max.unary_out", "max.default"), OpEntry("min.unary_out", "min.default"),
    OpEntry("max", "max.default", out="functional"),
    OpEntry("min", "min.default", out="functional"),
    # matrix units
    OpEntry("mm.out", "mm.default", aliases=("mm",), kernel="matmul"),
    OpEntry("bmm.out", "bmm.default", aliases=("bmm",), kernel="matmul"),
    OpEntry("addmm.out", "addmm.default", aliases=("addmm",), kernel="matmul"),
    OpEntry("linear", "linear.default", out="functional", autograd="linear", kernel="matmul",
            notes="under autograd: a Function whose backward is aten::linear_backward"),
    # softmax and selection
    OpEntry("_softmax.out", "_softmax.default", aliases=("_softmax",)),
    OpEntry("where.self_out", "where.self", skip_dtype=(0,)),
    OpEntry("where.self", "where.self", out="functional", skip_dtype=(0,)),
    OpEntry("masked_fill_.Scalar", "masked_fill.Scalar", out="inplace", skip_dtype=(1,)),
    OpEntry("masked_fill_.Tensor", "masked_fill.Tensor", out="inplace", skip_dtype=(1,)),
    # attention (4-D q/k/v; `_fused_sdp_choice` routes everything else to the math path)
    OpEntry("_scaled_dot_product_fused_attention_overrideable",
            "_scaled_dot_product_fused_attention_overrideable.default", out="functional",
            kernel="sdpa", align64=False, operands=(0, 1, 2, 3), skip_dtype=(3,),
            notes="head_dim, L and S multiples of 32, else CPU in fp32"),
    # backward kernels
    OpEntry("silu_backward.grad_input", "silu_backward.default",
            aliases=("silu_backward",)),
    OpEntry("_softmax_backward_data.out", "_softmax_backward_data.default",
            aliases=("_softmax_backward_data",)),
    OpEntry("linear_backward", "linear_backward.default", out="functional",
            kernel="linear_backward"),
    OpEntry("_scaled_dot_product_fused_attention_overrideable_backward",
            "_scaled_dot_product_fused_attention_overrideable_backward.default",
            out="functional", kernel="sdpa_backward", align64=False,
            operands=(0, 1, 2, 3, 4, 6), skip_dtype=(4,)),
)

BY_NAME = {e.name: e for e in DEVICE_OPS}

# Data-movement ops the device's copy engine runs natively (``dispatch/data_movement.py``): no
# compile, no pre-dispatch checks, any dtype; they run where their data is.
NATIVE_OPS = (
    "cat.out", "cat", "index_select.out", "index_select", "index_copy.out", "index_copy_",
    "repeat_interleave.Tensor", "arange", "arange.start", "arange.start_step", "arange.start_out",
    "clone", "fill_.Scalar", "fill_.Tensor", "zero_",
)

# Ops registered explicitly to the CPU fallback (the reference's list): they run on the host
# even with ``TORCH_RBLN_DISABLE_FALLBACK=unsupported_op`` and are logged and counted as
# ``host_op``. Every other op without a device kernel reaches the same fallback through the
# boxed catch-all (which ``unsupported_op`` turns into an error). ``cos``/``sin``/``exp`` are
# left to the catch-all: the tutorial shows ``torch.sin`` failing under ``unsupported_op``.
HOST_OPS = (
    "max.dim_max", "min.dim_min", "flip", "cumsum.out", "sum.IntList_out",
    "clamp.Tensor_out", "trunc.out", "equal", "_efficientzerotensor", "native_dropout",
    "normal_", "normal.Tensor_Tensor", "normal.Tensor_float", "uniform_", "random_.from",
    "randperm.generator_out", "masked_select", "masked_select.out", "masked_scatter_",
    "_index_put_impl_", "index_add.out", "index_fill_.int_Scalar", "gather.out",
    "scatter.src_out", "put_", "nonzero",
    *(f"bitwise_{b}.{k}" for b in ("and", "or", "xor") for k in ("Scalar_out", "Tensor_out")),
    "bitwise_not.out", "logical_and.out", "logical_or.out", "logical_xor.out",
    "all.all_out", "all.out", "any.all_out", "any.out", "argmax.out", "topk.values",
    "count_nonzero.dim_IntList", "fmod.Tensor_out", "sgn.out",
    "sign.out", "signbit.out", "pow.Tensor_Tensor_out", "pow.Scalar_out",
    "linalg_vector_norm.out", "_linalg_svd.U", "addcmul.out", "isnan", "isposinf.out",
    "isneginf.out", "nan_to_num.out", "isin.Tensor_Tensor_out", "tril.out", "triu.out", "relu",
    "native_batch_norm", "native_group_norm", "logit_backward.grad_input", "sigmoid_backward.grad_input",
    "tanh_backward.grad_input", "unfold_backward", "native_dropout_backward",
)
