"""Run the tutorial "Running and debugging RBLN PyTorch" on the virtual NPU, step by step.

Each step is its own script, run in a fresh process from this folder, exactly as the tutorial
runs it (`python3 add.py`, ...). Exit status is non-zero if any step fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

STEPS = [
    ("Check the installation", ["-m", "torch_rbln.diagnose"], {}),
    ("Step 1: first op on the NPU", ["add.py"], {}),
    ("Step 2: a module on the NPU", ["module.py"], {}),
    ("Step 3: what ran on the CPU (explain)", ["add_fp32.py"], {}),
    ("Step 3: the CPU-fallback log", ["sin_demo.py"], {"TORCH_RBLN_LOG_LEVEL": "INFO"}),
    ("Step 4: hidden overhead, one-time vs recurring", ["explain_demo.py"], {}),
]


def main() -> int:
    failed = 0
    for title, args, env in STEPS:
        if args[0].endswith(".py") and not (HERE / args[0]).exists():
            continue
        shown = " ".join(f"{k}={v}" for k, v in env.items())
        print(f"\n=== {title}\n$ {shown + ' ' if shown else ''}python3 {' '.join(args)}", flush=True)
        r = subprocess.run([sys.executable, *args], cwd=HERE, env={**os.environ, **env},
                           stderr=subprocess.STDOUT)
        if r.returncode != 0:
            failed += 1
            print(f"!!! {title} failed with exit status {r.returncode}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
