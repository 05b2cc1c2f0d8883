"""torch.autocast("rbln") casts as CUDA's autocast does, and torch.amp.GradScaler("rbln") steps
as the CPU's does (docs/torch-rbln.md ("Autocast")).

The op-policy table: CUDA's lists are read from this torch's ``ATen/autocast_mode.h`` (the
macros CUDA's registration and rbln's expand), each op runs on rbln under autocast, and its
result dtype must be the one CUDA's policy gives; its values must equal the CPU's run with
that policy applied by hand (the operands cast as CUDA casts them), and, where the CPU's
autocast gives the same dtype, the CPU autocast's result.
"""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import event_delta
from torch_rbln import amp, events

LOWER = (torch.float16, torch.bfloat16)
# docs/eager.md ("NPU numerics and tolerances")
TOL = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
       torch.float32: dict(atol=1e-4, rtol=1e-4)}


# -- CUDA's lists, as this torch's header spells them ---------------------------------------

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"


def _macro(text: str, name: str) -> str:
    start = text.index(f"#define {name}(_)")
    body = []
    for line in text[start:].splitlines()[1:]:
        body.append(line)
        if not line.rstrip().endswith("\\"):
            break
    return "\n".join(body)


def cuda_policies() -> dict[str, str]:
    """``aten::op[.overload]`` -> CUDA's cast policy, from the lists CUDA's registration uses."""
    text = HEADER.read_text()
    out = {}
    for macro, policy in (("AT_FORALL_LOWER_PRECISION_FP", "lower_precision_fp"),
                          ("AT_FORALL_FP32", "fp32"),
                          ("AT_FORALL_FP32_SET_OPT_DTYPE", "fp32_set_opt_dtype"),
                          ("AT_FORALL_PROMOTE", "promote")):
        for op, ov in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", _macro(text, macro)):
            out[f"aten::{op}.{ov}" if ov else f"aten::{op}"] = policy
    for name in re.findall(r'"(\w+\.\w+)"', _macro(text, "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE")):
        out[f"aten::{name}"] = "fp32_append_dtype"
    out["aten::binary_cross_entropy"] = "banned"    # registered beside the lists
    return out


POLICIES = cuda_policies()
CPU_CAST = amp.ops_cast_by("AutocastCPU")      # the ops the CPU's autocast has a policy for


def test_header_lists_are_cudas_registration():
    """The lists read from the header are every op CUDA's autocast has a kernel for (so the
    table below is CUDA's policy, not a copy that could drift)."""
    assert set(POLICIES) | set(amp.CUDA_ONLY) == amp.ops_cast_by("AutocastCUDA")


def test_rbln_casts_the_ops_cuda_casts():
    assert amp.coverage() == (set(), set())
    assert amp.ops_cast_by("AutocastPrivateUse1") == set(POLICIES)


# -- samples: one call of each op on CUDA's lists -------------------------------------------

class _Make:
    """Sample operands on the CPU, float32 (the test casts them per policy), from a seed."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def t(self, *shape):
        return torch.randn(*shape, generator=self.g)

    def unit(self, *shape):          # in (0.1, 0.9): acos, log, pow bases, probabilities
        return torch.rand(*shape, generator=self.g) * 0.8 + 0.1

    def long(self, high, *shape):
        return torch.randint(0, high, shape, generator=self.g)

    def sign(self, *shape):
        return self.long(2, *shape).float() * 2 - 1


def _conv(m, dims, transposed=False):
    x = m.t(2, 4, *(6,) * dims)
    w = m.t(4, 3, *(3,) * dims) if transposed else m.t(3, 4, *(3,) * dims)
    return x, w, m.t(3)


def _cell_operands(m, gates):
    return m.t(2, 8), m.t(2, 16), m.t(gates * 16, 8), m.t(gates * 16, 16), m.t(gates * 16), m.t(gates * 16)


def _up(dims):
    return lambda m: ((m.t(1, 2, *(4,) * dims), [8] * dims), {})


def _up_ac(dims):
    return lambda m: ((m.t(1, 2, *(4,) * dims), [8] * dims, False), {})


A = torch.ops.aten
SAMPLES = {
    # lower_precision_fp
    "aten::_convolution.deprecated": lambda m: ((*_conv(m, 2), [1, 1], [1, 1], [1, 1], False,
                                                  [0, 0], 1, False, False, True), {}),
    "aten::_convolution": lambda m: ((*_conv(m, 2), [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                      False, False, True, True), {}),
    "aten::conv1d": lambda m: (_conv(m, 1), {}),
    "aten::conv2d": lambda m: (_conv(m, 2), {}),
    "aten::conv3d": lambda m: (_conv(m, 3), {}),
    "aten::conv_tbc": lambda m: ((m.t(6, 2, 4), m.t(3, 4, 5), m.t(5), 1), {}),
    "aten::conv_transpose1d": lambda m: (_conv(m, 1, True), {}),
    "aten::conv_transpose2d.input": lambda m: (_conv(m, 2, True), {}),
    "aten::conv_transpose3d.input": lambda m: (_conv(m, 3, True), {}),
    "aten::convolution": lambda m: ((*_conv(m, 2), [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}),
    "aten::prelu": lambda m: ((m.t(2, 3, 4), m.t(3)), {}),
    "aten::addmm": lambda m: ((m.t(4, 8), m.t(4, 16), m.t(16, 8)), {}),
    "aten::addmv": lambda m: ((m.t(4), m.t(4, 16), m.t(16)), {}),
    "aten::addr": lambda m: ((m.t(4, 8), m.t(4), m.t(8)), {}),
    "aten::matmul": lambda m: ((m.t(2, 4, 16), m.t(16, 8)), {}),
    "aten::einsum": lambda m: (("ij,jk->ik", [m.t(4, 16), m.t(16, 8)]), {}),
    "aten::mm": lambda m: ((m.t(4, 16), m.t(16, 8)), {}),
    "aten::mv": lambda m: ((m.t(4, 16), m.t(16)), {}),
    "aten::linalg_vecdot": lambda m: ((m.t(4, 16), m.t(4, 16)), {}),
    "aten::linear": lambda m: ((m.t(4, 16), m.t(8, 16), m.t(8)), {}),
    "aten::addbmm": lambda m: ((m.t(4, 8), m.t(3, 4, 16), m.t(3, 16, 8)), {}),
    "aten::baddbmm": lambda m: ((m.t(3, 4, 8), m.t(3, 4, 16), m.t(3, 16, 8)), {}),
    "aten::bmm": lambda m: ((m.t(3, 4, 16), m.t(3, 16, 8)), {}),
    "aten::chain_matmul": lambda m: (([m.t(4, 16), m.t(16, 8), m.t(8, 4)],), {}),
    "aten::linalg_multi_dot": lambda m: (([m.t(4, 16), m.t(16, 8), m.t(8, 4)],), {}),
    "aten::_thnn_fused_lstm_cell": lambda m: ((m.t(2, 64), m.t(2, 64), m.t(2, 16), m.t(64),
                                               m.t(64)), {}),
    "aten::_thnn_fused_gru_cell": lambda m: ((m.t(2, 48), m.t(2, 48), m.t(2, 16), m.t(48),
                                              m.t(48)), {}),
    "aten::lstm_cell": lambda m: ((lambda x, h, *w: (x, [h, m.t(2, 16)], *w))(*_cell_operands(m, 4)), {}),
    "aten::gru_cell": lambda m: (_cell_operands(m, 3), {}),
    "aten::rnn_tanh_cell": lambda m: (_cell_operands(m, 1), {}),
    "aten::rnn_relu_cell": lambda m: (_cell_operands(m, 1), {}),
    "aten::scaled_dot_product_attention": lambda m: ((m.t(1, 2, 32, 64), m.t(1, 2, 32, 64),
                                                      m.t(1, 2, 32, 64)), {}),
    # fp32
    **{f"aten::{u}": (lambda m: ((m.unit(4, 8),), {}))
       for u in ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
                 "log1p", "reciprocal", "rsqrt", "sinh", "tan")},
    "aten::pow.Tensor_Scalar": lambda m: ((m.unit(4, 8), 3), {}),
    "aten::pow.Tensor_Tensor": lambda m: ((m.unit(4, 8), m.unit(4, 8) * 3), {}),
    "aten::pow.Scalar": lambda m: ((1.5, m.t(4, 8)), {}),
    "aten::softplus": lambda m: ((m.t(4, 8),), {}),
    "aten::layer_norm": lambda m: ((m.t(4, 16), [16], m.t(16), m.t(16)), {}),
    "aten::native_layer_norm": lambda m: ((m.t(4, 16), [16], m.t(16), m.t(16), 1e-5), {}),
    "aten::rms_norm": lambda m: ((m.t(4, 16), [16], m.t(16)), {}),
    "aten::group_norm": lambda m: ((m.t(2, 4, 6), 2, m.t(4), m.t(4)), {}),
    "aten::frobenius_norm.dim": lambda m: ((m.t(4, 8), [1]), {}),
    "aten::nuclear_norm": lambda m: ((m.t(4, 8),), {}),
    "aten::nuclear_norm.dim": lambda m: ((m.t(2, 4, 8), [1, 2]), {}),
    "aten::cosine_similarity": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::poisson_nll_loss": lambda m: ((m.t(4, 8), m.unit(4, 8) * 3, True, False, 1e-8, 1), {}),
    "aten::cosine_embedding_loss": lambda m: ((m.t(4, 8), m.t(4, 8), m.sign(4)), {}),
    "aten::nll_loss": lambda m: ((m.t(4, 8).log_softmax(-1), m.long(8, 4)), {}),
    "aten::nll_loss2d": lambda m: ((m.t(2, 5, 3, 3).log_softmax(1), m.long(5, 2, 3, 3)), {}),
    "aten::hinge_embedding_loss": lambda m: ((m.t(4, 8), m.sign(4, 8)), {}),
    "aten::kl_div": lambda m: ((m.t(4, 8).log_softmax(-1), m.unit(4, 8)), {}),
    "aten::l1_loss": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::smooth_l1_loss": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::huber_loss": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::mse_loss": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::margin_ranking_loss": lambda m: ((m.t(8), m.t(8), m.sign(8)), {}),
    "aten::multilabel_margin_loss": lambda m: ((m.t(4, 6), torch.tensor([[3, 0, -1, 1, 0, 0]] * 4)),
                                               {}),
    "aten::soft_margin_loss": lambda m: ((m.t(4, 8), m.sign(4, 8)), {}),
    "aten::triplet_margin_loss": lambda m: ((m.t(4, 8), m.t(4, 8), m.t(4, 8)), {}),
    "aten::multi_margin_loss": lambda m: ((m.t(4, 8), m.long(8, 4)), {}),
    "aten::binary_cross_entropy_with_logits": lambda m: ((m.t(4, 8), m.unit(4, 8)), {}),
    "aten::dist": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::pdist": lambda m: ((m.t(5, 8),), {}),
    "aten::cdist": lambda m: ((m.t(4, 8), m.t(5, 8)), {}),
    "aten::renorm": lambda m: ((m.t(4, 8), 2, 0, 1.0), {}),
    "aten::logsumexp": lambda m: ((m.t(4, 8), [1]), {}),
    "aten::upsample_nearest1d": _up(1),
    "aten::_upsample_nearest_exact1d": _up(1),
    "aten::upsample_nearest2d": _up(2),
    "aten::_upsample_nearest_exact2d": _up(2),
    "aten::upsample_nearest3d": _up(3),
    "aten::_upsample_nearest_exact3d": _up(3),
    "aten::upsample_linear1d": _up_ac(1),
    "aten::upsample_bilinear2d": _up_ac(2),
    "aten::_upsample_bilinear2d_aa": _up_ac(2),
    "aten::upsample_trilinear3d": _up_ac(3),
    "aten::upsample_bicubic2d": _up_ac(2),
    "aten::_upsample_bicubic2d_aa": _up_ac(2),
    # fp32_set_opt_dtype
    "aten::prod": lambda m: ((m.unit(4, 8) + 0.5,), {}),
    "aten::prod.dim_int": lambda m: ((m.unit(4, 8) + 0.5, 1), {}),
    "aten::softmax.int": lambda m: ((m.t(4, 8), -1), {}),
    "aten::log_softmax.int": lambda m: ((m.t(4, 8), -1), {}),
    "aten::cumprod": lambda m: ((m.unit(4, 8) + 0.5, 1), {}),
    "aten::cumsum": lambda m: ((m.t(4, 8), 1), {}),
    "aten::linalg_vector_norm": lambda m: ((m.t(4, 8),), {}),
    "aten::linalg_matrix_norm": lambda m: ((m.t(4, 8), 1), {}),
    "aten::linalg_matrix_norm.str_ord": lambda m: ((m.t(4, 8),), {}),
    "aten::sum": lambda m: ((m.t(4, 8),), {}),
    "aten::sum.dim_IntList": lambda m: ((m.t(4, 8), [1]), {}),
    # fp32_append_dtype
    "aten::norm.Scalar": lambda m: ((m.t(4, 8),), {}),
    "aten::norm.ScalarOpt_dim": lambda m: ((m.t(4, 8), 2, [1]), {}),
    # promote
    "aten::addcdiv": lambda m: ((m.t(4, 8), m.t(4, 8), m.unit(4, 8)), {}),
    "aten::addcmul": lambda m: ((m.t(4, 8), m.t(4, 8), m.t(4, 8)), {}),
    "aten::atan2": lambda m: ((m.t(4, 8), m.t(4, 8)), {}),
    "aten::bilinear": lambda m: ((m.t(4, 6), m.t(4, 5), m.t(3, 6, 5), m.t(3)), {}),
    "aten::cross": lambda m: ((m.t(4, 3), m.t(4, 3)), {}),
    "aten::dot": lambda m: ((m.t(16), m.t(16)), {}),
    "aten::vdot": lambda m: ((m.t(16), m.t(16)), {}),
    "aten::grid_sampler": lambda m: ((m.t(1, 2, 4, 4), m.t(1, 3, 3, 2).clamp(-1, 1), 0, 0, False),
                                     {}),
    "aten::index_put": lambda m: ((m.t(6, 4), [torch.tensor([0, 2, 5])], m.t(3, 4)), {}),
    "aten::tensordot": lambda m: ((m.t(3, 4, 5), m.t(4, 5, 2), [1, 2], [0, 1]), {}),
    "aten::scatter_add": lambda m: ((m.t(4, 8), 1, m.long(8, 4, 3), m.t(4, 3)), {}),
}

# the ops PyTorch has a kernel for on CUDA only: their values come from their definition
# (PyTorch's CUDA kernels' math), computed on the CPU in the policy's dtype


def _lstm_gates(ig, hg, cx, ib, hb):
    i, f, g, o = (ig + hg + ib + hb).chunk(4, 1)
    cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
    return o.sigmoid() * cy.tanh(), cy


def _gru_gates(ig, hg, hx, ib, hb):
    ir, ii, inn = (ig + ib).chunk(3, 1)
    hr, hi, hn = (hg + hb).chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (inn + r * hn).tanh()
    return (n + z * (hx - n),)


CUDA_ONLY_MATH = {"aten::_thnn_fused_lstm_cell": _lstm_gates,
                  "aten::_thnn_fused_gru_cell": _gru_gates}

# on CUDA's lists, but no device runs it but CUDA (the flash kernel of CUDA's SDPA): rbln
# reaches attention through scaled_dot_product_attention, which is on the list
NOT_RUNNABLE = {"aten::_scaled_dot_product_flash_attention"}


def test_every_listed_op_has_a_sample():
    runnable = set(POLICIES) - NOT_RUNNABLE - {"aten::binary_cross_entropy"}
    assert set(SAMPLES) == runnable


def _overload(name: str):
    packet, _, ov = name.removeprefix("aten::").partition(".")
    return getattr(getattr(A, packet), ov or "default")


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    return x


def _floats(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x] if x.is_floating_point() else []
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _floats(v)]
    return []


def _inputs(policy: str, args, low):
    """The operands as a test of ``policy`` gives them: float32 for the lower-precision list
    (autocast must lower them), ``low`` for the float32 lists (autocast must widen them), and
    for promotion the first floating operand ``low``, the others float32."""
    if policy == "lower_precision_fp":
        return args
    if policy == "promote":
        first = _floats(args)[0]
        return _map(args, lambda t: t.to(low) if t is first else t)
    return _map(args, lambda t: t.to(low) if t.is_floating_point() else t)


def _cuda_dtype(policy: str, low) -> torch.dtype:
    return low if policy == "lower_precision_fp" else torch.float32


@pytest.mark.parametrize("low", LOWER, ids=str)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_op_policy_is_cudas(name, low):
    policy = POLICIES[name]
    op = _overload(name)
    args, kwargs = SAMPLES[name](_Make(sum(map(ord, name))))
    args = _inputs(policy, args, low)
    want_dtype = _cuda_dtype(policy, low)
    # CUDA's policy by hand: every floating operand in the dtype the op runs in, no autocast
    ref_args = _map(args, lambda t: t.to(want_dtype) if t.is_floating_point() else t)
    ref = (CUDA_ONLY_MATH[name](*ref_args) if name in CUDA_ONLY_MATH
           else op(*ref_args, **kwargs))
    with torch.autocast("rbln", dtype=low):
        got = op(*_map(args, lambda t: t.to("rbln")), **kwargs)
    got, ref = _floats(got), _floats(ref)
    assert got and all(t.device.type == "rbln" for t in got)
    assert [t.dtype for t in got[:len(ref)]] == [want_dtype] * len(ref), name
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.cpu(), r, **TOL[want_dtype], equal_nan=True)
    if name in CUDA_ONLY_MATH:
        return
    try:
        with torch.autocast("cpu", dtype=low):
            cpu = _floats(op(*args, **kwargs))
    except (RuntimeError, NotImplementedError):
        # the CPU's autocast leaves this op alone, and its kernel refuses the operands as given
        # (mixed dtypes, or a dtype it lacks): CUDA's policy is what made them runnable
        assert name not in CPU_CAST
        return
    same = [t.dtype for t in cpu] == [t.dtype for t in got]
    # an op the CPU's autocast casts too gives CUDA's dtype there for these operands (the
    # policies may differ by name: prod, grid_sampler), so rbln is compared with it
    assert same or name not in CPU_CAST
    if same:
        for g, c in zip(got, cpu):
            torch.testing.assert_close(g.cpu(), c, **TOL[want_dtype], equal_nan=True)


def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda():
    p, t = torch.rand(4, 8).clamp(0.05, 0.95), torch.rand(4, 8)
    want = F.binary_cross_entropy(p, t)
    assert torch.allclose(F.binary_cross_entropy(p.to("rbln"), t.to("rbln")).cpu(), want)
    with torch.autocast("rbln", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast.*binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p.to("rbln"), t.to("rbln"))
        # CPU tensors are the CPU autocast's business, which is off here
        assert torch.allclose(F.binary_cross_entropy(p, t), want)


# -- the autocast region ---------------------------------------------------------------------

def test_dtypes_and_default_as_for_cuda():
    assert torch.rbln.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    # PyTorch's default for a PrivateUse1 backend, and CUDA's
    assert torch.get_autocast_dtype("rbln") == torch.get_autocast_dtype("cuda") == torch.float16
    x, w = torch.randn(4, 64, device="rbln"), torch.randn(64, 64, device="rbln")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("rbln"):
            assert torch.is_autocast_enabled("rbln")
            assert torch.get_autocast_dtype("rbln") == torch.float16
            assert (x @ w).dtype == torch.float16
    # a dtype autocast does not lower to warns and disables itself, as on the CPU
    for device in ("rbln", "cpu"):
        with pytest.warns(UserWarning, match="Disabling autocast"):
            with torch.autocast(device, dtype=torch.float64):
                assert not torch.is_autocast_enabled(device)


def test_graph_mode_casts_a_region_as_eager_does():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(),
                                torch.nn.Linear(128, 64)).to("rbln")

    def f(x):
        with torch.autocast("rbln", dtype=torch.bfloat16):
            y = model(x)
            return y, y.softmax(-1)

    x = torch.randn(8, 64, device="rbln")
    want = f(x)
    got = torch.compile(f, backend="rbln")(x)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16, torch.float32]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w.cpu(), **TOL[torch.bfloat16])


def _linear_pair():
    cpu = torch.nn.Linear(64, 64)
    return cpu, copy.deepcopy(cpu).to("rbln"), torch.randn(4, 64)


def _nested(lin, x, device):
    """Each level's (autocast enabled, result) for a region with regions switched off inside."""
    out = []

    def step():
        out.append((torch.is_autocast_enabled(device), lin(x)))

    with torch.autocast(device, dtype=torch.bfloat16):
        step()
        with torch.autocast(device, enabled=False):
            step()
            # another dtype inside: without the cache, which holds the outer region's casts
            with torch.amp.autocast(device_type=device, dtype=torch.float16, cache_enabled=False):
                step()
            step()
        with torch.amp.autocast(device_type=device, enabled=False):
            step()
        step()
    step()
    return out


def test_nesting_with_enabled_false_as_on_the_cpu():
    cpu, dev, x = _linear_pair()
    want = _nested(cpu, x, "cpu")
    got = _nested(dev, x.to("rbln"), "rbln")
    assert [(e, t.dtype) for e, t in got] == [(e, t.dtype) for e, t in want] == [
        (True, torch.bfloat16), (False, torch.float32), (True, torch.float16),
        (False, torch.float32), (False, torch.float32), (True, torch.bfloat16),
        (False, torch.float32)]
    for (_, g), (_, w) in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, **TOL[w.dtype])


def test_autocast_of_rbln_leaves_the_cpu_alone():
    cpu, dev, x = _linear_pair()
    with torch.autocast("rbln", dtype=torch.bfloat16):
        assert cpu(x).dtype == torch.float32             # CPU tensors: the CPU's autocast, off
        with torch.autocast("cpu", enabled=False):
            assert dev(x.to("rbln")).dtype == torch.bfloat16
        assert torch.is_autocast_enabled("rbln") and not torch.is_autocast_enabled("cpu")


class _Casts(torch.utils._python_dispatch.TorchDispatchMode):
    """The shapes of the tensors cast (``aten::_to_copy``) under it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def _cast_counts(lin, x, device, cache_enabled=True):
    """How often the weight and the input are cast: three calls in a region, a nested region,
    then a second region after a weight update."""
    counts = []
    outs = []
    for region in range(2):
        with _Casts() as casts:
            with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache_enabled):
                outs += [lin(x) for _ in range(3)]
                with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache_enabled):
                    outs.append(lin(x))
        counts.append((casts.shapes.count(tuple(lin.weight.shape)),
                       casts.shapes.count(tuple(x.shape))))
        with torch.no_grad():
            lin.weight.add_(0.5)      # between regions: the next region casts the new values
    return counts, outs


@pytest.mark.parametrize("cache_enabled", (True, False))
def test_weight_cast_cache_as_on_the_cpu(cache_enabled):
    """A weight (a leaf that requires grad) is cast once per autocast region, the cache is
    dropped when the outermost region exits; the input is cast at every call."""
    cpu, dev, x = _linear_pair()
    want, want_outs = _cast_counts(cpu, x, "cpu", cache_enabled)
    got, got_outs = _cast_counts(dev, x.to("rbln"), "rbln", cache_enabled)
    assert got == want == [(1 if cache_enabled else 4, 4)] * 2
    for g, w in zip(got_outs, want_outs):
        torch.testing.assert_close(g.cpu(), w, **TOL[torch.bfloat16])


def test_custom_op_registered_for_rbln_autocast():
    """An op defined in Python gets rbln's autocast through torch.library.register_autocast,
    as for CUDA."""
    lib = torch.library.Library("rbln_autocast_test", "FRAGMENT")
    try:
        @torch.library.custom_op("rbln_autocast_test::scale", mutates_args=())
        def scale(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x * y

        torch.library.register_autocast("rbln_autocast_test::scale", "rbln", torch.bfloat16)
        x, y = torch.randn(4, 64), torch.randn(4, 64)
        with torch.autocast("rbln", dtype=torch.float16):
            got = scale(x.to("rbln"), y.to("rbln"))
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.cpu(), x.bfloat16() * y.bfloat16(), atol=0, rtol=0)
    finally:
        lib._destroy()


# -- GradScaler ------------------------------------------------------------------------------

def _scaler_ops_host_runs(before, after) -> dict:
    return {key: n for (kind, key), (n, _) in event_delta(before, after, ()).items()
            if kind in ("host_op", "cpu_fallback") and "_amp_" in key}


@pytest.mark.parametrize("grad_dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
def test_scaler_ops_are_device_programs_equal_to_the_cpu(grad_dtype):
    """Unscale with the inf check, and the scale update, on the device: the CPU kernels' values
    bit for bit, nothing run on the host."""
    grads = [torch.randn(4, 64).to(grad_dtype) * 1024 for _ in range(3)]
    grads[1][2, 5] = float("inf")
    grads[2][0, 0] = float("nan")
    cases = [grads[:1], grads[:2], [grads[0], grads[2]]]
    for gs in cases:
        inv = torch.tensor(1 / 1024.0)
        want_g, want_inf = [g.clone() for g in gs], torch.zeros(())
        torch._amp_foreach_non_finite_check_and_unscale_(want_g, want_inf, inv)
        got_g, got_inf = [g.to("rbln") for g in gs], torch.zeros((), device="rbln")
        before = events.snapshot()
        with torch.rbln.explain() as report:
            torch._amp_foreach_non_finite_check_and_unscale_(got_g, got_inf, inv.to("rbln"))
        assert _scaler_ops_host_runs(before, events.snapshot()) == {}
        assert report.dump()["device_programs_by_op"] == {
            "aten::_amp_foreach_non_finite_check_and_unscale_": 1}
        assert torch.equal(got_inf.cpu(), want_inf)
        for g, w in zip(got_g, want_g):
            torch.testing.assert_close(g.cpu(), w, atol=0, rtol=0, equal_nan=True)
    # the scale update: growth after `interval` clean steps, backoff (and a reset) on an inf
    want = (torch.tensor(1024.0), torch.tensor(0, dtype=torch.int32))
    got = tuple(t.to("rbln") for t in want)
    for found in (0.0, 0.0, 0.0, 1.0, 0.0, 0.0):
        for scale, tracker in (want, got):
            found_inf = torch.tensor(found, device=scale.device)
            out = torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
            assert out is scale
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    assert want[0].item() == 2048.0


def _scaled_steps(model, device, opt_name, inject_at, steps=4):
    """(scale after each step, whether each step left the parameters as they were, the final
    parameters) of fp16 autocast steps under a GradScaler, an inf put into a gradient at step
    ``inject_at``."""
    params = list(model.parameters())
    opt = (torch.optim.SGD(params, lr=0.1) if opt_name == "sgd"
           else torch.optim.AdamW(params, lr=1e-2, fused=True))
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=2)
    gen = torch.Generator().manual_seed(1)
    scales, skipped = [], []
    for i in range(steps):
        x = torch.randn(8, 64, generator=gen).to(device)
        with torch.autocast(device, dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if i == inject_at:
            with torch.no_grad():
                params[0].grad[3, 7] = float("inf")
        before = [p.detach().cpu().clone() for p in params]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        skipped.append(all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, params)))
    return scales, skipped, [p.detach().cpu() for p in params]


@pytest.mark.parametrize("opt_name", ("sgd", "adamw_fused"))
def test_grad_scaler_steps_and_skips_as_on_the_cpu(opt_name):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 64))
    dev = copy.deepcopy(cpu).to("rbln")
    want = _scaled_steps(cpu, "cpu", opt_name, inject_at=1)
    before = events.snapshot()
    got = _scaled_steps(dev, "rbln", opt_name, inject_at=1)
    assert _scaler_ops_host_runs(before, events.snapshot()) == {}
    # the inf step is skipped and the scale backs off; clean steps grow it after two
    assert got[0] == want[0] == [1024.0, 512.0, 512.0, 1024.0]
    assert got[1] == want[1] == [False, True, False, False]
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, **TOL[torch.float16])


# -- an fp32 Llama under bf16 autocast -------------------------------------------------------

LLAMA = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LINEARS = 2 * 7 + 1          # q, k, v, o, gate, up, down per layer, and lm_head


def _llama_pair():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 64))
    return cpu, copy.deepcopy(cpu).to("rbln"), ids


def test_fp32_llama_under_bf16_autocast_runs_its_linears_on_the_device():
    cpu, dev, ids = _llama_pair()
    cpu.eval(), dev.eval()
    with torch.inference_mode():
        with torch.rbln.explain() as plain:
            dev(ids.to("rbln"))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = cpu(ids).logits
        with torch.rbln.explain() as report:
            with torch.autocast("rbln", dtype=torch.bfloat16):
                got = dev(ids.to("rbln")).logits
    # without autocast an fp32 model runs every linear on the host (dtype-not-fp16)
    d = plain.dump()
    assert d["cpu_fallback_by_op"]["aten::linear"] == LINEARS
    assert "aten::linear" not in d["device_programs_by_op"]
    # under autocast every linear is a device program in bf16
    d = report.dump()
    assert d["device_programs_by_op"]["aten::linear"] == LINEARS
    assert "aten::linear" not in d["cpu_fallback_by_op"]
    # what the model computes in fp32 itself (RMSNorm, RoPE, the fp32 residual stream) still
    # runs on the host, named as before; RoPE's half-head slices fail the alignment rule
    assert set(d["cpu_fallback_reasons"]) == {"dtype-not-fp16", "last-dim-not-64-aligned"}
    text = str(report)
    assert all(op in text for op in d["cpu_fallback_by_op"])
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), want, **TOL[torch.bfloat16])


def test_fp32_llama_backward_under_bf16_autocast_matches_cpu_autocast():
    cpu, dev, ids = _llama_pair()
    labels = torch.roll(ids, -1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = cpu(ids, labels=labels).loss
    want.backward()
    with torch.autocast("rbln", dtype=torch.bfloat16):
        got = dev(ids.to("rbln"), labels=labels.to("rbln")).loss
    with torch.rbln.explain() as report:
        got.backward()
    d = report.dump()
    assert d["device_programs_by_op"]["aten::linear_backward"] == LINEARS
    assert "aten::linear_backward" not in d["cpu_fallback_by_op"]
    torch.testing.assert_close(got.cpu(), want, **TOL[torch.bfloat16])
    for (name, w), g in zip(cpu.named_parameters(), dev.parameters()):
        assert g.grad.dtype == torch.float32, name       # the fp32 weights' gradients
        scale = w.grad.abs().max().item()
        torch.testing.assert_close(g.grad.cpu(), w.grad, atol=5e-2 * scale, rtol=5e-2,
                                   msg=lambda m: f"{name}: {m}")
