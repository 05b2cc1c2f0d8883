"""Hugging Face ``transformers`` on rbln: ``Trainer`` picks rbln as it picks CUDA, accepts
``bf16=True``, and keeps the rbln generators across ``resume_from_checkpoint``.

transformers finds the accelerator by name (``is_torch_xpu_available()``, ...,
``torch.cuda.is_available()``) in the three places patched here; the rest of its training stack
asks accelerate, which already finds rbln through ``torch.accelerator``.
docs/training-hf.md ("Training with Hugging Face").
"""

from __future__ import annotations

import functools
import os

from .patch import Integration, LibraryPatch, replace


def _rbln_is_accelerator() -> bool:
    import torch
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "rbln"


def _setup_devices(module) -> None:
    """``TrainingArguments.device`` is ``rbln:0`` where rbln is the accelerator.

    Outside distributed training transformers picks the device from a list of names and falls
    back to ``cuda:0`` or the CPU, while accelerate's ``PartialState`` (which places the model)
    picks ``torch.accelerator.current_accelerator()``, rbln: the model went to rbln, the args
    stayed on the CPU, and ``Trainer.train()`` failed ("Calculated loss must be on the original
    device"). Here the args follow accelerate onto ``rbln:0``, as they do onto ``xpu:0`` or
    ``npu:0``: one accelerator per process, ``n_gpu`` 1 (``n_gpu`` > 1 is transformers'
    ``nn.DataParallel`` path, CUDA's alone). ``use_cpu=True`` (or ``ACCELERATE_USE_CPU``) keeps
    the CPU: accelerate's state is on the CPU then."""
    import torch
    cls = module.TrainingArguments
    prop = cls.__dict__["_setup_devices"]
    orig = prop.func

    def _setup_devices(self):
        device = orig(self)
        state = self.distributed_state
        if (device.type == "cpu" and not self.use_cpu and state is not None
                and state.device is not None and state.device.type == "rbln"):
            device = torch.device("rbln", 0)
            torch.rbln.set_device(device)
            self._n_gpu = 1
        return device

    _setup_devices.__wrapped__ = orig
    _setup_devices.__doc__ = orig.__doc__
    new = functools.cached_property(_setup_devices)
    new.__set_name__(cls, "_setup_devices")
    cls._setup_devices = new


def _bf16_available(module) -> None:
    """``is_torch_bf16_gpu_available()`` is ``torch.rbln.is_bf16_supported()`` where rbln is the
    accelerator, so ``TrainingArguments(bf16=True)`` is accepted (it raised "Your setup doesn't
    support bf16/gpu"). Mixed precision itself is accelerate's ``torch.autocast("rbln")``."""
    orig = module.is_torch_bf16_gpu_available

    def is_torch_bf16_gpu_available() -> bool:
        if _rbln_is_accelerator():
            import torch
            return torch.rbln.is_bf16_supported()
        return orig()

    # also transformers.utils' and training_args' copies, if they were made before this ran
    replace(module, is_torch_bf16_gpu_available)


def _rng_file(trainer, output_dir: str) -> str:
    """The file ``Trainer._save_rng_state`` writes (and ``_load_rng_state`` reads)."""
    if trainer.args.world_size <= 1:
        return os.path.join(output_dir, "rng_state.pth")
    return os.path.join(output_dir, f"rng_state_{trainer.args.process_index}.pth")


def _rng_state(module) -> None:
    """A checkpoint's ``rng_state.pth`` holds the rbln generators under ``"rbln"`` (as it holds
    CUDA's under ``"cuda"``), and resuming restores them: dropout after
    ``resume_from_checkpoint`` draws what the uninterrupted run drew. Before, the file held the
    CPU, numpy and Python generators only, and a resumed run with dropout on rbln diverged.
    Saved for a run on rbln (``args.device``), so a ``use_cpu=True`` run never touches the
    device; all devices' states under distributed training, the current one's otherwise, as
    for CUDA."""
    import torch
    cls = module.Trainer
    save, load = cls._save_rng_state, cls._load_rng_state
    safe_globals = module.safe_globals       # numpy's state in a weights_only load
    logger = module.logger

    def _distributed(self) -> bool:
        return self.args.parallel_mode == module.ParallelMode.DISTRIBUTED

    def _save_rng_state(self, output_dir):
        save(self, output_dir)
        if self.args.device.type != "rbln":
            return
        path = _rng_file(self, output_dir)
        with safe_globals():
            states = torch.load(path, weights_only=True)
        states["rbln"] = (torch.rbln.get_rng_state_all() if _distributed(self)
                          else torch.rbln.get_rng_state())
        torch.save(states, path)

    def _load_rng_state(self, checkpoint):
        load(self, checkpoint)
        if checkpoint is None or self.args.device.type != "rbln":
            return
        path = _rng_file(self, checkpoint)
        if not os.path.isfile(path):
            return                              # the original logged it
        with safe_globals():
            states = torch.load(path, weights_only=True)
        if "rbln" not in states:
            logger.info("The checkpoint holds no rbln RNG state (saved before torch-rbln's "
                        "transformers integration, or on another device): dropout after "
                        "resuming differs from an uninterrupted run.")
            return
        try:
            if _distributed(self):
                torch.rbln.set_rng_state_all(states["rbln"])
            else:
                torch.rbln.set_rng_state(states["rbln"])
        except Exception as e:          # as transformers' set_rng_state_for_device does
            logger.error(f"Didn't manage to set back the RNG states of the RBLN because of the "
                         f"following error:\n {e}\nThis won't yield the same results as if the "
                         f"training had not been interrupted.")

    replace(cls, _save_rng_state)
    replace(cls, _load_rng_state)


INTEGRATION = Integration(
    library="transformers",
    checked=("5.23.0",),
    patches=(
        LibraryPatch(
            "transformers.training_args", ("TrainingArguments._setup_devices",),
            "Trainer trains on rbln:0 by default",
            "TrainingArguments._setup_devices takes torch.accelerator.current_accelerator() "
            "where it now falls back to cuda:0 or the CPU, as accelerate's PartialState does",
            _setup_devices),
        LibraryPatch(
            "transformers.utils.import_utils", ("is_torch_bf16_gpu_available",),
            "bf16=True is accepted on rbln",
            "is_torch_bf16_gpu_available() asks the current accelerator's device module "
            "(torch.get_device_module(acc).is_bf16_supported()) for any accelerator",
            _bf16_available),
        LibraryPatch(
            "transformers.trainer", ("Trainer._save_rng_state", "Trainer._load_rng_state"),
            "resuming restores the rbln generators",
            "Trainer saves and restores the current accelerator's RNG state under its device "
            "type (torch.get_device_module(acc).get_rng_state_all()), not a list of names",
            _rng_state),
    ),
)
