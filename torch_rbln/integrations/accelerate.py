"""Hugging Face ``accelerate`` on rbln: its capability checks ask ``torch.rbln``.

accelerate finds rbln through ``torch.accelerator`` (``PartialState().device`` is rbln,
``load_checkpoint_and_dispatch`` places weights there, ``Accelerator(mixed_precision="bf16")``
autocasts with ``torch.autocast("rbln")``). But ``get_torch_accelerator_backend()`` hands out
the backend's own device module only for the device types it names (cuda, xpu, npu, ...), and
``torch.accelerator`` for any other: the checks that ask that module (``get_amp_supported_dtype``
for ``mixed_precision="fp16"``, ``is_bf16_supported`` for bf16) found nothing on it and let
every dtype pass, even one ``torch.autocast("rbln")`` does not cast to (it then disables itself:
training ran in fp32). With ``torch.rbln`` (torch.cuda's API) handed out, fp16 and bf16 are
checked against what rbln's autocast supports, ``Accelerator.save_state`` keeps every rbln
device's generator (``get_rng_state_all``, as for CUDA), and the rest reads the same functions
under their torch.cuda names.
"""

from __future__ import annotations

from .patch import Integration, LibraryPatch, replace


def _accelerator_backend(module) -> None:
    import torch
    orig = module.get_torch_accelerator_backend

    def get_torch_accelerator_backend(check_available: bool = True):
        device_type, device_module = orig(check_available)
        if device_type == "rbln":
            return device_type, torch.rbln
        return device_type, device_module

    # also in accelerate's modules that took it by name during its import
    replace(module, get_torch_accelerator_backend)


INTEGRATION = Integration(
    library="accelerate",
    checked=("1.16.0",),
    patches=(
        LibraryPatch(
            "accelerate.utils.imports", ("get_torch_accelerator_backend",),
            "fp16/bf16 checks and RNG states ask torch.rbln",
            "get_torch_accelerator_backend() returns torch.get_device_module(type) for every "
            "accelerator that registered a device module, not only the device types it names",
            _accelerator_backend),
    ),
)
