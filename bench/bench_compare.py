"""What torch.rbln.compare costs around a small Hugging Face Llama forward.

Five variants of the same warmed-up forward, interleaved so that machine noise hits them alike
(but the first): the no-region forward measured before any region was ever opened, no region,
a compare() region, a record() region (statistics only, a new directory each time), and one
compare(keep_golden=True) object entered for each forward (its golden copy of the model made
once). Prints the median wall and process CPU time of each, and checks the targets:

* outside a region compare costs nothing: no region now vs before any region (+-noise);
* inside, at most the golden work plus 50%: (compare - no region) <= 1.5 x the golden work
  (the region's own measure of its golden runs, ``dump()["golden_ns"]``);
* record with statistics only: at most +30% over no region.

    python bench/bench_compare.py [--reps 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_explain import build_model, interleave   # the same Llama, sized by the arguments


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: keep)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, ids = build_model(args.hidden, args.layers, args.seq)
    tmp = Path(tempfile.mkdtemp(prefix="bench-compare-"))

    def forward():
        with torch.inference_mode():
            return model(ids).logits

    for _ in range(args.warmup):
        forward()
    before_wall, before_cpu = [], []
    for _ in range(args.reps):
        c0, t0 = time.process_time(), time.perf_counter()
        forward()
        before_wall.append(time.perf_counter() - t0)
        before_cpu.append(time.process_time() - c0)

    golden: list[float] = []
    runs = iter(range(10**9))

    def plain():
        forward()

    def compared():
        with torch.rbln.compare() as c:
            forward()
        golden.append(c.dump()["golden_ns"] / 1e9)

    def recorded():
        with torch.rbln.compare.record(tmp / f"run{next(runs)}"):
            forward()

    kept = torch.rbln.compare(keep_golden=True)
    golden_kept: list[float] = []

    def compared_kept():
        with kept:
            forward()
        golden_kept.append(kept.dump()["golden_ns"] / 1e9)

    compared()          # warm-up (each region builds its own golden copy of the model)
    compared_kept()     # (this one only once: later with-blocks refresh it where it changed)
    variants = {"no region": plain, "compare()": compared, "record() (statistics)": recorded,
                "compare(keep_golden=True)": compared_kept}
    golden.clear()
    golden_kept.clear()
    wall, cpu = interleave(variants, args.reps)
    shutil.rmtree(tmp, ignore_errors=True)

    wall["no region, before any region"] = before_wall
    cpu["no region, before any region"] = before_cpu
    med = statistics.median
    print(f"{'variant':<32}{'wall median':>22}{'cpu median':>22}")
    for name in ("no region, before any region", *variants):
        cells = []
        for series in (wall, cpu):
            v, base = med(series[name]), med(series["no region"])
            cells.append(f"{v * 1e3:>12.2f}ms {(v / base - 1) * 100:>+6.1f}%")
        print(f"{name:<32}" + "".join(cells))
    g = med(golden)
    extra = med(wall["compare()"]) - med(wall["no region"])
    print(f"compare(): golden work {g * 1e3:.2f}ms (median), region cost beyond the plain "
          f"forward {extra * 1e3:.2f}ms = {extra / g:.2f}x the golden work (target <= 1.50x)")
    extra = med(wall["compare(keep_golden=True)"]) - med(wall["no region"])
    print(f"compare(keep_golden=True), one object entered for each forward: golden work "
          f"{med(golden_kept) * 1e3:.2f}ms, beyond the plain forward {extra * 1e3:.2f}ms = "
          f"{extra / med(golden_kept):.2f}x the golden work")
    rec = med(wall["record() (statistics)"]) / med(wall["no region"]) - 1
    print(f"record(): {rec * 100:+.1f}% over no region (target <= +30%)")
    print(f"(medians of {args.reps} interleaved forwards each; Llama hidden {args.hidden}, "
          f"{args.layers} layers, seq {args.seq}, fp16, {torch.get_num_threads()} torch "
          "thread(s))")


if __name__ == "__main__":
    main()
