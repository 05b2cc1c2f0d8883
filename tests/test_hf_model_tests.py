"""Hugging Face's test harness on rbln: the device spec, and bench/hf_model_tests.py on a small
tree in the layout of a transformers checkout."""

from __future__ import annotations

import textwrap

import pytest

from conftest import ROOT, run_code, run_script
from torch_rbln import hf_device_spec

pytest.importorskip("transformers")


def test_spec_file_is_found_by_the_harness(tmp_path, capsys):
    assert hf_device_spec.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == "export TRANSFORMERS_TEST_DEVICE_SPEC=rbln_device_spec.py\n"
    assert (tmp_path / "rbln_device_spec.py").is_file()
    # transformers.testing_utils imports the spec by its bare name from the working directory
    code = ("import torch\n"
            "from transformers import testing_utils as tu\n"
            "tu.backend_manual_seed('rbln', 7); a = torch.rand(4, device='rbln')\n"
            "torch.manual_seed(0); tu.backend_manual_seed('rbln', 7); b = torch.rand(4, device='rbln')\n"
            "assert torch.equal(a.cpu(), b.cpu())\n"
            "x = torch.ones(1024, dtype=torch.float16, device='rbln'); (x + x).cpu(); del x\n"
            "tu.backend_empty_cache('rbln')\n"
            "print(tu.torch_device, tu.backend_device_count('rbln'), torch.rbln.memory_reserved())\n")
    r = run_code(code, cwd=tmp_path, env={"TRANSFORMERS_TEST_DEVICE_SPEC": "rbln_device_spec.py"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["rbln", "1", "0"]


# A tree in the layout of a transformers checkout: the harness function holding the tolerance
# table (the same branch on the device name as tests/test_modeling_common.py) and a model test
# file with a test of each kind the script tells apart.
COMMON = '''
import torch
from transformers.testing_utils import torch_device


def _test_eager_matches_sdpa_inference(self, dtype):
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    want = torch.softmax(x, -1)
    got = torch.softmax(x.to(torch_device, dtype), -1).float().cpu()
    if torch_device in ["cpu", "cuda"]:
        atol = 5e-3
    elif torch_device in ["hpu", "npu", "tpu"]:
        atol = 5e-3
    else:
        atol = 1e-7
    if not torch.allclose(got, want, atol=atol, rtol=1e-4):
        raise ValueError(f"mean relative difference for logits: 1e-3, torch atol = {atol}, torch rtol = 1e-4")
'''

MODEL_TESTS = '''
import unittest

import torch
from transformers.testing_utils import require_torch_accelerator, torch_device

from ...test_modeling_common import _test_eager_matches_sdpa_inference


class TinyModelTest(unittest.TestCase):
    def test_forward(self):
        x = torch.arange(64, dtype=torch.float16, device=torch_device)
        self.assertEqual((x + 1).sum().item(), 2080.0)

    def test_eager_matches_sdpa_inference_fp16(self):
        _test_eager_matches_sdpa_inference(self, torch.float16)

    @require_torch_accelerator
    def test_on_accelerator(self):
        self.assertEqual(torch.ones(2, device=torch_device).device.type, "rbln")

    def test_device_name(self):
        # fails on rbln for a reason other than the tolerance table: reported as such
        self.assertEqual(torch_device, "cpu")
'''


def _tree(root):
    for d in ("tests", "tests/models", "tests/models/tiny"):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "__init__.py").write_text("")
    (root / "tests/test_modeling_common.py").write_text(textwrap.dedent(COMMON))
    (root / "tests/models/tiny/test_modeling_tiny.py").write_text(textwrap.dedent(MODEL_TESTS))
    return root


@pytest.mark.slow
def test_script_tallies_and_causes(tmp_path):
    tree = _tree(tmp_path / "transformers")
    r = run_script(ROOT / "bench" / "hf_model_tests.py", "--tree", str(tree), "tiny", timeout=600)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr        # one failure is not the tolerance table's
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("tiny "))
    # tests, then CPU passed/failed/skipped/wall, then rbln passed/failed/skipped/wall
    assert row[1:5] == ["4", "3", "0", "1"] and row[6:9] == ["2", "2", "0"], out
    assert "2 pass on the CPU and fail on rbln (1 harness tolerance, 1 backend)" in out
    assert "[tolerance] TinyModelTest::test_eager_matches_sdpa_inference_fp16" in out
    assert "[backend] TinyModelTest::test_device_name" in out
    assert "[rbln only] TinyModelTest::test_on_accelerator  (CPU: skipped)" in out
    assert "backend failures: 1" in out
    assert not list(tree.glob("rbln_device_spec.py")), "the tree must stay untouched"
