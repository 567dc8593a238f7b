"""Intervals that stay honest with few seeds: Student's t, paired differences, Holm's correction.

With n seeds a standard error has n − 1 degrees of freedom, and the normal
quantiles that "2 SE" and "3 SE" stand for hold only for large n: with 2 seeds
a 3-SE band covers about 80% of the time, not 99.7%, and "beyond 2 SE" happens
by chance about 30% of the time. So every interval here takes the t quantile
for the degrees of freedom at hand (Student 1908).

The t distribution is computed here rather than taken from scipy, which
attnscale does not otherwise need: its CDF is the regularized incomplete beta
function, I_x(df/2, 1/2) with x = df / (df + t²), evaluated by its continued
fraction (modified Lentz; Press et al., Numerical Recipes, 3rd ed., 6.4), and
the quantile is found by bisection on that CDF to 1e-12. The tests hold both to
the printed tables (Fisher and Yates) and to the closed forms at 1 and 2
degrees of freedom.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["LEVEL", "t_cdf", "t_quantile", "interval", "paired", "holm", "paired_holm", "reading", "p_text",
           "decimals_for", "with_error"]

LEVEL = 0.95  # two-sided coverage of every interval the report prints


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (converges fast for x < (a + 1)/(a + b + 2))."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta did not converge at a={a}, b={b}, x={x}")


def _regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b  # the symmetry I_x(a, b) = 1 − I_{1−x}(b, a)


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * _regularized_beta(df / 2, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T ≤ t) = ``p`` for ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def interval(mean: float, se: float | None, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """The two-sided ``level`` interval of a mean of ``n`` values with standard error ``se``:
    mean ± t(1 − (1 − level)/2, n − 1) · se. None where there is no noise estimate (n < 2 or no SE)."""
    if se is None or n < 2:
        return None
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * se
    return mean - half, mean + half


def paired(a: dict, b: dict) -> dict:
    """The mean difference a − b over the keys (seeds) both hold, with its SE, paired t test and interval.

    Returns {"diff", "se", "n", "t", "p" (two-sided; None below 2 pairs or for an SE of 0), "interval"}."""
    keys = sorted(set(a) & set(b), key=str)
    diffs = [a[k] - b[k] for k in keys]
    n = len(diffs)
    diff = statistics.fmean(diffs) if diffs else None
    se = statistics.stdev(diffs) / math.sqrt(n) if n >= 2 else None
    t = p = None
    if se is not None and se > 0:
        t = diff / se
        p = 2.0 * (1.0 - t_cdf(abs(t), n - 1))
    return {"diff": diff, "se": se, "n": n, "t": t, "p": p, "interval": interval(diff, se, n) if diff is not None else None}


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (Holm 1979): sort the m p-values, multiply the k-th smallest
    by (m − k + 1), carry the running maximum, cap at 1. Rejecting where the adjusted p is below α keeps
    the chance of any false rejection among the m at most α. A None (no test) is left out and kept None."""
    known = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(known)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for k, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


def paired_holm(pairs: Sequence[tuple[dict, dict]]) -> list[dict]:
    """``paired(a, b)`` for every (a, b) in ``pairs``, each with "p_holm": its p adjusted by Holm over all of them."""
    tests = [paired(a, b) for a, b in pairs]
    return [{**t, "p_holm": p} for t, p in zip(tests, holm([t["p"] for t in tests]))]


def reading(test: dict, level: float = LEVEL) -> str:
    """What a ``paired_holm`` test says of a − b: "higher" or "lower" where its adjusted p is under 1 − level,
    else "inconclusive"."""
    alpha = round(1.0 - level, 12)  # 1 − 0.95 is 0.050000000000000044 in floating point
    if test["p_holm"] is None or test["p_holm"] >= alpha:
        return "inconclusive"
    return "higher" if test["diff"] > 0 else "lower"


def p_text(p: float | None) -> str:
    """A p-value to three decimals, "< 0.001" below that (never "0.000"), "" where there is no test."""
    return "" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def decimals_for(se: float, at_least: int = 0) -> int:
    """Decimals that show ``se`` to two significant digits (and the mean beside it to the same place),
    never fewer than ``at_least``; so an SE is never printed as 0.00."""
    if se <= 0 or not math.isfinite(se):
        return at_least
    return max(at_least, 1 - math.floor(math.log10(se)))


def with_error(mean: float, se: float | None, n: int, unit: str = "", decimals: int | None = None) -> str:
    """``mean ± se (n seeds, 95% interval a – b)`` at the precision the SE gives; "n=1, no interval" for one
    value; "(n seeds, identical)" where the seeds agree exactly (an SE of 0 is no width to print)."""
    if se is None or n < 2:
        d = 2 if decimals is None else decimals
        return f"{mean:.{d}f}{unit} (n={n}, no interval)"
    if se == 0:
        d = 2 if decimals is None else decimals
        return f"{mean:.{d}f}{unit} ({n} seeds, identical)"
    d = decimals_for(se) if decimals is None else decimals
    lo, hi = interval(mean, se, n)
    return f"{mean:.{d}f} ± {se:.{d}f}{unit} ({n} seeds, {LEVEL:.0%} interval {lo:.{d}f} – {hi:.{d}f})"
