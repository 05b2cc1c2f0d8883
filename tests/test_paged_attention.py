"""The NPU's paged decode attention kernel, ``torch.ops.rbln_custom_ops.paged_causal_attn_decode``,
against a reference written out per sequence: the new keys and values land in their slots, and
each query attends to its own sequence's keys through its block table (GQA, positions on page
boundaries, sequences of different lengths). On rbln it is one device program per call that
leaves the cache in device memory; fp32 runs on the host with its reason; mistakes raise."""

from __future__ import annotations

import math

import pytest
import torch

from test_ops import Events

OP = "rbln_custom_ops::paged_causal_attn_decode"
paged = torch.ops.rbln_custom_ops.paged_causal_attn_decode
BS, BLOCKS = 32, 24
# (heads, kv heads): GQA and plain multi-head attention
HEADS = [(8, 4), (4, 4)]
# each sequence's new position: the first slot, last and first slots of a page, a later page
POSITIONS = [0, 31, 32, 63, 70]
TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 1e-5}


def _case(heads, kv_heads, dtype, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = len(POSITIONS)
    q = torch.randn(B, heads, D, generator=g).to(dtype)
    k = torch.randn(B, kv_heads, D, generator=g).to(dtype)
    v = torch.randn(B, kv_heads, D, generator=g).to(dtype)
    cache = torch.randn(BLOCKS, BS, kv_heads, 2 * D, generator=g).to(dtype)
    seq = torch.tensor(POSITIONS, dtype=torch.int32)
    table = torch.randperm(BLOCKS, generator=g)[:B * 3].view(B, 3).to(torch.int32)
    return q, k, v, cache, seq, table, 1 / math.sqrt(D)


def _reference(q, k, v, cache, seq, table, scale):
    """The cache after the step and each sequence's attention, one sequence at a time, fp32."""
    cache = cache.clone()
    rows = cache.view(-1, cache.shape[2], cache.shape[3])
    D, group = q.shape[-1], q.shape[1] // k.shape[1]
    out = []
    for b, p in enumerate(seq.tolist()):
        rows[int(table[b, p // BS]) * BS + p % BS] = torch.cat([k[b], v[b]], -1)
        slots = torch.tensor([int(table[b, i // BS]) * BS + i % BS for i in range(p + 1)])
        keys = rows[slots, :, :D].float().transpose(0, 1).repeat_interleave(group, 0)
        vals = rows[slots, :, D:].float().transpose(0, 1).repeat_interleave(group, 0)
        w = torch.softmax(q[b].float().unsqueeze(1) @ keys.transpose(1, 2) * scale, -1)
        out.append((w @ vals).squeeze(1))
    return torch.stack(out), cache


@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_paged_decode_equals_the_reference_and_runs_as_one_device_program(heads, kv_heads, dtype):
    q, k, v, cache, seq, table, scale = _case(heads, kv_heads, dtype)
    want, want_cache = _reference(q, k, v, cache, seq, table, scale)
    on_cpu = cache.clone()
    cpu_out = paged(q, k, v, on_cpu, seq, scale, table)
    torch.testing.assert_close(cpu_out.float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(on_cpu, want_cache)

    dev_cache = cache.to("rbln")
    args = [t.to("rbln") for t in (q, k, v)]
    with Events() as ev:
        out = paged(*args, dev_cache, seq.to("rbln"), scale, table.to("rbln"))
        again = paged(*args, dev_cache, seq.to("rbln"), scale, table.to("rbln"))
    assert out.device.type == "rbln" and out.dtype == dtype and out.shape == q.shape
    assert torch.equal(out.cpu(), cpu_out)          # the program computes the CPU op's bits
    assert torch.equal(again.cpu(), cpu_out)        # the same slots written again: same result
    assert torch.equal(dev_cache.cpu(), want_cache)
    assert ev.count("dispatch", OP) == 2 and ev.count("device_program", OP) == 2
    assert ev.count("recompile", OP) <= 1 and ev.count("warm_hit", OP) >= 1
    assert ev.count("cpu_fallback") == 0
    from torch_rbln.runtime.storage import state_of
    assert state_of(dev_cache).residency != 0       # the cache was written on the device


@pytest.mark.parametrize("D", [128, 32, 20, 64], ids=["d128", "d32", "d20", "d64-double"])
def test_paged_decode_reads_any_head_dim_and_dtype_on_the_host(D):
    # the host computation's forms: head dims a multiple of 64 (a head's tokens at once),
    # of 8 (eight elements a step), others and float64 (element by element)
    dtype = torch.float64 if D == 64 else torch.bfloat16
    q, k, v, cache, seq, table, scale = _case(8, 2, dtype, D=D, seed=D)
    want, want_cache = _reference(q, k, v, cache, seq, table, scale)
    out = paged(q, k, v, cache, seq, scale, table)
    tol = 1e-5 if dtype == torch.float64 else TOL[dtype]     # (the reference sums in fp32)
    torch.testing.assert_close(out.double(), want.double(), atol=tol, rtol=tol)
    assert torch.equal(cache, want_cache)


def test_a_page_outside_the_cache_raises():
    # the last sequence (position 70) reads pages 0 and 1 of its table and writes page 2
    q, k, v, cache, seq, table, scale = _case(8, 4, torch.bfloat16)
    table[4, 0] = BLOCKS + 3
    with pytest.raises(RuntimeError, match="page 27 of sequence 4 is not one of the cache's 24"):
        paged(q, k, v, cache, seq, scale, table)


def test_a_step_plan_is_not_reused_for_other_positions():
    # every layer of a step passes the same positions and block table; a call with other
    # values (the next step) must not see the previous step's slots or mask
    q, k, v, cache, seq, table, scale = _case(8, 4, torch.bfloat16)
    dev_cache = cache.to("rbln")
    dq, dk, dv = (t.to("rbln") for t in (q, k, v))
    paged(dq, dk, dv, dev_cache, seq.to("rbln"), scale, table.to("rbln"))
    later = seq + 1
    want, want_cache = _reference(q, k, v, dev_cache.cpu(), later, table, scale)
    out = paged(dq, dk, dv, dev_cache, later.to("rbln"), scale, table.to("rbln"))
    torch.testing.assert_close(out.cpu().float(), want, atol=4e-2, rtol=4e-2)
    assert torch.equal(dev_cache.cpu(), want_cache)


def test_no_nan_scan_of_the_cache():
    # the reference's custom kernels do not scan their operands: a NaN in a page nobody reads
    # stays where it is, and the step runs on the device
    q, k, v, cache, seq, table, scale = _case(8, 4, torch.bfloat16)
    unused = sorted(set(range(BLOCKS)) - set(table.flatten().tolist()))[0]
    cache[unused] = float("nan")
    with Events() as ev:
        out = paged(*(t.to("rbln") for t in (q, k, v)), cache.to("rbln"), seq.to("rbln"), scale,
                    table.to("rbln"))
    assert ev.count("cpu_fallback") == 0 and not out.cpu().isnan().any()


def test_fp32_runs_on_the_host_with_its_reason():
    q, k, v, cache, seq, table, scale = _case(8, 4, torch.float32)
    want, want_cache = _reference(q, k, v, cache, seq, table, scale)
    dev_cache = cache.to("rbln")
    with Events() as ev:
        out = paged(*(t.to("rbln") for t in (q, k, v)), dev_cache, seq.to("rbln"), scale,
                    table.to("rbln"))
    assert ev.count("cpu_fallback", OP) == 1
    assert ev.count("cpu_fallback_reason", "dtype-not-fp16") == 1
    assert ev.count("device_program", OP) == 0
    torch.testing.assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(dev_cache.cpu(), want_cache)


def test_mistakes_raise_naming_the_op():
    q, k, v, cache, seq, table, scale = _case(8, 4, torch.bfloat16)
    dq, dk, dv, dc, ds, dt = (t.to("rbln") for t in (q, k, v, cache, seq, table))
    with pytest.raises(RuntimeError,
                       match=rf"{OP}: seq \[5\] must be \[5\] and block_table \[2, 3\]"):
        paged(dq, dk, dv, dc, ds, scale, dt[:2])
    with pytest.raises(RuntimeError, match=f"{OP}: 8 query heads are not a multiple of 3"):
        paged(dq, dk[:, :3], dv[:, :3], dc, ds, scale, dt)
    with pytest.raises(RuntimeError, match=f"{OP}: every tensor must be on rbln .*cpu"):
        paged(dq, dk, dv, dc, seq, scale, dt)
