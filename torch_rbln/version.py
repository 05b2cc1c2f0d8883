"""This package's distribution name and installed version (``torch_rbln.__version__``)."""

from __future__ import annotations

DIST_NAME = "torch-rbln-vnpu"

try:
    from importlib.metadata import version as _version
    __version__ = _version(DIST_NAME)
except Exception:  # not installed (source tree)
    __version__ = "0.0.0"
