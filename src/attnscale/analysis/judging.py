"""How a verdict is read from an estimate and its interval: one rule for every claim with seeds.

A claim of the course has up to two parts:
- a **direction** (one-sided: "the scale helps", gap > 0; "over 5,000"; "the
  spread grows"): it *holds* where the whole interval lies on the claimed side,
  *fails* where the whole interval lies on the other, and is *undecided* where
  the interval reaches both;
- a **size** ("about 2 points", read as a band such as 1.5–2.5): the estimate is
  *consistent* with it where the interval overlaps the band, and *fails* where it
  does not. A one-sided size ("over 5,000", "≥ 99%") is judged like a direction.

The verdict: "differs" where the direction fails; "partly" where the direction
holds and the size fails; "differs" where the size fails and the direction is
not established; "inconclusive" where the interval covers both answers (an
undecided direction or one-sided size); "agrees" otherwise. With one seed there
is no interval and the estimate alone decides: a value of the wrong sign
differs however small it is (the course's direction is part of its claim).

The interval is the 95% t interval over seeds (``intervals.interval``), so with
two seeds it is ± 12.7 SE: few seeds make verdicts inconclusive, never lucky.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["AGREES", "PARTLY", "DIFFERS", "INCONCLUSIVE", "NOT_RUN", "VERDICTS", "HOLDS", "FAILS", "UNDECIDED",
           "side", "overlaps", "verdict", "worst"]

AGREES, PARTLY, DIFFERS, INCONCLUSIVE, NOT_RUN = "agrees", "partly", "differs", "inconclusive", "not run"
VERDICTS = (AGREES, PARTLY, INCONCLUSIVE, DIFFERS, NOT_RUN)
HOLDS, FAILS, UNDECIDED = "holds", "fails", "undecided"


def side(lo: float, hi: float, holds: Callable[[float], bool]) -> str:
    """Whether a one-sided condition ``holds`` (monotone in the value: "x > 0", "x ≥ 0.99") over the interval
    [lo, hi]: HOLDS at both ends, FAILS at both, else UNDECIDED."""
    at_lo, at_hi = holds(lo), holds(hi)
    return HOLDS if at_lo and at_hi else FAILS if not at_lo and not at_hi else UNDECIDED


def overlaps(lo: float, hi: float, band: tuple[float, float]) -> str:
    """HOLDS where [lo, hi] meets ``band`` (the estimate is consistent with the size), else FAILS."""
    return HOLDS if lo <= band[1] and hi >= band[0] else FAILS


def verdict(size: str, direction: str | None = None) -> str:
    """The verdict from the size's and (where the claim has one) the direction's reading (HOLDS/FAILS/UNDECIDED)."""
    if direction == FAILS:
        return DIFFERS
    if size == FAILS:
        return PARTLY if direction == HOLDS else DIFFERS
    if size == UNDECIDED or direction == UNDECIDED:
        return INCONCLUSIVE
    return AGREES


def worst(verdicts: list[str]) -> str:
    """One verdict for a claim read at several widths: any "differs" differs, then "inconclusive", then "partly"."""
    for v in (DIFFERS, INCONCLUSIVE, PARTLY):
        if v in verdicts:
            return v
    return AGREES
