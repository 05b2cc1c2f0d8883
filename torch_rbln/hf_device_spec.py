"""Device spec for Hugging Face ``transformers``' test harness: run its model tests on rbln.

``transformers.testing_utils`` reads ``TRANSFORMERS_TEST_DEVICE_SPEC``, imports that file *by
its name* (so it must be a plain ``.py`` file name in the directory pytest runs from) and takes
the device name and the device functions from it. This module is the spec; running it writes
a one-line file that re-exports it and prints the variable to set::

    cd transformers                                    # a checkout: tests/ and utils/
    eval "$(python -m torch_rbln.hf_device_spec)"      # writes ./rbln_device_spec.py
    python -m pytest tests/models/llama/test_modeling_llama.py

``bench/bench_hf_tests.py`` runs model test files this way on rbln and on the CPU and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

__all__ = ["DEVICE_NAME", "MANUAL_SEED_FN", "EMPTY_CACHE_FN", "DEVICE_COUNT_FN"]

DEVICE_NAME = "rbln"
MANUAL_SEED_FN = torch.rbln.manual_seed
EMPTY_CACHE_FN = torch.rbln.empty_cache
DEVICE_COUNT_FN = torch.rbln.device_count

FILE_NAME = "rbln_device_spec.py"
ENV = "TRANSFORMERS_TEST_DEVICE_SPEC"


def write(directory: str | Path = ".") -> Path:
    """Write ``rbln_device_spec.py`` (a re-export of this module) into ``directory``."""
    path = Path(directory) / FILE_NAME
    path.write_text("# transformers test device spec for rbln (python -m torch_rbln.hf_device_spec)\n"
                    "from torch_rbln.hf_device_spec import *  # noqa: F401,F403\n")
    return path


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else Path(".")
    write(directory)
    # stdout carries only the shell line, so that `eval "$(python -m ...)"` sets it
    print(f"export {ENV}={FILE_NAME}")
    print(f"wrote {directory / FILE_NAME}; run pytest from {directory.resolve()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
