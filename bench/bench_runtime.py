"""Runtime costs, rbln and CPU side by side in one run.

    python bench/bench_runtime.py [--quick] [--no-build] [--pip]

* ``a + b`` on 64 fp16 elements (warm), us per op, with the NaN/Inf scan and without
  (``TORCH_RBLN_DEPLOY=ON``)
* one allocation (``torch.empty(64)`` fp16, current device and explicit index), us
* one host -> device -> host round trip of 1 MiB and 256 MiB (copy into an rbln tensor, h2d
  push at first device use, physical d2h when read back), against two CPU memcpys
* a 64 MiB ``non_blocking`` copy from pinned memory: time until the call returns and until the
  copy is done (``torch.rbln.synchronize()``), against one CPU memcpy of the same bytes
* import overhead of the backend on ``import torch`` (autoload on vs off), median of runs
* the native core's build: the first build of a fresh copy of the sources, and a rebuild with
  nothing changed (``setup.py build_ext --inplace``, what ``pip install`` runs; skip with
  ``--no-build``); ``--pip`` also times ``pip wheel`` of the copy (an isolated build
  environment: torch installed into it, then a full compile), as a fresh ``pip install`` does

rbln and CPU samples are taken in alternation and the medians printed, so a change of load on
a shared machine hits both sides alike. The header names the CPU and the kernel capability in
use (force the AVX2 paths with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``).
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from torch_rbln.runtime.storage import state_of

ROOT = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def interleaved_us(fns, n: int, rounds: int = 7) -> list[float]:
    """Median per-call time (us) of each function, the functions timed in alternation."""
    for fn in fns:
        for _ in range(min(n, 200)):
            fn()
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[k].append((time.perf_counter() - t0) / n * 1e6)
    return [statistics.median(s) for s in samples]


def row(name, rbln, cpu, unit="us"):
    ratio = rbln / cpu if cpu else float("nan")
    print(f"{name:<38} {rbln:>12.2f} {cpu:>12.2f}  {unit:<3} {ratio:>7.2f}x")


def timed(cmd, cwd, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def build_times(pip: bool) -> None:
    """Build the native core from a fresh copy of the sources, then again with nothing changed."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    with tempfile.TemporaryDirectory(prefix="rbln-build-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "*.so", "__pycache__", "*.egg-info", ".pytest_cache",
            ".hypothesis"))
        cmd = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
        first = timed(cmd, src, env)
        again = timed(cmd, src, env)
        so = next(src.glob("torch_rbln/_C*.so"))
        print(f"{'native core: first build (fresh copy)':<38} {first:>12.1f} {'':>12}  s   "
              f"({len(list(src.glob('torch_rbln/csrc/*.cpp')))} files, "
              f"{so.stat().st_size / 2**20:.1f} MiB .so, {os.cpu_count()} cores)")
        print(f"{'native core: rebuild, nothing changed':<38} {again:>12.1f} {'':>12}  s")
        if pip:
            wheel = timed([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(Path(tmp) / "wheel"), str(src)], tmp, env)
            print(f"{'pip wheel (isolated build env + build)':<38} {wheel:>12.1f} {'':>12}  s")


def async_h2d(reps: int) -> None:
    """A 64 MiB non_blocking copy from pinned memory: the time until the call returns and until
    the copy has finished (the stream's worker copies meanwhile), against one CPU memcpy of the
    same bytes. Samples alternate; medians in ms."""
    x = torch.randn(16 << 20).pin_memory()
    d = torch.empty(x.shape, device="rbln")
    c = torch.empty_like(x)
    ret, done, cpu = [], [], []
    for _ in range(reps + 1):
        torch.rbln.synchronize()
        t0 = time.perf_counter()
        d.copy_(x, non_blocking=True)
        t1 = time.perf_counter()
        torch.rbln.synchronize()
        t2 = time.perf_counter()
        c.copy_(x)
        t3 = time.perf_counter()
        ret.append((t1 - t0) * 1e3)
        done.append((t2 - t0) * 1e3)
        cpu.append((t3 - t2) * 1e3)
    ret, done, cpu = (statistics.median(v[1:]) for v in (ret, done, cpu))   # first: warm-up
    row("64 MiB pinned h2d non_blocking: return", ret, cpu, "ms")
    row("64 MiB pinned h2d non_blocking: done", done, cpu, "ms")


def main(quick: bool, build: bool, pip: bool) -> None:
    n = 2000 if quick else 20000
    env_isa = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                       if k in os.environ)
    print(f"torch {torch.__version__}, CPU: {cpu_name()}, capability "
          f"{torch.backends.cpu.get_cpu_capability()}{' (' + env_isa + ')' if env_isa else ''}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'measure':<38} {'rbln':>12} {'cpu':>12}  {'':<3} {'ratio':>7}")

    a = torch.arange(64, dtype=torch.float16, device="rbln")
    b = torch.ones(64, dtype=torch.float16, device="rbln")
    ac, bc = a.cpu(), b.cpu()
    row("a + b, 64 fp16 (warm)", *interleaved_us([lambda: a + b, lambda: ac + bc], n // 4))
    os.environ["TORCH_RBLN_DEPLOY"] = "ON"
    row("a + b, 64 fp16, TORCH_RBLN_DEPLOY=ON", *interleaved_us([lambda: a + b, lambda: ac + bc], n // 4))
    del os.environ["TORCH_RBLN_DEPLOY"]
    h = torch.float16
    row("allocation, empty(64) fp16",
        *interleaved_us([lambda: torch.empty(64, dtype=h, device="rbln"),
                         lambda: torch.empty(64, dtype=h)], n))
    row("allocation, empty(64) fp16 on rbln:0",
        *interleaved_us([lambda: torch.empty(64, dtype=h, device="rbln:0"),
                         lambda: torch.empty(64, dtype=h, device="cpu")], n))

    for mib in (1, 256):
        if quick and mib > 1:
            continue
        x = torch.randn(mib << 18)          # mib MiB of fp32
        dst = torch.empty_like(x)
        reps = 20 if mib == 1 else 3

        def round_trip():
            r = x.to("rbln")                 # host view written
            state = state_of(r)
            state.device_read()              # h2d push at first device use
            state.device_write(whole=True)   # a device program overwrote it
            dst.copy_(r)                     # physical d2h, then into the CPU tensor

        def cpu_twice():
            y = x.clone()
            dst.copy_(y)

        rb, cp = interleaved_us([round_trip, cpu_twice], reps, rounds=3)
        row(f"round trip h->d->h, {mib} MiB", rb / 1000, cp / 1000, "ms")

    async_h2d(5 if quick else 15)

    runs = 3 if quick else 7
    on, off = [], []
    for _ in range(runs):
        for env_val, acc in (("1", on), ("0", off)):
            env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=env_val)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
            acc.append(time.perf_counter() - t0)
    mon, moff = statistics.median(on), statistics.median(off)
    print(f"{'import torch (autoload on/off)':<38} {mon * 1e3:>12.1f} {moff * 1e3:>12.1f}  ms "
          f"  {(mon - moff) * 1e3:+.0f} ms (process wall, noisy)")
    # the backend's own share, timed inside the process: import + registration after torch
    code = ("import time, torch; t = time.perf_counter(); import torch_rbln; "
            "print(time.perf_counter() - t)")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    own = statistics.median(
        float(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout.split()[-1])
        for _ in range(runs))
    print(f"{'backend import + registration':<38} {own * 1e3:>12.1f} {'':>12}  ms   (budget 300 ms)")
    if build:
        build_times(pip)


if __name__ == "__main__":
    main("--quick" in sys.argv, "--no-build" not in sys.argv and "--quick" not in sys.argv,
         "--pip" in sys.argv)
