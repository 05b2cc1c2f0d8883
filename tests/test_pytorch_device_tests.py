"""PyTorch's own device-generic test files pass on rbln wherever they pass on the CPU.

The files (``test_torch.py``, ``test_dlpack.py``, ``test_linalg.py``, ``test_nn.py``,
``test_view_ops.py``, ``test_indexing.py``, ``test_shape_ops.py``,
``test_tensor_creation_ops.py``, ``test_modules.py``, ``test_unary_ufuncs.py``) come from a
PyTorch checkout's ``test/`` folder, named by ``$TORCH_RBLN_PYTORCH_TESTS`` (default
``../shared/third_party/pytorch-tests``); a test whose files are not there skips.
``bench/pytorch_device_tests.py`` runs them: both devices in one process, compared test by
test. Accepted, as its ``EXCEPTED`` table says why: sparse and quantized layouts (a clear
error), the accelerator-only checks that a CPU operand is rejected, tests that encode a
CUDA-only dtype limit or branch on the CPU and CUDA only, int4 weight packing (CUDA and MPS
only), and ``Module.to`` keeping TensorImpls (PyTorch's "dense" device types only).

Default: fast subsets (views and indexing; recurrent and lazy modules; a few tests each of
``test_torch``, ``test_dlpack``, ``test_linalg`` and ``test_nn``); ``--runslow``: every test
of every file, one process per file (minutes each; ``test_nn.py`` up to an hour).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "pytorch_device_tests", _ROOT / "bench" / "pytorch_device_tests.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

TESTS = Path(os.environ.get("TORCH_RBLN_PYTORCH_TESTS", runner.DEFAULT_TESTS))



def _need(*files):
    """Skip unless each of ``files`` is in the PyTorch test folder."""
    missing = [f for f in files if not (TESTS / f).is_file()]
    if missing:
        pytest.skip(f"PyTorch's {', '.join(missing)} not at {TESTS} (set "
                    f"TORCH_RBLN_PYTORCH_TESTS to a pytorch checkout's test/ folder)")

# views and their write-through, advanced indexing (get, set, accumulate): one process, about
# forty tests per device
FAST_FILES = ("test_view_ops.py", "test_indexing.py")
FAST = ("test_view_tensor_split or test_real_imag_view or test_diagonal_view or "
        "test_unfold_view or test_as_strided_view or test_flatten_view or test_reshape_view or "
        "test_advancedindex or test_bool_indices or test_take_along_dim or "
        "test_index_put_accumulate_expanded_values")


def _assert_matches_cpu(files, kexpr, least):
    results, tail = runner.run(TESTS, files, kexpr, timeout=300)
    assert not tail, tail
    tally, only, excepted = runner.compare(results)
    compared = sum(1 for by_dev in results.values()
                   if by_dev.get("cpu", ("",))[0] == "passed" and "rbln" in by_dev)
    assert compared >= least, f"only {compared} tests ran on both devices: {tally}"
    assert not only, "pass on the CPU, fail on rbln:\n" + "\n".join(
        f"{k[1]}.{k[2]}: {msg}" for k, msg, _ in only)
    return results


def test_fast_subset_matches_cpu():
    _need(*FAST_FILES)
    _assert_matches_cpu(FAST_FILES, FAST, least=30)


# recurrent modules (the fused RNN cell ops: forward and backward) and a lazy module moved to
# rbln (UninitializedParameter), on both devices
MODULES_FAST = ("(test_non_contiguous_tensors and (nn_GRU_ or nn_LSTM_) and train_mode and "
                "float32) or (test_forward and nn_LazyConv2d_ and float32)")


def test_modules_rnn_and_lazy_match_cpu():
    _need("test_modules.py")
    _assert_matches_cpu("test_modules.py", MODULES_FAST, least=3)


# a few tests of each of the four larger files, in one process: storage, indexing and memory
# formats; DLPack capsules; BLAS, decompositions, einsum; normalization, upsampling, CTC loss
CORE_FILES = ("test_torch.py", "test_dlpack.py", "test_linalg.py", "test_nn.py")
CORE_FAST = ("test_clone_zero_stride_dim or test_scatter_bool or test_cumsum or "
             "test_memory_format_clone or test_index_fill or test_dlpack_capsule_conversion or "
             "test_dlpack_shared_storage or test_inner or test_kron or test_cholesky_solve or "
             "test_einsum_corner_cases or test_upsamplingNearest2d or test_GroupNorm_general or "
             "test_conv_empty_channel or test_CTCLoss_empty_target or test_LayerNorm_general")


def test_core_files_subset_matches_cpu():
    _need(*CORE_FILES)
    results = _assert_matches_cpu(CORE_FILES, CORE_FAST, least=60)
    per_file = {f[:-3]: 0 for f in CORE_FILES}
    for key, by_dev in results.items():
        if by_dev.get("cpu", ("",))[0] == "passed" and "rbln" in by_dev:
            per_file[key[0]] = per_file.get(key[0], 0) + 1
    assert min(per_file.values()) >= 8, per_file


@pytest.mark.slow
@pytest.mark.parametrize("fname", runner.FILES)
def test_file_matches_cpu(fname):
    _need(fname)
    _assert_matches_cpu(fname, None, least=50)
