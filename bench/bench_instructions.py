"""Instructions per warm eager op, rbln against the CPU: a count a busy machine does not move.

    python bench/bench_instructions.py [--op add|mul|linear] [--calls 10000] [--grad-mode]

Wall-clock rows (``bench_speed.py``'s warm row) move by 10-40 % on a shared host; the number of
instructions an op executes does not. Each side runs in its own process under valgrind's
callgrind twice, with 2,000 and with 2,000 + ``--calls`` calls of the op on warm operands (64 fp16
elements; ``linear``: 4 x 64 by 64 x 64), and the difference of the two totals over ``--calls``
is the cost of one call, the import and the warm-up cancelled out. The calls run under
``torch.inference_mode()`` (as ``bench_speed.py``'s warm row), or with ``--grad-mode`` as most
code calls ops: in grad mode, on operands that need no gradient. Needs ``valgrind`` on PATH;
takes a few minutes (the program runs some fifty times slower under it).
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
import sys, torch
torch.set_num_threads(1)
import contextlib
op, device, n, grad = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "grad"
g = torch.Generator().manual_seed(0)
a = torch.randn(4, 64, generator=g).half().to(device)
w = torch.randn(64, 64, generator=g).half().to(device)
f = {"add": lambda: a + a, "mul": lambda: a * a,
     "linear": lambda: torch.nn.functional.linear(a, w)}[op]
with contextlib.nullcontext() if grad else torch.inference_mode():
    for _ in range(200):
        f()
    for _ in range(n):
        f()
"""

_BASE = 2000


def _instructions(op: str, device: str, calls: int, mode: str, work: str) -> int:
    out = os.path.join(work, f"cg.{op}.{device}.{calls}")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, "-c", _SCRIPT, op, device, str(calls), mode],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        for line in f:
            m = re.match(r"(summary|totals):\s+(\d+)", line)
            if m:
                return int(m.group(2))
    raise RuntimeError(f"no instruction total in {out}")


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
    per_call = {}
    with tempfile.TemporaryDirectory() as work:
        for device in ("cpu", "rbln"):
            lo = _instructions(args.op, device, _BASE, mode, work)
            hi = _instructions(args.op, device, _BASE + args.calls, mode, work)
            per_call[device] = (hi - lo) / args.calls
    cpu, rbln = per_call["cpu"], per_call["rbln"]
    print(f"warm {args.op}, fp16, {args.calls} calls ({mode} mode), instructions per call: "
          f"CPU eager {cpu:,.0f}, rbln {rbln:,.0f} ({rbln / cpu:.2f}x)")


if __name__ == "__main__":
    main()
