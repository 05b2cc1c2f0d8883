"""Builds the native core (``torch_rbln._C``) from ``torch_rbln/csrc/*.cpp`` with PyTorch's own
extension tooling, against the headers of the pinned torch. ``pip install .`` / ``-e .`` run it."""

import glob
import os
import shutil
import sys

from setuptools import setup


def _require_toolchain() -> None:
    """Fail early, naming what is missing, instead of deep inside the compiler driver."""
    missing = [tool for tool in ("g++",) if shutil.which(tool) is None and shutil.which("c++") is None]
    if missing:
        sys.exit("torch-rbln: building the native core needs a C++17 compiler (g++ or c++ on PATH); "
                 "install one (e.g. `apt-get install g++`) and rerun the install.")
    # an installed (editable) torch_rbln would be auto-loaded by `import torch` with its old _C,
    # which fails once the C++ changed: the build needs torch alone
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("torch-rbln: building the native core needs torch==2.13.0 in the build "
                 "environment (pyproject.toml lists it under build-system.requires).")


def _optimisation_flags() -> list[str]:
    """``TORCH_RBLN_BUILD_TYPE`` (as the vendor's build reads it): ``Release`` (default) or
    ``Debug`` (no optimisation, debug info, for gdb)."""
    kind = os.environ.get("TORCH_RBLN_BUILD_TYPE", "Release")
    if kind not in ("Release", "Debug"):
        sys.exit(f"torch-rbln: Invalid TORCH_RBLN_BUILD_TYPE value `{kind}`, expected Release "
                 "or Debug")
    # Release: no debug info (Python's default -g): a third less compile time, a 30x smaller .so
    return ["-O0", "-g"] if kind == "Debug" else ["-O2", "-g0"]


_require_toolchain()
import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

# the profiler (csrc/Profiler.cpp) is a Kineto activity profiler: torch's wheel ships Kineto's
# headers under include/kineto and exports the registry it plugs into (built with USE_KINETO)
_KINETO_INCLUDE = os.path.join(os.path.dirname(torch.__file__), "include", "kineto")

setup(
    ext_modules=[CppExtension(
        "torch_rbln._C",
        sorted(glob.glob("torch_rbln/csrc/*.cpp")),
        include_dirs=[_KINETO_INCLUDE],
        define_macros=[("USE_KINETO", None)],
        extra_compile_args=[*_optimisation_flags(), "-std=c++17", "-fvisibility=hidden"],
    )],
    # ninja (from the machine) compiles the files in parallel; without it the build is serial
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
)
