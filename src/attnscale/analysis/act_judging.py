"""The act study's judging (docs/act-study.md), pure: each run's outcome, the paired exact test of breaks,
paired differences of the final held-out loss, and the decision rule, each fixed before any seed ran.

A run here is a plain dict as the series file keeps it (``experiments.act_study.run_rows``): run_id, cell,
arm, seed, losses (every step; None where not finite), probes, valid_loss, alarm_step, action_steps. A *pair*
is one (cell, seed): the same seed's runs of two arms in one cell (same initial weights, same batches).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from attnscale.analysis import intervals
from attnscale.analysis import outcomes as oc
from attnscale.analysis import paired
from attnscale.analysis.paired import mcnemar_exact, paired_t

__all__ = ["FLOOR", "LEARNED_LEVEL", "BEST_OF_ARM", "LADDER", "ALPHA", "MARGIN", "REFERENCE", "BASELINE", "outcome_of", "tally",
           "mcnemar_exact", "paired_breaks", "paired_loss", "seed_loss", "attention_share", "break_leg", "loss_leg", "decide",
           "judge", "complete_seeds", "interval_text", "p_text"]

# the outcome rules' numbers, the warning study's (docs/warn-study.json "recipe"): its pilot's no-attention floor
# and learned level, and each arm's best held-out loss, from which "degraded" is measured
FLOOR = 2.2664992570877076
LEARNED_LEVEL = 1.9318205922842027
BEST_OF_ARM = {("z0", False): 1.593292909860611, ("z1e-4", False): 1.5885027945041656,
               ("z0", True): 1.6185084223747253, ("z1e-4", True): 1.6003541827201844}  # (cell, qk-norm)
ALPHA = 0.05  # the exact test's level
LADDER = (1e2, 3e2, 1e3, 3e3, 1e4, 3e4, 1e5)  # max |score|: the alarm's levels, one chosen on the act study's pilot
MARGIN = 0.05  # nats: how much worse than the reference's final loss an arm may be and still "save" runs
EQUIVALENCE = 0.02  # nats: the margin within which clipping on the alarm and clipping always are read as one (a re-read)
REFERENCE = "E"  # qk-norm at the same rate
BASELINE = "A"  # no action


def outcome_of(row: dict[str, Any], level: float = LEARNED_LEVEL, floor: float = FLOOR) -> dict[str, Any]:
    """``outcomes.classify`` of one run, as plain data: learned_at, break_step, break_reason, degraded, kind."""
    best = BEST_OF_ARM[(row["cell"], row["arm"] == REFERENCE)]
    o = oc.classify(row["losses"], row["valid_loss"], level, floor, best)
    return {"learned_at": o.learned_at, "break_step": None if o.broke is None else o.broke.step,
            "break_reason": None if o.broke is None else o.broke.reason, "degraded": o.degraded, "kind": o.kind}


def tally(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """runs, learned, mid_run_breaks, degraded, never_learned of the rows (their ``outcome``)."""
    out = {"runs": 0, "learned": 0, "mid_run_breaks": 0, "degraded": 0, "never_learned": 0}
    for r in rows:
        o = r["outcome"]
        out["runs"] += 1
        out["degraded"] += bool(o["degraded"])
        if o["learned_at"] is None:
            out["never_learned"] += 1
        else:
            out["learned"] += 1
            out["mid_run_breaks"] += o["break_step"] is not None
    return out


def _by_pair(rows: Sequence[dict[str, Any]], arm: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["cell"], r["seed"]): r for r in rows if r["arm"] == arm}


def _broke(r: dict[str, Any]) -> bool:
    return r["outcome"]["break_step"] is not None


def paired_breaks(rows: Sequence[dict[str, Any]], arm: str, baseline: str = BASELINE) -> dict[str, Any]:
    """Breaks of ``arm`` against ``baseline`` over the pairs both hold: the counts, the discordant b (baseline
    broke, arm held) and c (arm broke, baseline held), and McNemar's exact p."""
    a, x = _by_pair(rows, baseline), _by_pair(rows, arm)
    keys = sorted(set(a) & set(x))
    b = sum(_broke(a[k]) and not _broke(x[k]) for k in keys)
    c = sum(_broke(x[k]) and not _broke(a[k]) for k in keys)
    return {"pairs": len(keys), "baseline_breaks": sum(_broke(a[k]) for k in keys),
            "arm_breaks": sum(_broke(x[k]) for k in keys), "b": b, "c": c, "p": mcnemar_exact(b, c)}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def paired_loss(rows: Sequence[dict[str, Any]], arm: str, other: str) -> dict[str, Any]:
    """The final held-out loss of ``arm`` minus ``other``'s, paired: ``paired.paired_t`` over the pairs where both
    runs have a finite loss (mean, SE, n, t interval at n − 1 df), ``left_out``: pairs without one; ``reading``:
    "lower", "higher" or "inconclusive" (the interval holds 0, or there is none)."""
    a, x = _by_pair(rows, other), _by_pair(rows, arm)
    return paired_t({k: r["valid_loss"] for k, r in x.items()}, {k: r["valid_loss"] for k, r in a.items()})


def seed_loss(rows: Sequence[dict[str, Any]], arm: str, other: str) -> dict[str, Any]:
    """``paired_loss`` with the seed as the unit: each seed's (arm − other) averaged over its cells first (a seed's
    cells share its initial weights and batches, so they are not independent pairs), then the t interval over the
    seeds at n − 1 degrees of freedom. A seed any of whose cells has no finite loss in either arm is left out."""
    def per_seed(a: str):
        return paired.by_seed([r for r in rows if r["arm"] == a], lambda r: r["valid_loss"])

    mine, theirs = per_seed(arm), per_seed(other)
    cells = {s: {r["cell"] for r in rows if r["seed"] == s and r["arm"] in (arm, other)} for s in mine}
    both = {s for s in mine if s in theirs and all(any(r["seed"] == s and r["cell"] == c and r["arm"] == a for r in rows)
                                                   for c in cells[s] for a in (arm, other))}
    return paired.paired_t({s: mine[s] for s in both}, {s: theirs[s] for s in both})


def attention_share(test: dict[str, Any], reference_losses: Sequence[float], floor: float = FLOOR) -> dict[str, Any] | None:
    """A paired difference against the reference as a share of what attention is worth: (arm − E) / (floor − mean
    of E's losses), its interval's ends divided by the same denominator (taken as known)."""
    finite = [v for v in reference_losses if _finite(v)]
    if test["diff"] is None or not finite:
        return None
    worth = floor - math.fsum(finite) / len(finite)
    if worth <= 0:
        return None
    ci = test["interval"]
    return {"share": test["diff"] / worth, "interval": None if ci is None else (ci[0] / worth, ci[1] / worth),
            "worth": worth}


def break_leg(breaks: dict[str, Any], alpha: float = ALPHA) -> str:
    """"fewer" (b > c and p < ``alpha``), "not fewer" (b ≤ c) or "unclear"."""
    if breaks["b"] <= breaks["c"]:
        return "not fewer"
    return "fewer" if breaks["p"] < alpha else "unclear"


def loss_leg(test: dict[str, Any], margin: float = MARGIN) -> str:
    """Against the reference: "within" (the interval's upper end ≤ ``margin``), "worse" (its lower end > ``margin``),
    else "unclear" (also with no interval: fewer than 2 pairs; where every pair differs alike, that one number)."""
    ci = test["interval"]
    if ci is None:
        if test["n"] >= 2 and test["se"] == 0:
            ci = (test["diff"], test["diff"])
        else:
            return "unclear"
    if ci[1] <= margin:
        return "within"
    return "worse" if ci[0] > margin else "unclear"


def decide(breaks: dict[str, Any], versus_reference: dict[str, Any], alpha: float = ALPHA,
           margin: float = MARGIN) -> str:
    """The decision rule: "saves runs" (fewer, within), "saves runs at a loss cost" (fewer, worse), "does not save
    runs" (not fewer), else "inconclusive"."""
    b, l = break_leg(breaks, alpha), loss_leg(versus_reference, margin)
    if b == "not fewer":
        return "does not save runs"
    if b == "fewer" and l == "within":
        return "saves runs"
    if b == "fewer" and l == "worse":
        return "saves runs at a loss cost"
    return "inconclusive"


def complete_seeds(rows: Sequence[dict[str, Any]], arms: Sequence[str], cells: Sequence[str]) -> list[int]:
    """The seeds of which every arm of every cell has finished: a study cut short is read on these alone."""
    have = {(r["cell"], r["arm"], r["seed"]) for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    return [s for s in seeds if all((c, a, s) in have for c in cells for a in arms)]


def _arm_results(rows, arm: str, floor: float) -> dict[str, Any]:
    ref_losses = [r["valid_loss"] for r in rows if r["arm"] == REFERENCE]
    out: dict[str, Any] = {"tally": tally(r for r in rows if r["arm"] == arm)}
    if arm != BASELINE:
        out["breaks_vs_A"] = paired_breaks(rows, arm)
        out["loss_vs_A"] = paired_loss(rows, arm, BASELINE)
    if arm != REFERENCE:
        out["loss_vs_E"] = vs = paired_loss(rows, arm, REFERENCE)
        out["share_vs_E"] = attention_share(vs, ref_losses, floor)
    if arm != BASELINE:
        out["seed_loss_vs_A"] = seed_loss(rows, arm, BASELINE)
    if arm != REFERENCE:
        out["seed_loss_vs_E"] = seed_loss(rows, arm, REFERENCE)
    return out


def judge(rows: Sequence[dict[str, Any]], floor: float = FLOOR, arms: Sequence[str] = ("A", "B", "C", "D", "E"),
          interim: bool = True) -> dict[str, Any]:
    """Every endpoint per arm, pooled over the cells (the primary reading) and per cell, on the seeds whose runs
    have all finished, and the decision for each action arm. ``interim``: fewer seeds read than the study declared."""
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    seeds = complete_seeds(rows, arms, cells)
    rows = [r for r in rows if r["seed"] in seeds and r["arm"] in arms]
    present = [a for a in arms if any(r["arm"] == a for r in rows)]
    pooled = {a: _arm_results(rows, a, floor) for a in present}
    for a in present:
        if a not in (BASELINE, REFERENCE):
            pooled[a]["decision"] = decide(pooled[a]["breaks_vs_A"], pooled[a]["loss_vs_E"])
    per_cell = {c: {a: _arm_results([r for r in rows if r["cell"] == c], a, floor) for a in present} for c in cells}
    out = {"seeds": seeds, "cells": cells, "interim": interim, "arms": pooled, "per_cell": per_cell,
           "alpha": ALPHA, "margin": MARGIN, "floor": floor}
    if {"B", "C"} <= set(present):  # clipping on the alarm against clipping always, the seed as the unit
        def per_seed(a):
            return paired.by_seed([r for r in rows if r["arm"] == a], lambda r: r["valid_loss"])

        out["C_vs_B"] = paired.equivalence(per_seed("C"), per_seed("B"), EQUIVALENCE)
    return out


def p_text(p: float | None) -> str:
    """An exact p to three significant places; "—" where there is no test."""
    return "—" if p is None else intervals.p_text(p) if p < 0.001 else f"{p:.3g}"


def interval_text(test: dict[str, Any], unit: str = "") -> str:
    """A paired difference as "mean [lo, hi]" at the precision its SE sets (never "± 0.00"); "identical" where every
    pair agrees, "n=1, no interval" for one pair, "—" for none."""
    return paired.estimate_text(test["diff"], test["se"], test["n"], test["interval"], signed=True, unit=unit)
