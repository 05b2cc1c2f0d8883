"""Sparse and quantized tensors: the NPU has neither; every way in gives one clear error."""

from __future__ import annotations

import pytest
import torch

CASES = {
    "quantize_per_tensor": ("quantized", lambda: torch.quantize_per_tensor(
        torch.randn(4, device="rbln"), 0.1, 5, torch.quint8)),
    "_empty_affine_quantized": ("quantized", lambda: torch._empty_affine_quantized(
        [2], scale=2, zero_point=3, dtype=torch.quint8, device="rbln")),
    "quantized .to(rbln)": ("quantized", lambda: torch.quantize_per_tensor(
        torch.randn(4), 0.1, 5, torch.quint8).to("rbln")),
    "to_sparse": ("sparse", lambda: torch.randn(2, 2, device="rbln").to_sparse()),
    "to_sparse_csr": ("sparse compressed", lambda: torch.randn(2, 2, device="rbln").to_sparse_csr()),
    "sparse_coo_tensor": ("sparse", lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 1]], device="rbln"), torch.tensor([1., 2.], device="rbln"), (3,))),
    "zeros(layout=sparse_coo)": ("sparse", lambda: torch.zeros(
        2, 2, device="rbln", layout=torch.sparse_coo)),
    "sparse .to(rbln)": ("sparse", lambda: torch.randn(2, 2).to_sparse().to("rbln")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unsupported_layout_is_a_clear_error(case):
    kind, make = CASES[case]
    with pytest.raises(NotImplementedError, match=rf"^{kind}.* tensors are not supported on rbln "
                                                   r"\(`aten::\w+(\.\w+)?`\).*to_dense"):
        make()


def test_dense_work_is_unaffected():
    # the same data, dense, still round-trips and computes
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 5, torch.quint8)
    x = q.dequantize().to("rbln")
    assert torch.equal((x * 2).cpu(), q.dequantize() * 2)
    s = torch.randn(2, 2).to_sparse()
    assert torch.equal(s.to_dense().to("rbln").cpu(), s.to_dense())
