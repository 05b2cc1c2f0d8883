"""Executor forms of compiled programs: how a program computes on device memory.

NPU numerics: tensors are stored in fp16/bf16, every program accumulates in fp32 and rounds
to the output dtype once, at the op boundary. The forms:

* ``direct``  the functional aten op on CPU tensors over device buffers. PyTorch's CPU kernels
  for fp16/bf16 elementwise ops, reductions, softmax and matmuls already widen to fp32
  internally and round once, which is exactly the NPU contract, so no extra pass is needed.
* ``fp32``    widen every fp16/bf16 input to fp32, run the op, round each floating output to
  its dtype (for ops whose CPU kernel would round between internal steps).
* ``matmul``  the matrix units: ``direct`` where this CPU has native half-precision GEMM kernels
  (AVX512-FP16 / AMX for fp16, AVX512-BF16 / AMX for bf16: fp32 accumulation, one rounding),
  ``fp32`` elsewhere (without them PyTorch's half-precision GEMM is many times slower than
  widening; where the CPU has one but it measures slower than widening, as bf16's can on a
  CPU without AMX, ``fp32`` too). :func:`matmul_precision` makes the choice once per process;
  graph programs make
  the same one (``graph/rewrite.py``), and ``python -m torch_rbln.diagnose`` shows it. A
  native-dtype ``linear`` takes its weight in the GEMM library's blocked layout, kept per
  weight (:func:`packed_dtypes`).
* custom      programs whose body is written out here (attention, ``linear_backward``): each
  step in fp32 (float64 in float64, as on the CPU), one rounding per output; the paged decode
  attention kernel (:func:`paged_causal_attn_decode`) feeds the matrix units as the NPU's
  attention unit does.

The widening forms (``fp32``, a widened ``matmul``, custom bodies) mark their run callable
``widened``: the eager kernel then hands them their half-precision operands already in fp32,
from the storage's kept widened form where it has one (a weight read again and not written
since: ``StorageState.device_input_widened`` in the native core), so an unchanged operand is
converted once, not on every call.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

from .. import _C

HALF = (torch.float16, torch.bfloat16)
_f32 = torch.float32


def _widen(x):
    # fp16/bf16 to fp32; wider dtypes (float32, float64) keep their own precision
    if isinstance(x, torch.Tensor) and x.dtype in HALF:
        return x.to(_f32)
    if isinstance(x, (list, tuple)):
        return type(x)(_widen(v) for v in x)
    return x


def _round(x, meta):
    if isinstance(x, torch.Tensor) and meta is not None and x.dtype != meta[1]:
        return x.to(meta[1])
    if isinstance(x, (list, tuple)):
        return type(x)(_round(v, m) for v, m in zip(x, meta))
    return x


def _rounder(meta):
    """:func:`_round` worked out once for a program's output meta (it never changes): a
    function that rounds a result, or None where nothing can need it. A multi-output program
    (attention's nine outputs) then checks only its tensor outputs, and builds no new tuple
    when they already have their dtypes."""
    if not isinstance(meta, tuple):
        return None
    if len(meta) == 3 and isinstance(meta[1], torch.dtype):       # one tensor
        dtype = meta[1]
        return lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype != dtype else x
    parts = [(i, r) for i, r in enumerate(map(_rounder, meta)) if r is not None]

    def many(xs):
        if not isinstance(xs, (list, tuple)):
            return _round(xs, meta)
        out = None
        for i, r in parts:
            if i < len(xs):
                v = r(xs[i])
                if v is not xs[i]:
                    if out is None:
                        out = list(xs)
                    out[i] = v
        return xs if out is None else type(xs)(out)
    return many


def direct(fn, out_meta):
    # an aten overload's own C++ entry point: OpOverload.__call__ only forwards to it
    return fn._op if isinstance(fn, torch._ops.OpOverload) else fn


def fp32(fn, out_meta):
    rnd = _rounder(out_meta) or (lambda x: x)

    def run(*args, **kwargs):
        return rnd(fn(*_widen(args), **_widen(kwargs)))
    run.widened = True
    return run


def custom(body, out_meta, widened: bool = True):
    """A custom program: its body computes in fp32 (``widened``: the caller passes its fp16/bf16
    operands widened) and the outputs round once, to ``out_meta``'s dtypes."""
    rnd = _rounder(out_meta) or (lambda x: x)

    def run(*args, **kwargs):
        return rnd(body(*args, **kwargs))
    run.widened = widened
    return run


def _out_dtype(out_meta):
    for m in out_meta if isinstance(out_meta, tuple) else ():
        if isinstance(m, tuple) and len(m) == 3 and isinstance(m[1], torch.dtype):
            return m[1]
    return None


# ------------------------------------------------------------------------------------------
# attention

def _bmm(a, b):
    """Batched matmul over all leading dims, written as the matrix unit's ``bmm`` (tracing
    ``torch.matmul`` would pull in symbolic-shape machinery for nothing)."""
    lead = a.shape[:-2]
    out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
    return out.reshape(*lead, a.shape[-2], b.shape[-1])

def _scores(q, k, attn_bias, is_causal, scale):
    """Attention logits ``q @ kᵀ * scale + mask`` in the widened dtype (GQA: k heads repeated)."""
    k = _repeat_kv(k, q.shape[-3])
    s = _bmm(q, k.transpose(-2, -1)) * scale
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:   # top-left aligned, as the math backend builds it
        rows = torch.arange(L, device=q.device).unsqueeze(-1)
        keep = rows >= torch.arange(S, device=q.device).unsqueeze(0)
        s = s.masked_fill(keep.logical_not(), float("-inf"))
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool:
            s = s.masked_fill(attn_bias.logical_not(), float("-inf"))
        else:
            s = s + attn_bias.to(s.dtype)
    return s


def _repeat_kv(x, h):
    """GQA: each of the ``hk`` kv heads serves ``h // hk`` query heads."""
    hk = x.shape[-3]
    if hk == h:
        return x
    shape = x.shape
    return x.unsqueeze(-3).expand(*shape[:-2], h // hk, *shape[-2:]).reshape(
        *shape[:-3], h, *shape[-2:])


def _sum_heads(g, hk):
    """Gradient of a GQA-repeated k/v: sum the copies of each kv head."""
    h = g.shape[-3]
    if h == hk:
        return g
    return g.unflatten(-3, (hk, h // hk)).sum(-3)


def _softmax_and_lse(s):
    """Attention weights ``softmax(s)`` and each row's logsumexp. A row whose logits are all
    ``-inf`` (a query that may attend to no key: a fully masked row) has zero weights instead of
    NaN, as PyTorch's own attention (``aten::_safe_softmax``) defines it, and logsumexp ``-inf``
    (a row holding a NaN stays NaN).

    The logsumexp is read off the softmax instead of computed by a pass of its own (several
    times the softmax's cost on a CPU): at a row's largest logit ``m`` the weight is
    ``exp(m - lse)``, so ``lse = m - log(max weight)``. The weights are the softmax kernel's own,
    so the attention's output does not change; only ``lse`` may differ from ``torch.logsumexp``
    in its last bits (the backward recomputes its own weights and does not read it)."""
    m = s.amax(-1)
    masked = m.eq(float("-inf"))
    w = torch.softmax(s, -1).masked_fill(masked.unsqueeze(-1), 0.0)
    lse = torch.where(masked, m, m - w.amax(-1).log())
    return w, lse


_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_flash_cpu_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _float_mask(attn_bias, dtype):
    """An attention mask as the fused kernels take it: additive, in the operands' ``dtype``
    (``-inf`` where a bool mask is False), or None."""
    if attn_bias is None:
        return None
    if attn_bias.dtype == torch.bool:
        return torch.zeros(attn_bias.shape, dtype=dtype).masked_fill(attn_bias.logical_not(),
                                                                     float("-inf"))
    return attn_bias.to(dtype)


def _fused(q, k, v, attn_bias, is_causal, scale):
    """fp32 attention through the host's fused kernel (PyTorch's CPU flash attention: tiled,
    no ``L x S`` weights in memory; GQA heads as they are): the math of :func:`_scores` and
    :func:`_softmax_and_lse` in one pass. A fully masked row gets zero weights there too; its
    logsumexp, which that kernel leaves 0, is set to ``-inf`` as the math defines it."""
    mask = _float_mask(attn_bias, q.dtype)
    out, lse = _flash_cpu(q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)
    if mask is not None:      # rows whose every logit is masked (the causal mask included)
        if is_causal:
            L, S = q.shape[-2], k.shape[-2]
            keep = torch.arange(L).unsqueeze(-1) >= torch.arange(S).unsqueeze(0)
            mask = mask.masked_fill(keep.logical_not(), float("-inf"))
        dead = mask.amax(-1).eq(float("-inf"))
        lse = torch.where(dead.expand(lse.shape), float("-inf"), lse)
    return out, lse


def dropout_keep(seed: int, shape, p: float) -> torch.Tensor:
    """The attention dropout mask drawn from ``seed``: True where a weight is kept (probability
    ``1 - p``). The same seed gives the same mask, so the backward rebuilds the forward's."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) >= p


def _dropout_scale(p: float) -> float:
    # every weight is dropped at p == 1: the output is zeros, as the reference's dropout gives
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)


def sdpa_forward(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False,
                 return_debug_mask=False, *, scale=None, dropout_mask=None):
    """Attention forward. With ``dropout_p > 0`` the weights where ``dropout_mask`` is False are
    dropped and ``v`` is scaled by ``1 / (1 - p)``: PyTorch's math attention given that mask."""
    dtype = q.dtype
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    # 4-D (B, H, L, E), or 3-D (H, L, E) with B = 1, as PyTorch's meta kernel of the op says
    B, H, L = (q.shape[0], q.shape[1], q.shape[2]) if q.dim() == 4 else (1, *q.shape[:2])
    S = k.shape[-2]
    if dropout_p == 0.0 and not return_debug_mask and q.dim() == 4:
        out, lse = _fused(_widen(q), _widen(k), _widen(v), attn_bias, is_causal, sc)
        out = out.to(dtype)
        debug = torch.empty(0, dtype=dtype)
    else:
        s = _scores(_widen(q), _widen(k), attn_bias, is_causal, sc)
        w, lse = _softmax_and_lse(s)
        vr = _repeat_kv(_widen(v), q.shape[-3])
        if dropout_p > 0.0:
            w = w.masked_fill(dropout_mask.logical_not(), 0.0)
            vr = vr * _dropout_scale(dropout_p)
        out = _bmm(w, vr).to(dtype)
        debug = w.to(dtype) if return_debug_mask else torch.empty(0, dtype=dtype)
    if lse.shape != (B, H, L):
        lse = lse.reshape(B, H, L)      # a view only where needed: a view is delivered copied
    empty_i = torch.empty(0, dtype=torch.int64)
    return (out, lse, empty_i, empty_i.clone(), L, S,
            torch.empty((), dtype=torch.int64), torch.empty((), dtype=torch.int64), debug)


def _reduce_to(g, shape):
    """Sum a broadcast gradient back to ``shape``."""
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


def sdpa_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                  cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset,
                  *, scale=None, dropout_mask=None):
    dtype = q.dtype
    h, hk = q.shape[-3], k.shape[-3]
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    qf, kf, vf, go = _widen((q, k, v, grad_out))
    bias_grad = attn_bias is not None and attn_bias.dtype != torch.bool and grad_input_mask[3]
    if dropout_p == 0.0 and not bias_grad and q.dim() == 4:
        # the host's fused backward (flash attention's): the weights recomputed from the
        # forward's logsumexp, tile by tile, GQA heads as they are
        lse = logsumexp.masked_fill(logsumexp.eq(float("-inf")), 0.0)
        dq, dk, dv = _flash_cpu_backward(go, qf, kf, vf, _widen(out), lse, 0.0, is_causal,
                                         attn_mask=_float_mask(attn_bias, qf.dtype), scale=sc)
        return (dq.to(dtype) if grad_input_mask[0] else None,
                dk.to(dtype) if grad_input_mask[1] else None,
                dv.to(dtype) if grad_input_mask[2] else None, None)
    s = _scores(qf, kf, attn_bias, is_causal, sc)
    w, _ = _softmax_and_lse(s)
    kr, vr = _repeat_kv(kf, h), _repeat_kv(vf, h)
    if dropout_p > 0.0:
        # out = (w * keep) @ (v * c): the dropped weights get no gradient
        c = _dropout_scale(dropout_p)
        drop = dropout_mask.logical_not()
        dv = _sum_heads(_bmm(w.masked_fill(drop, 0.0).transpose(-2, -1), go) * c, hk)
        dw = (_bmm(go, vr.transpose(-2, -1)) * c).masked_fill(drop, 0.0)
    else:
        dv = _sum_heads(_bmm(w.transpose(-2, -1), go), hk)
        dw = _bmm(go, vr.transpose(-2, -1))
    ds = w * (dw - (dw * w).sum(-1, keepdim=True))        # grad of the logits
    dq = _bmm(ds, kr) * sc
    dk = _sum_heads(_bmm(ds.transpose(-2, -1), qf) * sc, hk)
    dbias = None
    if attn_bias is not None and attn_bias.dtype != torch.bool and grad_input_mask[3]:
        dbias = _reduce_to(ds, attn_bias.shape).to(attn_bias.dtype)
    return (dq.to(dtype) if grad_input_mask[0] else None,
            dk.to(dtype) if grad_input_mask[1] else None,
            dv.to(dtype) if grad_input_mask[2] else None,
            dbias)


# ------------------------------------------------------------------------------------------
# linear backward

_unsafe_view = torch.ops.aten._unsafe_view.default


def _gemm(a, b, dtype, widened: bool):
    """``a @ b`` for a program of ``dtype``, the result in ``dtype`` (so the program's output
    meta, traced on the op's own operands, is the op's dtype). ``widened``: the program's
    operands arrive in fp32 (a weight's kept form), so the GEMM runs on them, whatever its rows;
    else on fp32 operands where the matrix units widen (:func:`widens`), else the dtype's own
    GEMM (fp32 accumulation, one rounding)."""
    if widened or widens(dtype, a.shape[0]):
        return torch.mm(a.to(_f32), b.to(_f32)).to(dtype)
    return torch.mm(a, b)


def linear_backward(x, grad_output, weight, output_mask, dtype=None):
    """``aten::linear_backward``. ``dtype``: the op's dtype, given where a widening program
    passes its fp16/bf16 operands in fp32 (:func:`build`)."""
    if len(output_mask) < 3:
        raise ValueError(f"linear_backward: output_mask needs 3 entries, got {list(output_mask)}")
    widened = dtype is not None
    dtype = dtype or weight.dtype
    gy = grad_output.reshape(-1, grad_output.shape[-1])
    dx = dw = db = None
    if output_mask[0]:
        # the fresh GEMM result in x's shape, not a view of it: a view would be copied out
        dx = _unsafe_view(_gemm(gy, weight, dtype, widened), (*x.shape[:-1], weight.shape[-1]))
    if output_mask[1]:
        dw = _gemm(gy.t(), x.reshape(-1, x.shape[-1]), dtype, widened)
    if output_mask[2]:
        db = gy.sum(0)          # half-precision sums accumulate in fp32 on the CPU
    return dx, dw, db


# ------------------------------------------------------------------------------------------
# paged decode attention (rbln_custom_ops::paged_causal_attn_decode)

def paged_decode_plan(seq, block_table, block_size: int):
    """What a paged decode step reads and writes, from its positions and block table alone
    (every layer of a step shares it): each new token's slot ``[B]``, and the positions and
    block table as the attention reads them (int64, contiguous)."""
    pos = seq.to(torch.int64).contiguous()
    table = block_table.to(torch.int64).contiguous()
    new = table.gather(1, (pos // block_size).unsqueeze(1)).squeeze(1) * block_size \
        + pos % block_size
    return new, pos, table


def paged_causal_attn_decode(q, k, v, kv_cache, seq, scale, block_table, plan=None):
    """One decode step of causal attention over a paged KV cache: the NPU's paged attention
    kernel. ``q`` ``[B, H, D]`` (one new token per sequence), ``k``/``v`` ``[B, Hkv, D]``;
    ``kv_cache`` ``[blocks, block_size, Hkv, 2 * D]`` (token-major pages, each token's keys then
    its values: vLLM's layout); ``seq[b]`` the new token's position (the tokens already cached),
    ``block_table[b]`` the pages of sequence ``b``. Writes the new keys and values at their
    positions, then attends each query to its sequence's keys ``0 .. seq[b]`` (GQA: query head
    ``h`` reads KV head ``h // (H / Hkv)``). Returns ``[B, H, D]``. ``plan``: the step's
    :func:`paged_decode_plan`, when the caller kept it.

    The attention reads each sequence's cached tokens in place through its block table (the
    native core's loop, ``csrc/PagedAttention.cpp``) with the numerics of the host's fused
    attention kernel, as the NPU's attention unit computes it: the scores and the softmax in
    fp32, its weights entering the sum over the values in the operands' dtype (that sum in
    fp32), one rounding of the output."""
    hk, D = k.shape[1], q.shape[-1]
    new, pos, table = plan or paged_decode_plan(seq, block_table, kv_cache.shape[1])
    kv_cache.view(-1, hk, 2 * D).index_copy_(0, new, torch.cat([k, v], -1))
    return _C.paged_decode_attention(q, kv_cache, pos, table, scale)


# custom bodies whose only heavy steps are matmuls: they take the matrix units' choice
# (:func:`widens`) instead of computing every step in fp32
_MATMUL_BODIES = frozenset({"linear_backward"})


CUSTOM = {
    "sdpa": sdpa_forward,
    "sdpa_backward": sdpa_backward,
    "linear_backward": linear_backward,
}


# ------------------------------------------------------------------------------------------
# matmul precision per CPU

# oneDNN's ISA levels from low to high (ONEDNN_MAX_CPU_ISA caps the kernels it may use); the
# first level with native fp16 / bf16 GEMMs
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16",
                "AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16",
                "AVX512_CORE_AMX_FP16", "ALL", "DEFAULT")
_ONEDNN_NATIVE = {torch.float16: "AVX10_1_512", torch.bfloat16: "AVX512_CORE_BF16"}


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@dataclass(frozen=True)
class MatmulPrecision:
    """How half-precision matmuls compute on this host: ``"native"`` (the dtype's own CPU
    kernel) or ``"widen"`` (fp32 operands, one rounding), per dtype, and why. ``kernels``: the
    dtypes this CPU has native GEMM kernels for (a superset of ``native``: a kernel measured
    slower than widening still serves the matmuls with too few rows to widen)."""
    native: frozenset
    reason: str
    kernels: frozenset = frozenset()

    def form(self, dtype) -> str:
        return "native" if dtype in self.native else "widen"

    @property
    def summary(self) -> str:
        kinds = ", ".join(f"{str(d).removeprefix('torch.')} {self.form(d)}"
                          for d in (torch.float16, torch.bfloat16))
        return f"{kinds} ({self.reason})"


# A native kernel is not always the fast one: on some CPUs with AVX512-BF16 and no AMX, the
# bf16 GEMM runs at about half fp32's speed, so widening (fp32 operands, the weight kept widened)
# beats it. A dtype whose kernel the flags promise is therefore timed once per host against
# its widened form, on one transformer-layer linear (rows, in, out); it widens where native is
# SLOWER times slower or more. The margin keeps the choice from flipping between runs; the
# result is kept per host (CPU model, flags, torch, ISA cap) in the user's cache directory, so
# a host always computes the same way.
PROBE_SHAPE = (256, 1024, 1024)
SLOWER = 1.25


def _probe_cache() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "torch_rbln", "matmul-precision.json")


def _time_native_over_widened(dtype) -> float:
    """Best-of-7 time of ``dtype``'s native linear over its widened form (weight already fp32,
    as kept): > 1 where widening is faster. One intra-op thread, each form run once before
    (the GEMM library builds its kernel on the first call), the calling thread's CPU time:
    other processes' load moves it little."""
    m, k, n = PROBE_SHAPE
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    xh, wh = x.to(dtype), w.to(dtype)
    forms = (lambda: torch.nn.functional.linear(xh, wh),
             lambda: torch.nn.functional.linear(xh.float(), w).to(dtype))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for f in forms:
            f()
        best = [math.inf, math.inf]
        for _ in range(7):      # alternated: a burst of load hits both alike
            for i, f in enumerate(forms):
                t0 = time.thread_time()
                f()
                best[i] = min(best[i], time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    return best[0] / best[1]


def _read_ratios(path: str, key: str, names: dict) -> dict | None:
    try:
        with open(path) as f:
            entry = json.load(f).get(key, {})
        return {d: float(entry[nm]) for d, nm in names.items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def _measured_ratios(key: str, dtypes) -> dict:
    """``{dtype: native time / widened time}`` for this host, from the cache or measured (and
    kept). Processes starting together (ranks, workers) measure once, under a file lock, and
    all read that one result; an unwritable cache only means measuring again next time."""
    import fcntl
    path = _probe_cache()
    names = {d: str(d).removeprefix("torch.") for d in dtypes}
    got = _read_ratios(path, key, names)
    if got is not None:
        return got
    lock = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = open(path + ".lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        got = _read_ratios(path, key, names)        # another process measured meanwhile
        if got is not None:
            return got
    except OSError:
        pass
    try:
        got = {d: round(_time_native_over_widened(d), 3) for d in dtypes}
        try:
            with open(path) as f:
                cached = json.load(f)
            cached = cached if isinstance(cached, dict) else {}
        except (OSError, ValueError):
            cached = {}
        entry = cached.get(key)
        if not isinstance(entry, dict):
            entry = cached[key] = {}
        entry.update({names[d]: r for d, r in got.items()})
        try:
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(cached, f, indent=1)
            os.replace(tmp, path)
        except OSError:
            pass
        return got
    finally:
        if lock is not None:
            lock.close()        # releases the lock


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f
                         if ln.startswith("model name")), "")
    except OSError:
        return ""


@lru_cache(maxsize=None)
def matmul_precision() -> MatmulPrecision:
    """The process's choice (TORCH_RBLN_MATMUL_PRECISION, read once: ``auto`` detects)."""
    from .. import config
    forced = config.latched("TORCH_RBLN_MATMUL_PRECISION")
    if forced == "native":
        both = frozenset({torch.float16, torch.bfloat16})
        return MatmulPrecision(both, "TORCH_RBLN_MATMUL_PRECISION=native", both)
    if forced == "widen":
        return MatmulPrecision(frozenset(), "TORCH_RBLN_MATMUL_PRECISION=widen")
    cap = torch.backends.cpu.get_cpu_capability()
    if not cap.startswith("AVX512"):
        return MatmulPrecision(frozenset(), f"kernel capability {cap}: no native half-precision "
                                            f"GEMM")
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").strip().upper()
    level = _ONEDNN_ISAS.index(isa) if isa in _ONEDNN_ISAS else len(_ONEDNN_ISAS)
    flags = _cpu_flags()
    has = {torch.float16: bool(flags & {"avx512_fp16", "amx_fp16"}),
           torch.bfloat16: bool(flags & {"avx512_bf16", "amx_bf16"})}
    native = [d for d, ok in has.items()
              if ok and level >= _ONEDNN_ISAS.index(_ONEDNN_NATIVE[d])]
    found = [f for f in ("avx512_fp16", "amx_fp16", "avx512_bf16", "amx_bf16") if f in flags]
    reason = (f"capability {cap}, CPU flags: {', '.join(found) or 'none'}"
              f"{'; ONEDNN_MAX_CPU_ISA=' + isa if isa != 'ALL' else ''}")
    kernels = frozenset(native)
    if native:
        key = "|".join((_cpu_model(), ",".join(sorted(found)), torch.__version__, cap, isa))
        ratios = _measured_ratios(key, native)
        slow = [d for d in native if ratios[d] >= SLOWER]
        for d in slow:
            reason += (f"; {str(d).removeprefix('torch.')}'s native GEMM measured "
                       f"{ratios[d]:.2f}x the time of widening on this CPU")
        native = [d for d in native if d not in slow]
    return MatmulPrecision(frozenset(native), reason, kernels)


# Below this many rows of the left operand, widening costs more than it saves: the conversion
# copies the whole right operand (the weight) on every call, while the GEMM itself is small.
# A decode step (one token per sequence) is the case: its LM head alone converts 262M weights.
WIDEN_MIN_ROWS = 64


def widens(dtype, rows: int | None) -> bool:
    """A matmul of ``dtype`` whose left operand has ``rows`` rows (per batch entry; None:
    unknown) computes on fp32 operands: a half-precision dtype without a native GEMM on this
    CPU, and enough rows. Eager programs, the native warm path and graph programs ask this."""
    return (dtype in HALF and dtype not in matmul_precision().native
            and (rows is None or rows >= WIDEN_MIN_ROWS))


@lru_cache(maxsize=None)
def packed_dtypes() -> frozenset:
    """The dtypes whose linear programs take their weight in the host GEMM library's blocked
    layout (PyTorch's packed linear: oneDNN's weight format, made once per weight and kept
    until the weight is written; ``StorageState.device_input_packed`` in the native core): the
    half-precision dtypes with native GEMM kernels on this CPU, including one whose kernel
    measured slower than widening: its linears with too few rows to widen (a decode step's)
    take the packed kernel, the fastest form there (bf16, 16 x 512 x 1536, AVX512-BF16 without
    AMX: packed 253 us, plain 317 us, widened 340 us). The results are the plain linear's, bit
    for bit; what changes is the time (the weight is not re-laid-out by every call), as an NPU's
    compiler lays weights out for its matrix units once."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return frozenset()
    mkldnn = {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    return frozenset(d for d in matmul_precision().kernels if mkldnn[d])


_packed_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def linear_packed(x, w, b=None):
    """``aten::linear`` with ``w`` in the GEMM library's layout (or plain: computed as it is)."""
    if w.is_mkldnn:
        return _packed_linear(x, w, b, "none", [], "")
    return torch.ops.aten.linear.default(x, w, b)


linear_packed.packed = True


def matmul(fn, out_meta):
    shape, dtype = (out_meta[0], out_meta[1]) if (
        isinstance(out_meta, tuple) and len(out_meta) == 3) else ((), None)
    rows = math.prod(shape[:-1]) if shape else None
    if rows is not None and fn is torch.ops.aten.bmm.default:
        rows //= max(shape[0], 1)           # per batch entry: each GEMM is one matrix
    if widens(dtype, rows):
        return fp32(fn, out_meta)
    if fn is torch.ops.aten.linear.default and dtype in packed_dtypes():
        return linear_packed
    return direct(fn, out_meta)


def build(kernel: str, fn, out_meta):
    """The run callable of a program compiled for ``fn`` in executor form ``kernel``."""
    if kernel == "direct":
        return direct(fn, out_meta)
    if kernel == "fp32":
        return fp32(fn, out_meta)
    if kernel == "matmul":
        return matmul(fn, out_meta)
    body = CUSTOM[kernel]
    if kernel not in _MATMUL_BODIES:
        return custom(body, out_meta)
    dtype = _out_dtype(out_meta)
    if not widens(dtype, None):
        return custom(body, out_meta, widened=False)
    # operands arrive in fp32 (a weight's kept form): the body is told the op's dtype
    return custom(lambda *args, **kwargs: body(*args, **kwargs, dtype=dtype), out_meta)
