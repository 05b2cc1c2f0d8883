"""Random generators of the logical devices (docs/torch-rbln.md ("Random numbers")).

The native core keeps one default generator per logical device and makes
``torch.Generator(device="rbln")`` work. Random ops run on the host (the CPU fallback), whose
kernels accept CPU generators only, so each rbln generator owns a CPU generator that is its
state: :func:`host` is what a CPU kernel draws from.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from .. import _C


def default(index: int) -> torch.Generator:
    """The default generator of logical device ``index`` (created seeded on first use)."""
    return _C._default_generator(index)


def host(gen: torch.Generator) -> torch.Generator:
    """The CPU generator behind the rbln generator ``gen`` (shares its state)."""
    return _C._host_generator(gen)


def default_host(index: int) -> torch.Generator:
    """What a random op on device ``index`` without an explicit generator draws from."""
    return _C._host_generator(_C._default_generator(index))


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator, also those created later. Never raises."""
    _C._manual_seed_all(seed)


_swap_lock = threading.Lock()


@contextmanager
def cpu_default_from(index: int):
    """Run a CPU kernel that draws from the CPU default generator (a random op without a
    ``generator`` argument, e.g. ``native_dropout``) on device ``index``'s generator: its state
    is swapped into the CPU default generator for the call and taken back afterwards, so the
    CPU generator's own sequence is untouched."""
    dev = default_host(index)
    cpu = torch.default_generator
    with _swap_lock:
        saved = cpu.get_state()
        cpu.set_state(dev.get_state())
        try:
            yield
        finally:
            dev.set_state(cpu.get_state())
            cpu.set_state(saved)
