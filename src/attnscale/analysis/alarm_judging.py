"""The alarm study's judging (docs/alarm-study.md), pure, fixed before its pilot ran.

A row is a run as ``experiments.alarm_study.rows`` gives it: arm (A, B, C, E, F), seed, losses, probes (max |score|
every 10 steps), valid_loss, outcome. A *breaker* is a learned run of arm A that broke mid-run, a *holder* a learned
run of A that did not; never-learned runs are counted apart. The alarm at level L is the first probe after step 0
whose max |score| is over L.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from attnscale.analysis import intervals, paired, warning
from attnscale.analysis.act_judging import LADDER, LEARNED_LEVEL

__all__ = ["LEVEL", "LADDER", "MIN_LEAD", "MARGIN", "SEPARATES", "alarm_step", "pilot_shares", "choose_rate",
           "added_rate",
           "sensitivity", "false_alarms", "separation", "mean_loss", "arms", "judge", "decide"]

LEVEL = 1e4
MIN_LEAD = 100  # steps: an alarm this long before the break counts as a warning
MARGIN = 0.02  # nats: C against B, and qk-norm within reach of the better of C and F
SEPARATES = (0.8, 0.3)  # a level separates where sensitivity's lower end >= 0.8 and false alarms' upper end <= 0.3
DATINGS = ("study", "smoothed")


def alarm_step(row: dict[str, Any], level: float = LEVEL) -> int | None:
    return next((p["step"] for p in row["probes"]
                 if p["step"] > 0 and p["max_score"] is not None and p["max_score"] > level), None)


def _learned(r) -> bool:
    return r["outcome"]["learned_at"] is not None


def _broke(r) -> bool:
    return r["outcome"]["break_step"] is not None


def pilot_shares(rows: Sequence[dict[str, Any]]) -> dict[float, dict[str, Any]]:
    """Per rate: mid-run breaks over learned runs of arm A, with the Wilson interval, and the never-learned count."""
    out = {}
    for lr in sorted({r["lr"] for r in rows}):
        at = [r for r in rows if r["lr"] == lr and r["arm"] == "A"]
        learned = [r for r in at if _learned(r)]
        out[lr] = {**paired.share(sum(_broke(r) for r in learned), len(learned)),
                   "never_learned": len(at) - len(learned)}
    return out


def choose_rate(shares: dict[float, dict[str, Any]], low: float = 0.25, high: float = 0.75) -> dict[str, Any]:
    """The rule: the rate whose break share lies in [low, high], nearest 50%, a tie to the lower rate. Where none
    qualifies: if the rate the rule adds was already trained (``added_rate``), the rate nearest 50% (a tie to the
    lower), marked ``"fallback"``; else None, with the rate to add (the geometric mean of the highest rate under
    ``low`` and the lowest over ``high``, 8e-2 standing for the latter where no rate is over it)."""
    known = {lr: s for lr, s in shares.items() if s["share"] is not None}
    ok = [(abs(s["share"] - 0.5), lr) for lr, s in known.items() if low <= s["share"] <= high]
    if ok:
        return {"rate": min(ok)[1], "add": None}
    added = added_rate(shares, low, high)
    if added is not None:
        return {"rate": min((abs(s["share"] - 0.5), lr) for lr, s in known.items())[1], "add": None,
                "fallback": True, "added": added}
    return {"rate": None, "add": _to_add(known, low, high)}


def _to_add(known, low, high) -> float | None:
    under = [lr for lr, s in known.items() if s["share"] < low]
    over = [lr for lr, s in known.items() if s["share"] > high]
    hi = min(over) if over else 8e-2
    lo = max((x for x in under if x < hi), default=None)
    return None if lo is None else float(f"{(lo * hi) ** 0.5:.3g}")


def added_rate(shares: dict[float, dict[str, Any]], low: float = 0.25, high: float = 0.75) -> float | None:
    """The rate among ``shares`` that the rule added: the one without which the others qualify none and the rule
    adds exactly it (the pilot adds once, so at most one rate is so); None where the pilot added none."""
    known = {lr: s for lr, s in shares.items() if s["share"] is not None}
    for x in sorted(known):
        rest = {lr: s for lr, s in known.items() if lr != x}
        if rest and not any(low <= s["share"] <= high for s in rest.values()):
            add = _to_add(rest, low, high)
            if add is not None and abs(add - x) <= 1e-9 * x:
                return x
    return None


def _a_runs(rows):
    return [r for r in rows if r["arm"] == "A" and _learned(r)]


def sensitivity(rows: Sequence[dict[str, Any]], level: float = LEVEL, min_lead: int = MIN_LEAD) -> dict[str, Any]:
    """Per dating: the breakers of arm A whose alarm came at least ``min_lead`` steps before the break, as a share
    with its Wilson interval."""
    breakers = [r for r in _a_runs(rows) if _broke(r)]
    out = {}
    for dating in DATINGS:
        hits = 0
        for r in breakers:
            d = warning.dates(r["losses"], LEARNED_LEVEL)
            b = r["outcome"]["break_step"] if d is None else d[dating]
            s = alarm_step(r, level)
            hits += s is not None and s <= b - min_lead
        out[dating] = paired.share(hits, len(breakers))
    return out


def false_alarms(rows: Sequence[dict[str, Any]], level: float = LEVEL) -> dict[str, Any]:
    """The holders of arm A in which the alarm fired at any probe, as a share with its Wilson interval, and the
    seeds it fired on."""
    holders = [r for r in _a_runs(rows) if not _broke(r)]
    steps = {r["seed"]: alarm_step(r, level) for r in holders}
    fired = sorted(seed for seed, step in steps.items() if step is not None)
    return {**paired.share(len(fired), len(holders)), "seeds": fired,
            "median_step": statistics.median(steps[s] for s in fired) if fired else None}


def mean_loss(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The runs' mean final held-out loss over those that have one, with its two-sided 95% t interval."""
    losses = [r["valid_loss"] for r in rows if r["valid_loss"] is not None and math.isfinite(r["valid_loss"])]
    n = len(losses)
    mean = statistics.fmean(losses) if n else None
    se = statistics.stdev(losses) / math.sqrt(n) if n > 1 else None
    return {"mean": mean, "se": se, "n": n, "interval": None if mean is None else intervals.interval(mean, se, n)}


def arms(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: its runs, mid-run breaks, never-learned runs and mean final loss; and arm A's holders and breakers
    apart (a holder that never broke may still end far above the other arms)."""
    out = {}
    for arm in sorted({r["arm"] for r in rows}):
        mine = [r for r in rows if r["arm"] == arm]
        out[arm] = {"runs": len(mine), "breaks": sum(_broke(r) for r in mine),
                    "never_learned": sum(not _learned(r) for r in mine), "loss": mean_loss(mine)}
    learned = _a_runs(rows)
    out["A holders"] = {"runs": sum(not _broke(r) for r in learned), "loss": mean_loss([r for r in learned if not _broke(r)])}
    out["A breakers"] = {"runs": sum(_broke(r) for r in learned), "loss": mean_loss([r for r in learned if _broke(r)])}
    return out


def separation(rows: Sequence[dict[str, Any]], ladder=LADDER) -> list[dict[str, Any]]:
    """Per level of the ladder: sensitivity (the study's dating) and false-alarm share, and whether it separates."""
    out = []
    for level in ladder:
        sens, fa = sensitivity(rows, level)["study"], false_alarms(rows, level)
        ok = (sens["interval"] is not None and sens["interval"][0] >= SEPARATES[0]
              and fa["interval"] is not None and fa["interval"][1] <= SEPARATES[1])
        out.append({"level": level, "sensitivity": sens, "false_alarms": fa, "separates": ok})
    return out


def _losses(rows, arm: str, seeds=None) -> dict[int, float | None]:
    return {r["seed"]: r["valid_loss"] for r in rows if r["arm"] == arm and (seeds is None or r["seed"] in seeds)}


def judge(rows: Sequence[dict[str, Any]], level: float = LEVEL) -> dict[str, Any]:
    """Every endpoint of docs/alarm-study.md and the decision."""
    fa = false_alarms(rows, level)
    out: dict[str, Any] = {"level": level, "sensitivity": sensitivity(rows, level), "false_alarms": fa,
                           "separation": separation(rows), "never_learned": sum(not _learned(r) for r in rows
                                                                                 if r["arm"] == "A"),
                           "arms": arms(rows)}
    out["false_alarm_cost"] = paired.paired_t(_losses(rows, "C", set(fa["seeds"])), _losses(rows, "A", set(fa["seeds"])))
    out["C_vs_B"] = paired.equivalence(_losses(rows, "C"), _losses(rows, "B"), MARGIN)
    out["F_vs_C"] = paired.paired_t(_losses(rows, "F"), _losses(rows, "C"))
    broke = {a: {r["seed"]: _broke(r) for r in rows if r["arm"] == a} for a in "CF"}
    common = sorted(set(broke["C"]) & set(broke["F"]))
    b = sum(broke["C"][s] and not broke["F"][s] for s in common)
    c = sum(broke["F"][s] and not broke["C"][s] for s in common)
    out["F_vs_C_breaks"] = {"pairs": len(common), "C": sum(broke["C"][s] for s in common),
                            "F": sum(broke["F"][s] for s in common), "b": b, "c": c, "p": paired.mcnemar_exact(b, c)}
    better = "F" if (out["F_vs_C"]["diff"] or 0) < 0 else "C"
    out["E_vs_best"] = {"against": better, **paired.paired_t(_losses(rows, "E"), _losses(rows, better))}
    out["E_breaks"] = sum(_broke(r) for r in rows if r["arm"] == "E")
    out["decision"] = decide(out)
    return out


def decide(j: dict[str, Any]) -> str:
    """The rule written before any study seed (docs/alarm-study.md), the first that holds."""
    e = j["E_vs_best"]
    if e["interval"] is not None and (e["interval"][1] < 0 or (e["interval"][1] <= MARGIN and j["E_breaks"] == 0)):
        return "use qk-norm"
    fc, br = j["F_vs_C"], j["F_vs_C_breaks"]
    if fc["interval"] is not None and fc["interval"][1] < 0 and br["F"] <= br["C"]:
        return "lower the rate"
    fa = j["false_alarms"]
    if j["C_vs_B"]["verdict"] == "equivalent" and fa["interval"] is not None and fa["interval"][0] >= 0.5:
        return "clip always"
    cost = j["false_alarm_cost"]
    if any(s["separates"] for s in j["separation"] if s["level"] == j["level"]) and cost["interval"] is not None \
            and cost["interval"][1] <= MARGIN:
        return "act on the alarm"
    return "inconclusive"
