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
made once per device and dtype from vLLM's own ``cos_sin_cache``, and their rows for a step's
positions are looked up once per forward (all layers share the module and the positions).
Where the keys follow the queries in each row of one buffer (the fused q/k/v projection's
output, split), queries and keys are rotated together, as one tensor. Partial rotary
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


def _step_tables(rope, positions: torch.Tensor, query: torch.Tensor):
    """The tables' rows for ``positions``, ``[tokens, 1, head_size]`` each: looked up once per
    forward (every layer shares one rotary module and gets the same ``positions`` tensor)."""
    last = getattr(rope, "_rbln_step", None)
    if last is not None and last[0] is positions and last[1] == (query.device, query.dtype):
        return last[2], last[3]
    cos, sin = _tables(rope, query)
    flat = positions.flatten()
    rows = (cos.index_select(0, flat).unsqueeze(-2), sin.index_select(0, flat).unsqueeze(-2))
    rope._rbln_step = (positions, (query.device, query.dtype), *rows)
    return rows


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int):
    """``x`` ``[tokens, heads, head_size]`` rotated: ``x * cos + [x2, x1] * sin``."""
    half = head_size // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), -1)
    return x * cos + swapped * sin


def _adjacent(query: torch.Tensor, key: torch.Tensor) -> bool:
    """``key`` follows ``query`` in each row of one buffer (vLLM's fused q/k/v projection
    output, split): both can be rotated as one tensor."""
    return (query.dim() == 2 and key.dim() == 2 and query.shape[0] == key.shape[0]
            and query.stride() == key.stride() and query.stride(1) == 1
            and query.dtype == key.dtype
            and key.untyped_storage().data_ptr() == query.untyped_storage().data_ptr()
            and key.storage_offset() == query.storage_offset() + query.shape[1])


def rope_forward_oot(self, positions: torch.Tensor, query: torch.Tensor,
                     key: torch.Tensor | None = None):
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    if (not self.is_neox_style or self.rotary_dim != self.head_size
            or type(self).forward_native is not RotaryEmbedding.forward_native):
        return self.forward_native(positions, query, key)
    eager = not torch.compiler.is_compiling()      # a traced graph keeps no state, reads no
    if eager:                                       # pointers: its compiler does the rest
        cos, sin = _step_tables(self, positions, query)
    else:
        half = self.cos_sin_cache.index_select(0, positions.flatten()).to(query.dtype)
        cos, sin = half.chunk(2, dim=-1)
        cos, sin = torch.cat((cos, cos), -1).unsqueeze(-2), torch.cat((-sin, sin), -1).unsqueeze(-2)
    n, d = cos.shape[0], self.head_size
    if eager and key is not None and _adjacent(query, key):
        # one rotation for both: the rows of q and k side by side, as the projection wrote them
        width = query.shape[1] + key.shape[1]
        both = query.as_strided((n, width // d, d), (query.stride(0), d, 1))
        out = _rotate(both, cos, sin, d).view(n, width)
        return out[:, :query.shape[1]], out[:, query.shape[1]:]
    q = _rotate(query.view(n, -1, d), cos, sin, d).view(query.shape)
    if key is not None:
        key = _rotate(key.view(n, -1, d), cos, sin, d).view(key.shape)
    return q, key


def install() -> None:
    """Give vLLM's layers their rbln versions (before the model is built: vLLM picks a
    layer's forward when it constructs it)."""
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    RotaryEmbedding.forward_oot = rope_forward_oot
