"""torch.rbln RNG. Generators are host-side, one per logical device; random ops on rbln tensors
draw from the generator of their device, so ``torch.rbln.manual_seed`` makes them reproducible
independently of the CPU generator. README: "torch.rbln API"."""

from __future__ import annotations

import torch

from .runtime import devices

__all__ = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
           "get_rng_state_all", "set_rng_state", "set_rng_state_all", "default_generator"]

_generators: dict[int, torch.Generator] = {}
_pending_seed_all: int | None = None


def default_generator(index: int | None = None) -> torch.Generator:
    idx = devices.current() if index is None else index
    g = _generators.get(idx)
    if g is None:
        g = _generators[idx] = torch.Generator()
        if _pending_seed_all is not None:
            g.manual_seed(_pending_seed_all)
    return g


def _index(device) -> int:
    from .device_api import _index_or_current
    idx = _index_or_current(device)
    return devices.current() if idx < 0 else idx


def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed) & ((1 << 64) - 1))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator, including ones created later. Never raises."""
    global _pending_seed_all
    s = int(seed) & ((1 << 64) - 1)
    _pending_seed_all = s
    for g in _generators.values():
        g.manual_seed(s)


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    for i in range(max(1, devices.count())):
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
