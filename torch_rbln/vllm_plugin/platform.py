"""``RblnPlatform``: what vLLM asks of a device, answered for rbln.

Modelled on vLLM's own CPU platform (the closest device that also lacks CUDA graphs, NCCL and
Triton kernels) and on vllm-ascend (a PrivateUse1 device out of tree). Choices, and why:

* eager by default through vLLM's own model code: the models' custom ops run their
  ``forward_oot`` (= PyTorch-native) bodies, so every op goes through the rbln dispatcher and
  shows up in the fallback log and ``torch.rbln.explain()``;
* when compilation is on, vLLM's "trace once" mode with the ``rbln`` Dynamo backend (vLLM's
  own piecewise backend is built on Inductor for CUDA/CPU and CUDA graphs);
* attention through :mod:`.attention` (a small SDPA backend over a paged KV cache in rbln
  memory), since vLLM's attention kernels are CUDA, Triton or CPU C++;
* pinned host memory off for vLLM's buffers, as the vendor's plugin declares it (torch_rbln
  has pinned memory; see ``is_pin_memory_available``);
* async scheduling as vLLM decides it (on by default): the runner's output copies overlap on
  an rbln stream and are synchronised with rbln events (see ``model_runner.py``);
* tensor parallelism as on vLLM's CPU platform: vLLM's multiprocessing executor, one worker
  per rbln device (see ``worker.py``), vLLM's process groups on ``rbln-ccl``
  (``dist_backend``) with :class:`~.communicator.RblnCommunicator` for the device tensors.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import register_backend

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

ATTENTION_BACKEND = "torch_rbln.vllm_plugin.attention.RblnSdpaBackend"
WORKER = "torch_rbln.vllm_plugin.worker.RblnWorker"
COMMUNICATOR = "torch_rbln.vllm_plugin.communicator.RblnCommunicator"
# rbln-ccl waits 5 s (the reference's default) for the ranks of a new group unless the caller
# gives a timeout; vLLM's workers start a process each and import vLLM first, which on a loaded
# host takes longer than that, so groups get this timeout unless --distributed-timeout-seconds
# sets one
DIST_TIMEOUT_S = 300
# vLLM names attention backends by enum member; out-of-tree ones register theirs
register_backend("RBLN_SDPA", ATTENTION_BACKEND)


# vLLM's ahead-of-time compile (vllm/compilation/decorators.py, `aot_compile`) serialises the
# backend's output and so requires an Inductor OutputCode (torch/_dynamo/aot_compile.py); the
# rbln graph backend returns its own program, so the model is compiled the regular way.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


class RblnPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "rbln"
    device_type: str = "rbln"
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "rbln-ccl"
    device_control_env_var: str = "RBLN_DEVICES"
    # small standalone functions vLLM compiles (samplers, logprobs) use the rbln backend too
    simple_compile_backend: str = "rbln"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # the NPU computes in fp16/bf16; fp32 models run, but op by op on the host
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"rbln: model dtype {dtype} is not supported; use float16, "
                             "bfloat16 or float32 (--dtype)")

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.rbln.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.rbln.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.rbln.max_memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.rbln.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.rbln.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # Off because the vendor's plugin (vllm-rbln) declares it off, so vLLM stages its host
        # buffers the way it does on the NPU. torch_rbln itself has pinned memory: vLLM code
        # that pins unconditionally gets pinned tensors, and torch.accelerator.empty_host_cache()
        # (vLLM's shutdown) empties rbln's host allocator.
        return False

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("rbln: MLA and sparse attention are not supported; "
                                      "models with standard (multi-/grouped-query) attention run")
        if selected_backend is not None:
            logger.info("rbln: attention backend %s requested; rbln uses RBLN_SDPA",
                        selected_backend.name)
        return ATTENTION_BACKEND

    @classmethod
    def get_punica_wrapper(cls) -> str:
        return "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # attention stays one custom op in a traced graph; its Python body runs eagerly on rbln
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return torch.get_num_threads()

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's compiled kernels are CUDA or CPU; the models' PyTorch-native paths need none
        pass

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        from .model_runner import compute_slot_mapping_kernel
        register_kernels({"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel":
                          compute_slot_mapping_kernel})

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        if parallel.world_size > 1:
            check_parallel(parallel)
            if parallel.distributed_timeout_seconds is None:
                parallel.distributed_timeout_seconds = DIST_TIMEOUT_S
        if parallel.enable_dbo:
            parallel.enable_dbo = False

        comp = vllm_config.compilation_config
        comp.cudagraph_capture_sizes = []
        comp.cudagraph_mode = CUDAGraphMode.NONE
        if comp.mode == CompilationMode.VLLM_COMPILE:
            # vLLM's piecewise backend targets Inductor + CUDA graphs; on rbln the model is
            # traced once by Dynamo and compiled by the rbln graph backend
            comp.mode = CompilationMode.DYNAMO_TRACE_ONCE
            comp.backend = "rbln"
        if comp.mode == CompilationMode.DYNAMO_TRACE_ONCE and comp.backend in ("", "inductor"):
            comp.backend = "rbln"

        _choose_start_method()
        # shared-expert overlap uses CUDA streams
        os.environ["VLLM_DISABLE_SHARED_EXPERTS_STREAM"] = "1"


# the worker start method this plugin chose last (a value set by anyone else is kept)
_start_method: str | None = None


def _choose_start_method() -> None:
    """Engine core and workers start as vLLM starts them on a GPU: forked from this process,
    which costs nothing, unless this process already opened its NPUs (a committed device
    mapping: arenas, claims, stream workers), which a child must not inherit; then spawned,
    as vLLM spawns once CUDA is initialized. A spawned worker imports vLLM again (seconds per
    worker). ``VLLM_WORKER_MULTIPROC_METHOD`` set by the user is kept."""
    global _start_method
    from ..runtime import devices

    current = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
    if current is not None and current != _start_method:
        return
    _start_method = "spawn" if devices.is_committed() else "fork"
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = _start_method


def check_parallel(parallel) -> None:
    """Every rank of a tensor/pipeline-parallel engine needs an rbln device of its own; say how
    to get them before vLLM starts a worker."""
    n, tp, pp = parallel.world_size, parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    have = torch.rbln.device_count()
    if n > have:
        from ..runtime import devices
        host = devices.host()
        raise ValueError(
            f"rbln: tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs {n} rbln "
            f"devices (one per worker), but this process sees {have} (visible NPUs "
            f"{list(devices.visible())} of the virtual host's {host.npus}). Make {n} visible: "
            f"TORCH_RBLN_VIRTUAL_NPUS={max(n, host.npus)} emulates that many NPUs, and "
            "RBLN_DEVICES / RBLN_VISIBLE_DEVICES must name them; or lower tensor_parallel_size")
