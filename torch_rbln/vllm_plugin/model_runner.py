"""``RblnModelRunner``: vLLM's GPU model runner with rbln as the device.

vLLM's V1 runner (``vllm/v1/worker/gpu_model_runner.py``) is written for CUDA but speaks to the
device through ``self.device``; the parts that assume CUDA are replaced here, the way vLLM's CPU
and XPU runners do it:

* streams and events: the runner creates ``torch.cuda.Stream`` / ``torch.cuda.Event`` /
  ``torch.Event`` objects in ``__init__`` (async output copies, a transfer event for
  ``_to_list``). rbln has no stream/event synchronisation yet, so they are created as no-op
  placeholders (as vLLM's CPU runner does) and ``_to_list`` copies with a plain ``tolist``;
* step metadata on the host: block tables, slot mappings, query start offsets and sequence
  lengths stay host tensors (the runner's CPU half of each ``CpuGpuBuffer``), as the vendor's
  plugin keeps them by default. Integer bookkeeping would otherwise run as CPU fallbacks of
  int ops every step. Model inputs (token ids, positions), sampling parameters, weights,
  activations and the KV cache are rbln tensors;
* the ``compute_slot_mapping`` kernel (Triton on GPUs, C++ on the CPU) has a PyTorch body here;
* per-request generators (seeded sampling, and the sampler warm-up) are made with
  ``torch.Generator(device=self.device)``; where this torch_rbln build has no rbln generators
  they are host generators, which is where random sampling runs anyway (RNG ops are host ops
  on rbln).

Weights: ``load_model`` builds the model under ``torch.device(self.device)`` like the GPU path,
so every parameter and buffer is created on rbln.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from vllm.logger import init_logger
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = init_logger(__name__)

# runner attributes that feed the model itself and so live on the device
_DEVICE_INPUTS = frozenset({"input_ids", "inputs_embeds", "mrope_positions", "positions",
                            "is_padding", "lookback_token_ids"})


class RblnModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        with _no_streams_or_events():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False
        self._keep_metadata_on_host()

    def _keep_metadata_on_host(self) -> None:
        for name, v in list(vars(self).items()):
            if name in _DEVICE_INPUTS:
                continue
            if isinstance(v, CpuGpuBuffer):
                v.gpu = v.cpu
            elif name in ("seq_lens", "num_computed_tokens") and isinstance(v, torch.Tensor):
                setattr(self, name, v.cpu())
        for table in self.input_batch.block_table.block_tables:
            for v in vars(table).values():
                if isinstance(v, CpuGpuBuffer):
                    v.gpu = v.cpu

    def _update_states(self, scheduler_output):
        with _host_generators_if_needed():
            return super()._update_states(scheduler_output)

    def _dummy_sampler_run(self, *args, **kwargs):
        with _host_generators_if_needed():
            return super()._dummy_sampler_run(*args, **kwargs)

    def _sync_device(self) -> None:
        torch.rbln.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()


@contextmanager
def _no_streams_or_events():
    """CUDA stream/event objects the runner creates in ``__init__`` become no-op placeholders."""

    class _Event:
        def __init__(self, *args, **kwargs):
            pass

        def record(self, *args, **kwargs):
            pass

        def synchronize(self):
            pass

        def wait(self, *args, **kwargs):
            pass

    class _Stream:
        def __init__(self, *args, **kwargs):
            self.device = torch.device("rbln")

        def wait_stream(self, *args, **kwargs):
            pass

    saved = torch.Event, torch.cuda.Event, torch.cuda.Stream
    torch.Event, torch.cuda.Event, torch.cuda.Stream = _Event, _Event, _Stream
    try:
        yield
    finally:
        torch.Event, torch.cuda.Event, torch.cuda.Stream = saved


def _has_device_generators() -> bool:
    try:
        torch.Generator(device="rbln")
        return True
    except (NotImplementedError, RuntimeError):
        return False


_DEVICE_GENERATORS = _has_device_generators()


@contextmanager
def _host_generators_if_needed():
    """``torch.Generator(device="rbln")`` made inside gives a host generator (see above)."""
    if _DEVICE_GENERATORS:
        yield
        return
    real = torch.Generator

    def generator(device=None):
        if device is not None and torch.device(device).type == "rbln":
            device = "cpu"
        return real(device=device) if device is not None else real()

    torch.Generator = generator
    try:
        yield
    finally:
        torch.Generator = real


def compute_slot_mapping_kernel(num_tokens, max_num_tokens, query_start_loc, positions,
                                block_table, block_table_stride, slot_mapping,
                                KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
                                CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024):
    """PyTorch body of vLLM's ``ComputeSlotMappingKernel`` (Triton on GPUs): the KV cache slot of
    every scheduled token, on the host block table; slots past ``num_tokens`` get ``PAD_ID``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("rbln: context parallelism is not supported")
    starts = query_start_loc.cpu().to(torch.int64)
    pos = positions[:num_tokens].cpu()
    req = torch.repeat_interleave(torch.arange(starts.numel() - 1), starts.diff())
    blocks = block_table.cpu()[req, pos // KV_CACHE_BLOCK_SIZE].to(torch.int64)
    slots = blocks * KV_CACHE_BLOCK_SIZE + pos % KV_CACHE_BLOCK_SIZE
    slot_mapping[:num_tokens].copy_(slots)
    slot_mapping[num_tokens:max_num_tokens].fill_(PAD_ID)
