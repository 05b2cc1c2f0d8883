"""The ``rbln`` Dynamo backend: ``torch.compile(model, backend="rbln")``.

Pipeline per Dynamo graph (one compile id, ``"0/0"``, ``"0/1"`` ...):

1. AOTAutograd traces the graph to functional aten graphs (one for inference, or a forward and
   a backward for training). Only the composites of ``compiler_optable.DECOMPOSE`` are
   decomposed (PyTorch's decompositions), into primitives the compiler covers; every other node
   is the aten op eager would see.
2. Each aten graph is placed node by node by the compiler's op table, then the eager rules
   (``placement.py``), and split into device and host partitions (``split.py``). A device
   partition with an unaligned last dim at its boundary is compiled whole; the padding is
   counted once per launch (a ``graph_pad`` event).
3. Each device partition is compiled to fused code by Inductor's C++ backend, on CPU example
   inputs made inside the graph's own fake mode, and runs as one launch on the device buffers;
   host partitions are compiled the same way with eager's per-op rounding and run on the host
   views (op by op where fusing would compute something else: ``rewrite.compilable``);
   operators with their own rbln kernel are called on the rbln tensors between partitions
   (``runners.py``; graph rewrites in ``rewrite.py``).

Each compiled aten graph is one ``recompile`` event keyed ``graph <compile id>`` (the backward
``graph <compile id> backward``) carrying its compile time, and one :class:`CompiledProgram` for
``torch.rbln.capture_programs()``. docs/graph-mode.md ("Graph mode").
"""

from __future__ import annotations

import copy
import inspect
import time
import weakref

import torch
import torch.fx

from .. import events
from ..dispatch import compiler_optable, rules
from ..runtime import caches, devices
from . import programs, split
from .rewrite import (compilable, fp32_matmuls, inject_fault, linears_by_rows, packed_inputs,
                      to_cpu_devices, use_custom_kernels, widen_cuda_dtypes, widened_inputs)
from .runners import DevicePartition, EagerCall, Forms, HostPartition, Results

__all__ = ["rbln_backend", "drop_all"]

# the reference's options; `npu`, `cache_dir` and `disable_logger` change nothing here
_OPTIONS = ("npu", "devices", "num_devices", "tensor_parallel_size", "mode", "cache_dir",
            "disable_logger")

# every compiled graph alive (Dynamo's cache owns them); empty_cache() drops their programs
_live: "weakref.WeakSet[GraphProgram]" = weakref.WeakSet()


@caches.register
def drop_all() -> None:
    """Drop the compiled device programs of every graph; each recompiles on its next call."""
    for g in list(_live):
        g.drop()


class GraphProgram:
    """A compiled aten graph: the outer graph calls the partitions in order."""

    def __init__(self, name: str, key: str, outer: torch.fx.GraphModule, device_parts: list,
                 per_call: tuple = ()):
        self.name = name
        self.key = key
        self.outer = outer
        self.device_parts = device_parts
        # every call's events: one launch per device partition, then per_call ((kind, key,
        # amount): where the nodes ran, the padding)
        self.events = events.Batch((("dispatch", key, 0), ("warm_hit", key, 0)) * len(device_parts)
                                   + tuple(per_call))
        self.stale = False
        # AOTAutograd passes the arguments as one list (an instance attribute: its wrappers copy
        # the callee's __dict__)
        self._boxed_call = True

    def build(self) -> None:
        t0 = time.perf_counter_ns()
        for p in self.device_parts:
            p.build()
        self.stale = False
        events.record("recompile", self.key, time.perf_counter_ns() - t0)

    def drop(self) -> None:
        for p in self.device_parts:
            p.drop()
        self.stale = True

    def __call__(self, args):
        if self.stale:
            self.build()
        events.record_batch(self.events)
        return self.outer.forward(*args)     # skips nn.Module's call machinery


def _check_options(options: dict | None, mode: str | None = None) -> dict:
    """The reference's options; ``mode`` (in ``options``, or torch.compile's own ``mode=``
    set to ``"compile_only"``) asks for a compile-only run, which is refused: graphs here
    compile at their first call and run. torch.compile's other modes have no effect."""
    options = dict(options or {})
    unknown = sorted(k for k in options if k not in _OPTIONS)
    if unknown:
        raise TypeError(f"unknown rbln options {unknown}")
    asked = options.get("mode") or (mode if mode == "compile_only" else None)
    if asked:
        raise NotImplementedError(
            f"rbln mode {asked!r} is not supported: the virtual NPU has no compile-only mode "
            f"(compiling into the cache without running); a graph compiles at its first call. "
            f"Remove 'mode' from the options, and call the compiled function to compile it.")
    n = options.get("devices", options.get("num_devices", options.get("tensor_parallel_size", 1)))
    if n != 1:
        raise NotImplementedError(f"a graph over {n} devices; torch-rbln runs graphs on one device")
    return options


def _target_device(example_inputs) -> torch.device:
    for v in example_inputs:
        if isinstance(v, torch.Tensor) and v.device.type == "rbln":
            return torch.device("rbln", v.device.index or 0)
    return torch.device("rbln", devices.current())


def _inductor(sub: torch.fx.GraphModule, fakes: list, fake_mode, device_side: bool = True):
    """Fused code for one partition: Inductor's C++ backend on CPU example inputs made inside
    the graph's fake mode (made outside it, symbolic shapes fail on a cold cache). A device
    partition gets the NPU's matmul numerics; a host partition keeps eager's: each op rounds
    to its result's dtype, as the op-by-op fallback does."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    with fake_mode:
        cpu = [torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device="cpu")
               if isinstance(v, torch.Tensor) else v for v in fakes]
    gm = torch.fx.GraphModule(sub, copy.deepcopy(sub.graph))   # compile_fx may mutate its graph
    to_cpu_devices(gm)
    widened = packed = frozenset()
    fp32_of: tuple = ()
    if device_side:
        fp32_of = linears_by_rows(gm)
        fp32_matmuls(gm)
        widened = widened_inputs(gm)
        packed = packed_inputs(gm, widened)
    if widened or fp32_of:
        with fake_mode:
            cpu = [v.float() if i in widened else v for i, v in enumerate(cpu)]
            cpu += [cpu[i].float() for i in fp32_of]
    # no per-call size/alignment asserts: Dynamo's guards fix each input's shape and strides,
    # and the values between partitions come from programs compiled for them
    with (torch._guards.tracing(torch._guards.TracingContext(fake_mode)),
          config.patch(emulate_precision_casts=not device_side, size_asserts=False,
                       alignment_asserts=False)):
        fn = compile_fx(gm, cpu)

    def run(*args):
        out = fn(*args)
        return out if isinstance(out, (tuple, list)) else (out,)
    return run, Forms(widened, packed, fp32_of)


def _output_values(gm: torch.fx.GraphModule) -> tuple:
    """The traced value (``meta["val"]``) of each of the graph's results, or None."""
    res = gm.graph.output_node().args[0]
    return tuple(getattr(o, "meta", {}).get("val")
                 for o in (res if isinstance(res, (tuple, list)) else (res,)))


def _rbln_outputs(sub: torch.fx.GraphModule) -> tuple:
    return tuple(isinstance(v, torch.Tensor) and v.device.type == "rbln"
                 for v in _output_values(sub))


def _may_alias(sub: torch.fx.GraphModule, args) -> bool:
    """Whether a result of the partition (called on the outer graph's nodes ``args``) may be a
    view of one of its inputs: a traced result sharing a traced input's storage. A value
    without a trace counts as one that may."""
    from torch.multiprocessing.reductions import StorageWeakRef

    ins = [a.meta.get("val") for a in args if isinstance(a, torch.fx.Node)]
    outs = _output_values(sub)
    if any(v is None for v in (*ins, *outs)):
        return True
    storages = {StorageWeakRef(v.untyped_storage()) for v in ins if isinstance(v, torch.Tensor)}
    return any(isinstance(v, torch.Tensor) and StorageWeakRef(v.untyped_storage()) in storages
               for v in outs)


def _spec_shape(t: torch.Tensor) -> tuple:
    return tuple(int(s) if not isinstance(s, torch.SymInt) else str(s) for s in t.shape)


def _specs(gm: torch.fx.GraphModule):
    ins, outs = [], []
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            ins.append(programs.InputSpec(n.name, _spec_shape(v), v.dtype, len(ins)))
    for i, v in enumerate(_output_values(gm)):
        if isinstance(v, torch.Tensor):
            outs.append(programs.OutputSpec(_spec_shape(v), v.dtype, i))
    return tuple(ins), tuple(outs)


def _padding(sub: torch.fx.GraphModule) -> int:
    """Bytes the compiler pads at a device partition's boundary: each input and result whose
    static last dim is not a multiple of 64, padded up to one (and cut back for results)."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint as hint
    vals = [n.meta.get("val") for n in sub.graph.find_nodes(op="placeholder")]
    vals.extend(_output_values(sub))
    total = 0
    for v in vals:
        if isinstance(v, torch.Tensor) and v.dim() and not rules.aligned(v.shape[-1]):
            rows = 1
            for s in v.shape[:-1]:          # size hints: a dynamic batch extent is not guarded
                rows *= hint(s)
            total += (-int(v.shape[-1]) % 64) * rows * v.element_size()
    return total


def _node_events(nodes) -> tuple:
    """One ``graph_node`` event per (where, op, why), its amount the number of such nodes."""
    groups: dict = {}
    for where, op, why in nodes:
        k = f"{where}\t{op}\t{why}"
        groups[k] = groups.get(k, 0) + 1
    return tuple(("graph_node", k, n) for k, n in groups.items())


def _results_as_rbln(gm: torch.fx.GraphModule, index: int) -> None:
    """Route the graph's results through :class:`Results` (staged values -> rbln tensors)."""
    out = gm.graph.output_node()
    values = out.args[0]
    with gm.graph.inserting_before(out):
        node = gm.graph.call_function(Results(index), tuple(values))
    out.args = (node,)
    gm.recompile()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str, kind: str,
                  device: torch.device, scopes: tuple = ()) -> GraphProgram:
    """Place, split and compile one aten graph."""
    t0 = time.perf_counter_ns()
    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    input_specs, output_specs = _specs(gm)
    placed, dev_names = split.split(gm)
    index = device.index or 0
    key = f"graph {name}" + (" backward" if kind == "backward" else "")
    device_parts, host_ops, host_parts, padded = [], [], 0, []
    for node in gm.graph.find_nodes(op="call_module"):
        sub = getattr(gm, node.target)
        use_custom_kernels(sub, placed, index)
        rbln_out = _rbln_outputs(sub)
        fakes = [a.meta.get("val") for a in node.args]
        aliases = _may_alias(sub, node.args)
        if node.target in dev_names:
            inject_fault(sub)
            pad = _padding(sub)
            if pad:
                padded.append((node.target, pad))
            part = DevicePartition(node.target, rbln_out, index, f"{key} {node.target}",
                                   lambda sub=sub, fakes=fakes: _inductor(sub, fakes, fake_mode),
                                   aliases)
            part.build()
            device_parts.append(part)
        else:
            to_cpu_devices(sub)
            widen_cuda_dtypes(sub)
            ops = split.placements_of(sub, placed)
            run = None
            if compilable(sub):
                # the same ops on the same host, without a Python call per op
                run = _inductor(sub, fakes, fake_mode, device_side=False)[0]
            part = HostPartition(node.target, rbln_out, index, sub, ops, run, aliases)
            host_ops.extend((p.op, p.reason) for p in part.ops)
            host_parts += 1
        # called as a plain function from the outer graph: no nn.Module call per partition
        gm.delete_submodule(node.target)
        node.op, node.target = "call_function", part
    for node in gm.graph.nodes:
        p = placed.get(node.name) if node.op == "call_function" else None
        if p is not None and p.where == "eager":
            node.target = EagerCall(node.target, index)
    _results_as_rbln(gm, index)
    nodes = tuple((p.where, p.op, p.why) for p in placed.values()
                  if p.where in ("device", "in-program", "host", "eager"))
    per_call = _node_events(nodes) + tuple(("graph_pad", f"{key} {part}", b) for part, b in padded)
    program = GraphProgram(name, key, gm, device_parts, per_call)
    _live.add(program)
    events.record("recompile", key, time.perf_counter_ns() - t0)
    programs.publish(programs.CompiledProgram(
        name=name, device=device, function=program, input_specs=input_specs,
        output_specs=output_specs, kind=kind, device_partitions=len(device_parts),
        host_ops=tuple(host_ops), host_partitions=host_parts,
        in_program_ops=tuple((op, why) for where, op, why in nodes if where == "in-program"),
        nodes=nodes, padded=tuple(padded)), scopes)
    return program


def rbln_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
                 mode: str | None = None, **_):
    """Dynamo backend: compile ``gm`` for the rbln device (inference and training)."""
    from torch._dynamo.backends.common import aot_autograd

    _check_options(options, mode)
    cid = torch._guards.CompileContext.current_compile_id()
    name = str(cid) if cid is not None else ""
    device = _target_device(example_inputs)
    # the backward compiles later, at the first backward(), possibly on another thread: it is
    # published to the capture scopes open where the forward compiled, too
    scopes = programs.open_scopes()

    def compiler(kind):
        def fn(g, inputs):
            return compile_graph(g, inputs, name, kind, device, scopes)
        return fn

    compiled = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                            inference_compiler=compiler("inference"),
                            decompositions=_decompositions())(gm, example_inputs)
    return _unboxed_mark(compiled)


def _unboxed_mark(fn):
    """AOTAutograd's compiled forward takes its arguments one by one, but copies the
    ``_boxed_call`` mark of the list-taking function inside it (functools.wraps copies
    ``__dict__``); Dynamo's accuracy minifier (``repro_level=4``) reads the mark and would call
    it with one list. The mark is set right here."""
    if getattr(fn, "_boxed_call", False) and any(
            p.kind is p.VAR_POSITIONAL
            for p in inspect.signature(fn, follow_wrapped=False).parameters.values()):
        fn._boxed_call = False
    return fn


_DECOMPOSITIONS: dict | None = None


def _decompositions() -> dict:
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        _DECOMPOSITIONS = compiler_optable.decompositions()
    return _DECOMPOSITIONS
