"""The course's end of training, decided by a rule written before the long run ran.

The course says that at d = 1,024, after training, the unscaled head's spread in layer 0 is
over 5,000 with 99.9% of its rows frozen, the scaled one's settles near 3.4, and the gap in
perplexity is about 2 points at d = 128 and 17–18 from 256 up. Read against what attention is
worth, V = F − ppl(scaled) with F the no-attention floor, the course's gaps are a share of
about 0.11 at 128 (2 of its 17–18-point plateau) and about 1 at 1,024: the unscaled model
falls to the floor.

The rule (issue 45), per run read at its last record, layer 0 (the mean over its heads):

- **consistent** if for every seed: unscaled spread > 5,000, frozen share ≥ 99%, scaled spread
  within 2.4–4.4; and the gap's share of V is ≤ 0.25 at d = 128 and within 0.8–1.2 at 1,024;
- **inconsistent** for this family of setups if, for every seed, the unscaled/scaled spread
  ratio stays under 1,000 over the last 2,000 steps and grows less than 10% across them (the
  end state is not on its way), or the share at 128 is ≥ 0.5 (the knee is not the course's);
- otherwise **undecided**, with what would decide it.

F is the trained ``uniform`` model of the same shape and budget (attention that weighs every
visible key equally): the floor of this very model, where a bigram count would be the floor
of another family; the bigram floor is shown beside it, not judged. Gaps are paired by seed
and averaged; with two seeds the rule reads the point values, and each seed's are shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from attnscale.analysis.course_figures import COURSE_LAYER, COURSE_WIDTH, END_FROZEN, END_SPREAD
from attnscale.analysis.estimates import mean_se
from attnscale.analysis.gaps import course_shares, share_of_value
from attnscale.analysis.intervals import LEVEL, interval

__all__ = ["NARROW", "SCALED_RANGE", "SHARE_NARROW_MAX", "SHARE_WIDE_RANGE", "RATIO_FLOOR", "RATIO_GROWTH",
           "TAIL_STEPS", "SHARE_KNEE", "COURSE_SHARES", "summary", "share", "judge", "CONSISTENT", "INCONSISTENT",
           "UNDECIDED", "RULE", "verdict_lines"]

NARROW = 128  # the width where the course's gap is small
SCALED_RANGE = (2.4, 4.4)  # "settled around 3.4", ± 1
SHARE_NARROW_MAX = 0.25  # the course's 0.11 at 128, with room for noise
SHARE_WIDE_RANGE = (0.8, 1.2)  # the course's 1 at 1,024: the unscaled model at the floor
RATIO_FLOOR = 1000.0  # the course's end-spread ratio is about 1,500; under 1,000 it is not reached
RATIO_GROWTH = 0.10  # ... and not on its way if the ratio grows less than this over the tail
TAIL_STEPS = 2000
SHARE_KNEE = 0.5  # a share this large at 128 is a knee the course does not have
COURSE_SHARES = course_shares()  # the course's gaps read against its plateau (its floor is not given)
CONSISTENT, INCONSISTENT, UNDECIDED = "consistent", "inconsistent", "undecided"
RULE = (f"consistent if, in layer 0 for every seed at d = 1,024, the unscaled spread is over {END_SPREAD:,.0f} with "
        f"at least {END_FROZEN:.0%} of rows frozen and the scaled spread lies within {SCALED_RANGE[0]}–{SCALED_RANGE[1]}, "
        f"and the gap's share of V is at most {SHARE_NARROW_MAX} at d = {NARROW} and within "
        f"{SHARE_WIDE_RANGE[0]}–{SHARE_WIDE_RANGE[1]} at 1,024; inconsistent for this family of setups if on every "
        f"seed the unscaled/scaled spread ratio stays under {RATIO_FLOOR:,.0f} and grows less than "
        f"{RATIO_GROWTH:.0%} over the last {TAIL_STEPS:,} steps, or the share at {NARROW} is {SHARE_KNEE} or more; "
        "otherwise undecided, with what would decide it")


def summary(run: Any) -> dict[str, Any]:
    """What the rule reads of a ``runs.record.TrainRun``: {head_dim, scale, seed, perplexity, steps,
    series: [{"step", "spread", "frozen"}] of layer 0 at every record, evals}."""
    from attnscale.core.diagnostics import reduce_heads

    series = []
    for line in run.recorded:
        layer = line["layers"][COURSE_LAYER]
        series.append({"step": line["step"], "spread": reduce_heads([layer.get("spread", [])]),
                       "frozen": reduce_heads([layer.get("frozen_fraction", [])])})
    return {"head_dim": run.head_dim, "scale": run.scale, "seed": run.seed, "perplexity": run.perplexity,
            "steps": run.train_config.steps, "series": series, "evals": list(run.results.evals)}


share = share_of_value  # the gap as a share of what attention is worth (``analysis.gaps``)


def _at(series: Sequence[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """The record at ``step``, or the last one before it."""
    before = [r for r in series if r["step"] <= step]
    return before[-1] if before else None


def _pair_gap(rows, width: int) -> tuple[float | None, float | None, list[float]]:
    """Mean over paired seeds of ppl(none) − ppl(1/√d) at ``width``, the scaled mean, each seed's gap."""
    ppl = {(r["scale"], r["seed"]): r["perplexity"] for r in rows if r["head_dim"] == width}
    seeds = sorted({s for (sc, s) in ppl if sc == "none"} & {s for (sc, s) in ppl if sc == "inv_sqrt_d"})
    gaps = [ppl[("none", s)] - ppl[("inv_sqrt_d", s)] for s in seeds
            if ppl[("none", s)] is not None and ppl[("inv_sqrt_d", s)] is not None]
    scaled = [ppl[("inv_sqrt_d", s)] for s in seeds if ppl[("inv_sqrt_d", s)] is not None]
    if not gaps:
        return None, None, []
    return sum(gaps) / len(gaps), sum(scaled) / len(scaled), gaps


def _ratio_tail(unscaled, scaled) -> dict[str, Any] | None:
    """One seed's unscaled/scaled spread ratio: its largest over the last ``TAIL_STEPS`` and its growth
    across them (end / ``TAIL_STEPS`` before − 1)."""
    if not unscaled or not scaled:
        return None
    end = min(unscaled[-1]["step"], scaled[-1]["step"])
    ratios = {}
    for u in unscaled:
        s = _at(scaled, u["step"])
        if end - TAIL_STEPS <= u["step"] <= end and s is not None and s["spread"] > 0:
            ratios[u["step"]] = u["spread"] / s["spread"]
    first = ratios.get(end - TAIL_STEPS)
    if not ratios or first is None or end not in ratios:
        return None
    return {"end": ratios[end], "max": max(ratios.values()), "growth": ratios[end] / first - 1, "step": end}


def judge(rows: Sequence[dict[str, Any]], wide: int = COURSE_WIDTH, narrow: int = NARROW) -> dict[str, Any]:
    """The verdict on the course's end state from ``summary`` rows: each claim ("met" True, False,
    or None where unmeasured), the overall verdict, why, and what would decide it when undecided."""
    rows = list(rows)
    floor = next((r["perplexity"] for r in rows if r["scale"] == "uniform" and r["head_dim"] == narrow), None)
    wide_rows = {(r["scale"], r["seed"]): r for r in rows if r["head_dim"] == wide}
    seeds = sorted({s for (sc, s) in wide_rows if sc == "none"} & {s for (sc, s) in wide_rows if sc == "inv_sqrt_d"})
    ends = {k: (r["series"][-1] if r["series"] else None) for k, r in wide_rows.items()}

    def per_seed(scale, key):
        return [ends[(scale, s)][key] if ends.get((scale, s)) else None for s in seeds]

    def all_met(values, test):
        return None if not values or any(v is None or math.isnan(v) for v in values) else all(test(v) for v in values)

    shares = {}
    for width in (narrow, wide):
        gap, scaled, gaps = _pair_gap(rows, width)
        # the rule reads the point values; the t interval over the paired seeds says how far they can be trusted
        ci = interval(gap, mean_se(gaps)[1], len(gaps)) if gaps else None
        shares[width] = {"gap": gap, "scaled": scaled, "gaps": gaps, "share": share(gap, floor, scaled),
                         "interval": ci, "share_interval": None if ci is None else
                         tuple(share(g, floor, scaled) for g in ci)}
    unscaled_spread, frozen, scaled_spread = per_seed("none", "spread"), per_seed("none", "frozen"), per_seed("inv_sqrt_d", "spread")
    s_narrow, s_wide = shares[narrow]["share"], shares[wide]["share"]
    claims = [
        {"claim": f"unscaled spread at d = {wide:,}", "course": f"> {END_SPREAD:,.0f}", "values": unscaled_spread,
         "met": all_met(unscaled_spread, lambda v: v > END_SPREAD)},
        {"claim": "unscaled rows frozen", "course": f"99.9% (≥ {END_FROZEN:.0%})", "values": frozen,
         "met": all_met(frozen, lambda v: v >= END_FROZEN)},
        {"claim": f"scaled spread at d = {wide:,}", "course": f"about 3.4 ({SCALED_RANGE[0]}–{SCALED_RANGE[1]})",
         "values": scaled_spread, "met": all_met(scaled_spread, lambda v: SCALED_RANGE[0] <= v <= SCALED_RANGE[1])},
        {"claim": f"gap share at d = {narrow}", "course": f"about {COURSE_SHARES[128]:.2f} (≤ {SHARE_NARROW_MAX})",
         "values": [s_narrow], "met": None if s_narrow is None else s_narrow <= SHARE_NARROW_MAX},
        {"claim": f"gap share at d = {wide:,}", "course": f"about 1 ({SHARE_WIDE_RANGE[0]}–{SHARE_WIDE_RANGE[1]})",
         "values": [s_wide], "met": None if s_wide is None else SHARE_WIDE_RANGE[0] <= s_wide <= SHARE_WIDE_RANGE[1]},
    ]
    tails = [_ratio_tail(wide_rows[("none", s)]["series"], wide_rows[("inv_sqrt_d", s)]["series"]) for s in seeds]
    stalled = bool(tails) and all(t is not None and t["max"] < RATIO_FLOOR and t["growth"] < RATIO_GROWTH
                                  for t in tails)
    knee = s_narrow is not None and s_narrow >= SHARE_KNEE
    if all(c["met"] for c in claims):
        verdict, why, decide = CONSISTENT, "every claim of the end state is met", None
    elif stalled or knee:
        said = []
        if stalled:
            said.append(f"the unscaled/scaled spread ratio stays under {RATIO_FLOOR:,.0f} and grows less than "
                        f"{RATIO_GROWTH:.0%} over the last {TAIL_STEPS:,} steps on every seed")
        if knee:
            said.append(f"the gap share at d = {narrow} is {s_narrow:.2f}, ≥ {SHARE_KNEE}")
        verdict, why, decide = INCONSISTENT, "; ".join(said), None
    elif any(c["met"] is None for c in claims):
        verdict, why = UNDECIDED, "not measured: " + ", ".join(c["claim"] for c in claims if c["met"] is None)
        decide = "the runs that measure it: every run of the end state, to its last record"
    else:
        unmet = [c["claim"] for c in claims if not c["met"]]
        verdict, why = UNDECIDED, "not met: " + ", ".join(unmet) + "; neither stalled nor a knee"
        growing = [t for t in tails if t is not None and t["growth"] >= RATIO_GROWTH]
        decide = ("a longer constant phase, until the spread ratio passes 1,000 or stops growing"
                  if growing or any(t is None for t in tails) else
                  "more seeds, to settle the gap shares between the two thresholds")
    return {"verdict": verdict, "why": why, "would_decide": decide, "claims": claims, "floor": floor,
            "shares": shares, "tails": dict(zip(seeds, tails)), "seeds": seeds}


def _num(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def verdict_lines(judged: dict[str, Any]) -> list[str]:
    """The verdict in words: each claim (course, here per seed, met or not), the floor, the rule's answer."""
    met = {True: "met", False: "not met", None: "not measured"}
    lines = []
    for c in judged["claims"]:
        fmt = "{:.2f}" if "share" in c["claim"] or "frozen" in c["claim"] else "{:,.1f}"
        here = ", ".join(_num(v, fmt) for v in c["values"])
        lines.append(f"{c['claim']}: course {c['course']}, here {here}: {met[c['met']]}")
    lines.append(f"no-attention floor F (the trained uniform model): {_num(judged['floor'], '{:.2f}')}; "
                 "share = gap / (F − ppl(1/√d)), the course's read as gap / 17.5 (its plateau)")
    for width, s in judged["shares"].items():
        if s["gap"] is None:
            continue
        each = ", ".join(f"{g:+.2f}" for g in s["gaps"])
        if s["interval"] is None:
            said = "1 seed, no interval"
        else:
            lo, hi = s["interval"]
            said = (f"{len(s['gaps'])} seeds ({each}), {LEVEL:.0%} t interval {lo:+.2f} to {hi:+.2f}"
                    + (", so its sign is not settled" if lo <= 0 <= hi else ""))
            if None not in s["share_interval"]:
                said += f"; as a share {s['share_interval'][0]:.2f} to {s['share_interval'][1]:.2f}"
        lines.append(f"gap at d = {width:,}: {s['gap']:+.2f} points ({said})")
    for seed, tail in judged["tails"].items():
        if tail is not None:
            lines.append(f"seed {seed}: unscaled/scaled spread ratio {tail['end']:,.0f} at step {tail['step']:,}, "
                         f"{tail['growth']:+.0%} over the last {TAIL_STEPS:,} steps")
    lines.append(f"verdict: {judged['verdict']} ({judged['why']})"
                 + (f"; would decide it: {judged['would_decide']}" if judged["would_decide"] else ""))
    return lines
