"""Runtime costs, rbln and CPU side by side in one run.

    python bench/bench_runtime.py [--quick]

* ``a + b`` on 64 fp16 elements (warm), us per op
* one allocation (``torch.empty`` of 64 fp16), us
* one host -> device -> host round trip of 1 MiB and 256 MiB (copy into an rbln tensor, h2d
  push at first device use, physical d2h when read back), against two CPU memcpys
* import overhead of the backend on ``import torch`` (autoload on vs off), median of runs
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

from torch_rbln.runtime.storage import state_of


def per_call_us(fn, n: int, repeat: int = 5) -> float:
    for _ in range(min(n, 200)):
        fn()
    best = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(best)


def row(name, rbln, cpu, unit="us"):
    ratio = rbln / cpu if cpu else float("nan")
    print(f"{name:<34} {rbln:>12.2f} {cpu:>12.2f}  {unit:<3} {ratio:>7.2f}x")


def main(quick: bool) -> None:
    n = 2000 if quick else 20000
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'measure':<34} {'rbln':>12} {'cpu':>12}  {'':<3} {'ratio':>7}")

    a = torch.arange(64, dtype=torch.float16, device="rbln")
    b = torch.ones(64, dtype=torch.float16, device="rbln")
    ac, bc = a.cpu(), b.cpu()
    row("a + b, 64 fp16 (warm)", per_call_us(lambda: a + b, n), per_call_us(lambda: ac + bc, n))
    os.environ["TORCH_RBLN_DEPLOY"] = "ON"
    row("a + b, 64 fp16, TORCH_RBLN_DEPLOY=ON", per_call_us(lambda: a + b, n),
        per_call_us(lambda: ac + bc, n))
    del os.environ["TORCH_RBLN_DEPLOY"]
    row("allocation, empty(64) fp16",
        per_call_us(lambda: torch.empty(64, dtype=torch.float16, device="rbln"), n),
        per_call_us(lambda: torch.empty(64, dtype=torch.float16), n))

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

        row(f"round trip h->d->h, {mib} MiB", per_call_us(round_trip, reps, 3) / 1000,
            per_call_us(cpu_twice, reps, 3) / 1000, "ms")

    runs = 3 if quick else 7
    on, off = [], []
    for _ in range(runs):
        for env_val, acc in (("1", on), ("0", off)):
            env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=env_val)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
            acc.append(time.perf_counter() - t0)
    mon, moff = statistics.median(on), statistics.median(off)
    print(f"{'import torch (autoload on/off)':<34} {mon * 1e3:>12.1f} {moff * 1e3:>12.1f}  ms "
          f"  {(mon - moff) * 1e3:+.0f} ms (process wall, noisy)")
    # the backend's own share, timed inside the process: import + registration after torch
    code = ("import time, torch; t = time.perf_counter(); import torch_rbln; "
            "print(time.perf_counter() - t)")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    own = statistics.median(
        float(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout.split()[-1])
        for _ in range(runs))
    print(f"{'backend import + registration':<34} {own * 1e3:>12.1f} {'':>12}  ms   (budget 300 ms)")


if __name__ == "__main__":
    main("--quick" in sys.argv)
