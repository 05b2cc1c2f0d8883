"""Mixed precision on rbln: what ``torch.autocast("rbln")`` casts, as CUDA's autocast does.

The casting kernels are PyTorch's own autocast wrappers, registered for AutocastPrivateUse1 by
the native core (``csrc/Autocast.cpp``) from the op lists CUDA's registration expands: an op is
cast on rbln exactly when, and to what, it is on CUDA (its lower-precision list, its float32
list, promotion, ``binary_cross_entropy`` refused), with the weight cast cache. The device
computes float16 and bfloat16, so both are offered; the default is float16, PyTorch's default
for a PrivateUse1 backend and CUDA's. The vendor's 0.12 binding offers none (older vendor docs:
float16 only). ``torch.amp.GradScaler("rbln")``'s unscale and scale update are device programs
(``dispatch/fused_optimizers.py``). docs/torch-rbln.md ("Autocast").
"""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)

# what torch.rbln.get_amp_supported_dtype() gives in the vendor's 0.12 binding
VENDOR_SUPPORTED_DTYPES = ()

# ops of CUDA's autocast registration that exist for CUDA's own libraries only
CUDA_ONLY = ("aten::cudnn_convolution", "aten::cudnn_convolution_transpose")


def ops_cast_by(key: str) -> set[str]:
    """The aten ops with an autocast kernel of their own for ``key`` (``"AutocastCUDA"``,
    ``"AutocastPrivateUse1"``, ...); every other op passes through autocast untouched."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return {n for n in torch._C._dispatch_get_all_op_names() if has(n, key)}


def coverage() -> tuple[set[str], set[str]]:
    """(ops CUDA's autocast casts that rbln's does not, ops rbln's casts that CUDA's does not),
    both empty when rbln casts what CUDA casts (CUDA's own ops aside). Registers the native
    kernels first if the backend has not (diagnose mode): they are what is checked."""
    from . import _C
    _C.register_autocast()
    cuda = ops_cast_by("AutocastCUDA") - set(CUDA_ONLY)
    rbln = ops_cast_by("AutocastPrivateUse1")
    return cuda - rbln, rbln - cuda
