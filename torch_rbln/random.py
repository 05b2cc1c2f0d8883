"""torch.rbln RNG: one default generator per logical device (``runtime/generators.py``); random
ops on rbln tensors draw from the generator of their device (or the ``generator=`` given), so
``torch.rbln.manual_seed`` makes them reproducible independently of the CPU generator.
docs/torch-rbln.md ("torch.rbln API")."""

from __future__ import annotations

import torch

from .runtime import devices, generators

__all__ = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
           "get_rng_state_all", "set_rng_state", "set_rng_state_all", "default_generator"]


def default_generator(index: int | None = None) -> torch.Generator:
    """The default generator of device ``index`` (the current device for None)."""
    return generators.default(devices.current() if index is None else index)


def _index(device) -> int:
    from .device_api import _index_or_current
    idx = _index_or_current(device)
    return devices.current() if idx < 0 else idx


def _get_generator(device: torch.device) -> torch.Generator:
    """The default generator of ``device`` (``torch.cuda._get_generator``)."""
    return default_generator(_index(device))


def default_generators() -> tuple:
    """Every logical device's default generator (``torch.rbln.default_generators`` reads it)."""
    return tuple(default_generator(i) for i in range(devices.count()))


def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed) & ((1 << 64) - 1))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator, including ones created later. Never raises."""
    generators.manual_seed_all(int(seed) & ((1 << 64) - 1))


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    for i in range(devices.count()):
        default_generator(i).seed()


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="rbln") -> torch.Tensor:
    idx = _index(device)
    return default_generator(idx).get_state()


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(devices.count())]


def set_rng_state(new_state: torch.Tensor, device="rbln") -> None:
    idx = _index(device)
    default_generator(idx).set_state(new_state.detach().to("cpu", torch.uint8).clone().contiguous())


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)
