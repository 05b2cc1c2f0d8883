"""PyTorch's OpInfo database run on rbln against the CPU.

For every OpInfo and each of float16, bfloat16 and float32, the first samples the CPU can run
are run again on rbln tensors (device ops, native copies or the CPU fallback, whatever the
dispatcher picks) and the results compared with the CPU's. Default: ``SAMPLES`` samples per
(op, dtype); ``--runslow`` (or ``TORCH_RBLN_RUNSLOW=1``): every sample.

A mismatch fails unless ``opinfo_known_failures.KNOWN`` lists it with a reason; so does a
warning on rbln where the CPU gives none (e.g. a fallback's resize warning). Each sample runs
under a time limit, so a hang fails that test instead of the run. At the end of the session
the pass rate per dtype is printed (and written to ``$TORCH_RBLN_OPINFO_REPORT`` if set).

``test_opinfo_grad`` compares input gradients the same way (see its section below).
"""

from __future__ import annotations

import json
import os
import signal
import warnings
from collections import defaultdict

import pytest
import torch

from opinfo_known_failures import KNOWN, KNOWN_GRAD, RANDOM_OPS
from torch_rbln import tolerances
from torch_rbln.runtime.storage import state_of

SAMPLES = 2
SAMPLE_TIMEOUT_S = 30
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# outcome counters per dtype: samples the CPU ran, matched, known failures, new failures
STATS: dict = defaultdict(lambda: defaultdict(int))


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def _ops():
    seen = set()
    for op in _op_db():
        name = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
        if name in seen:
            continue
        seen.add(name)
        yield name, op


def _params():
    out = []
    for name, op in _ops():
        for dtype in DTYPES:
            if op.supports_dtype(dtype, "cpu"):
                out.append(pytest.param(op, dtype, id=f"{name}-{str(dtype)[6:]}"))
    return out


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU with its storage layout kept (size, stride and offset into a copy of
    the whole storage), so ops that address the storage (``as_strided``) see the same bytes."""
    if t.layout != torch.strided:
        return t.cpu()
    state = state_of(t)
    state.host_read()
    storage = state.host_bytes().clone().untyped_storage()
    out = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())
    if t.is_conj():
        out = out.conj()
    if t.is_neg():
        out = out._neg_view()
    return out


def _to_cpu(x):
    """A CPU copy of a sample argument (rbln tensors copied, device arguments rewritten)."""
    if isinstance(x, torch.Tensor):
        return _cpu_copy(x.detach()) if x.device.type == "rbln" else x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x) if not hasattr(x, "_fields") else \
            type(x)(*(_to_cpu(v) for v in x))
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "rbln":
        return torch.device("cpu")
    if isinstance(x, str) and x.startswith("rbln"):
        return "cpu"
    return x


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [_cpu(v) for v in x]
    return x


def _tolerance(dtype):
    # rbln programs round once per op boundary, like the CPU kernels they mirror; composite
    # ops may be decomposed differently (fp32 inside), hence a few ulps of slack: the table of
    # docs/eager.md ("NPU numerics and tolerances")
    return tolerances.for_dtype(dtype)


def _compare(actual, expected, dtype, metadata_only: bool):
    actual, expected = _cpu(actual), _cpu(expected)
    if metadata_only:
        flat_a = actual if isinstance(actual, list) else [actual]
        flat_e = expected if isinstance(expected, list) else [expected]
        for a, e in zip(flat_a, flat_e):
            if isinstance(e, torch.Tensor):
                assert a.shape == e.shape and a.dtype == e.dtype
        return
    atol, rtol = _tolerance(dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True,
                               check_device=False, check_stride=False, check_dtype=True)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"sample took longer than {SAMPLE_TIMEOUT_S}s")


def _known(op, dtype):
    name = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
    return KNOWN.get((name, str(dtype)[6:])) or KNOWN.get((name, "*"))


_NOT_COUNTED = object()     # a reference that says: the CPU cannot run this sample


def _sweep(samples, limit, stats, known, reference, check, what):
    """Run up to ``limit`` samples, each under ``SAMPLE_TIMEOUT_S``: ``reference(sample, i)`` on
    the CPU (a sample it cannot run, or ``_NOT_COUNTED``, is not counted), then
    ``check(sample, ref, i)`` on rbln; tally ``stats`` and fail (or xfail when ``known``)
    naming the first differing sample."""
    ran, failures = 0, []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        while limit is None or ran < limit:
            signal.alarm(SAMPLE_TIMEOUT_S)
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - building the sample on rbln failed
                failures.append(f"sample on rbln: {type(e).__name__}: {e}")
                ran += 1                # counted as a sample that does not match
                stats["ran"] += 1
                break
            finally:
                signal.alarm(0)
            try:
                ref = reference(sample, ran)
            except Exception:   # noqa: BLE001 - the CPU cannot run this sample: not counted
                continue
            if ref is _NOT_COUNTED:
                continue
            ran += 1
            stats["ran"] += 1
            signal.alarm(SAMPLE_TIMEOUT_S)
            try:
                check(sample, ref, ran - 1)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                failures.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    stats["matched"] += ran - len(failures)
    if not failures:
        return
    if known:
        stats["known"] += len(failures)
        pytest.xfail(f"known: {known}")
    stats["new"] += len(failures)
    pytest.fail(f"{len(failures)}/{ran} {what} differ on rbln: {failures[0]}")


@pytest.mark.parametrize("op,dtype", _params())
def test_opinfo(op, dtype, request):
    full = request.config.getoption("--runslow") or os.environ.get("TORCH_RBLN_RUNSLOW") == "1"
    random_op = op.name in RANDOM_OPS

    def reference(sample, i):
        with warnings.catch_warnings(record=True) as cpu_warnings:
            warnings.simplefilter("always")
            torch.manual_seed(0)
            expected = op(_to_cpu(sample.input), *_to_cpu(sample.args), **_to_cpu(sample.kwargs))
        return expected, cpu_warnings

    def check(sample, ref, i):
        expected, cpu_warnings = ref
        with warnings.catch_warnings():
            # where the CPU warns nothing, rbln must not warn either (a warning the CPU gives
            # once may already have been given: then nothing is checked)
            warnings.simplefilter("error" if not cpu_warnings else "ignore")
            torch.manual_seed(0)
            actual = op(sample.input, *sample.args, **sample.kwargs)
        _compare(actual, expected, dtype, random_op or _random_sample(sample))

    # samples are built for the device under test (as PyTorch's device tests do: the sample
    # function decides which operands live on the device); the CPU runs copies
    _sweep(op.sample_inputs("rbln", dtype, requires_grad=False), None if full else SAMPLES,
           STATS[str(dtype)[6:]], _known(op, dtype), reference, check, "samples")


# ------------------------------------------------------------------------------------------
# dtypes CUDA supports and the CPU kernels lack: rbln accepts the union (library code takes the
# CUDA path on any device that is not the CPU). CUDA returns the dtype the meta kernels give and
# computes half types in float; the reference is the CPU op on inputs widened to a dtype its
# kernel has, rounded to that dtype (or the op's NumPy reference where no CPU dtype works).

_REF_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
              torch.complex32: torch.complex64, torch.complex64: torch.complex128,
              torch.bool: torch.float64, torch.uint8: torch.float64, torch.int8: torch.float64,
              torch.int16: torch.float64, torch.int32: torch.float64, torch.int64: torch.float64}

# CUDA's own kernels with no CPU kernel at all (attention backends): not ops a CPU fallback runs
_CUDA_KERNELS_ONLY = ("torch.ops.aten._flash_attention_forward",
                      "torch.ops.aten._efficient_attention_forward")


def _cuda_only_params():
    out = []
    for name, op in _ops():
        if name in _CUDA_KERNELS_ONLY:
            continue
        for dtype in sorted(op.supported_dtypes("cuda") - op.supported_dtypes("cpu"), key=str):
            out.append(pytest.param(op, dtype, id=f"{name}-{str(dtype)[6:]}"))
    return out


def _retyped(x, old, new, device):
    """A copy of a sample argument on ``device``, tensors of dtype ``old`` converted to ``new``."""
    if isinstance(x, torch.Tensor):
        c = _cpu_copy(x.detach()) if x.device.type == "rbln" else x.detach().clone()
        return c.to(device=device, dtype=new if c.dtype == old else c.dtype)
    if isinstance(x, (list, tuple)):
        vals = [_retyped(v, old, new, device) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else type(x)(vals)
    if isinstance(x, dict):
        return {k: _retyped(v, old, new, device) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "rbln":
        return torch.device(device)
    if isinstance(x, str) and x.startswith("rbln"):
        return device
    return x


def _call(op, sample, old, new, device):
    return op(_retyped(sample.input, old, new, device), *_retyped(sample.args, old, new, device),
              **_retyped(sample.kwargs, old, new, device))


def _flat(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _cuda_reference(op, sample, dtype):
    """(expected results, how they were computed) or None when no reference can be had."""
    try:
        return _flat(_call(op, sample, dtype, dtype, "cpu")), "cpu"
    except Exception:   # noqa: BLE001 - the CPU kernel lacks the dtype: widen
        pass
    try:
        meta = [m.dtype if isinstance(m, torch.Tensor) else None
                for m in _flat(_call(op, sample, dtype, dtype, "meta"))]
    except Exception:   # noqa: BLE001 - no meta kernel: CUDA keeps the input's dtype
        meta = None
    try:
        wide = _flat(_call(op, sample, dtype, _REF_DTYPE[dtype], "cpu"))
        how = "cpu in " + str(_REF_DTYPE[dtype])[6:]
    except Exception:   # noqa: BLE001
        if op.ref is None:
            return None
        import numpy as np
        np_sample = _retyped(sample, dtype, dtype, "cpu").numpy()
        res = op.ref(np_sample.input, *np_sample.args, **np_sample.kwargs)
        wide = [torch.as_tensor(np.asarray(r)) for r in _flat(res)]
        how = "numpy reference"
    if meta is None:
        meta = [dtype if isinstance(w, torch.Tensor) else None for w in wide]
    return [w.to(d) if d is not None and isinstance(w, torch.Tensor) else w
            for w, d in zip(wide, meta)], how


def _compare_cuda(actual, expected, dtype):
    actual = [_cpu(a) for a in _flat(actual)]
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if not isinstance(e, torch.Tensor):
            assert a == e
            continue
        assert a.dtype == e.dtype, f"dtype {a.dtype}, CUDA returns {e.dtype}"
        assert a.shape == e.shape, f"shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        if e.dtype == torch.complex32:      # compared through complex64 (isclose lacks chalf)
            a, e = a.to(torch.complex64), e.to(torch.complex64)
        half = e.dtype in (torch.float16, torch.bfloat16, torch.complex64)
        atol, rtol = _tolerance(torch.bfloat16 if e.dtype == torch.bfloat16 else
                                torch.float16 if half else torch.float32)
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True,
                                   check_device=False, check_stride=False)


@pytest.mark.parametrize("op,dtype", _cuda_only_params())
def test_opinfo_cuda_dtypes(op, dtype, request):
    """Dtypes only CUDA supports: rbln returns CUDA's dtype and values."""
    full = request.config.getoption("--runslow") or os.environ.get("TORCH_RBLN_RUNSLOW") == "1"
    limit = None if full else SAMPLES
    random_op = op.name in RANDOM_OPS
    stats = STATS["cuda-only"]
    ran, failures = 0, []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for sample in op.sample_inputs("rbln", dtype, requires_grad=False):
            if limit is not None and ran >= limit:
                break
            torch.manual_seed(0)
            ref = _cuda_reference(op, sample, dtype)
            if ref is None:
                continue
            expected, how = ref
            ran += 1
            stats["ran"] += 1
            signal.alarm(SAMPLE_TIMEOUT_S)
            try:
                torch.manual_seed(0)
                actual = op(sample.input, *sample.args, **sample.kwargs)
                if random_op:
                    assert [getattr(a, "dtype", None) for a in _flat(actual)] == \
                        [getattr(e, "dtype", None) for e in expected]
                else:
                    _compare_cuda(actual, expected, dtype)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                failures.append(f"{type(e).__name__} (reference: {how}): "
                                f"{str(e).splitlines()[0] if str(e) else ''}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert ran, "no sample had a reference"
    stats["matched"] += ran - len(failures)
    stats["new"] += len(failures)
    assert not failures, f"{len(failures)}/{ran} samples differ on rbln: {failures[0]}"


def pytest_sessionfinish_report():
    lines = []
    for dt, s in sorted(STATS.items()):
        rate = 100.0 * s["matched"] / s["ran"] if s["ran"] else 100.0
        lines.append(f"{dt:9s} samples {s['ran']:5d}  matched {s['matched']:5d} ({rate:.2f}%)  "
                     f"known failures {s['known']:4d}  new failures {s['new']:4d}"
                     + (f"  (of the matched, closer to float64 than the CPU: "
                        f"{s['closer_than_cpu']})" if s.get("closer_than_cpu") else ""))
    return lines


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    lines = pytest_sessionfinish_report()
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\nOpInfo on rbln vs CPU:\n  " + "\n  ".join(lines))
    path = os.environ.get("TORCH_RBLN_OPINFO_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({k: dict(v) for k, v in STATS.items()}, f, indent=1)


# ------------------------------------------------------------------------------------------
# gradients: for each OpInfo that supports autograd, the input gradients of its samples
# (``torch.autograd.grad`` with the same random cotangents) on rbln vs the CPU. Default: the
# first sample of each op in float32 (a quick pass over every backward formula); ``--runslow``:
# every sample in float16, bfloat16 and float32.

GRAD_SAMPLES = 1
GRAD_QUICK_DTYPES = (torch.float32,)


def _grad_params():
    out = []
    for name, op in _ops():
        if not op.supports_autograd or op.name in RANDOM_OPS:
            continue
        for dtype in DTYPES:
            if dtype in op.supported_backward_dtypes("cpu"):
                marks = () if dtype in GRAD_QUICK_DTYPES else (pytest.mark.slow,)
                out.append(pytest.param(op, dtype, id=f"{name}-{str(dtype)[6:]}", marks=marks))
    return out


def _flat_tensors(x, out):
    """Every tensor in a sample argument (nested lists, tuples, dicts), in order."""
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _flat_tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _flat_tensors(v, out)
    return out


def _map_containers(fn, x):
    """``fn`` over the items of a list, tuple, namedtuple or dict; a CPU copy of anything else."""
    if isinstance(x, (list, tuple)):
        vals = [fn(v) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else type(x)(vals)
    if isinstance(x, dict):
        return {k: fn(v) for k, v in x.items()}
    return _to_cpu(x)


def _grad_leaves(x):
    """A CPU copy of a sample argument whose copies of the tensors that require grad require
    grad too."""
    if isinstance(x, torch.Tensor):
        c = _to_cpu(x)
        return c.requires_grad_() if x.requires_grad and c.is_floating_point() or (
            x.requires_grad and c.is_complex()) else c
    return _map_containers(_grad_leaves, x)


def _input_grads(op, sample, inp, args, kwargs, seed, device, draw_dtype=None):
    """(differentiable-output mask, input gradients) of ``op`` on the given arguments, with
    cotangents drawn from a CPU generator seeded ``seed`` (so both devices get the same;
    ``draw_dtype``: drawn in that dtype, then converted to the output's)."""
    inputs = [t for t in _flat_tensors((inp, args, kwargs), []) if t.requires_grad]
    outs = _flat_tensors(sample.output_process_fn_grad(op(inp, *args, **kwargs)), [])
    mask = [o.requires_grad for o in outs]
    outs = [o for o in outs if o.requires_grad]
    if not inputs or not outs:
        return mask, None
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(o.shape, dtype=draw_dtype or o.dtype, generator=gen).to(device, o.dtype)
            for o in outs]
    return mask, torch.autograd.grad(outs, inputs, cots, allow_unused=True)


def _float64(x):
    """A float64 CPU copy of a sample argument (the copies of tensors that require grad
    require grad)."""
    if isinstance(x, torch.Tensor):
        c = _to_cpu(x)
        if c.is_floating_point():
            c = c.double().requires_grad_(x.requires_grad)
        return c
    return _map_containers(_float64, x)


def _closer_to_float64(op, sample, seed, actual, expected, dtype) -> bool:
    """Half-precision gradients that differ from the CPU's: rbln's are accepted when they are
    at least as close to the float64 gradients (same inputs, same cotangents) as the CPU's are.
    rbln's multi-step programs (SDPA backward, linear_backward) round once where the CPU's half
    kernels round between steps (docs/eager.md ("NPU numerics and tolerances"))."""
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    try:
        _, ref = _input_grads(op, sample, _float64(sample.input), _float64(sample.args),
                              _float64(sample.kwargs), seed, "cpu", draw_dtype=dtype)
    except Exception:   # noqa: BLE001 - no float64 reference: the mismatch stands
        return False
    for a, e, r in zip(actual, expected, ref):
        if r is None or a is None or e is None:
            continue
        err_rbln = (_cpu(a).double() - r).abs().nan_to_num(0).max()
        err_cpu = (e.double() - r).abs().nan_to_num(0).max()
        if err_rbln > err_cpu:
            return False
    return True


def _random_sample(sample) -> bool:
    """A sample whose result depends on random draws (attention dropout): rbln builds the mask
    from its own generator's seed (dispatch/attention_dropout.py), so only the results' and
    gradients' shapes and dtypes are compared (tests/test_attention.py compares the values for
    one mask)."""
    return bool(sample.kwargs.get("dropout_p", 0))


def _compare_grads(actual, expected, dtype, metadata_only=False):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), f"input {i}: gradient {a is not None}, CPU {e is not None}"
        if e is not None and metadata_only:
            assert a.shape == e.shape and a.dtype == e.dtype, f"input {i} gradient's metadata"
        elif e is not None:
            atol, rtol = _tolerance(dtype)
            torch.testing.assert_close(_cpu(a), e, atol=atol, rtol=rtol, equal_nan=True,
                                       check_device=False, check_stride=False,
                                       msg=lambda m, i=i: f"input {i} gradient: {m}")


@pytest.mark.parametrize("op,dtype", _grad_params())
def test_opinfo_grad(op, dtype, request):
    full = request.config.getoption("--runslow") or os.environ.get("TORCH_RBLN_RUNSLOW") == "1"
    stats = STATS["grad-" + str(dtype)[6:]]

    def reference(sample, i):
        torch.manual_seed(0)
        cpu_mask, expected = _input_grads(
            op, sample, _grad_leaves(sample.input), _grad_leaves(sample.args),
            _grad_leaves(sample.kwargs), i, "cpu")
        # nothing differentiable in this sample: not counted
        return _NOT_COUNTED if expected is None else (cpu_mask, expected)

    def check(sample, ref, i):
        cpu_mask, expected = ref
        torch.manual_seed(0)
        mask, actual = _input_grads(op, sample, sample.input, sample.args, sample.kwargs, i,
                                    "rbln")
        assert mask == cpu_mask, f"differentiable outputs {mask}, CPU {cpu_mask}"
        try:
            _compare_grads(actual, expected, dtype, _random_sample(sample))
        except AssertionError:
            if not _closer_to_float64(op, sample, i, actual, expected, dtype):
                raise
            stats["closer_than_cpu"] += 1

    _sweep(op.sample_inputs("rbln", dtype, requires_grad=True), None if full else GRAD_SAMPLES,
           stats, _known_grad(op, dtype), reference, check, "samples' gradients")


def _known_grad(op, dtype):
    name = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
    return KNOWN_GRAD.get((name, str(dtype)[6:])) or KNOWN_GRAD.get((name, "*"))
