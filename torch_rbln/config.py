"""Environment variables: one table, one parser each, one place that reads them.

Each variable has a documented read time (``Var.read_at``, see :data:`READ_TIMES`):

* ``import``    read once when the extension loads (``latched()``),
* ``runtime``   read once when the virtual NPU runtime starts: the first device query,
* ``commit``    re-read by every device query until the mapping is committed (first real device
                use), ignored afterwards,
* ``live``      read on every dispatch, check or allocation (``live()``),
* ``category``  per fallback category (``TORCH_RBLN_DISABLE_FALLBACK``).

Malformed values raise :class:`EnvError` (a ``ValueError``) naming the variable and the accepted
values, at the variable's read time; nothing is silently ignored unless the reference documents
it (unknown names in ``TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK``). A variable read at import never
breaks ``import torch``: its error is raised by the first rbln use instead (:func:`latched`). Variables of the reference
that mean nothing on a virtual NPU host are listed in :data:`INERT`; diagnose flags them.

``docs/env.md`` is generated from this table (``markdown()``); a test keeps them equal.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["EnvError", "VARS", "INERT", "live", "latched", "parse", "describe", "markdown"]


class EnvError(ValueError):
    """A TORCH_RBLN_* / RBLN_* variable holds a value we do not accept."""


def _bad(name: str, raw: str, accepted: str) -> EnvError:
    return EnvError(f"Invalid {name} value `{raw}`, expected {accepted}")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FALLBACK_CATEGORIES = ("unsupported_op", "compile_error", "strided_copy_error", "non_blocking_copy")
CHECK_NAMES = ("dispatch_mode", "trace", "reentrant", "dtype", "scalar", "storage_offset", "nan_inf")
GROUP_SIZES = (1, 2, 4, 8, 16, 32)
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")


def _log_level(name: str, raw: str) -> str:
    v = raw.strip().upper()
    if v == "WARN":
        v = "WARNING"
    if v not in LOG_LEVELS:
        raise EnvError(f"Invalid {name} `{raw}`, expected one of: {', '.join(LOG_LEVELS)}")
    return v


def _flag_exact_on(name: str, raw: str) -> bool:
    # TORCH_RBLN_DEPLOY is on only for exactly "ON" (reference behaviour); "OFF"/"" are off.
    if raw == "ON":
        return True
    if raw in ("", "OFF"):
        return False
    raise _bad(name, raw, "`ON` or `OFF`")


def _matmul_precision(name: str, raw: str) -> str:
    v = raw.strip().lower()
    if v not in ("auto", "native", "widen"):
        raise _bad(name, raw, "`auto`, `native` or `widen`")
    return v


def _flag_one(name: str, raw: str) -> bool:
    if raw in ("1",):
        return True
    if raw in ("", "0"):
        return False
    raise _bad(name, raw, "`1` or `0`")


def _flag_truthy(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE or v == "":
        return False
    raise _bad(name, raw, f"one of {', '.join(_TRUE + _FALSE)}")


def _skip_abi(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "on", "true", "yes"):
        return True
    if v in ("", "0", "off", "false", "no"):
        return False
    raise _bad(name, raw, "1/ON/TRUE/YES to skip (case-insensitive), or 0/OFF/FALSE/NO")


def _fallback_categories(name: str, raw: str) -> frozenset:
    out = set()
    for tok in (t.strip() for t in raw.split(",")):
        if not tok:
            continue
        if tok == "all":
            out.update(FALLBACK_CATEGORIES)
        elif tok in FALLBACK_CATEGORIES:
            out.add(tok)
        else:
            raise EnvError(
                f"Invalid {name} option `{tok}`, expected one of: all,"
                + ",".join(sorted(FALLBACK_CATEGORIES)))
    return frozenset(out)


def _check_names(name: str, raw: str) -> frozenset:
    toks = {t.strip() for t in raw.split(",") if t.strip()}
    if "all" in toks:
        return frozenset(CHECK_NAMES)
    return frozenset(t for t in toks if t in CHECK_NAMES)  # unknown names ignored (documented)


_DTYPE_NAMES = {
    "float16": "float16", "half": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float32": "float32", "float": "float32", "fp32": "float32",
    "int32": "int32", "int": "int32", "int64": "int64", "long": "int64",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}


def _dtypes(name: str, raw: str) -> tuple:
    out = []
    for tok in (t.strip().lower().removeprefix("torch.") for t in raw.split(",")):
        if not tok:
            continue
        if tok not in _DTYPE_NAMES:
            raise _bad(name, tok, "comma-separated dtype names such as float32,int32")
        out.append(_DTYPE_NAMES[tok])
    return tuple(out)


def _positive_int(name: str, raw: str) -> int:
    try:
        v = int(raw.strip())
    except ValueError:
        raise _bad(name, raw, "a positive integer") from None
    if v < 1:
        raise _bad(name, raw, "a positive integer")
    return v


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


def _byte_size(name: str, raw: str) -> int:
    m = _SIZE_RE.match(raw)
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise _bad(name, raw, "a byte count such as 17179869184, 16GiB or 512MiB")
    v = int(float(m.group(1)) * _UNITS[unit])
    if v < 1 << 20:
        raise _bad(name, raw, "at least 1MiB")
    return v


def _id_list(name: str, raw: str) -> tuple:
    out = []
    for tok in raw.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if not tok.isdigit():
            raise _bad(name, raw, "a comma-separated list of physical NPU ids such as 0,1,2,3")
        out.append(int(tok))
    if len(set(out)) != len(out):
        raise EnvError(f"Invalid {name} value `{raw}`: NPU ids must not repeat")
    return tuple(out)


def _group_size(name: str, raw: str) -> int:
    try:
        v = int(raw.strip())
    except ValueError:
        v = -1
    if v not in GROUP_SIZES:
        raise _bad(name, raw, "one of " + ", ".join(map(str, GROUP_SIZES)))
    return v


def _device_map(name: str, raw: str) -> tuple:
    """Parse ``"[0,1],[2,3,4,5]"`` into ((0, 1), (2, 3, 4, 5))."""
    try:
        return _parse_device_map(name, raw)
    except EnvError as e:
        # the reference's detailed message, then the value and what is accepted
        raise EnvError(f"{e} (value `{raw}`; expected groups of NPU ids such as "
                       f"\"[0,1],[2,3,4,5]\", group sizes {', '.join(map(str, GROUP_SIZES))}, "
                       f"no id twice)") from None


def _parse_device_map(name: str, raw: str) -> tuple:
    s, i, groups = raw.strip(), 0, []
    if not s:
        raise EnvError(f"Invalid {name} format: empty value. Expected groups like \"[0,1],[2,3]\"")
    while i < len(s):
        if s[i] != "[":
            raise EnvError(f"Invalid {name} format. Expected '[' at position {i} in \"{raw}\"")
        j = s.find("]", i)
        if j < 0:
            raise EnvError(f"Invalid {name} format. Expected ']' after position {i} in \"{raw}\"")
        body = [t.strip() for t in s[i + 1:j].split(",")]
        if not body or not all(t.isdigit() for t in body):
            raise EnvError(f"Invalid {name} format. Expected comma-separated NPU ids inside "
                           f"[...] at position {i} in \"{raw}\"")
        g = tuple(int(t) for t in body)
        if len(g) not in GROUP_SIZES:
            raise EnvError(f"Invalid {name}: group [{','.join(map(str, g))}] has {len(g)} NPUs; "
                           f"each group size must be one of {', '.join(map(str, GROUP_SIZES))}")
        groups.append(g)
        i = j + 1
        while i < len(s) and s[i] in " \t":
            i += 1
        if i < len(s):
            if s[i] != ",":
                raise EnvError(f"Invalid {name} format. Expected ',' at position {i} in \"{raw}\"")
            i += 1
            while i < len(s) and s[i] in " \t":
                i += 1
            if i >= len(s):
                raise EnvError(f"Invalid {name} format. Expected '[' at position {i} in \"{raw}\"")
    seen = set()
    for g in groups:
        for n in g:
            if n in seen:
                raise EnvError(f"Invalid {name}: NPU {n} appears in more than one group")
            seen.add(n)
    return tuple(groups)


def _test_fault(name: str, raw: str) -> tuple | None:
    # [eager:|graph:]OP[@N][+AMOUNT]: where (both by default), aten::mul (every overload) or
    # aten::mul.Tensor (that one), @3 (its third eager device run from when it was set), +0.5
    # (added to each element; default 1)
    v = raw.strip()
    if not v:
        return None
    m = re.fullmatch(r"(?:(eager|graph):)?(aten::\w+(?:\.\w+)?)(?:@([1-9]\d*))?"
                     r"(?:\+([0-9.eE+-]+))?", v)
    try:
        amount = float(m.group(4)) if m and m.group(4) else 1.0
    except ValueError:
        m = None
    if m is None:
        raise _bad(name, raw, "[eager:|graph:]OP[@N][+AMOUNT], e.g. `aten::silu`, "
                              "`eager:aten::mul.Tensor@3+0.5`")
    return m.group(1) or "both", m.group(2), int(m.group(3)) if m.group(3) else None, amount


def _npu_name(name: str, raw: str) -> str:
    v = raw.strip()
    if not re.fullmatch(r"RBLN-C[AR]\d\d", v):
        raise _bad(name, raw, "an RBLN NPU name such as RBLN-CA25, RBLN-CA22, RBLN-CA12, RBLN-CA02 "
                              "or RBLN-CR13")
    return v


def _log_path(name: str, raw: str) -> str:
    folder = os.path.dirname(os.path.abspath(raw)) if raw else ""
    if not raw or os.path.isdir(raw) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        why = ("it is a directory" if raw and os.path.isdir(raw)
               else f"the directory {folder} does not exist or is not writable" if raw
               else "it is empty")
        raise EnvError(f"Invalid {name} value `{raw}` ({why}), expected a path to a file in a "
                       f"writable directory")
    return raw


@dataclass(frozen=True)
class Var:
    name: str
    default: Any
    parse: Callable[[str, str], Any]
    read_at: str          # a key of READ_TIMES
    values: str
    meaning: str


VARS: dict[str, Var] = {v.name: v for v in (
    Var("TORCH_RBLN_LOG_LEVEL", "WARNING", _log_level, "import", "DEBUG, INFO, WARNING, ERROR",
        "Log verbosity of the `torch_rbln` logger; CPU-fallback notices are INFO."),
    Var("TORCH_RBLN_LOG", None, _log_level, "import", "same as TORCH_RBLN_LOG_LEVEL",
        "Deprecated alias of TORCH_RBLN_LOG_LEVEL (which wins when both are set)."),
    Var("TORCH_RBLN_LOG_PATH", None, _log_path, "import", "a file path in a writable directory",
        "Also write the log to this file."),
    Var("TORCH_RBLN_DIAGNOSE", False, _flag_one, "import", "1",
        "`import torch` skips backend initialisation (diagnose mode)."),
    Var("TORCH_RBLN_SKIP_ABI_CHECK", False, _skip_abi, "import", "1/ON/TRUE/YES",
        "Skip the ABI handshake at import (escape hatch; hides the diagnosis, not the problem)."),
    Var("TORCH_RBLN_DISPATCH_DTYPES", (), _dtypes, "import", "dtype names, e.g. int32",
        "Extra dtypes admitted to the eager device dispatch catalog."),
    Var("TORCH_RBLN_DISPATCH_STRICT", (), _dtypes, "import", "dtype names",
        "Dtypes that skip the performance fallbacks (64-alignment rule)."),
    Var("TORCH_RBLN_EXPLAIN_AT_EXIT", False, _flag_one, "import", "1",
        "Print the torch.rbln.explain report of the whole run to stderr when the process exits "
        "(each torchrun worker its own, its rank in the header); as `python -m "
        "torch_rbln.explain` does for a script (ours)."),
    Var("TORCH_RBLN_DEPLOY", False, _flag_exact_on, "live", "ON",
        "Deploy mode: skip the host NaN/Inf scan before device dispatch."),
    Var("TORCH_RBLN_NATIVE_WARM_PATH", True, _flag_truthy, "import",
        "1/true/t/yes/y/on or 0/false/f/no/n/off",
        "Serve program-cache hits of eager device ops from the native core (default on); off "
        "runs every op through the Python kernel, for comparison (ours)."),
    Var("TORCH_RBLN_MATMUL_PRECISION", "auto", _matmul_precision, "import", "auto, native, widen",
        "How half-precision matmuls compute (NPU numerics either way: fp32 accumulation, one "
        "rounding): `native` fp16/bf16 GEMMs where the CPU has them (AVX512-FP16/AMX, "
        "AVX512-BF16), else `widen` to fp32; `auto` detects it, widening a dtype whose native "
        "GEMM measures slower than widening on this CPU (measured once per host, kept in "
        "`~/.cache/torch_rbln/`; see [eager](eager.md)) (ours)."),
    Var("TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK", frozenset(), _check_names, "live",
        "comma list of " + ", ".join(CHECK_NAMES) + ", or all",
        "Development only: skip the named pre-dispatch checks (warns once)."),
    Var("TORCH_RBLN_EAGER_MALLOC", False, _flag_one, "live", "1",
        "Allocate device memory when a tensor is created instead of at first device use."),
    Var("TORCH_RBLN_TEST_FAULT", None, _test_fault, "live",
        "`OP`, `eager:OP` or `graph:OP`; then `@N`, `+AMOUNT`",
        "Test only: a deliberate error in one op's device result, added to each element of "
        "the op's output in the programs compiled while it is set: eager device programs and "
        "graph partitions, or only those of `eager:` / `graph:`; `@N` only the Nth eager run. "
        "For the tests of torch.rbln.compare and the minifier; never set it otherwise (ours)."),
    Var("TORCH_RBLN_DISABLE_FALLBACK", frozenset(), _fallback_categories, "category",
        "comma list of " + ", ".join(FALLBACK_CATEGORIES) + ", or all",
        "Turn the listed silent fallbacks into errors (unsupported_op is fixed at load)."),
    Var("RBLN_DEVICES", None, _id_list, "commit", "comma list of physical NPU ids",
        "Physical NPUs visible to this process (like CUDA_VISIBLE_DEVICES); wins over "
        "RBLN_VISIBLE_DEVICES. Empty: none."),
    Var("RBLN_VISIBLE_DEVICES", None, _id_list, "commit", "comma list of physical NPU ids",
        "Alias of RBLN_DEVICES."),
    Var("RBLN_NPUS_PER_DEVICE", 1, _group_size, "commit", "1, 2, 4, 8, 16, 32",
        "Group this many consecutive NPUs into one logical device."),
    Var("RBLN_DEVICE_MAP", None, _device_map, "commit", "\"[0,1],[2,3,4,5]\"",
        "Explicit logical->physical grouping; overrides RBLN_NPUS_PER_DEVICE."),
    Var("RBLN_FORCE_NPU_NAME", "RBLN-CA25", _npu_name, "runtime", "RBLN-CA25, RBLN-CR13, ...",
        "NPU model the virtual host emulates (device name, memory per NPU)."),
    Var("RBLN_DUMMY_DEVICE", False, _flag_truthy, "runtime",
        "1/true/t/yes/y/on or 0/false/f/no/n/off",
        "Validated like the runtime does (any other value is an error). The virtual NPU already "
        "runs anywhere, so the host-backed dummy device is not emulated: a true value warns and "
        "devices still execute."),
    Var("TORCH_RBLN_VIRTUAL_NPUS", 1, _positive_int, "runtime", "a positive integer",
        "Number of physical NPUs on the virtual host (ours)."),
    Var("TORCH_RBLN_DEVICE_MEMORY", None, _byte_size, "runtime", "bytes, or 16GiB / 512MiB",
        "Device memory (arena capacity) per physical NPU; default from the NPU model "
        "(16 GiB; RBLN-CR13: 144 GiB) (ours)."),
    Var("TORCH_RBLN_C10D_ASYNC", False, _flag_truthy, "live",
        "1/true/t/yes/y/on or 0/false/f/no/n/off",
        "rbln-ccl collectives return before the transfer completed (`Work.wait()` waits); "
        "default: they complete before returning."),
    Var("RBLN_FORCE_LOOPBACK_CONTROL_PLANE", False, _flag_truthy, "group",
        "1/true/t/yes/y/on or 0/false/f/no/n/off",
        "rbln-ccl sets RBLN_LOCAL_IP and RBLN_ROOT_IP to 127.0.0.1 (otherwise only defaults "
        "them); the control plane itself is the c10d store."),
)}


def parse(name: str, raw: str | None = None) -> Any:
    """The parsed value of ``name`` now (``raw`` overrides the environment)."""
    var = VARS[name]
    if raw is None:
        raw = os.environ.get(name)
    if raw is None:
        return var.default
    return var.parse(name, raw)


# Live variables are read on every dispatch: an unset variable (the common case) costs one
# lookup in the environment's own mapping, a set one a dict hit on its cached parse.
_environ_data = getattr(os.environ, "_data", None)
_KEYS = {name: name.encode() for name in VARS}
_live_cache: dict[tuple[str, Any], Any] = {}


def live(name: str) -> Any:
    """The value of ``name`` now (a ``live`` variable, read on every call)."""
    if _environ_data is not None:
        raw = _environ_data.get(_KEYS[name])
        if raw is None:
            return VARS[name].default
    else:  # pragma: no cover - non-posix
        raw = os.environ.get(name)
    key = (name, raw)
    try:
        return _live_cache[key]
    except KeyError:
        pass
    val = parse(name, raw.decode() if isinstance(raw, bytes) else raw)
    _live_cache[key] = val
    return val


_latched: dict[str, Any] = {}
# Bad values of the variables read when the backend loads. The backend loads on every
# `import torch`, also in scripts that never use rbln, so a bad value must not break the import:
# the variable keeps its default and the first rbln use raises the error (see check_settings).
_load_errors: dict[str, EnvError] = {}


def latched(name: str) -> Any:
    """Value read at import/start time and kept for the process lifetime. A malformed value
    gives the default; its error is raised at the first rbln use."""
    try:
        return _latched[name]
    except KeyError:
        pass
    try:
        v = parse(name)
    except EnvError as e:
        defer(name, e)
        v = VARS[name].default
    _latched[name] = v
    return v


def defer(name: str, error: Exception) -> None:
    """Record ``error`` (a bad value of ``name`` met while the backend loads) for the first rbln
    use to raise."""
    _load_errors.setdefault(name, error if isinstance(error, EnvError) else EnvError(str(error)))


def check_settings() -> None:
    """Raise the error of a bad setting: one met while the backend loaded, else a live variable
    that holds a bad value now. Every device query that plans the devices calls it, so the first
    rbln use (a tensor on the device) fails with it, as it does for a bad device variable."""
    if _load_errors:
        names = ", ".join(_load_errors)
        raise EnvError("; ".join(str(e) for e in _load_errors.values()) +
                       f" ({names} {'is' if len(_load_errors) == 1 else 'are'} read when "
                       f"`import torch` loads the rbln backend: fix or unset, and start the "
                       f"process again)")
    for var in VARS.values():
        if var.read_at == "live":
            live(var.name)


def log_level() -> str:
    """TORCH_RBLN_LOG_LEVEL, or its deprecated alias TORCH_RBLN_LOG (warns once)."""
    if os.environ.get("TORCH_RBLN_LOG_LEVEL") is None and os.environ.get("TORCH_RBLN_LOG") is not None:
        warnings.warn("TORCH_RBLN_LOG is deprecated; use TORCH_RBLN_LOG_LEVEL", FutureWarning,
                      stacklevel=2)
        return latched("TORCH_RBLN_LOG") or VARS["TORCH_RBLN_LOG_LEVEL"].default
    return latched("TORCH_RBLN_LOG_LEVEL")


READ_TIMES = {
    "import": "once, when `import torch` loads the extension",
    "runtime": "once, at the first device query (the virtual NPU runtime starts)",
    "commit": "by every device query until the first real device use commits the mapping; "
              "frozen afterwards",
    "live": "on every dispatch, check or allocation",
    "group": "when an rbln-ccl process group is created",
    "category": "`unsupported_op` when the extension loads; the other categories on each check",
}

# Reference variables with no meaning on a virtual NPU host: name -> why.
INERT = {
    "TORCH_RBLN_USE_DEVICE_TP": "older releases only; eager ops always compile for one NPU",
    "TORCH_RBLN_USE_TP_FAILOVER": "older releases only; eager ops always compile for one NPU",
    "TORCH_RBLN_BUILD_TYPE": "read by the install command only (`Release`, the default, or "
                             "`Debug`: the native core without optimisation, with debug info)",
    "RBLN_ROOT_IP": "rbln-ccl's control plane is the c10d store (MASTER_ADDR/MASTER_PORT); "
                    "defaulted to 127.0.0.1 when a group is created, otherwise unused",
    "RBLN_LOCAL_IP": "rbln-ccl's control plane is the c10d store (MASTER_ADDR/MASTER_PORT); "
                     "defaulted to 127.0.0.1 when a group is created, otherwise unused",
    "RBLN_RDMA_IP": "rbln-ccl data plane: virtual NPUs exchange data through gloo, not RDMA",
    "RBLN_RDMA_HCA": "rbln-ccl data plane: virtual NPUs exchange data through gloo, not RDMA",
    "RBLN_DISABLE_AUTO_RDMA_IP": "rbln-ccl data plane: virtual NPUs exchange data through "
                                 "gloo, not RDMA",
    "RBLN_PROFILER": "the NPU profiler's Kineto bridge needs librbln.so",
    "RBLN_PROFILER_DIR": "the NPU profiler's Kineto bridge needs librbln.so",
    "RBLN_OFFLOAD_DIR": "file offload is a librbln.so feature",
    "REBEL_HOME": "no librbln.so is searched for; the runtime is part of this package",
}


def describe() -> list[tuple[str, str, str, str, str]]:
    """(name, default, values, read at, meaning) rows, for docs/env.md and diagnose."""
    return [(v.name, _show_default(v.default), v.values, v.read_at, v.meaning)
            for v in VARS.values()]


def _show_default(d: Any) -> str:
    if d is None or d == () or d == frozenset():
        return "unset"
    if d is False:
        return "off"
    return str(d)


def markdown() -> str:
    """docs/env.md: the variable table, the read times and the inert variables."""
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    out = ["# Environment variables", "",
           "Generated from `torch_rbln.config.describe()`; do not edit by hand. Regenerate with",
           "`python -c \"from torch_rbln import config; "
           "open('docs/env.md', 'w').write(config.markdown())\"`.", "",
           "A malformed value raises an error naming the variable and the accepted values, at "
           "the variable's read time (`device_count()` warns and returns 0 instead, and "
           "`is_available()` returns False, for the device variables). A variable read at "
           "import never breaks `import torch`: the backend loads with its default, and the "
           "first rbln use raises the error (as for a bad device variable). "
           "`python -m torch_rbln.diagnose` reports every bad value as a failed check.", "",
           "| Variable | Default | Values | Read | Meaning |", "|---|---|---|---|---|"]
    for name, default, values, read_at, meaning in describe():
        out.append(f"| `{name}` | {esc(default)} | {esc(values)} | {read_at} | {esc(meaning)} |")
    out += ["", "## Read times", "", "| Read | When |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in READ_TIMES.items()]
    out += ["", "## Reference variables with no effect here", "",
            "`python -m torch_rbln.diagnose` flags these when they are set.", "",
            "| Variable | Why |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in INERT.items()]
    return "\n".join(out) + "\n"
