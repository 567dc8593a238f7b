"""The statistics every pre-registered paired study shares (act, alarm and learning-rate studies), pure.

A study's runs share seeds across arms: the same seed is the same initial weights and the same batches, so
two arms are compared seed by seed, and the seed is the unit. Where a study has several cells (the act
study's two z-loss cells), a seed's cells are not independent of each other (they share its weights and
batches): ``by_seed`` averages a seed's cells into one difference before any interval is made, so n is the
number of seeds, not of (cell, seed) pairs.

- ``mcnemar_exact``: breaks, paired, two-sided exact (McNemar 1947, the binomial form);
- ``paired_t``: a mean difference with its two-sided t interval at n − 1 degrees of freedom, and its reading;
- ``equivalence``: two one-sided tests (Schuirmann 1987): equivalent where the 90% t interval lies inside
  (−margin, +margin);
- ``wilson``: a share's score interval (Wilson 1927), honest near 0 and 1 and at small n.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from attnscale.analysis import intervals
from attnscale.analysis.detectors import wilson

__all__ = ["ALPHA", "mcnemar_exact", "paired_t", "reading", "equivalence", "wilson", "by_seed", "share", "estimate_text"]

ALPHA = 0.05


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact test, two-sided, on the discordant pairs: ``b`` where the baseline broke and the arm did
    not, ``c`` the other way. p = min(1, 2 · P(Bin(b + c, ½) ≤ min(b, c))); 1 where there is no discordant pair."""
    if b < 0 or c < 0:
        raise ValueError(f"counts must be non-negative, got {b}, {c}")
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    tail = math.fsum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def reading(test: Mapping[str, Any]) -> str:
    """"lower", "higher" or "inconclusive" (the interval holds 0, or there is none) of a ``paired_t`` result; where
    every pair differs by the same amount (SE 0), that amount's sign."""
    ci = test["interval"]
    if ci is None:
        if test["n"] >= 2 and test["se"] == 0:
            return "lower" if test["diff"] < 0 else "higher" if test["diff"] > 0 else "inconclusive"
        return "inconclusive"
    return "inconclusive" if ci[0] <= 0 <= ci[1] else "higher" if ci[0] > 0 else "lower"


def paired_t(a: Mapping[Hashable, float | None], b: Mapping[Hashable, float | None],
             level: float = intervals.LEVEL) -> dict[str, Any]:
    """a − b over the keys (seeds) where both hold a finite value: ``intervals.paired`` (mean, SE, n, t interval
    at n − 1 df, at ``level``), ``left_out``: the keys both hold where either value is not finite, and its
    ``reading``."""
    keys = sorted(set(a) & set(b), key=str)
    both = [k for k in keys if _finite(a[k]) and _finite(b[k])]
    test = intervals.paired({k: a[k] for k in both}, {k: b[k] for k in both})
    if level != intervals.LEVEL and test["diff"] is not None:
        test["interval"] = intervals.interval(test["diff"], test["se"], test["n"], level)
    out = {**test, "left_out": len(keys) - len(both)}
    out["reading"] = reading(out)
    return out


def equivalence(a: Mapping[Hashable, float | None], b: Mapping[Hashable, float | None], margin: float,
                alpha: float = ALPHA) -> dict[str, Any]:
    """Is a − b within ±``margin``? Two one-sided tests at ``alpha``: "equivalent" where the 1 − 2·alpha t interval
    lies inside (−margin, +margin); "different" where the 1 − alpha interval excludes 0 and reaches past the
    margin; else "inconclusive" (also with fewer than 2 pairs). With both intervals."""
    if not (_finite(margin) and margin > 0):
        raise ValueError(f"the equivalence margin must be a positive number, got {margin!r}")
    narrow = paired_t(a, b, level=1.0 - 2.0 * alpha)
    wide = paired_t(a, b, level=1.0 - alpha)
    ci90, ci95 = narrow["interval"], wide["interval"]
    if ci90 is None and narrow["n"] >= 2 and narrow["se"] == 0:
        ci90 = ci95 = (narrow["diff"], narrow["diff"])
    verdict = "inconclusive"
    if ci90 is not None and -margin < ci90[0] and ci90[1] < margin:
        verdict = "equivalent"
    elif ci95 is not None and (ci95[0] > 0 or ci95[1] < 0) and (ci95[1] > margin or ci95[0] < -margin):
        verdict = "different"
    return {"diff": wide["diff"], "se": wide["se"], "n": wide["n"], "interval_90": ci90, "interval_95": ci95,
            "margin": margin, "verdict": verdict}


def by_seed(rows: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float | None],
            keep: Callable[[Mapping[str, Any]], bool] = lambda r: True) -> dict[int, float | None]:
    """Each seed's mean of ``value`` over its rows that ``keep`` holds (its cells): the seed as the unit. A seed
    any of whose values is not finite reads None (its pair is then left out, and counted, by ``paired_t``)."""
    out: dict[int, list] = {}
    for r in rows:
        if keep(r):
            out.setdefault(r["seed"], []).append(value(r))
    return {s: (statistics.fmean(vs) if all(_finite(v) for v in vs) else None) for s, vs in sorted(out.items())}


def share(k: int, n: int, level: float = 0.95) -> dict[str, Any]:
    """k of n as a share with its Wilson interval (None where n is 0)."""
    if not (isinstance(k, int) and isinstance(n, int)) or not 0 <= k <= n:
        raise ValueError(f"a share needs integers 0 <= k <= n, got {k!r} of {n!r}")
    return {"k": k, "n": n, "share": k / n if n else None, "interval": wilson(k, n, level)}


def estimate_text(value: float | None, se: float | None, n: int, interval: tuple[float, float] | None,
                  signed: bool = False, unit: str = "", alike: str = "every pair alike") -> str:
    """"value [lo, hi]" at the precision the SE sets (never "± 0.00"); ``alike`` where the SE is 0, "n=1, no
    interval" for one value, "—" for none. ``signed``: a difference, printed with its sign."""
    sign = "+" if signed else ""
    if value is None:
        return "—"
    if n < 2 or se is None:
        return f"{value:{sign}.3f}{unit} (n=1, no interval)"
    if se == 0 or interval is None:
        return f"{value:{sign}.3f}{unit} ({alike})"
    d = intervals.decimals_for(se, 2)
    lo, hi = interval
    return f"{value:{sign}.{d}f}{unit} [{lo:{sign}.{d}f}, {hi:{sign}.{d}f}]"
