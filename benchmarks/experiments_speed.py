"""Compute time of the two init experiments at the chapter's settings.

    python benchmarks/experiments_speed.py

Targets: spread at 20,000 pairs × 7 widths under 1 s; fresh head at 7 widths ×
2 schemes × 200 sequences under 2 s. Medians of 5 runs; the ratio to the target
is printed (< 1 meets it).
"""

from __future__ import annotations

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
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    cases = [
        ("spread 20,000 pairs x 7 widths", 1.0, lambda: spread.run(spread.SpreadConfig())),
        ("fresh unit init, 7 widths x 2 schemes x 200 seq", 2.0, lambda: fresh.run(fresh.FreshConfig(init="unit"))),
        ("fresh model init, 7 widths x 2 schemes x 200 seq", 2.0, lambda: fresh.run(fresh.FreshConfig(init="model"))),
    ]
    for name, target, fn in cases:
        t = median_time(fn)
        print(f"{name:<50} {t:7.3f} s   target {target:.0f} s   time/target {t / target:.2f}")


if __name__ == "__main__":
    main()
