"""torch.rbln has torch.cuda's device-generic surface: every public name of ``torch.cuda`` (and
the private probes PyTorch's own utilities make on a device module) exists on ``torch.rbln``
and works, or raises an error naming why it does not apply to an NPU; the names that are
CUDA's alone are listed below with the reason."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

# private names PyTorch's utilities read from a device module (torch.utils.checkpoint,
# torch.random.fork_rng, torch._functorch, torch._prims, torch.testing's _sleep, ...)
PROBES = ("_initialized", "_lazy_init", "_is_in_bad_fork", "_get_device_index",
          "_get_generator", "_sleep", "_exchange_device", "_maybe_exchange_device", "_is_compiled")

_LEGACY = "legacy typed tensor/storage types: torch.empty(..., dtype=, device='rbln') instead"
_SUBMODULE = ("a submodule: torch.rbln is one flat namespace and has its functions (streams, "
              "memory, random) directly")

# names of torch.cuda that are CUDA's alone (toolkit, libraries, graphs, NVIDIA formats)
CUDA_ONLY = {
    **{n: _LEGACY for n in (
        "BFloat16Storage", "BFloat16Tensor", "BoolStorage", "BoolTensor", "ByteStorage",
        "ByteTensor", "CharStorage", "CharTensor", "ComplexDoubleStorage", "ComplexFloatStorage",
        "DoubleStorage", "DoubleTensor", "FloatStorage", "FloatTensor", "HalfStorage",
        "HalfTensor", "IntStorage", "IntTensor", "LongStorage", "LongTensor", "ShortStorage",
        "ShortTensor")},
    **{n: _SUBMODULE for n in ("memory", "random", "streams", "graphs", "profiler")},
    "amp": "torch.cuda.amp is deprecated: torch.autocast(\"rbln\") and "
           "torch.amp.GradScaler(\"rbln\") instead",
    "sparse": "sparse layouts are not supported on rbln",
    "nccl": "NVIDIA's collective library (rbln's process group is torch_rbln.distributed)",
    "nvtx": "NVIDIA's profiler annotations",
    "jiterator": "runtime-compiled CUDA C++ kernels",
    "gds": "NVIDIA GPUDirect Storage",
    "tunable": "TunableOp selects among cuBLAS/hipBLASLt GEMM kernels",
    "green_contexts": "CUDA green contexts (SM partitioning)",
    "GreenContext": "CUDA green contexts (SM partitioning)",
    "CUDAGraph": "CUDA graph capture: rbln compiles graphs with torch.compile (backend rbln)",
    "graph": "CUDA graph capture: rbln compiles graphs with torch.compile (backend rbln)",
    "graph_pool_handle": "CUDA graph capture",
    "make_graphed_callables": "CUDA graph capture",
    "CUDAPluggableAllocator": "the arena is rbln's one allocator (no pluggable allocators)",
    "change_current_allocator": "the arena is rbln's one allocator (no pluggable allocators)",
    "MemPool": "private memory pools of CUDA's allocator (the arena has one pool per device)",
    "use_mem_pool": "private memory pools of CUDA's allocator (the arena has one pool per device)",
    "ExternalStream": "wraps a raw cudaStream_t",
    "get_stream_from_external": "wraps a raw cudaStream_t",
    "cudart": "the CUDA runtime library",
    "check_error": "CUDA runtime error codes",
    "CudaError": "CUDA runtime error codes",
    "cudaStatus": "CUDA runtime error codes",
    "DeferredCudaCallError": "CUDA's lazy-init call queue",
    "current_blas_handle": "cuBLAS handle",
    "current_solver_handle": "cuSOLVER handle",
    "get_arch_list": "CUDA compute capabilities the wheel was built for",
    "get_gencode_flags": "CUDA compute capabilities the wheel was built for",
    "host_memory_stats_as_nested_dict": "host_memory_stats has flat keys only",
}


def _walk():
    """torch.cuda's public names defined by torch.cuda itself (not its imports: typing,
    functools, os ...), and the private probes."""
    out = []
    for name in dir(torch.cuda):
        if name.startswith("_") and name not in PROBES:
            continue
        obj = getattr(torch.cuda, name)
        if isinstance(obj, types.ModuleType):
            if not obj.__name__.startswith("torch.cuda."):
                continue
        elif callable(obj):
            if not (getattr(obj, "__module__", None) or "").startswith(("torch.cuda", "torch.")):
                continue
            if getattr(obj, "__module__", "").startswith(("torch._utils", "torch.types")):
                continue    # helpers torch.cuda imports (classproperty, Device)
        elif name != "default_generators":
            continue        # constants (has_half, TYPE_CHECKING ...)
        out.append(name)
    return out


WALK = _walk()


def test_every_cuda_name_exists_on_rbln_or_is_listed_as_cuda_only():
    missing = [n for n in WALK if not hasattr(torch.rbln, n) and n not in CUDA_ONLY]
    assert not missing, f"torch.cuda names missing on torch.rbln without a reason: {missing}"
    listed_but_present = [n for n in CUDA_ONLY if hasattr(torch.rbln, n)]
    assert not listed_but_present
    assert len(WALK) > 100     # the walk does see torch.cuda's surface


def _no_required_args(fn) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values())


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", [n for n in WALK if n not in CUDA_ONLY])
def test_each_name_works_or_says_why_not(name):
    """Functions callable without arguments are called: they return, or raise an error naming
    rbln and why the call does not apply to an NPU."""
    obj = getattr(torch.rbln, name)
    if inspect.isclass(obj) or not callable(obj) or not _no_required_args(obj):
        return
    try:
        obj()
    except (RuntimeError, NotImplementedError) as e:
        assert "rbln" in str(e) and "does not apply to an NPU" in str(e), str(e)


def test_device_generic_answers():
    assert torch.rbln.is_bf16_supported() and not torch.rbln.is_tf32_supported()
    assert not torch.rbln.is_current_stream_capturing()
    assert torch.rbln.can_device_access_peer(0, 0) is False
    assert torch.rbln.get_sync_debug_mode() == 0
    torch.rbln.set_sync_debug_mode("default")
    with pytest.raises(RuntimeError, match="only mode 0"):
        torch.rbln.set_sync_debug_mode("warn")
    assert torch.rbln.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.rbln._is_compiled()
    gens = torch.rbln.default_generators
    assert len(gens) == torch.rbln.device_count() and gens[0] is torch.rbln.default_generator(0)
    assert torch.rbln._get_generator(torch.device("rbln:0")) is gens[0]
    assert torch.rbln._exchange_device(0) == 0 and torch.rbln._maybe_exchange_device(-1) == -1
    assert torch.rbln.get_allocator_backend() == "native"


def test_memory_views_agree_with_memory_stats():
    t = torch.ones(1 << 12, device="rbln", dtype=torch.float16).mul_(2)   # a device block
    flat, nested = torch.rbln.memory_stats(), torch.rbln.memory_stats_as_nested_dict()
    assert nested["allocated"]["current"] == flat["allocated.current"] > 0
    with pytest.warns(FutureWarning):
        assert torch.rbln.memory_cached() == torch.rbln.memory_reserved()
    free, total = torch.rbln.mem_get_info()
    assert torch.rbln.device_memory_used() == total - free
    ptr = torch.rbln.caching_allocator_alloc(1 << 10)
    assert torch.rbln.memory_allocated() >= flat["allocated.current"]
    torch.rbln.caching_allocator_delete(ptr)
    with pytest.raises(ValueError, match="was not allocated"):
        torch.rbln.caching_allocator_delete(ptr)
    assert set(torch.rbln.host_memory_stats()) >= {"active_bytes", "num_host_alloc"}
    p = torch.ones(1 << 16).pin_memory()
    assert torch.rbln.host_memory_stats()["active_bytes.peak"] >= 1 << 18
    del p
    torch.rbln.reset_peak_host_memory_stats()
    stats = torch.rbln.host_memory_stats()
    assert stats["active_bytes.peak"] == stats["active_bytes"]
    torch.rbln.reset_accumulated_host_memory_stats()
    assert torch.rbln.host_memory_stats()["num_host_alloc"] == 0
    del t


def test_sleep_queues_pending_work_on_the_current_stream():
    s = torch.rbln.Stream()
    with torch.rbln.stream(s):
        torch.rbln._sleep(200_000_000)                   # 0.2 s at the virtual NPU's 1 GHz
        assert not s.query()
    s.synchronize()
    assert s.query()
