"""Instructions per warm eager op, rbln against the CPU: a count a busy machine does not move.

    python bench/bench_instructions.py [--op add|mul|linear] [--calls 10000] [--grad-mode]

Wall-clock rows (``bench_speed.py``'s warm row) move by 10-40 % on a shared host; the number of
instructions an op executes does not. Each side runs in its own process under valgrind's
callgrind twice, with 2,000 and with 2,000 + ``--calls`` calls of the op on warm operands (64 fp16
elements; ``linear``: 4 x 64 by 64 x 64), and the difference of the two totals over ``--calls``
is the cost of one call, the import and the warm-up cancelled out. Only the main thread is
counted: the process's other threads wake on timers, so their share follows the wall time,
which a loaded machine moves (the process totals moved by up to 3,700 per call between runs,
the main thread's by 150-250). The rbln kernel's own inclusive count is printed too (it moved
by 30-50): a change smaller than the totals' spread shows there.
The calls run under ``torch.inference_mode()`` (as ``bench_speed.py``'s warm row), or with
``--grad-mode`` as most code calls ops: in grad mode, on operands that need no gradient. Needs
``valgrind`` on PATH; takes a few minutes (the program runs some fifty times slower under it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

_SCRIPT = r"""
import contextlib, gc, sys, torch
torch.set_num_threads(1)
op, device, n, grad = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "grad"
g = torch.Generator().manual_seed(0)
a = torch.randn(4, 64, generator=g).half().to(device)
w = torch.randn(64, 64, generator=g).half().to(device)
f = {"add": lambda: a + a, "mul": lambda: a * a,
     "linear": lambda: torch.nn.functional.linear(a, w)}[op]
with contextlib.nullcontext() if grad else torch.inference_mode():
    for _ in range(200):
        f()
    # no cyclic collection in the window: a full one scans every object torch made at import,
    # and whether one falls between the two runs' ends moved the count by hundreds per call
    gc.collect()
    gc.disable()
    for _ in range(n):
        f()
"""

_BASE = 2000


# the rbln kernel's own share (the warm path's entry, everything it calls included)
KERNEL = "WarmKernel::operator()"


def _instructions(op: str, device: str, calls: int, mode: str, work: str) -> tuple[int, int]:
    """(the main thread's total, the rbln kernel's inclusive count) of one run."""
    base = os.path.join(work, f"cg.{op}.{device}.{calls}")
    # one profile per thread: the main thread's is the ops' (threads that wake on a timer count
    # instructions by the wall time they ran, which a loaded machine moves)
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                    f"--callgrind-out-file={base}",
                    sys.executable, "-c", _SCRIPT, op, device, str(calls), mode],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = base + "-01"
    total = None
    with open(out) as f:
        for line in f:
            m = re.match(r"(summary|totals):\s+(\d+)", line)
            if m:
                total = int(m.group(2))
                break
    if total is None:
        raise RuntimeError(f"no instruction total in {out}")
    kernel = 0
    if shutil.which("callgrind_annotate"):
        ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                             capture_output=True, text=True).stdout
        for line in ann.splitlines():
            if KERNEL in line:
                kernel = int(line.split()[0].replace(",", ""))
                break
    return total, kernel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="add", choices=("add", "mul", "linear"))
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--grad-mode", action="store_true",
                   help="call the op in grad mode instead of under inference_mode")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH")
    mode = "grad" if args.grad_mode else "inference"
    per_call, kernel = {}, 0.0
    with tempfile.TemporaryDirectory() as work:
        for device in ("cpu", "rbln"):
            lo = _instructions(args.op, device, _BASE, mode, work)
            hi = _instructions(args.op, device, _BASE + args.calls, mode, work)
            per_call[device] = (hi[0] - lo[0]) / args.calls
            if device == "rbln":
                kernel = (hi[1] - lo[1]) / args.calls
    cpu, rbln = per_call["cpu"], per_call["rbln"]
    print(f"warm {args.op}, fp16, {args.calls} calls ({mode} mode), instructions per call: "
          f"CPU eager {cpu:,.0f}, rbln {rbln:,.0f} ({rbln / cpu:.2f}x); of rbln's, its kernel "
          f"({KERNEL}, all it calls included) {kernel:,.0f}")


if __name__ == "__main__":
    main()
