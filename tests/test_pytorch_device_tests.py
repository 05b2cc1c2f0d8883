"""PyTorch's own device-generic test files pass on rbln wherever they pass on the CPU.

The files (``test_view_ops.py``, ``test_indexing.py``, ``test_shape_ops.py``,
``test_tensor_creation_ops.py``, ``test_modules.py``, ``test_unary_ufuncs.py``) come from a
PyTorch checkout's ``test/`` folder, named by ``$TORCH_RBLN_PYTORCH_TESTS`` (default
``../shared/third_party/pytorch-tests``); a test whose files are not there skips.
``bench/pytorch_device_tests.py`` runs them: both devices in one process, compared test by
test. Excepted, as its ``EXCEPTED`` table says why: sparse and quantized layouts (a clear
error), the accelerator-only checks that a CPU operand is rejected, and ``Module.to`` keeping
TensorImpls (PyTorch's "dense" device types only).

Default: fast subsets (views and indexing; recurrent and lazy modules); ``--runslow``: every
test of every file, one process per file (minutes each).
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


@pytest.mark.slow
@pytest.mark.parametrize("fname", runner.FILES)
def test_file_matches_cpu(fname):
    _need(fname)
    _assert_matches_cpu(fname, None, least=50)
