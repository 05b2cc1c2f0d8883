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

logger = logging.getLogger(__name__)

PLATFORM = "torch_rbln.vllm_plugin.platform.RblnPlatform"


def register() -> str | None:
    """Entry point: the rbln platform when an rbln device is usable, else None.

    vLLM's own ``VLLM_TARGET_DEVICE=cpu`` still selects its CPU platform (it is checked before
    any plugin), which is how the same installation serves the CPU reference.
    """
    import torch

    if not torch.rbln.is_available():
        logger.warning("rbln vLLM plugin: no usable rbln device (torch.rbln.device_count() == 0; "
                       "check RBLN_DEVICES / RBLN_DEVICE_MAP with python -m torch_rbln.diagnose)")
        return None
    return PLATFORM
