"""``RBLN_SDPA``: vLLM decoder attention over a paged KV cache in rbln memory.

vLLM's attention backends are CUDA/ROCm/Triton kernels or the CPU's C++ paged-attention op;
none runs on a PrivateUse1 device. This backend keeps vLLM's paged KV cache (blocks of
``block_size`` tokens, a block table per request) and runs each step as the NPU does:

* a decode step (one new token per request, vLLM's steady state) is one device program per
  layer, the NPU's paged decode attention kernel
  ``torch.ops.rbln_custom_ops.paged_causal_attn_decode`` (``torch_rbln/dispatch/
  paged_attention.py``): it writes the step's keys and values into their pages and attends each
  request's query to its cached keys, reading the pages through the request's block table; the
  step's positions and block table are moved to the device once and shared by every layer;
* any other step (prefill, chunked prefill, a prefill mixed with decodes) writes the cache with
  ``index_copy_`` of the step's keys and values into their slots, reads each request's context
  with ``index_select`` into a dense ``[B, S, H_kv, D]`` batch, runs one
  ``F.scaled_dot_product_attention`` for the whole batch (GQA native) with a boolean mask that
  encodes causality, each request's own length and the padding, and ``index_select``s the
  output back to vLLM's packed token order. The device attention kernel tiles query and key
  lengths by 32, so the batch is padded to multiples of 32 (padded query rows see key 0 only
  and are dropped; padded keys are masked). The index tensors and the mask are computed once
  per step on the host from vLLM's host-side metadata, moved to the device once, and shared by
  every layer.

The backend writes the cache itself (``forward_includes_kv_cache_update``), so a decode step's
cache write is part of its attention program.

Cache layout: vLLM's ``LBNHC`` layout (token-major pages): per layer the cache is
``[num_blocks, block_size, H_kv, 2 * D]`` in memory, keys in the first ``D`` of the last axis,
values in the second; a slot ``block * block_size + offset`` is one row of the flattened cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from torch_rbln.dispatch.paged_attention import DECODE, NAMESPACE

TILE = 32   # the device attention kernel's tile for query and key lengths


_paged_decode = getattr(getattr(torch.ops, NAMESPACE), DECODE)


class RblnSdpaBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]

    @staticmethod
    def get_name() -> str:
        return "RBLN_SDPA"

    @staticmethod
    def get_impl_cls() -> type[RblnSdpaImpl]:
        return RblnSdpaImpl

    @staticmethod
    def get_builder_cls() -> type[RblnSdpaMetadataBuilder]:
        return RblnSdpaMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(TILE)]

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class RblnSdpaMetadata:
    num_actual_tokens: int
    num_reqs: int
    # a decode step (one token per request): the paged decode kernel's operands
    seq: torch.Tensor | None = None          # [B] position of each request's new token
    block_table: torch.Tensor | None = None  # [B, pages] each request's cache blocks
    # any other step: the cache writes and the dense SDPA batch
    write_slots: torch.Tensor | None = None   # [num_actual_tokens] cache slot of each token
    query_len: int = 0      # padded query rows per request (multiple of TILE)
    key_len: int = 0        # padded keys per request (multiple of TILE)
    query_index: torch.Tensor | None = None   # [B * query_len] token row of each padded row
    key_slots: torch.Tensor | None = None     # [B * key_len] cache slot of each padded key
    out_index: torch.Tensor | None = None     # [num_actual_tokens] padded row of each output
    mask: torch.Tensor | None = None          # [B, 1, query_len, key_len] True = attend

    @property
    def decode(self) -> bool:
        return self.seq is not None


def _round_up(n: int, m: int) -> int:
    return max(m, (n + m - 1) // m * m)


class RblnSdpaMetadataBuilder(AttentionMetadataBuilder[RblnSdpaMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.device = device

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> RblnSdpaMetadata:
        m = common_attn_metadata
        B, T = m.num_reqs, m.num_actual_tokens
        seq_t = m.seq_lens_cpu_upper_bound
        seq_t = (seq_t if seq_t is not None else m.seq_lens.cpu())[:B]
        # the block table and slot mapping are host tensors on rbln (see model_runner.py)
        table = m.block_table_tensor[:B].cpu()
        dev = self.device
        if B and T == B and m.max_query_len == 1:
            # a decode step: the positions of the new tokens and the block table, for the
            # paged decode kernel (copies: vLLM reuses its host buffers for the next step)
            pos = (seq_t - 1).to(torch.int32)
            return RblnSdpaMetadata(num_actual_tokens=T, num_reqs=B, seq=pos.to(dev),
                                    block_table=table.to(dev))
        qsl = m.query_start_loc_cpu[:B + 1].tolist()
        seq = seq_t.tolist()
        qlens = [qsl[i + 1] - qsl[i] for i in range(B)]
        Lp = _round_up(max(qlens, default=1), TILE)
        Sp = _round_up(max(seq, default=1), TILE)

        bs = self.block_size
        pos = torch.arange(Sp)
        # slot of every key position of every request (positions past its length: masked)
        blocks = table.to(torch.int64).gather(1, (pos // bs).clamp(max=table.shape[1] - 1)
                                              .expand(B, Sp))
        key_slots = blocks * bs + pos % bs
        q_rows = torch.arange(Lp)
        query_index = torch.zeros(B, Lp, dtype=torch.int64)
        mask = torch.zeros(B, 1, Lp, Sp, dtype=torch.bool)
        out_index, write_slots = [], []
        for i in range(B):
            L, S = qlens[i], seq[i]
            query_index[i, :L] = torch.arange(qsl[i], qsl[i] + L)
            # query j of request i is token S - L + j and sees keys 0 .. S - L + j
            mask[i, 0, :L] = pos[None, :] <= (S - L + q_rows[:L, None])
            mask[i, 0, L:, 0] = True        # padded rows: one visible key, no NaN rows
            out_index.append(torch.arange(i * Lp, i * Lp + L))
            write_slots.append(key_slots[i, S - L:S])
        key_slots[pos[None, :].expand(B, Sp) >= torch.tensor(seq)[:, None]] = 0
        out_index = torch.cat(out_index) if out_index else torch.zeros(0, dtype=torch.int64)
        write_slots = torch.cat(write_slots) if write_slots else torch.zeros(0, dtype=torch.int64)
        assert out_index.numel() == T, (out_index.numel(), T)
        return RblnSdpaMetadata(
            num_actual_tokens=T, num_reqs=B, query_len=Lp, key_len=Sp,
            query_index=query_index.view(-1).to(dev), key_slots=key_slots.view(-1).to(dev),
            write_slots=write_slots.to(dev), out_index=out_index.to(dev), mask=mask.to(dev))


def _pages(kv_cache: torch.Tensor) -> torch.Tensor:
    """The layer's cache as ``[num_blocks, block_size, H_kv, 2 * D]`` (its memory order)."""
    pages = kv_cache.permute(0, 2, 1, 3)              # vLLM's logical [B, H, N, C] view
    if not pages.is_contiguous():
        raise RuntimeError("rbln attention needs the LBNHC KV cache layout with dense pages "
                           f"(got strides {tuple(kv_cache.stride())}); unset "
                           "VLLM_KV_CACHE_LAYOUT")
    return pages


def _slots(kv_cache: torch.Tensor) -> torch.Tensor:
    """The layer's cache as ``[num_blocks * block_size, H_kv, 2 * D]`` rows, one per slot."""
    nb, bs, h, c = (pages := _pages(kv_cache)).shape
    return pages.view(nb * bs, h, c)


class RblnSdpaImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes, sliding_window, kv_cache_dtype: str, logits_soft_cap=None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 sinks=None) -> None:
        unsupported = [name for name, v in (("ALiBi", alibi_slopes),
                                            ("sliding window", sliding_window),
                                            ("logits soft cap", logits_soft_cap),
                                            ("attention sinks", sinks),
                                            ("KV cache sharing between layers",
                                             kv_sharing_target_layer_name)) if v]
        if unsupported or kv_cache_dtype not in ("auto", "float16", "bfloat16"):
            raise NotImplementedError(
                f"rbln attention: {', '.join(unsupported) or 'kv cache dtype ' + kv_cache_dtype}"
                " not supported")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("rbln attention: fused output quantization")
        md: RblnSdpaMetadata | None = attn_metadata
        if md is None:                      # profiling / warm-up pass without a cache
            return output
        n, D = md.num_actual_tokens, self.head_size
        if md.decode:
            o = _paged_decode(query[:n], key[:n], value[:n], _pages(kv_cache), md.seq,
                              self.scale, md.block_table)
            output[:n].copy_(o)
            return output
        _slots(kv_cache).index_copy_(0, md.write_slots, torch.cat([key[:n], value[:n]], -1))
        B, Lp, Sp = md.num_reqs, md.query_len, md.key_len
        ctx = _slots(kv_cache).index_select(0, md.key_slots).view(B, Sp, self.num_kv_heads, 2 * D)
        k = ctx[..., :D].transpose(1, 2)
        v = ctx[..., D:].transpose(1, 2)
        q = query[:n].index_select(0, md.query_index).view(B, Lp, self.num_heads, D).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=md.mask, scale=self.scale,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        o = o.transpose(1, 2).reshape(B * Lp, self.num_heads, D)
        output[:n].copy_(o.index_select(0, md.out_index))
        return output
