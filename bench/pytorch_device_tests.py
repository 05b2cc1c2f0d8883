"""PyTorch's own device-generic test files on rbln and on the CPU, side by side.

    python bench/pytorch_device_tests.py [--tests DIR] [FILE ...] [-k EXPR] [--timeout S]

PyTorch's test files (``test/test_torch.py``, ``test_dlpack.py``, ``test_linalg.py``,
``test_nn.py``, ``test_view_ops.py``, ``test_indexing.py``, ``test_shape_ops.py``,
``test_tensor_creation_ops.py``, ``test_modules.py``, ``test_unary_ufuncs.py``) are written
once for every device: ``common_device_type`` instantiates each test class per device type, and a PrivateUse1 backend gets its own classes
(``TestViewOpsPRIVATEUSE1``). They are not in the wheel; ``DIR`` is a folder holding them
(a ``pytorch`` checkout's ``test/``, or ``$TORCH_RBLN_PYTORCH_TESTS``; default
``../shared/third_party/pytorch-tests`` next to this repository).

Each file runs once, in a fresh process, with both the CPU and the rbln classes
(``PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu,privateuse1``); the tallies are printed side by side,
then every test that passes on the CPU and fails on rbln, grouped by cause. A failure is
*accepted* when ``EXCEPTED`` names it, each with its reason: the layouts the NPU does not have
(quantized, sparse), for which a clear error is the behaviour; the accelerator-only checks that
mixing rbln and CPU operands raises (rbln accepts mixed operands, as the vendor's backend does);
tests that encode a CUDA-only dtype limit or branch on the CPU and CUDA only (``storage_type()``,
``map_``); int4 weight packing, which PyTorch implements for CUDA and MPS only; and
``Module.to`` keeping each parameter's TensorImpl, which PyTorch allows only between its
"dense" device types. ``HEAVY`` tests (more memory than a shared development machine has) are
deselected for both devices. Files missing from ``DIR`` are skipped with a note. The exit
status is 1 when any other rbln-only failure remains.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = ROOT.parent / "shared" / "third_party" / "pytorch-tests"
FILES = ("test_view_ops.py", "test_indexing.py", "test_shape_ops.py",
         "test_tensor_creation_ops.py", "test_modules.py", "test_unary_ufuncs.py",
         "test_torch.py", "test_dlpack.py", "test_linalg.py", "test_nn.py")

# Tests neither device runs here: they need more memory than a shared development machine has
# (both devices would allocate it); deselected alike for the CPU and rbln.
HEAVY = {
    "test_indexing.py": ("test_index_put_accumulate_large_tensor",),   # 2^31-element tensors
    # 64-bit indexing of grid_sample: 8.8 GB (float32) and 17.6 GB (float64) images; rbln skips
    # them anyway (largeTensorTest knows no PrivateUse1 memory), the CPU runs them when as much
    # is free, taking it from everything else on the machine
    "test_nn.py": ("test_grid_sample_large_index_2d", "test_grid_sample_large_index_3d"),
}

# (test name regex, failure message regex, cause): accepted rbln-only failures, the documented
# behaviour, not defects.
_MIXED = ("mixed rbln/CPU operands: the test expects an accelerator to reject a CPU operand; "
          "rbln accepts mixed operands as the vendor's backend does")
_QUANT = "quantized layout: the NPU has no quantized tensors; rbln raises a clear error"
_SPARSE = "sparse layout: the NPU has no sparse tensors; rbln raises a clear error"
_SHALLOW = ("Module.to() without swap_tensors keeps each parameter's TensorImpl (.data) only "
            "between device types PyTorch lists as dense (_has_compatible_shallow_copy_type: "
            "CPU, CUDA, ...), never PrivateUse1; rbln keeps the Parameter objects by swapping")
_GROUPNORM_GRAD = ("GroupNorm's input gradient is contiguous for a channels-last input on "
                   "every device but the CPU: PyTorch's derivative formula for native_group_norm "
                   "makes it so (the values equal the CPU's; CUDA's ModuleInfo skips this test)")
_STORAGE_TYPE = ("the test branches on CPU/CUDA only: Tensor.storage_type() is a legacy typed-"
                 "storage class, which PyTorch has for the CPU and CUDA only (torch.FloatStorage, "
                 "torch.cuda.FloatStorage); the test expects the CPU's class on every device that "
                 "is not CUDA, rbln's is None")
_MAP = ("the test branches on CPU/CUDA only: Tensor.map_/map2_ are implemented for CPU tensors "
        "only (a Python callable per element); the test skips them for CUDA tensors alone")
_FAST_PATH = ("the test branches on CPU/CUDA only: PyTorch's TransformerEncoderLayer takes its "
              "inference fast path on CPU, CUDA and PrivateUse1 (fully masked rows give NaN, as "
              "on the CPU), but the test expects the fast path's NaNs only when the result "
              "is_cpu or is_cuda")
_UINT8_RESIZE = ("CUDA-only dtype limit: the test expects every device but the CPU to reject "
                 "uint8 bilinear/bicubic interpolation (CUDA has no uint8 kernel); rbln computes "
                 "it, equal to the CPU")
_BF16_BLAS = ("CUDA-only dtype limit: the test expects every device but the CPU to reject "
              "bfloat16 addbmm unless CUDA's compute capability is 5.3 or later (cuBLAS); rbln "
              "computes it")
_LSTSQ = (_MIXED + "; the test then expects CUDA's message for an unknown lstsq driver on "
          "every device but the CPU (a CPU/CUDA-only branch)")
_INT4 = ("int4 weight packing: _convert_weight_to_int4pack and _weight_int4pack_mm are "
         "implemented for CUDA and MPS only (the CPU has its own _for_cpu ops); rbln, which runs "
         "an op without a device kernel on the CPU's, raises an error naming the op")
EXCEPTED = (
    (r"^test_nonzero(_[a-z0-9]+)?$", r"RuntimeError not raised", _MIXED),
    (r"^test_tensor_storage_type_", r"None mismatch: None is not <class 'torch\.\w+Storage'>",
     _STORAGE_TYPE),
    (r"^test_v?dot_invalid_args$", r"RuntimeError not raised", _MIXED),
    (r"^test_linalg_lstsq_input_checks_", r"RuntimeError not raised", _LSTSQ),
    (r"^test_broadcast_fn_map2?$", r"map2?_ is only implemented on CPU tensors", _MAP),
    (r"^test_addbmm_bfloat16$", r"RuntimeError not raised", _BF16_BLAS),
    (r"int4", r"aten::_(convert_weight_to_int4pack|weight_int4pack_mm)\b", _INT4),
    (r"^test_transformerencoderlayer_(float|double|half|bfloat)", r"False is not true",
     _FAST_PATH),
    (r"^test_upsamplingBiMode2d_nonsupported_dtypes_.*_mode_bi(linear|cubic)_(uint8_)?uint8$",
     r"RuntimeError not raised", _UINT8_RESIZE),
    (r"^test_memory_format_nn_GroupNorm_", r"False is not true", _GROUPNORM_GRAD),
    (r"^test_to_.*swap_False", r"False is not true", _SHALLOW),
    (r"", r"quantized tensors are not supported on rbln", _QUANT),
    (r"", r"sparse.* tensors are not supported on rbln", _SPARSE),
)


def _key(classname: str, name: str) -> tuple[str, str, str]:
    """(file, class without device suffix, test name without device) and the device."""
    mod, _, cls = classname.rpartition(".")
    # the rbln classes are named ...PRIVATEUSE1 or ...RBLN depending on how a file instantiates
    for dev, suffix in (("rbln", "PRIVATEUSE1"), ("rbln", "RBLN"), ("cpu", "CPU")):
        if cls.endswith(suffix):
            token = "_" + ("rbln" if dev == "rbln" else "cpu")
            i = name.rfind(token)
            base = name[:i] + name[i + len(token):] if i >= 0 else name
            return (mod, cls[: -len(suffix)], base), dev
    return (mod, cls, name), "other"


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag in ("failure", "error"):
        el = case.find(tag)
        if el is not None:
            msg = (el.get("message") or el.text or "").strip()
            return "failed", msg
    el = case.find("skipped")
    if el is not None:
        kind = "xfailed" if "xfail" in (el.get("type") or "") else "skipped"
        return kind, (el.get("message") or "").strip()
    return "passed", ""


def run(tests: Path, files, kexpr: str | None = None, timeout: int = 600) -> tuple[dict, str]:
    """Run test files in one process, CPU and rbln classes both:
    ``{(module, class, test): {"cpu" | "rbln": (outcome, message)}}`` and, when the process did
    not end normally, the tail of its output."""
    files = [files] if isinstance(files, str) else list(files)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
               f"--junitxml={xml}", "-o", "junit_family=xunit1", f"--timeout={timeout}",
               "--rootdir", str(tests)]
        # heavy tests are deselected by name, for both devices
        k = ([f"({kexpr})"] if kexpr else []) + [
            f"not {h}" for f in files for h in HEAVY.get(f, ())]
        if k:
            cmd += ["-k", " and ".join(k)]
        env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR="cpu,privateuse1",
                   PYTORCH_PRINT_REPRO_ON_FAILURE="0")
        proc = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True)
        results: dict = defaultdict(dict)
        if not xml.exists():
            return results, proc.stdout[-3000:] + proc.stderr[-3000:]
        for case in ET.parse(xml).iter("testcase"):
            key, dev = _key(case.get("classname", ""), case.get("name", ""))
            results[key][dev] = _outcome(case)
        tail = "" if proc.returncode in (0, 1, 5) else proc.stdout[-2000:] + proc.stderr[-2000:]
        return results, tail


def compare(results: dict) -> tuple[dict, list, list]:
    """Tallies per device, the rbln-only failures and the excepted ones
    (each ``(key, first line of the failure, cause)``)."""
    tally = {d: Counter() for d in ("cpu", "rbln")}
    only, excepted = [], []
    for key, by_dev in sorted(results.items()):
        for d in ("cpu", "rbln"):
            if d in by_dev:
                tally[d][by_dev[d][0]] += 1
        cpu, rbln = by_dev.get("cpu"), by_dev.get("rbln")
        if cpu and rbln and cpu[0] == "passed" and rbln[0] == "failed":
            cause = _excepted(key, rbln[1])
            (excepted if cause else only).append((key, _first_line(rbln[1]), cause))
    return tally, only, excepted


def _first_line(msg: str) -> str:
    for line in msg.splitlines():
        line = line.strip()
        if line and not line.startswith(("To execute this test", "python ")):
            return line[:200]
    return ""


def _excepted(key, msg: str) -> str | None:
    for name_re, msg_re, cause in EXCEPTED:
        if re.search(name_re, key[2]) and re.search(msg_re, msg):
            return cause
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", default=list(FILES))
    p.add_argument("--tests", type=Path,
                   default=Path(os.environ.get("TORCH_RBLN_PYTORCH_TESTS", DEFAULT_TESTS)))
    p.add_argument("-k", dest="kexpr", default=None, help="pytest -k expression")
    p.add_argument("--timeout", type=int, default=600, help="per test, seconds")
    args = p.parse_args(argv)
    if not args.tests.is_dir():
        print(f"no PyTorch test folder at {args.tests}: pass --tests DIR (a pytorch "
              f"checkout's test/) or set TORCH_RBLN_PYTORCH_TESTS", file=sys.stderr)
        return 2

    bad = 0
    print(f"PyTorch device-generic tests, CPU vs rbln ({args.tests})")
    print(f"{'file':<30} {'CPU pass':>9} {'fail':>5} {'skip':>5}   {'rbln pass':>9} "
          f"{'fail':>5} {'skip':>5}   {'compared':>8} {'rbln-only fail':>14} {'accepted':>8}")
    details = []
    for fname in args.files:
        if not (args.tests / fname).is_file():
            print(f"{fname:<30} not in {args.tests}: skipped")
            continue
        results, tail = run(args.tests, fname, args.kexpr, args.timeout)
        tally, only, excepted = compare(results)
        bad += len(only)
        c, r = tally["cpu"], tally["rbln"]
        # tests that pass on the CPU and ran on rbln: the ones the comparison is about
        compared = sum(1 for v in results.values()
                       if v.get("cpu", ("",))[0] == "passed" and v.get("rbln", ("",))[0]
                       in ("passed", "failed"))
        print(f"{fname:<30} {c['passed']:>9} {c['failed']:>5} {c['skipped']:>5}   "
              f"{r['passed']:>9} {r['failed']:>5} {r['skipped']:>5}   {compared:>8} "
              f"{len(only):>14} {len(excepted):>8}")
        details.append((fname, only, excepted, tail))

    for fname, only, excepted, tail in details:
        if tail:
            print(f"\n{fname}: the test process did not finish normally:\n{tail}")
        if only:
            print(f"\n{fname}: passes on the CPU, fails on rbln ({len(only)}), by cause:")
            by_cause = defaultdict(list)
            for key, msg, _ in only:
                by_cause[msg].append(f"{key[1]}.{key[2]}")
            for msg, names in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
                print(f"  {len(names):4d}  {msg}")
                for n in names:
                    print(f"          {n}")
        if excepted:
            print(f"\n{fname}: accepted rbln-only failures ({len(excepted)}):")
            counts = Counter(cause for _, _, cause in excepted)
            for cause, n in counts.most_common():
                names = sorted({k[2] for k, _, c in excepted if c == cause})
                print(f"  {n:4d}  {cause}\n          tests: {', '.join(names)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
