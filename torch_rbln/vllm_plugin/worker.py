"""``RblnWorker``: one vLLM worker per rbln device.

vLLM's GPU worker (``vllm/v1/worker/gpu_worker.py``) accepts only ``device_type == "cuda"`` in
``init_device``; this worker does the same steps for ``rbln:N`` (device selection, process
group, seeds, memory snapshot through ``torch.accelerator``, which rbln answers) and builds the
rbln model runner. The rest of the GPU worker (load, profile, KV cache, execute) is reused.

KV cache size. vLLM sizes the KV cache from the device's memory (``--gpu-memory-utilization``
of ``total_memory``, 16 GiB for the default NPU). The virtual NPU backs device memory with host
memory, so that budget is also capped by what this host can give: a quarter of the host memory
available when the worker starts (a device-resident byte costs its host view plus its device
buffer, and the host runs everything else). ``--kv-cache-memory-bytes`` sets it exactly.

Tensor/pipeline parallelism. vLLM's multiprocessing executor starts one worker process per rank,
all with the engine's environment. Each worker keeps only its own NPU(s) visible before its first
device use, as the multi-NPU tutorial does for ``torchrun`` ranks (``RBLN_VISIBLE_DEVICES`` per
``LOCAL_RANK``): it then claims just those NPUs (torch_rbln/runtime/claims.py) and rbln-ccl's
layout check sees one NPU per rank. Its device is ``rbln:0``.
"""

from __future__ import annotations

import gc
import os
from contextlib import nullcontext

import psutil
import torch
from vllm.config import CompilationMode
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot, format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import request_memory
from vllm.v1.worker.worker_base import CompilationTimes

logger = init_logger(__name__)


class RblnWorker(Worker):
    def init_device(self):
        if self.device_config.device_type != "rbln":
            raise RuntimeError(f"RblnWorker runs on rbln, not {self.device_config.device}")
        if self.local_rank >= torch.rbln.device_count():
            raise RuntimeError(f"rbln worker for local rank {self.local_rank}, but only "
                               f"{torch.rbln.device_count()} rbln device(s) are visible "
                               "(RBLN_DEVICES)")
        index = self.local_rank
        if self.parallel_config.world_size > 1:
            index = keep_own_npus(self.local_rank)
        self.device = torch.device(f"rbln:{index}")
        torch.rbln.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        # one rank has nothing to communicate: its groups stay on gloo, as before TP existed
        backend = current_platform.dist_backend if self.parallel_config.world_size > 1 else "gloo"
        init_worker_distributed_environment(self.vllm_config, self.rank,
                                            self.distributed_init_method, self.local_rank,
                                            backend)
        if index != self.local_rank:
            _groups_on(self.device)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.rbln.empty_cache()
        self.init_snapshot = MemorySnapshot(device=self.device)
        self.requested_memory = request_memory(self.init_snapshot, self.cache_config)
        self._host_available = psutil.virtual_memory().available
        self._init_workspace_and_model_runner()

    # called by name through LLM.collective_rpc: what each rank's NPU holds, and explain regions
    # opened and closed around engine steps (the steps run in the workers, not in the caller)
    def rbln_memory(self) -> dict:
        return {"rank": self.rank, "device": str(self.device), "npus": _npus_of(self.device),
                "allocated": torch.rbln.memory_allocated(self.device),
                "max_allocated": torch.rbln.max_memory_allocated(self.device),
                "reserved": torch.rbln.memory_reserved(self.device)}

    def rbln_explain_start(self) -> None:
        self._explain = torch.rbln.explain().start()

    def rbln_explain_stop(self) -> dict:
        p = self._explain.stop()
        return {"rank": self.rank, "report": p.report(), "dump": p.dump()}

    def _maybe_get_memory_pool_context(self, tag: str):
        # the GPU worker sends every out-of-tree device to vLLM's CuMem sleep-mode allocator
        return nullcontext()

    def _make_model_runner(self):
        from .model_runner import RblnModelRunner
        return RblnModelRunner(self.vllm_config, self.device)

    def determine_available_memory(self) -> int:
        explicit = self.cache_config.kv_cache_memory_bytes
        if (explicit and self.compilation_config.mode == CompilationMode.NONE
                and self.parallel_config.pipeline_parallel_size == 1):
            # eager with an explicit size: no graph to trace and nothing to measure (a later
            # pipeline stage still needs the profiling run: it makes the buffers the previous
            # stage's hidden states are received into)
            logger.info("rbln: KV cache %s GiB (--kv-cache-memory-bytes)", format_gib(explicit))
            return explicit
        available = super().determine_available_memory()
        if explicit:
            return available
        cap = self._host_available // 4
        if available > cap:
            logger.info("rbln: KV cache capped at %s GiB of the %s GiB the device could hold: "
                        "the virtual NPU backs device memory with host memory (a quarter of "
                        "the %s GiB available at start); --kv-cache-memory-bytes sets it",
                        format_gib(cap), format_gib(available), format_gib(self._host_available))
            return cap
        return available

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # The GPU worker's version warms CUDA kernels (FlashInfer, DeepGEMM, Triton JIT) and
        # captures CUDA graphs; none exists here. With compilation on, the model was traced and
        # compiled by the profiling run in determine_available_memory.
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)


def keep_own_npus(local_rank: int) -> int:
    """Narrow this process to the NPU(s) of logical device ``rbln:<local_rank>`` (the variables
    as a launcher sets them per rank) and return its index afterwards, 0. Must run before the
    first device use: after it the mapping is frozen."""
    from ..runtime import devices

    if devices.is_committed():
        raise RuntimeError(f"rbln worker {local_rank}: the device mapping was committed before "
                           "the worker chose its NPU (a device was used at import)")
    npus = devices.plan().groups[local_rank]
    os.environ["RBLN_DEVICES"] = ",".join(str(n) for n in npus)
    os.environ.pop("RBLN_VISIBLE_DEVICES", None)
    os.environ.pop("RBLN_DEVICE_MAP", None)
    os.environ["RBLN_NPUS_PER_DEVICE"] = str(len(npus))
    return 0


def _groups_on(device: torch.device) -> None:
    """vLLM gives each group coordinator (and its communicator) the device
    ``rbln:<local_rank>`` (``GroupCoordinator.__init__``, out-of-tree platforms), where buffers
    it receives into are made; this worker sees its own NPU as ``rbln:0`` only."""
    from vllm.distributed import parallel_state

    for ref in parallel_state._groups.values():
        group = ref()
        if group is None:
            continue
        group.device = device
        if group.device_communicator is not None:
            group.device_communicator.device = device


def _npus_of(device: torch.device) -> list[int]:
    from ..runtime import devices
    return list(devices.plan().groups[device.index or 0])
