"""The NPU's paged attention kernels: ``torch.ops.rbln_custom_ops.*``.

RBLN PyTorch ships its paged attention as custom ops in the ``rbln_custom_ops`` namespace
(schemas from the compiler: ``paged_attn_decode``, ``paged_causal_attn_decode``, ...), which
the vendor's vLLM plugin calls for a decode step; they are device kernels, not compositions of
eager ops. This module defines the decode kernel the vLLM plugin uses here:

    paged_causal_attn_decode(q, k, v, kv_cache, seq, scale, block_table)

one device program per call that writes the step's keys and values into the paged cache and
attends each sequence's one new query to its cached keys (``runtime/executors.py`` computes it:
the shapes and numerics are there). It takes the cache as one tensor, keys and values side by
side in each token's row, as vLLM lays it out and as the vendor's vLLM plugin passes its cache
to its attention kernels (the reference's op of this name takes the key and value caches
separately). Per call, as for any device op: a ``dispatch`` event, the
kernel's own checks (the reference's asserts: the query's and the caches' last dimension a
multiple of 64; half-precision operands), ``recompile`` or ``warm_hit`` for the program of this
shape, the operands' device reads (an ``h2d`` push for host-latest data: the step's positions
and block table, made by the host), ``device_program``. The caches stay in device memory and
are written there. A failed check runs the same computation on the host views, as a CPU
fallback with its reason (an fp32 model: ``dtype-not-fp16``). No NaN/Inf scan: the reference
scans the operands of its eager op shims, not of its custom kernels (and a scan would read the
whole cache every step).

On the CPU the op computes the same thing (the reference implementation the tests compare
against).
"""

from __future__ import annotations

import time

import torch

from .. import events
from ..runtime import caches, devices, executors
from ..runtime.storage import device_input, device_output, host_input, host_output
from . import results, rules

_record = events.record
_record_program = events.record_program
_span_start = events.span_start
_perf_ns = time.perf_counter_ns

NAMESPACE = "rbln_custom_ops"
DECODE = "paged_causal_attn_decode"
SCHEMA = (f"{DECODE}(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, Tensor seq, "
          "float scale, Tensor block_table) -> Tensor")
OP_NAME = f"{NAMESPACE}::{DECODE}"

# program keys compiled so far (empty_cache() drops them: the next call compiles again)
_compiled: set = set()
# the last plan (executors.paged_decode_plan) and the positions and block table it is for:
# every layer of a decode step passes the same ones, so the new tokens' slots are derived once
# per step
_plan: list = [None]


@caches.register
def _drop() -> None:
    _compiled.clear()
    _plan[0] = None


def _plan_for(seq_d, table_d, block_size: int):
    """The plan of these positions and block table (device aliases): the last one while they
    hold the same values."""
    last = _plan[0]
    if (last is not None and last[0] == block_size and last[1].shape == seq_d.shape
            and last[2].shape == table_d.shape and torch.equal(last[1], seq_d)
            and torch.equal(last[2], table_d)):
        return last[3]
    plan = executors.paged_decode_plan(seq_d, table_d, block_size)
    _plan[0] = (block_size, seq_d.clone(), table_d.clone(), plan)
    return plan


def unsupported(q, k, v, kv_cache, seq, block_table) -> str | None:
    """Why the device kernel cannot take these operands (the reference's asserts), or None."""
    if any(t.dtype is not q.dtype for t in (k, v, kv_cache)) or q.dtype not in rules.HALF:
        return "dtype-not-fp16"
    if q.shape[-1] % 64 or kv_cache.shape[-1] % 64:
        return "last-dim-not-64-aligned"
    return None


def _check(q, k, v, kv_cache, seq, block_table) -> None:
    """Shapes the computation needs (a mistake here is the caller's: it raises)."""
    problems = []
    if q.dim() != 3 or k.dim() != 3 or kv_cache.dim() != 4:
        problems.append(f"q {list(q.shape)}, k {list(k.shape)} must be [B, heads, head_dim] "
                        f"and kv_cache {list(kv_cache.shape)} [blocks, block_size, Hkv, 2 * D]")
    else:
        B, H, D = q.shape
        hk = k.shape[1]
        if v.shape != k.shape or k.shape[0] != B or k.shape[2] != D:
            problems.append(f"k {list(k.shape)} and v {list(v.shape)} must be [{B}, Hkv, {D}]")
        if hk == 0 or H % hk:
            problems.append(f"{H} query heads are not a multiple of {hk} KV heads")
        if kv_cache.shape[2:] != (hk, 2 * D) or not kv_cache.is_contiguous():
            problems.append(f"kv_cache {list(kv_cache.shape)} must be a contiguous "
                            f"[blocks, block_size, {hk}, {2 * D}]")
        if tuple(seq.shape) != (B,) or block_table.dim() != 2 or block_table.shape[0] != B:
            problems.append(f"seq {list(seq.shape)} must be [{B}] and block_table "
                            f"{list(block_table.shape)} [{B}, pages]")
    if seq.dtype.is_floating_point or block_table.dtype.is_floating_point:
        problems.append("seq and block_table must be integer tensors")
    if problems:
        raise RuntimeError(f"{OP_NAME}: " + "; ".join(problems))


def _rbln(t) -> bool:
    return t.device.type == "rbln"


def _kernel(q, k, v, kv_cache, seq, scale, block_table):
    _record("dispatch", OP_NAME)
    index = q.device.index
    reads = (q, k, v, seq, block_table)
    for t in (*reads, kv_cache):
        if not _rbln(t):
            raise RuntimeError(f"{OP_NAME}: every tensor must be on rbln (got {t.device}); "
                               "move the step's positions and block table with .to('rbln')")
        if t.device.index != index:
            raise devices.mixed_devices(index, t.device.index)
    _check(q, k, v, kv_cache, seq, block_table)
    reason = unsupported(q, k, v, kv_cache, seq, block_table)
    body = executors.paged_causal_attn_decode
    if reason is not None:
        _record("cpu_fallback_reason", reason)
        t0 = _perf_ns()
        try:
            qh, kh, vh, sh, th = (host_input(t) for t in reads)
            host_input(kv_cache)            # read, then partly written, on the host
            out = body(qh, kh, vh, host_output(kv_cache), sh, scale, th)
        finally:
            _record("cpu_fallback", OP_NAME, _perf_ns() - t0)
        return results.wrap_result(out, index)
    key = (index, q.shape, k.shape, q.dtype, kv_cache.shape, seq.dtype, block_table.shape,
           block_table.dtype)
    if key in _compiled:
        _record("warm_hit", OP_NAME)
    else:
        _compiled.add(key)
        _record("recompile", OP_NAME, 0)
    qd, kd, vd, sd, td = (device_input(t) for t in reads)
    device_input(kv_cache)                  # read, then partly written, in device memory
    cache = device_output(kv_cache)
    t0 = _span_start()
    plan = _plan_for(sd, td, kv_cache.shape[1])
    out = body(qd, kd, vd, cache, sd, scale, td, plan)
    _record_program(OP_NAME, index, t0)
    return results.deliver_device(out, None, index)


def _fake(q, k, v, kv_cache, seq, scale, block_table):
    return q.new_empty(q.shape)


def register(libs: list) -> None:
    """Define the op and register its rbln kernel, its CPU reference and its fake."""
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    libs.append(lib)
    lib.define(SCHEMA)
    lib.impl(DECODE, _kernel, "PrivateUse1")
    lib.impl(DECODE, executors.paged_causal_attn_decode, "CPU")
    lib.impl(DECODE, _fake, "Meta")
