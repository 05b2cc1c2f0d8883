"""The Hugging Face libraries taught rbln: one module here per library (named as the library),
each a list of patches for the places where that library knows accelerators only by name.

``install()`` (at backend load) imports none of the libraries, nor their modules here: once the
user imports a library, its module here is loaded and each of its patches waits for the library
module it patches (``post_import``), applied then, once. ``python -m torch_rbln.diagnose``
lists them with the library versions they were checked against.
docs/training-hf.md ("Training with Hugging Face").
"""

from __future__ import annotations

import importlib

from .post_import import when_imported

LIBRARIES = ("transformers", "accelerate", "safetensors")


def integration(library: str):
    """The :class:`~.patch.Integration` of ``library`` (imports its module here, not the
    library)."""
    return importlib.import_module(f"{__name__}.{library}").INTEGRATION


def _arm(library) -> None:
    from .patch import apply
    i = integration(library.__name__)
    for p in i.patches:
        when_imported(p.module, lambda module, p=p: apply(i, p, module))


def install() -> None:
    """Arm every library's patches for when (or, if already imported, as soon as) the user
    imports it."""
    for library in LIBRARIES:
        when_imported(library, _arm)
