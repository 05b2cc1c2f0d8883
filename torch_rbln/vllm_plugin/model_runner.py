"""``RblnModelRunner``: vLLM's GPU model runner with rbln as the device.

vLLM's V1 runner (``vllm/v1/worker/gpu_model_runner.py``) is written for CUDA but speaks to the
device through ``self.device``; the parts that assume CUDA are replaced here, the way vLLM's CPU
and XPU runners do it:

* streams and events: the runner names ``torch.cuda.Stream`` / ``torch.cuda.Event`` /
  ``torch.cuda.current_stream`` / ``torch.cuda.stream`` (async output copies, async
  scheduling) and ``torch.Event`` (the transfer event of ``_to_list``). While the runner is
  built and while it samples (where async outputs are made), those ``torch.cuda`` names are
  rbln's streams and events, the way vLLM's XPU runner and vllm-ascend map them onto their
  devices; ``torch.Event()`` is an rbln event already (rbln is the current accelerator);
* step metadata on the host: block tables, slot mappings, query start offsets and sequence
  lengths stay host tensors (the runner's CPU half of each ``CpuGpuBuffer``), as the vendor's
  plugin keeps them by default. Integer bookkeeping would otherwise run as CPU fallbacks of
  int ops every step. Model inputs (token ids, positions), sampling parameters, weights,
  activations and the KV cache are rbln tensors;
* the ``compute_slot_mapping`` kernel (Triton on GPUs, C++ on the CPU) has a PyTorch body here;
* per-request generators (seeded sampling, and the sampler warm-up) are rbln generators,
  ``torch.Generator(device=self.device)`` as on a GPU;
* layers with an rbln version (``layers.py``: the rotary embedding) get it before the model is
  built.

Weights: ``load_model`` builds the model under ``torch.device(self.device)`` like the GPU path,
so every parameter and buffer is created on rbln.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from ..patches import cuda_names_as_rbln
from . import layers

logger = init_logger(__name__)

# runner attributes that feed the model itself and so live on the device
_DEVICE_INPUTS = frozenset({"input_ids", "inputs_embeds", "mrope_positions", "positions",
                            "is_padding", "lookback_token_ids"})


class RblnModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        layers.install()
        with cuda_names_as_rbln():
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

    def sample_tokens(self, *args, **kwargs):
        with cuda_names_as_rbln():
            return super().sample_tokens(*args, **kwargs)

    def _sync_device(self) -> None:
        torch.rbln.synchronize(self.device)


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
