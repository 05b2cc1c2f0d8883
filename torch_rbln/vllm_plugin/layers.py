"""vLLM layers written the way the NPU runs them (their ``forward_oot``, vLLM's hook for an
out-of-tree platform's own version of a layer).

Rotary embedding. vLLM's native version rotates the two halves of each head separately
(``x1 * cos - x2 * sin``, ``x2 * cos + x1 * sin``, on ``[tokens, heads, head_dim / 2]`` views),
so with 64-wide heads every one of its elementwise ops is 32 wide and runs on the host
(``last-dim-not-64-aligned``), with its operands pulled from the device and back. The vendor's
vLLM plugin rewrites it in the full-width form for the NPU; so does this one:

    out = x * [cos, cos] + [x2, x1] * [-sin, sin]

two multiplications and an addition over whole heads (device ops) and a ``cat`` of the halves
(the copy engine). Each half of ``out`` is ``x1 * cos + x2 * -sin`` and ``x2 * cos + x1 * sin``:
the products and sums vLLM computes, rounded the same way (negating ``sin`` is exact), so the
result is vLLM's bit for bit. The two full-width tables (``cos`` and the signed ``sin``) are
made once per layer, device and dtype, from vLLM's own ``cos_sin_cache``. Partial rotary
dimensions and GPT-J-style (interleaved) rotation, and rotary classes with a ``forward_native``
of their own, keep vLLM's version.
"""

from __future__ import annotations

import torch


def _tables(rope, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[cos, cos]`` and ``[-sin, sin]`` per position, in ``query``'s device and dtype."""
    key = (query.device, query.dtype)
    cached = getattr(rope, "_rbln_tables", None)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    cos, sin = rope.cos_sin_cache.to(query.device, query.dtype).chunk(2, dim=-1)
    tables = (torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1))
    rope._rbln_tables = (key, *tables)
    return tables


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tokens: int,
            head_size: int) -> torch.Tensor:
    shape = x.shape
    x = x.view(tokens, -1, head_size)
    half = head_size // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), -1)
    return (x * cos + swapped * sin).view(shape)


def rope_forward_oot(self, positions: torch.Tensor, query: torch.Tensor,
                     key: torch.Tensor | None = None):
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    if (not self.is_neox_style or self.rotary_dim != self.head_size
            or type(self).forward_native is not RotaryEmbedding.forward_native):
        return self.forward_native(positions, query, key)
    cos, sin = _tables(self, query)
    positions = positions.flatten()
    cos = cos.index_select(0, positions).unsqueeze(-2)      # [tokens, 1, head_size]
    sin = sin.index_select(0, positions).unsqueeze(-2)
    n = positions.shape[0]
    query = _rotate(query, cos, sin, n, self.head_size)
    if key is not None:
        key = _rotate(key, cos, sin, n, self.head_size)
    return query, key


def install() -> None:
    """Give vLLM's layers their rbln versions (before the model is built: vLLM picks a
    layer's forward when it constructs it)."""
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    RotaryEmbedding.forward_oot = rope_forward_oot
