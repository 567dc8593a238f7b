"""Estimates over seeds and rows: means, standard errors, and how a mean and its SE are written.

Pure functions of plain numbers, read by the report's claims, the sweep's and
the studies' tables alike, so every table prints one estimate one way.

Standard errors:
- a mean over n values: sample std / sqrt(n), only for n ≥ 2 (one value has no
  noise estimate, and we never pretend it does);
- the spread of q·k with unit entries: by the delta method the sample std of n
  values has relative SE ½·sqrt((2 + 6/d)/n) (Var(q·k) = d, kurtosis 3 + 6/d);
- a share of n rows: the binomial sqrt(p(1 − p)/n).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence

from attnscale.analysis.intervals import decimals_for

__all__ = ["mean", "mean_se", "plus_minus", "spread_se", "binomial_se", "within"]


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean; a ValueError for no values (a caller must say what is missing)."""
    vals = list(values)
    if not vals:
        raise ValueError("mean of no values")
    return math.fsum(vals) / len(vals)


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean); (None, None) for no values, SE None for one."""
    if not values:
        return None, None
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None
    return m, se


def spread_se(head_dim: int, pairs: int) -> float:
    """SE of the sample spread of q·k over ``pairs`` pairs of width ``head_dim`` with unit entries."""
    return 0.5 * math.sqrt((2 + 6 / head_dim) / pairs) * math.sqrt(head_dim)


def binomial_se(share: float, n: int) -> float:
    """SE of a share of ``n`` independent rows; kept above 0 so a 0% or 100% share still has a width."""
    return math.sqrt(max(share * (1 - share), 1e-12) / n)


def plus_minus(mean: float | None, se: float | None, fmt: str = "{:.3f}", terminal: bool = False) -> str:
    """``mean ± se`` in ``fmt`` ("—" for no mean, the mean alone for no SE); ``terminal``: the
    command-line tables' narrower form, "-" and "x ±y". An SE that ``fmt`` would round to zero is
    printed to two significant digits instead (never "± 0.00"), and an SE of exactly 0 says so."""
    if mean is None:
        return "-" if terminal else "—"
    if se is None:
        return fmt.format(mean)
    if se == 0:  # seeds that agree exactly: an SE of 0 is no width to print
        return fmt.format(mean) + (" (identical)" if terminal else " (seeds identical)")
    if not re.search(r"[1-9]", fmt.format(se)):  # "± 0.00": show the SE to its own precision, the mean to match
        spec = re.search(r"\{:([^}]*?)(?:\.\d+)?([f%])\}", fmt)
        if spec:
            shown = se * 100 if spec.group(2) == "%" else se
            fmt = fmt.replace(spec.group(0), "{:" + spec.group(1) + f".{decimals_for(shown)}{spec.group(2)}}}")
    return fmt.format(mean) + (" ±" if terminal else " ± ") + fmt.replace("{:+", "{:").format(se)  # an SE has no sign


def within(value: float, target: float, relative: float) -> bool:
    """|value − target| ≤ relative · |target|."""
    return abs(value - target) <= relative * abs(target)
