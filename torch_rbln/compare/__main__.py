"""``python -m torch_rbln.compare A B [--atol X] [--rtol Y] [--json PATH]``: compare record B
with reference record A (both written by ``torch.rbln.compare.record``) and print the report.
Exit status 0 when B is within tolerance of A, 1 when it diverged, 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_rbln.compare",
        description="Compare two records of torch.rbln.compare.record: B against reference A.")
    parser.add_argument("a", help="the reference record (e.g. a CPU float32 run)")
    parser.add_argument("b", help="the record to judge (e.g. an rbln float16 run)")
    parser.add_argument("--atol", type=float, help="absolute tolerance for every dtype")
    parser.add_argument("--rtol", type=float, help="relative tolerance for every dtype")
    parser.add_argument("--json", metavar="PATH", help="also write the dump as JSON to PATH")
    args = parser.parse_args(argv)
    from .offline import compare_records
    from .report import render
    try:
        d = compare_records(args.a, args.b, atol=args.atol, rtol=args.rtol)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(d, footer="  (raw: --json PATH)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d, f, indent=1)
    return 1 if d["first_divergence"] else 0


if __name__ == "__main__":
    sys.exit(main())
