"""Compute time of the two init experiments at the chapter's settings.

    python benchmarks/experiments_speed.py [--widths 4 32 64 128 256 512 1024] [--repeats 5]

Targets: spread at 20,000 pairs × 7 widths under 1 s; fresh head at 7 widths ×
2 schemes × 200 sequences under 2 s. Medians of 5 runs; the ratio to the target
is printed (< 1 meets it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnscale.experiments import fresh, spread


def median_time(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=list(spread.SpreadConfig().head_dims),
                    help="the targets hold for the chapter's 7 widths only")
    ap.add_argument("--pairs", type=int, default=spread.SpreadConfig().pairs)
    ap.add_argument("--sequences", type=int, default=fresh.FreshConfig().sequences)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    widths, n = tuple(args.widths), len(args.widths)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    cases = [
        (f"spread {args.pairs:,} pairs x {n} widths", 1.0,
         lambda: spread.run(spread.SpreadConfig(head_dims=widths, pairs=args.pairs))),
        *((f"fresh {init} init, {n} widths x 2 schemes x {args.sequences} seq", 2.0,
           lambda init=init: fresh.run(fresh.FreshConfig(head_dims=widths, sequences=args.sequences, init=init)))
          for init in ("unit", "model")),
    ]
    for name, target, fn in cases:
        t = median_time(fn, args.repeats)
        print(f"{name:<50} {t:7.3f} s   target {target:.0f} s   time/target {t / target:.2f}")


if __name__ == "__main__":
    main()
