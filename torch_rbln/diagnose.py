"""``python -m torch_rbln.diagnose``: the environment report, printed to stderr, exit code 0.

Run it first for any import or device-configuration error. Started as a module it puts the
package in diagnose mode (``torch_rbln.is_diagnose_mode()``), so the backend is never
initialised; it imports torch itself only to check it, and prints the whole report even when
``import torch`` fails. Sections (the reference layout, for a virtual NPU host):

* this package: version, install type, where it was loaded from, where it is installed, and a
  warning when a local copy shadows the installed one;
* torch: version and location;
* the virtual NPU runtime: NPU model, physical NPUs, the logical mapping, memory per device;
* ``rebel ABI handshake:`` (:mod:`torch_rbln.abi`) ending in ``verdict: OK`` or
  ``verdict: MISMATCH -- <reason>``;
* ``autocast:``: the dtypes ``torch.autocast("rbln")`` takes and whether the native core casts
  the ops CUDA's autocast casts (``verdict: OK`` or ``verdict: MISMATCH -- ...``);
* ``settings check:``: each set variable against the values it accepts (``[FAIL]`` lines naming
  variable, value and what is accepted; ``verdict: OK`` or ``verdict: FAILED -- ...``);
* ``library integrations:``: the Hugging Face libraries taught rbln (:mod:`torch_rbln.integrations`),
  each with its installed version, the versions it was checked against, and what it patches;
* the environment variables that affect the backend; the Python interpreter.

docs/diagnose.md ("Diagnose and environment variables").
"""

from __future__ import annotations

import json
import os
import platform
import sys
import warnings

_PKG_DIR = os.path.dirname(os.path.realpath(__file__))


def _fmt_bytes(n: int) -> str:
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} bytes"


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"


# -- sections ---------------------------------------------------------------------------------

def package_section() -> list[str]:
    from importlib import metadata
    from .version import DIST_NAME, __version__
    out = ["torch-rbln package:", f"  version: {__version__}"]
    # a source tree's *.egg-info (a build artifact on sys.path when run from the checkout) is
    # not an installation: prefer the installer's *.dist-info
    dists = sorted(metadata.distributions(name=DIST_NAME),
                   key=lambda d: not str(getattr(d, "_path", "")).endswith(".dist-info"))
    if not dists:
        return out + ["  install_type: unknown (no installed distribution)",
                      f"  loaded from: {_PKG_DIR}"]
    dist = dists[0]
    installed, install_type = None, "normal"
    url = dist.read_text("direct_url.json")
    if url:
        info = json.loads(url)
        if info.get("dir_info", {}).get("editable"):
            install_type = "editable"
            src = info.get("url", "")
            if src.startswith("file://"):
                installed = os.path.join(src[len("file://"):], "torch_rbln")
    if installed is None:
        installed = str(dist.locate_file("torch_rbln"))
    installed = os.path.realpath(installed)
    out += [f"  install_type: {install_type}", f"  loaded from: {_PKG_DIR}",
            f"  installed at: {installed}"]
    if installed != _PKG_DIR:
        out += ["  >>> Local package is shadowing the installed wheel (loaded from != installed at).",
                "      Run from outside the project or fix PYTHONPATH/sys.path to use the wheel."]
    return out


def import_torch():
    """(torch module or None, error text or None), without initialising the backend."""
    try:
        import torch
        return torch, None
    except BaseException as e:  # a broken torch may raise anything, even SystemExit
        return None, _err(e)


def torch_section(torch, error) -> list[str]:
    out = ["torch package:"]
    if torch is None:
        return out + [f"  import failed: {error}"]
    from .abi import TORCH_VERSION
    return out + [f"  version: {torch.__version__} (this torch-rbln needs {TORCH_VERSION})",
                  f"  loaded from: {os.path.dirname(os.path.realpath(torch.__file__))}"]


def cpu_section(torch) -> list[str]:
    """The host CPU the virtual NPU computes on, and the kernels that choice gives."""
    out = ["host CPU:"]
    if torch is None:
        return out + ["  unknown (torch does not import)"]
    from .runtime import executors
    name = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:
        name = platform.processor() or platform.machine()
    p = executors.matmul_precision()
    return out + [f"  model: {name} ({os.cpu_count()} logical cores)",
                  f"  kernel capability: {torch.backends.cpu.get_cpu_capability()}",
                  f"  half-precision matmuls: {p.summary}"]


def runtime_section() -> list[str]:
    from .runtime import devices
    out = ["virtual NPU runtime:"]
    try:
        h = devices.host()
    except Exception as e:
        return out + [f"  error: {_err(e)}"]
    out += [f"  NPU model: {h.npu_name}",
            f"  physical NPUs on the host: {h.npus}",
            f"  memory per NPU: {_fmt_bytes(h.memory_per_npu)} ({h.chiplets} chiplet(s))"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = devices.plan(settings=False)      # other variables: settings check
    except Exception as e:
        return out + [f"  device mapping: invalid -- {_err(e)}"]
    out += [f"  visible NPUs: {list(p.visible)}", f"  logical devices: {len(p.groups)}"]
    for i, g in enumerate(p.groups):
        out.append(f"    rbln:{i}: NPUs {list(g)}, memory {_fmt_bytes(p.memory_per_npu * len(g))}")
    out += ["  " + line for line in devices.summary_text(p).splitlines()]
    return out


def abi_section(torch, error) -> list[str]:
    from . import abi, config
    out = ["rebel ABI handshake:", f"  built against ABI: {abi.BUILT_ABI}",
           "  runtime: virtual NPU (torch_rbln.runtime)"]
    lo, hi = abi.runtime_window()
    out.append(f"  runtime accepts: {lo}..{hi} (min_supported..current)")
    out.append(f"  torch pinned: {abi.TORCH_VERSION}")
    try:
        disabled = config.parse("TORCH_RBLN_SKIP_ABI_CHECK")
    except config.EnvError:
        disabled = False          # the environment section names the bad value
    err = None
    if torch is None:
        out.append("  private hooks: not checked (torch could not be imported)")
        verdict = f"MISMATCH -- torch could not be imported ({error})"
        err = f"could not import torch: {error}"
    else:
        try:
            res = abi.handshake()
            out.append(f"  private hooks: {len(abi.HOOKS) - len(res.missing)} of "
                       f"{len(abi.HOOKS)} present")
            out += [f"    [MISSING] {h.path}  (used for: {h.used_for})" for h in res.missing]
            out.append(f"  native core: {res.native or 'does not load'}")
            verdict = res.verdict
        except Exception as e:
            verdict = f"MISMATCH -- the handshake could not run ({_err(e)})"
            err = f"handshake failed: {_err(e)}"
    out.append(f"  verdict: {verdict}")
    if disabled:
        out.append("  >>> check is DISABLED via TORCH_RBLN_SKIP_ABI_CHECK; import will not "
                   "enforce it.")
    if err:
        out.append(f"  error: {err}")
    return out


def autocast_section(torch) -> list[str]:
    """What ``torch.autocast("rbln")`` casts: the dtypes, and the native kernels against the ops
    CUDA's autocast casts (registered here if the backend is not loaded: they are the check)."""
    out = ["autocast:"]
    if torch is None:
        return out + ["  not checked (torch could not be imported)"]
    from . import amp
    names = ", ".join(map(str, amp.SUPPORTED_DTYPES))
    default = torch.get_autocast_dtype(torch._C._get_privateuse1_backend_name())
    out += [f"  dtypes: {names} (default {default}, as for CUDA)",
            "  vendor's 0.12 binding: none (get_amp_supported_dtype() is [] there: autocast "
            "disables itself)"]
    try:
        missing, extra = amp.coverage()
    except Exception as e:
        return out + [f"  verdict: MISMATCH -- the cast kernels could not be checked ({_err(e)})"]
    cast = amp.ops_cast_by("AutocastPrivateUse1")
    own = ", ".join(n.removeprefix("aten::") for n in amp.CUDA_ONLY)
    out.append(f"  cast ops: {len(cast)}, CUDA's lists and policies (CUDA's own {own} aside)")
    if missing:
        out.append(f"  verdict: MISMATCH -- CUDA's autocast casts {len(missing)} op(s) rbln's does "
                   f"not: {', '.join(sorted(missing))}")
    else:
        out.append("  verdict: OK")
    return out


def settings_section() -> list[str]:
    """Every set TORCH_RBLN_* / RBLN_* variable checked against what it accepts: a bad value is
    a failed check (``import torch`` still works; the first rbln use raises that error)."""
    from . import config
    out = ["settings check:"]
    given = [(name, os.environ[name]) for name in config.VARS if name in os.environ]
    bad = 0
    for name, raw in given:
        try:
            config.parse(name, raw)
        except config.EnvError as e:
            bad += 1
            out.append(f"  [FAIL] {name}={raw}: {e}")
    if bad:
        out.append(f"  verdict: FAILED -- {bad} of {len(given)} variable(s) set hold a value "
                   f"torch-rbln does not accept; `import torch` works, the first rbln use "
                   f"raises the error")
    else:
        out.append(f"  verdict: OK ({len(given)} variable(s) set, all valid)")
    return out


def integrations_section() -> list[str]:
    """Each library integration: installed version (read from its distribution, without
    importing the library), the versions its patches were checked against, the patches."""
    from importlib import metadata

    from . import integrations
    out = ["library integrations (patched when the library is imported):"]
    for library in integrations.LIBRARIES:
        i = integrations.integration(library)
        checked = ", ".join(i.checked)
        try:
            version = metadata.version(library)
        except metadata.PackageNotFoundError:
            out.append(f"  {library}: not installed (checked against {checked})")
            continue
        out.append(f"  {library} {version} (checked against {checked})")
        if version not in i.checked:
            out.append(f"  >>> {library} {version} was not checked: its patches are applied and "
                       f"one that no longer fits is skipped with a warning")
        for p in i.patches:
            out.append(f"    {', '.join(p.module + '.' + t for t in p.targets)}: {p.why}")
    return out


# variables outside config.VARS that change what gets loaded
_OTHER_ENV = ("TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONPATH", "PATH")


def _path_lines(name: str, raw: str) -> list[str]:
    parts = [p for p in raw.replace(";", ":").split(":") if p] or [""]
    return [f"  {name}={parts[0]}"] + [f"    {p}" for p in parts[1:]]


def env_section() -> list[str]:
    from . import config
    out = ["Environment variables (affecting torch-rbln):"]
    for name in config.VARS:
        raw = os.environ.get(name)
        if raw is None:
            out.append(f"  {name}= (not set)")
            continue
        out.append(f"  {name}={raw}")
        try:
            config.parse(name, raw)
        except config.EnvError as e:
            out.append(f"  >>> invalid: {e}")
    for name, why in config.INERT.items():
        if name in os.environ:
            out.append(f"  {name}={os.environ[name]}")
            out.append(f"  >>> no effect on a virtual NPU host: {why}")
    for name in _OTHER_ENV:
        raw = os.environ.get(name)
        out += [f"  {name}= (not set)"] if raw is None else _path_lines(name, raw)
    return out


def collect() -> list[str]:
    """The report's lines (header and all sections). Never raises."""
    lines = ["=== torch-rbln environment diagnostics ===", ""]
    torch, error = import_torch()
    sections = (package_section, lambda: torch_section(torch, error), lambda: cpu_section(torch),
                runtime_section,
                lambda: abi_section(torch, error), lambda: autocast_section(torch),
                settings_section, integrations_section, env_section)
    for section in sections:
        try:
            lines += section()
        except Exception as e:  # one broken section must not hide the others
            lines.append(f"  error: {_err(e)}")
        lines.append("")
    lines.append(f"Python: {sys.executable} ({platform.python_version()})")
    return lines


def main() -> int:
    print("Running torch-rbln environment diagnostics...", file=sys.stderr)
    print("\n".join(collect()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
