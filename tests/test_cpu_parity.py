"""Behaviour PyTorch's device-generic tests check on every device, rbln against the CPU:
``copy_`` of a Python number, ``out=`` tensors a kernel reads or resizes (their contents,
their layout, their overlap with the inputs), in-place ops on self-overlapping tensors,
argument and overlap errors, and ops the CPU cannot run."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import warm_path
from test_ops import Events
from torch_rbln.runtime.storage import DEVICE, state_of

D = "rbln"


def outcome(fn, device):
    """What ``fn(device)`` gives: ("ok", value on the CPU, warnings) or ("error", type,
    message)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            r = fn(device)
        except Exception as e:      # noqa: BLE001 -- the error itself is compared
            return ("error", type(e), str(e))
    # (PyTorch gives "Casting complex values to real" once per process: whichever side runs
    # first; the NPU sharing notice is this test host's)
    msgs = sorted(str(x.message) for x in w if "NPU" not in str(x.message)
                  and "Casting complex values" not in str(x.message))
    return ("ok", _cpu(r), msgs)


def on(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t`` on ``device``, never ``t`` itself (the CPU side's writes must not reach the next)."""
    return t.clone() if device == "cpu" else t.to(device)


def _cpu(r):
    if isinstance(r, torch.Tensor):
        return r.cpu(), r.shape, r.stride(), r.dtype
    if isinstance(r, (list, tuple)):
        return type(r)(_cpu(x) for x in r)
    return r


def same_outcome(fn):
    """``fn`` on rbln gives the CPU's values, shapes, strides, dtypes, warnings or error."""
    want, got = outcome(fn, "cpu"), outcome(fn, D)
    assert got[0] == want[0], (got, want)
    if want[0] == "error":
        assert got[1:] == want[1:]
        return
    assert got[2] == want[2]
    _assert_same(got[1], want[1])


def _assert_same(got, want):
    if isinstance(want, tuple) and len(want) == 4 and isinstance(want[0], torch.Tensor):
        assert got[1:] == want[1:]
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
    else:
        assert got == want


# -- copy_ of a Python number ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool,
                                   torch.complex64])
@pytest.mark.parametrize("value", [2.7, -3, True, 1 + 2j, 1e10, 65504.7])
def test_copy_of_a_number_casts_and_broadcasts_as_the_cpu(dtype, value):
    same_outcome(lambda d: torch.zeros(2, 3, dtype=dtype, device=d).copy_(value))
    same_outcome(lambda d: torch.zeros(4, 6, dtype=dtype, device=d)[:, ::2].copy_(value))


def test_copy_of_a_number_into_an_expanded_tensor_raises_as_the_cpu():
    same_outcome(lambda d: torch.zeros(3, device=d).expand(2, 3).copy_(1.5))
    same_outcome(lambda d: torch.zeros(3, device=d).copy_(1.5, non_blocking=True))


# -- out= tensors: their contents, layout and resizes ---------------------------------------

def test_out_kernel_that_accumulates_into_out_reads_its_contents():
    x, c = torch.randn(3, 2, 2), torch.randn(1, 3)
    for out in (lambda d: torch.ones(1, 2, 2, device=d),
                lambda d: torch.full((2, 4, 2), 3.0, device=d)[:1, ::2]):
        same_outcome(lambda d: torch._compute_linear_combination(on(x, d), on(c, d),
                                                                 out=out(d)))


def test_out_reads_fetch_old_contents_only_for_kernels_that_may_read_them():
    h = torch.float16
    x, c = torch.randn(3, 64).to(h), torch.randn(1, 3).to(h)
    two = torch.full((1, 64), 2.0, dtype=h)
    with warm_path(False):
        out = torch.ones(1, 64, dtype=h, device=D) * 2.0      # device-latest (a program)
        o2 = torch.ones(1, 64, dtype=h, device=D) * 2.0
        assert state_of(out).residency == state_of(o2).residency == DEVICE
        xr, cr = x.to(D), c.to(D)
        with Events() as ev:
            torch.cos(xr[:1], out=o2)                      # writes every element: no fetch
        assert ev.count("d2h") == 0
        with Events() as ev:
            torch._compute_linear_combination(xr, cr, out=out)   # reads out: one fetch
        assert ev.count("d2h") == 1
    torch.testing.assert_close(out.cpu(), torch._compute_linear_combination(x, c, out=two),
                               rtol=0, atol=0)
    torch.testing.assert_close(o2.cpu(), torch.cos(x[:1]), rtol=0, atol=0)


@pytest.mark.parametrize("warm", [True, False])
@pytest.mark.parametrize("dtype,op", [(torch.float16, torch.add),     # a device program
                                      (torch.float32, torch.add),     # the host, by the rules
                                      (torch.float32, torch.sin),     # the CPU fallback
                                      (torch.float32, torch.sgn)])    # a host op of the table
def test_resized_out_takes_the_results_layout(warm, dtype, op):
    x = torch.randn(2, 64, 128).to(dtype)
    args = (lambda d: (on(x, d).permute(0, 2, 1), 1)) if op is torch.add \
        else (lambda d: (on(x, d).permute(0, 2, 1),))
    with warm_path(warm):
        for _ in range(2):        # the second call: a warm one
            same_outcome(lambda d: op(*args(d), out=torch.empty(0, dtype=dtype, device=d)))
            # an out= of the right shape keeps its own layout
            same_outcome(lambda d: op(*args(d), out=torch.empty(2, 128, 64, dtype=dtype,
                                                                device=d)))


def test_out_grown_past_its_memory_or_shrunk_in_it_as_the_cpu():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    same_outcome(lambda d: torch.nonzero(on(x, d), out=torch.zeros(1, 2, dtype=torch.long,
                                                                  device=d)))
    same_outcome(lambda d: torch.nonzero(on(x, d), out=torch.zeros(6, 2, dtype=torch.long,
                                                                  device=d)))
    base = torch.arange(24).view(12, 2)
    same_outcome(lambda d: (lambda b: (torch.nonzero(on(x, d), out=b[1:]), b))(on(base, d)))


# -- in-place ops on self-overlapping tensors -----------------------------------------------

@pytest.mark.parametrize("shape", [(6,), (1, 6)])
def test_in_place_on_an_expanded_tensor_allowed_or_refused_as_the_cpu(shape):
    t = torch.rand(shape)
    # threshold overwrites each element with a value of its own: the CPU allows the overlap
    same_outcome(lambda d: F.threshold(on(t, d).expand(6, 6), 0.5, 0.5, inplace=True))
    same_outcome(lambda d: (F.threshold(on(t, d).expand(6, 6), 0.5, 0.5, inplace=True),
                            on(t, d))[1])
    same_outcome(lambda d: on(t, d).expand(6, 6).add_(1))
    same_outcome(lambda d: on(t, d).expand(6, 6).sin_())
    u = torch.rand(6, 6)
    same_outcome(lambda d: torch.sin(on(u, d), out=on(t, d).expand(6, 6)))


@pytest.mark.parametrize("warm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_device_op_in_place_on_an_expanded_tensor_as_the_cpu(warm, dtype):
    t = torch.rand(1, 64).to(dtype)
    mask = torch.rand(6, 64) > 0.5
    with warm_path(warm):
        for _ in range(2):
            # masked_fill_ warns (deprecated) and writes; add_ refuses
            same_outcome(lambda d: on(t, d).expand(6, 64).masked_fill_(on(mask, d), 2.0))
            same_outcome(lambda d: on(t, d).expand(6, 64).add_(1))


# -- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"beta": 2.5}, {"alpha": 0.5}, {"beta": True}, {"alpha": True},
                                {}, {"beta": 0, "alpha": 2}])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_addr_checks_its_scalars_as_the_cpu(kw, dtype):
    m, a, b = (torch.randint(0, 3, s).to(dtype) for s in ((3, 4), (3,), (4,)))
    same_outcome(lambda d: torch.addr(on(m, d), on(a, d), on(b, d), **kw))
    same_outcome(lambda d: torch.addr(on(m, d), on(a, d), on(b, d), out=torch.empty(
        0, dtype=dtype, device=d), **kw))


def test_out_sharing_an_inputs_memory_is_judged_by_the_kernel():
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    same_outcome(lambda d: (lambda a: torch.cross(a, on(y, d), dim=1, out=a))(on(x, d)))
    same_outcome(lambda d: (lambda a: torch.linalg.cross(a, on(y, d), out=a[:, :]))(on(x, d)))
    same_outcome(lambda d: torch.cross(on(x, d), on(y, d), dim=1,
                                       out=torch.empty(0, device=d)))
    # an elementwise op into its own input is fine, on the CPU too
    same_outcome(lambda d: (lambda a: torch.sin(a, out=a))(on(x, d)))


def test_local_scalar_dense_of_an_empty_tensor_gives_the_cpus_message():
    same_outcome(lambda d: torch.ops.aten._local_scalar_dense(torch.empty(0, device=d)))
    same_outcome(lambda d: torch.empty(0, device=d).item())
    same_outcome(lambda d: torch.tensor([2.5], device=d).item())
    # the op itself reads the first of several elements (item() refuses them)
    same_outcome(lambda d: torch.ops.aten._local_scalar_dense(torch.tensor([3.0, 4.0],
                                                                           device=d)))
    same_outcome(lambda d: torch.tensor([3.0, 4.0], device=d).item())


def test_op_without_a_cpu_kernel_names_itself_and_why():
    w = torch.randint(0, 255, (32, 32), dtype=torch.uint8, device=D)
    with pytest.raises(NotImplementedError) as e:
        torch._convert_weight_to_int4pack(w, 2)
    msg = str(e.value)
    assert "`aten::_convert_weight_to_int4pack` cannot run on RBLN devices" in msg
    assert "no rbln kernel" not in msg and "has none for this one" in msg
    assert "`aten::_convert_weight_to_int4pack_for_cpu`" in msg
    assert "Could not run" not in msg


def test_ops_with_a_cpu_kernel_and_a_generic_composite_run_the_cpu_kernel():
    from torch_rbln.dispatch.fallback import CPU_OVER_COMPOSITE, _has_kernel as has
    from torch_rbln.dispatch.optable import HOST_OPS
    # every aten op the CPU has a kernel of its own for, which rbln would otherwise reach
    # through the composite every other backend gets (those the op table routes to the host
    # aside)
    want = set()
    for s in torch._C._jit_get_all_schemas():
        name = s.name + ("." + s.overload_name if s.overload_name else "")
        if (s.name.startswith("aten::") and has(name, "CPU")
                and has(name, "CompositeExplicitAutograd")):
            want.add(name[len("aten::"):])
    assert set(CPU_OVER_COMPOSITE) == want - set(HOST_OPS)
    for n in CPU_OVER_COMPOSITE:
        assert has("aten::" + n, "PrivateUse1")
    x = torch.randn(2, 0, 8)
    # the CPU kernel's mean and rstd of an empty input: the input's dtype
    same_outcome(lambda d: torch.native_layer_norm(on(x.half(), d), (8,), None, None, 1e-5))
    u = torch.rand(3, 4, 5)
    same_outcome(lambda d: torch.all(on(u, d) > 0.2, dim=(0, 2)))
    same_outcome(lambda d: torch.any(on(u, d) > 0.9, dim=(0, 2)))
