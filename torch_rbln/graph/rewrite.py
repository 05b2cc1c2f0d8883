"""Rewrites of a partition's graph before it runs: CPU devices, custom program bodies, and the
NPU's matmul numerics."""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..dispatch import cuda_dtypes
from ..dispatch.attention_dropout import with_attention_dropout
from ..runtime import executors, faults

_CPU = torch.device("cpu")


def to_cpu_devices(gm: torch.fx.GraphModule) -> None:
    """Rewrite ``device=rbln`` constants to the CPU: partitions compute on CPU tensors over the
    device buffers (or the host views)."""
    def fix(v):
        if isinstance(v, torch.device) and v.type == "rbln":
            return _CPU
        return v

    for n in gm.graph.nodes:
        n.args = torch.fx.node.map_aggregate(n.args, fix)
        n.kwargs = torch.fx.node.map_aggregate(n.kwargs, fix)
    gm.recompile()


def _traced(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def widen_cuda_dtypes(gm: torch.fx.GraphModule) -> None:
    """Host nodes whose op CUDA runs in dtypes the CPU kernel lacks, on such operands, compute
    as eager's fallback does (``dispatch/cuda_dtypes.py``): ``histc`` on int32 works in a graph
    too. Decided on the traced operands: every other node keeps its aten op."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            args = torch.fx.node.map_aggregate(n.args, _traced)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, _traced)
            if cuda_dtypes.changes(n.target, args, kwargs):
                n.target = cuda_dtypes.host_kernel(n.target)
    gm.recompile()


def compilable(gm: torch.fx.GraphModule) -> bool:
    """Whether Inductor may compile a host partition without changing what it computes: aten
    ops only (no widening stand-in, no custom program body) and no random op (Inductor draws
    its own random numbers, eager's fallback draws from the CPU generator)."""
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            continue
        if (not isinstance(n.target, torch._ops.OpOverload)
                or torch.Tag.nondeterministic_seeded in n.target.tags):
            return False
    return True


def use_custom_kernels(gm: torch.fx.GraphModule, placed: dict, index: int) -> None:
    """Ops whose program body is written out in ``runtime/executors.py`` (attention,
    ``linear_backward``) have no CPU kernel: both sides run that body, as eager does (attention
    dropout included: its mask is drawn from rbln:``index``'s generator at each call)."""
    for n in gm.graph.nodes:
        p = placed.get(n.name)
        if n.op == "call_function" and p is not None and p.kernel:
            body = with_attention_dropout(p.op.removeprefix("aten::"),
                                          executors.CUSTOM[p.kernel], index)
            n.target = _with_layouts(body, n.meta.get("val"))
    gm.recompile()


def _stride_order(v: torch.Tensor) -> tuple:
    """Dims from outermost to innermost in ``v``'s memory layout (size hints, no guards)."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint as hint
    return tuple(sorted(range(v.dim()), key=lambda d: -hint(v.stride()[d])))


def _with_layouts(fn, val):
    """``fn`` with each result laid out like the traced op's (a custom body returns contiguous
    results; the graph may view them assuming the op's own layout, e.g. attention's)."""
    single = not isinstance(val, (tuple, list))
    orders = tuple(_stride_order(v) if isinstance(v, torch.Tensor) else None
                   for v in ((val,) if single else val))

    def relayout(o, order):
        if not isinstance(o, torch.Tensor) or order is None or o.dim() != len(order):
            return o
        if order == tuple(range(o.dim())) and o.is_contiguous():
            return o
        inverse = sorted(range(len(order)), key=order.__getitem__)
        return o.permute(order).contiguous().permute(inverse)

    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        if single:
            return relayout(out, orders[0])
        return tuple(relayout(o, order) for o, order in zip(out, orders))

    run.__name__ = fn.__name__
    return run


_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                      torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default,
                      torch.ops.aten.linear.default})
_to_copy = torch.ops.aten._to_copy.default


def _rows(n: torch.fx.Node):
    """Rows of the left operand of a matmul node (its size hint if symbolic), or None."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint as hint
    a = n.args[1] if n.target is torch.ops.aten.addmm.default else n.args[0]
    v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    rows = 1
    for s in v.shape[:-1]:
        rows *= hint(s)
    if n.target in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
        rows //= max(hint(v.shape[0]), 1)       # per batch entry: each GEMM is one matrix
    return rows


def fp32_matmuls(gm: torch.fx.GraphModule) -> None:
    """Give half-precision matmuls the NPU's numerics explicitly: operands widened to fp32,
    fp32 accumulation, the result rounded once. A host without a native fp16 GEMM runs the
    half-precision kernel several times slower than fp32 (AVX2: ~7x), so this is also what
    makes device programs fast. Matmuls with few rows keep the half-precision kernel, which
    accumulates in fp32 and rounds once as well, and so do dtypes this CPU has native GEMMs for
    (AVX512-FP16/AMX): the choice eager programs make too (``executors.widens``)."""
    g = gm.graph
    for n in list(g.nodes):
        v = n.meta.get("val")
        if (n.op != "call_function" or n.target not in _MATMULS
                or not executors.widens(getattr(v, "dtype", None), _rows(n))):
            continue
        with g.inserting_before(n):
            n.args = tuple(g.call_function(_to_copy, (a,), {"dtype": torch.float32})
                           if isinstance(a, torch.fx.Node) else a for a in n.args)
        with g.inserting_after(n):
            back = g.call_function(_to_copy, (n,), {"dtype": v.dtype})
        n.replace_all_uses_with(back, delete_user_cb=lambda u: u is not back)
    gm.recompile()


def widened_inputs(gm: torch.fx.GraphModule) -> frozenset:
    """Inputs that :func:`fp32_matmuls` only ever widens (a weight feeding matmuls) take fp32
    directly: their ``_to_copy`` nodes go, and the runner passes the input's kept widened form
    (``device_input_widened``), so an unchanged weight is converted once, not per call.
    Returns the positions of those placeholders."""
    out = set()
    for i, ph in enumerate(gm.graph.find_nodes(op="placeholder")):
        users = list(ph.users)
        v = ph.meta.get("val")
        if not users or getattr(v, "dtype", None) not in executors.HALF or not all(
                u.target is _to_copy and u.kwargs == {"dtype": torch.float32}
                and len(u.args) == 1 for u in users):
            continue
        for u in users:
            u.replace_all_uses_with(ph)
            gm.graph.erase_node(u)
        out.add(i)
    if out:
        gm.recompile()
    return frozenset(out)


def inject_fault(gm: torch.fx.GraphModule) -> None:
    """Test only (``TORCH_RBLN_TEST_FAULT``, ``runtime/faults.py``): the faulty op's floating
    results in a device partition get the fault's amount added, as its eager programs do."""
    fault = faults.spec("graph")
    if fault is None:
        return
    op, _, amount = fault
    hit = False
    for n in list(gm.graph.nodes):
        if (n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload)
                or not faults.matches(op, n.target.name())):
            continue
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.is_floating_point():
            continue
        with gm.graph.inserting_after(n):
            bumped = gm.graph.call_function(torch.ops.aten.add.Tensor, (n, amount))
        bumped.meta["val"] = val
        n.replace_all_uses_with(bumped, delete_user_cb=lambda user: user is not bumped)
        hit = True
    if hit:
        gm.recompile()


# a linear whose weight the runner passes in the GEMM library's blocked layout (the weight's kept
# packed form, ``device_input_packed``): the eager linear program's computation
# (``executors.linear_packed``), a call Inductor makes as it is
_lib = torch.library.Library("torch_rbln", "FRAGMENT")
_lib.define("packed_linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor")
_lib.impl("packed_linear", executors.linear_packed, "CompositeExplicitAutograd")
_lib.impl("packed_linear", lambda x, w, b=None: x.new_empty((*x.shape[:-1], w.shape[0])), "Meta")
_packed_linear = torch.ops.torch_rbln.packed_linear.default
_linear = torch.ops.aten.linear.default


# a linear whose rows are known per call only (a symbolic batch): both forms of the eager linear
# program are bound, and each call takes the one its rows choose (``executors.widens``), as the
# eager program would: the weight's fp32 form (a widened GEMM, one rounding) for enough rows, else
# the weight itself (packed where this dtype packs: ``packed_inputs``)
_lib.define("linear_by_rows(Tensor input, Tensor weight, Tensor weight_fp32, Tensor? bias=None)"
            " -> Tensor")


def _linear_by_rows(x, w, w32, b=None):
    if executors.widens(x.dtype, x.numel() // max(x.shape[-1], 1)):
        return _linear(x.float(), w32, None if b is None else b.float()).to(x.dtype)
    return executors.linear_packed(x, w, b)


_lib.impl("linear_by_rows", _linear_by_rows, "CompositeExplicitAutograd")
_lib.impl("linear_by_rows", lambda x, w, w32, b=None: x.new_empty((*x.shape[:-1], w.shape[0])),
          "Meta")
_by_rows = torch.ops.torch_rbln.linear_by_rows.default


def _symbolic(n: torch.fx.Node) -> bool:
    """Whether the rows of a matmul node's left operand are known per call only."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int
    a = n.args[0]
    v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    return isinstance(v, torch.Tensor) and not all(map(is_concrete_int, v.shape[:-1]))


def _placeholders_first(g: torch.fx.Graph, phs: list) -> None:
    """Move the inputs, in their order, ahead of every other node (a split partition's come
    where their first user is), so that an input appended after them is defined before any
    node uses it."""
    first = next(iter(g.nodes))
    if first is not phs[0]:
        first.prepend(phs[0])
    for a, b in zip(phs, phs[1:]):
        a.append(b)


def linears_by_rows(gm: torch.fx.GraphModule) -> tuple:
    """Linears of a half-precision dtype that widens (:func:`fp32_matmuls`' choice), over a
    symbolic number of rows, on a weight the partition takes as an input: the choice is made per
    call (``torch_rbln::linear_by_rows``), not once from the size hint (vLLM traces one graph
    whose token count hints at a prefill's; its decode steps have a few rows). Each such weight
    gets a second input, appended after the others, that the runner binds to the weight's kept
    fp32 form. Returns the input position each appended input is the fp32 form of."""
    g = gm.graph
    phs = list(g.find_nodes(op="placeholder"))
    position = {ph: i for i, ph in enumerate(phs)}
    fp32_of: dict = {}
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not _linear or len(n.args) < 2:
            continue
        v, w = n.meta.get("val"), n.args[1]
        wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if (w not in position or n.args[0] is w or not isinstance(wv, torch.Tensor)
                or wv.dim() != 2 or not isinstance(v, torch.Tensor) or v.dtype != wv.dtype
                or not executors.widens(v.dtype, None) or not _symbolic(n)):
            continue
        w32 = fp32_of.get(w)
        if w32 is None:
            if not fp32_of:
                _placeholders_first(g, phs)
            with g.inserting_after(phs[-1]):
                w32 = fp32_of[w] = g.placeholder(f"{w.name}_fp32")
            with wv.fake_mode:
                w32.meta["val"] = torch.empty_like(wv, dtype=torch.float32)
            phs.append(w32)
        n.target = _by_rows
        n.args = (n.args[0], w, w32, *n.args[2:])
    if fp32_of:
        gm.recompile()
    return tuple(position[w] for w in fp32_of)


def packed_inputs(gm: torch.fx.GraphModule, widened: frozenset = frozenset()) -> frozenset:
    """Inputs that only ever serve as the 2-D weight of a linear in a dtype whose linear
    programs take packed weights (``executors.packed_dtypes``): their linears call
    ``torch_rbln::packed_linear`` (or ``linear_by_rows``, whose few-row calls then take it) and
    the runner passes the weight's kept packed form, as the eager linear program takes it, so a
    weight is laid out once, not per call. Positions in ``widened`` (taken in fp32,
    ``widened_inputs``) are not packed. Returns the positions of those placeholders."""
    packed = executors.packed_dtypes()
    out = set()
    if not packed:
        return frozenset()
    for i, ph in enumerate(gm.graph.find_nodes(op="placeholder")):
        v = ph.meta.get("val")
        users = list(ph.users)
        if (i in widened or not isinstance(v, torch.Tensor) or v.dim() != 2 or v.dtype not in packed or not users
                or not all(u.target in (_linear, _by_rows) and len(u.args) >= 2
                           and u.args[1] is ph and u.args[0] is not ph for u in users)):
            continue
        for u in users:
            if u.target is _linear:
                u.target = _packed_linear
        out.add(i)
    if out:
        gm.recompile()
    return frozenset(out)

