"""``RblnCommunicator``: vLLM's device communicator for rbln, over ``rbln-ccl``.

With tensor or pipeline parallelism every vLLM worker drives one rbln device, and vLLM's
process groups are made with the platform's ``dist_backend``: each group coordinator holds a
*device group* on ``rbln-ccl`` (torch_rbln/distributed) and a *CPU group* on gloo, as on
vLLM's CPU platform. The communicator is what vLLM's model layers call for the device tensors:

* ``all_reduce`` (row-parallel linears, vocabulary-parallel embedding), ``all_gather``
  (logits of the vocabulary-parallel LM head), ``reduce_scatter``, ``broadcast``,
  ``send``/``recv`` (pipeline stages): vLLM's base implementations, each one collective of the
  device group; rbln-ccl runs them on the device (float16 SUM reductions, any gather) or
  through its gloo fallback on the host (other dtypes and ops), and records each as a
  ``collective`` event, so ``torch.rbln.explain()`` in a worker counts them;
* ``gather``: rbln-ccl has no gather (as the reference has none), so it is an all-gather whose
  result only the destination keeps.

vLLM's CPU communicator swaps torch.distributed for its shared-memory C++ kernels when they are
built; those read host memory, so there is no such fast path here: device tensors stay on the
device through rbln-ccl.
"""

from __future__ import annotations

import torch
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)


class RblnCommunicator(DeviceCommunicatorBase):
    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """``input_`` of every rank concatenated along ``dim`` on rank ``dst`` of the group,
        ``None`` elsewhere (``dst`` is the rank in the group, as in vLLM's base class)."""
        gathered = self.all_gather(input_, dim)
        return gathered if self.rank_in_group == dst else None
