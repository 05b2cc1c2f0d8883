"""Every change this package makes to PyTorch's own objects, and every private PyTorch name it
relies on, in one place.

PyTorch has no extension point for a few things an rbln user expects (tied weights staying tied
across ``Module.to``, ``torch.accelerator`` memory statistics, the default ``torch.compile`` on
rbln tensors, ...). Each :class:`Patch` replaces one PyTorch attribute for that, says why, and is
applied once at load by :func:`apply_all`. :data:`PRIVATE` lists the private (or undocumented)
PyTorch names the rest of the package uses without changing them.

The ABI handshake (``abi.HOOKS``) is derived from both lists, so it checks every one of them on
the installed torch; ``tests/test_diagnose.py`` fails when the package uses a private torch name
that is not listed here.

Nothing here imports torch at module level: diagnose reads the lists where ``import torch``
fails.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Hook:
    path: str              # dotted attribute path starting at ``torch``
    used_for: str
    at_import: bool = True  # False: only needed later (e.g. graph mode); diagnose still checks it


@dataclass(frozen=True)
class Patch:
    targets: tuple[str, ...]   # the PyTorch attributes replaced (dotted, starting at ``torch``)
    why: str
    apply: Callable[[], None]
    at_import: bool = True     # False: resolving a target imports a heavy module (Dynamo)


# -- the patches ----------------------------------------------------------------------------

def _module_apply() -> None:
    """Module moves to or from rbln keep each Parameter object, as moves to CUDA do.

    PyTorch moves a parameter in place (``param.data = new``, same object) only between
    backends whose TensorImpls it knows to be interchangeable (CPU, CUDA, ...), not
    PrivateUse1; otherwise each module slot gets a fresh Parameter, so references taken before
    ``model.to("rbln")`` (an optimizer's, a test's ``emb = model.get_input_embeddings().weight``)
    go stale, and weights shared between modules come apart. After the outermost
    ``Module._apply`` (``to``, ``cpu``, ``half``, ...), each parameter that moved to or from rbln
    takes its new contents in the old object (``torch.utils.swap_tensors``, which PyTorch itself
    uses for ``swap_module_params_on_conversion``), and every slot that held it holds it again.
    Where a swap is refused (e.g. a weak reference to the parameter), the slots share the new
    object, so tied weights still stay tied. A lazy module's ``UninitializedParameter`` stays
    one (PyTorch's fresh Parameter would be an empty initialized weight, which the lazy module
    then never materializes)."""
    import threading

    import torch
    from torch.nn.parameter import is_lazy
    orig_apply = torch.nn.Module._apply
    tls = threading.local()

    def _moved_with_rbln(old, new) -> bool:
        # not from meta (``to_empty``): PyTorch gives a meta module fresh Parameters on any
        # device, CUDA included, and its own tests check that it does
        kinds = (old.device.type, new.device.type)
        return (new is not old and type(new) is type(old) and "rbln" in kinds
                and "meta" not in kinds)

    def _apply(self, fn, recurse=True):
        if getattr(tls, "busy", False):
            return orig_apply(self, fn, recurse)
        before: dict[int, tuple] = {}          # id -> (parameter, the slots holding it)
        for mod in self.modules():
            for name, p in mod.named_parameters(recurse=False, remove_duplicate=False):
                before.setdefault(id(p), (p, []))[1].append((mod, name))
        tls.busy = True
        try:
            out = orig_apply(self, fn, recurse)
        finally:
            tls.busy = False
        for old, slots in before.values():
            keep = getattr(*slots[0])
            if (keep is not old and is_lazy(old) and not is_lazy(keep)
                    and "rbln" in (old.device.type, keep.device.type)):
                # a lazy module's UninitializedParameter came back a plain (empty) Parameter:
                # it stays uninitialized, on the new device and dtype, as on CUDA
                keep = torch.nn.UninitializedParameter(old.requires_grad, device=keep.device,
                                                       dtype=keep.dtype)
            if _moved_with_rbln(old, keep):
                try:
                    torch.utils.swap_tensors(old, keep)
                    keep = old
                except RuntimeError:         # weakref or another owner: not swappable
                    pass
            for mod, name in slots:
                if getattr(mod, name) is not keep:
                    setattr(mod, name, keep)
        return out

    torch.nn.Module._apply = _apply


_ACCELERATOR_MEMORY = ("memory_stats", "empty_cache", "reset_peak_memory_stats",
                       "reset_accumulated_memory_stats", "get_memory_info")


def _accelerator_memory() -> None:
    """``torch.accelerator``'s memory functions ask the C++ device allocator of the device
    type, which does not hold rbln memory: for rbln, answer them from ``torch.rbln``."""
    import collections

    import torch
    import torch.accelerator as acc
    import torch.accelerator.memory as accmem

    from . import api

    def _is_rbln(device_index) -> bool:
        if isinstance(device_index, (str, torch.device)):
            return torch.device(device_index).type == "rbln"
        cur = torch.accelerator.current_accelerator()
        return cur is not None and cur.type == "rbln"

    def _idx(device_index):
        if isinstance(device_index, (str, torch.device)):
            return torch.device(device_index).index
        return device_index

    def _wrap(name, ours):
        orig = getattr(acc, name)

        def fn(device_index=None, /):
            if _is_rbln(device_index):
                return ours(_idx(device_index))
            return orig(device_index)

        fn.__doc__ = orig.__doc__
        fn.__name__ = name
        setattr(acc, name, fn)
        if hasattr(accmem, name):
            setattr(accmem, name, fn)

    def memory_stats(idx):
        s = api.memory_stats(idx)
        out = collections.OrderedDict()
        for ours, theirs in (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"),
                             ("active", "active_bytes")):
            out[f"{theirs}.all.current"] = s.get(f"{ours}.current", 0)
            out[f"{theirs}.all.peak"] = s.get(f"{ours}.peak", 0)
            out[f"{theirs}.all.allocated"] = s.get(f"{ours}.total_allocated", 0)
            out[f"{theirs}.all.freed"] = s.get(f"{ours}.total_freed", 0)
        out["inactive_split_bytes.all.current"] = s.get("cached.current", 0)
        out["num_alloc_retries"] = s.get("num_alloc_retries", 0)
        out["num_ooms"] = s.get("num_ooms", 0)
        out["num_device_alloc"] = s.get("num_device_alloc", 0)
        out["num_device_free"] = s.get("num_device_free", 0)
        return out

    _wrap("memory_stats", memory_stats)
    _wrap("empty_cache", lambda idx: api.empty_cache(idx))
    _wrap("reset_peak_memory_stats", lambda idx: api.reset_peak_memory_stats(idx))
    _wrap("reset_accumulated_memory_stats", lambda idx: api.reset_accumulated_memory_stats(idx))
    _wrap("get_memory_info", lambda idx: api.mem_get_info(idx))


def _dynamo_reset() -> None:
    """``torch._dynamo.reset()`` also drops the eager program cache. Dynamo takes seconds to
    import, so the patch waits for its import instead of importing it now."""
    import importlib.abc
    import importlib.util
    import sys

    def wrap(mod) -> None:
        orig = getattr(mod, "reset", None)
        if orig is None or getattr(orig, "_rbln_wrapped", False):
            return

        def reset(*args, **kwargs):
            from .runtime import compiler
            compiler.clear_cache()
            return orig(*args, **kwargs)

        reset._rbln_wrapped = True
        reset.__wrapped__ = orig
        reset.__doc__ = orig.__doc__
        mod.reset = reset

    mod = sys.modules.get("torch._dynamo")
    if mod is not None:
        wrap(mod)
        return

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "torch._dynamo":
                return None
            # let the normal import run, then patch the module when it finishes loading
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def _exec(module):
                    exec_module(module)
                    wrap(module)
                spec.loader.exec_module = _exec
            return spec

    sys.meta_path.insert(0, _Finder())


def _default_compile() -> None:
    """``torch.compile(f)`` (the default backend, Inductor) on rbln tensors runs the graph with
    the rbln backend: Inductor has no code generator for rbln (it would fail with
    ``KeyError: 'rbln'``), and library code (``transformers``' ``generate``) compiles with the
    default backend. Graphs without rbln tensors go to Inductor unchanged; Inductor's options
    and ``mode`` do not apply to the rbln backend."""
    import torch
    cls = torch._TorchCompileInductorWrapper
    orig_call = cls.__call__

    def __call__(self, model_, inputs_, *args, **kwargs):
        if _touches_rbln(model_, inputs_):
            from .graph.backend import rbln_backend
            return rbln_backend(model_, inputs_)
        return orig_call(self, model_, inputs_, *args, **kwargs)

    __call__.__wrapped__ = orig_call
    cls.__call__ = __call__


def _touches_rbln(gm, inputs) -> bool:
    """An rbln tensor among the graph's inputs or among the values its nodes produce."""
    import torch

    def rbln(v) -> bool:
        return isinstance(v, torch.Tensor) and v.device.type == "rbln"

    if any(rbln(v) for v in inputs):
        return True
    graph = getattr(gm, "graph", None)
    for node in (graph.nodes if graph is not None else ()):
        v = node.meta.get("example_value", node.meta.get("val"))
        if rbln(v) or (isinstance(v, (tuple, list)) and any(rbln(x) for x in v)):
            return True
    return False


def _backward_on_calling_thread() -> None:
    """A backward pass runs on the thread that called ``backward()`` / ``autograd.grad``, as
    PyTorch runs a CPU (or lazy-tensor) backward, not on autograd's per-device worker threads.

    The virtual NPU's programs run on the host CPU, so a device worker thread buys no overlap
    (the caller waits for it) and costs a second OpenMP thread team: with more OpenMP threads
    than cores, libgomp stops spinning its idle workers, and from then on every parallel region
    in the process (the caller's CPU work included) pays a futex wake-up. Measured on a 2-core
    host, a training step got 30% slower, the CPU's own fp32 step in the same process too.
    ``torch.autograd.set_multithreading_enabled(False)`` is PyTorch's switch for this; it is
    thread-local, so it is set around each backward. Each node still runs under its device's
    stream guard, so its device (``rbln:1``) is current inside it."""
    import torch
    import torch.autograd.graph as graph
    orig = graph._engine_run_backward
    on_calling_thread = torch.autograd.set_multithreading_enabled

    def _engine_run_backward(*args, **kwargs):
        with on_calling_thread(False):
            return orig(*args, **kwargs)

    _engine_run_backward.__wrapped__ = orig
    _engine_run_backward.__doc__ = orig.__doc__
    graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward


def _dlpack() -> None:
    """DLPack for rbln tensors (``dlpack.py``): PyTorch's ``Tensor.__dlpack_device__`` knows
    PrivateUse1 only by its original name and raises for ``rbln``; an export must bring the host
    view it hands out up to date first (and leave it host-latest), and an import of an rbln
    capsule gives the exporter's storage back, so that both sides share one residency."""
    import torch
    import torch.utils.dlpack

    from . import dlpack
    orig_device = torch.Tensor.__dlpack_device__

    def __dlpack_device__(self):
        if self.device.type == "rbln" and not torch.overrides.has_torch_function_unary(self):
            return dlpack.device(self)
        return orig_device(self)

    def exporting(orig):
        def _to_dlpack(tensor, *, dl_device=None, copy=None):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "rbln":
                return dlpack.export(orig, tensor, dl_device, copy)
            return orig(tensor, dl_device=dl_device, copy=copy)

        _to_dlpack.__wrapped__ = orig
        _to_dlpack.__doc__ = orig.__doc__
        return _to_dlpack

    orig_import = torch._C._from_dlpack

    def _from_dlpack(capsule):
        t = orig_import(capsule)
        return dlpack.imported(t) if t.device.type == "rbln" else t

    __dlpack_device__.__wrapped__ = orig_device
    __dlpack_device__.__doc__ = orig_device.__doc__
    _from_dlpack.__wrapped__ = orig_import
    _from_dlpack.__doc__ = orig_import.__doc__
    torch.Tensor.__dlpack_device__ = __dlpack_device__
    to_dlpack = exporting(torch._C._to_dlpack)
    torch._C._to_dlpack = torch.utils.dlpack.to_dlpack = torch.to_dlpack = to_dlpack
    torch._C._to_dlpack_versioned = exporting(torch._C._to_dlpack_versioned)
    torch._C._from_dlpack = _from_dlpack


PATCHES: tuple[Patch, ...] = (
    Patch(("torch.nn.Module._apply",), "Module.to(rbln) keeps tied parameters tied",
          _module_apply),
    Patch(tuple(f"torch.accelerator.{name}" for name in _ACCELERATOR_MEMORY),
          "torch.accelerator memory statistics for rbln", _accelerator_memory),
    Patch(("torch._dynamo.reset",), "torch._dynamo.reset() drops the eager program cache",
          _dynamo_reset, at_import=False),
    Patch(("torch._TorchCompileInductorWrapper.__call__",),
          "default torch.compile on rbln tensors runs the rbln backend", _default_compile),
    Patch(("torch.autograd.graph._engine_run_backward", "torch.autograd._engine_run_backward"),
          "a backward pass runs on the calling thread (no second OpenMP team)",
          _backward_on_calling_thread),
    Patch(("torch.Tensor.__dlpack_device__", "torch._C._to_dlpack", "torch._C._to_dlpack_versioned",
           "torch._C._from_dlpack", "torch.utils.dlpack.to_dlpack", "torch.to_dlpack"),
          "DLPack export and import of rbln tensors", _dlpack),
)


# -- scoped patches: applied only inside a ``with`` block ------------------------------------

# the torch.cuda names vLLM's GPU model runner uses; torch.rbln has each under the same name
CUDA_AS_RBLN = ("Stream", "Event", "current_stream", "default_stream", "stream", "set_stream",
                "synchronize")


# the names the scoped patches replace (checked by the ABI handshake like the others)
SCOPED: tuple[Hook, ...] = tuple(
    Hook(f"torch.cuda.{name}", "vLLM's model runner on rbln (scoped)", at_import=False)
    for name in CUDA_AS_RBLN)


@contextmanager
def cuda_names_as_rbln():
    """Inside, ``torch.cuda.Stream``/``Event``/``stream``/... are ``torch.rbln``'s (vLLM's GPU
    model runner calls them by their CUDA names; vLLM's XPU runner and vllm-ascend map them the
    same way). Scoped, not for the whole process, so that code outside still sees torch's own
    ``torch.cuda``."""
    import torch
    saved = {name: getattr(torch.cuda, name) for name in CUDA_AS_RBLN}
    for name in CUDA_AS_RBLN:
        setattr(torch.cuda, name, getattr(torch.rbln, name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)


def apply_all() -> None:
    """Apply every patch (once per process: the backend loads once)."""
    for p in PATCHES:
        p.apply()


# -- private names used as they are ---------------------------------------------------------

PRIVATE: tuple[Hook, ...] = (
    # registration (_backend.py)
    Hook("torch.utils.rename_privateuse1_backend", "rename PrivateUse1 to rbln"),
    Hook("torch.utils.generate_methods_for_privateuse1_backend", "Tensor.rbln() and friends"),
    Hook("torch._register_device_module", "make torch.rbln the device module"),
    Hook("torch.library.Library.impl", "per-op PrivateUse1 kernels"),
    Hook("torch.library.Library.fallback", "the boxed CPU fallback"),
    Hook("torch.library.fallthrough_kernel", "copies pass through the conjugate and negative bits"),
    # dispatch (dispatch/*)
    Hook("torch._C.DispatchKeySet", "redispatch below PrivateUse1 to the CPU key"),
    Hook("torch._C.DispatchKey.CPU", "redispatch below PrivateUse1 to the CPU key"),
    Hook("torch._C.DispatchKey.NestedTensorCPU", "nested tensors' metadata ops: their nested kernel"),
    Hook("torch._ops.OpOverload.redispatch", "view/metadata ops on rbln tensors (set_, ...)"),
    Hook("torch._ops.OpOverload._handle", "boxed redispatch handle of an operator"),
    Hook("torch.ops.aten.as_strided.default._schema", "reading operator schemas (fallback, checks)"),
    Hook("torch._ops.OpOverload._opname", "the op's packet name in the compiler"),
    Hook("torch.ops.aten.as_strided.default._op", "the C++ callable of an overload (executor)"),
    Hook("torch._ops.OpOverload.decompose", "CompositeImplicit ops lowered by the compiler"),
    Hook("torch.ops.aten.as_strided.default._handle", "views of fallback outputs"),
    Hook("torch._C._DispatchOperatorHandle.redispatch_boxed", "boxed redispatch of view ops"),
    Hook("torch._C._len_torch_dispatch_stack", "dispatch-mode pre-dispatch check"),
    Hook("torch._C._data_address", "a storage's data pointer without materializing a lazy clone"),
    Hook("torch._debug_has_internal_overlap", "an out= or in-place target overlapping itself"),
    Hook("torch.ops.mkldnn._is_mkldnn_bf16_supported", "packed linear weights (executors)"),
    Hook("torch.ops.mkldnn._is_mkldnn_fp16_supported", "packed linear weights (executors)"),
    Hook("torch.ops.mkldnn._linear_pointwise", "the packed linear (executors, the warm path)"),
    Hook("torch.ops.mkldnn._reorder_linear_weight", "a weight's packed form (the native core)"),
    Hook("torch.ops.aten._local_scalar_dense.default._op",
         "the CPU's .item() on a host view (its own errors for an empty tensor)"),
    Hook("torch._C.TensorType", "reading operator schemas in the CPU fallback"),
    Hook("torch._C._AutoDispatchBelowAutograd", "device kernels that bypass autograd"),
    Hook("torch.Tensor._base", "whether a device op result owns its storage"),
    Hook("torch.utils._python_dispatch.TorchDispatchMode", "op lowering in the compiler"),
    Hook("torch.utils._python_dispatch.TorchDispatchMode._should_skip_dynamo",
         "the compiler's lowering mode never imports Dynamo"),
    Hook("torch._decomp.decomposition_table", "op lowering in the compiler"),
    # autocast (amp.py, diagnose.py): the ops each autocast key casts
    Hook("torch._C._dispatch_get_all_op_names", "the ops autocast casts (diagnose)",
         at_import=False),
    Hook("torch._C._get_privateuse1_backend_name", "autocast's default dtype in diagnose",
         at_import=False),
    # torch.rbln.compare (compare/*): loaded at its first use
    Hook("torch._C._current_autograd_node", "compare: which backward node runs an op"),
    Hook("torch._C._DisableTorchDispatch",
         "compare: golden runs and summaries inside a region are not observed"),
    Hook("torch.utils._pytree.tree_leaves", "compare: the tensors of a result"),
    Hook("torch.nn.modules.dropout._DropoutNd", "compare: modules that draw random numbers"),
    Hook("torch.nn.modules.module._global_forward_hooks_with_kwargs",
         "compare: a closed region leaves no global hook flag (its handle's remove() keeps it)"),
    Hook("torch.nn.modules.module.Module._call_impl",
         "compare: a module call's keyword arguments, read off the frame that runs the global "
         "forward pre-hooks (they receive the positional ones only)"),
    # graph mode (graph/*): needed by the first torch.compile(backend="rbln")
    Hook("torch._C._dispatch_has_kernel_for_dispatch_key", "graph partitioning", at_import=False),
    Hook("torch._guards.detect_fake_mode", "graph-mode example inputs", at_import=False),
    Hook("torch._guards.tracing", "graph-mode compile of a subgraph", at_import=False),
    Hook("torch._guards.TracingContext", "graph-mode compile of a subgraph", at_import=False),
    Hook("torch._guards.CompileContext.current_compile_id", "graph-mode program names",
         at_import=False),
    Hook("torch._dynamo.backends.common.aot_autograd", "graph-mode training", at_import=False),
    Hook("torch._higher_order_ops.auto_functionalize.auto_functionalized",
         "graph-mode: mutating operators with their own rbln kernel", at_import=False),
    Hook("torch._higher_order_ops.auto_functionalize.auto_functionalized_v2",
         "graph-mode: mutating operators with their own rbln kernel", at_import=False),
    Hook("torch._inductor.compile_fx.compile_fx", "graph-mode kernels", at_import=False),
    Hook("torch._inductor.config.patch", "graph-mode kernels: host partitions' per-op rounding",
         at_import=False),
    # the rbln-ccl process group (distributed/process_group.py) overrides these of PyTorch's
    # Python ProcessGroup route
    *(Hook(f"torch.distributed.ProcessGroup.{name}", "the rbln-ccl process group")
      for name in ("_allgather_base", "_reduce_scatter_base", "_get_sequence_number_for_group",
                   "_set_sequence_number_for_group", "_set_group_name")),
)


def hooks() -> tuple[Hook, ...]:
    """Every PyTorch name the backend patches or relies on (what ``abi.HOOKS`` checks)."""
    return tuple(Hook(t, p.why, p.at_import) for p in PATCHES for t in p.targets) + PRIVATE + SCOPED
