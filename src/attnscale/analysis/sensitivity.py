"""The learning-rate study's endpoints (docs/lr-study.md), pure, each fixed before any of its runs trained.

A row is a run as ``experiments.lr_study.rows`` gives it: optimizer, d_model, lr, treatment, seed, valid_loss (the
final held-out loss; None where the run diverged) and outcome. *L_s(η)* is seed s's loss at rate η, a run without a
finite loss read as the floor F (a model whose attention learns nothing):

- best loss: best_s = min over η of L_s(η), its mean over seeds with the t interval;
- LR sensitivity (Wortsman et al. 2023, the floor in place of the loss at initialisation):
  S_s = mean over the grid of min(L_s(η), F) − best_s, its mean with the t interval;
- stable range: the rates whose seed-mean loss is within ``WITHIN`` of the seed-mean curve's minimum.

Treatments are compared seed by seed (``analysis.paired``): the seed is the unit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from attnscale.analysis import alarm_judging as aj
from attnscale.analysis import intervals, paired

__all__ = ["WITHIN", "MARGIN", "capped", "failed", "curve", "compare", "judge", "alarm_readings"]

WITHIN = 0.05  # nats: a rate is in the stable range where its mean loss is this close to the best
MARGIN = 0.02  # nats: the equivalence margin of alarm-clip against clip


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def capped(loss: float | None, floor: float) -> float:
    """min(loss, floor); a run without a finite loss reads as the floor."""
    return min(loss, floor) if _finite(loss) else floor


def failed(row: dict[str, Any]) -> bool:
    """Whether the run broke mid-run or never learnt (its outcome's)."""
    return row["outcome"]["learned_at"] is None or row["outcome"]["break_step"] is not None


def _mean_ci(values: Sequence[float]) -> dict[str, Any]:
    n = len(values)
    mean = statistics.fmean(values) if values else None
    se = statistics.stdev(values) / math.sqrt(n) if n >= 2 else None
    return {"mean": mean, "se": se, "n": n, "interval": intervals.interval(mean, se, n) if mean is not None else None}


def _per_seed(rows: Sequence[dict[str, Any]], floor: float,
              grid: Sequence[float] | None) -> tuple[list[float], dict[int, dict[float, float]]]:
    lrs = sorted(set(grid) if grid is not None else {r["lr"] for r in rows})
    grid: dict[int, dict[float, float]] = {}
    for r in rows:
        grid.setdefault(r["seed"], {})[r["lr"]] = capped(r["valid_loss"], floor)
    whole = {s: g for s, g in grid.items() if set(g) == set(lrs)}  # a seed missing a rate is left out
    return lrs, whole


def curve(rows: Sequence[dict[str, Any]], floor: float, within: float = WITHIN,
          lrs: Sequence[float] | None = None) -> dict[str, Any]:
    """One treatment × optimizer × width: the loss at every rate and seed, outcomes per rate, best loss, LR
    sensitivity and stable range (the module's docstring), on the seeds that have every rate of ``lrs`` (the
    block's grid; by default the rates the rows hold)."""
    if not _finite(floor):
        raise ValueError(f"the floor must be a finite loss, got {floor!r}")
    lrs, grid = _per_seed(rows, floor, lrs)
    seeds = sorted(grid)
    per_rate = []
    for lr in lrs:
        at = [r for r in rows if r["lr"] == lr and r["seed"] in grid]
        per_rate.append({"lr": lr, "losses": {r["seed"]: r["valid_loss"] for r in sorted(at, key=lambda r: r["seed"])},
                         "mean": statistics.fmean(grid[s][lr] for s in seeds) if seeds else None,
                         "failed_seeds": sorted(r["seed"] for r in at if failed(r)),
                         "mid_run_breaks": sum(r["outcome"]["break_step"] is not None for r in at),
                         "never_learned": sum(r["outcome"]["learned_at"] is None for r in at),
                         "diverged": sum(not _finite(r["valid_loss"]) for r in at), "runs": len(at)})
    best_s = {s: min(grid[s].values()) for s in seeds}
    sens_s = {s: statistics.fmean(grid[s].values()) - best_s[s] for s in seeds}
    out: dict[str, Any] = {"seeds": seeds, "lrs": lrs, "floor": floor, "per_rate": per_rate,
                           "best": _mean_ci(list(best_s.values())), "sensitivity": _mean_ci(list(sens_s.values())),
                           "best_by_seed": best_s, "sensitivity_by_seed": sens_s}
    means = [p["mean"] for p in per_rate]
    if seeds:
        low = min(means)
        out["best_lr"] = lrs[means.index(low)]
        stable = [lr for lr, m in zip(lrs, means) if m <= low + within]
        out["stable"] = {"lrs": stable, "low": stable[0], "high": stable[-1], "ratio": stable[-1] / stable[0],
                         "within": within}
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Curve a against curve b, seed by seed: best loss and LR sensitivity, a − b with the t interval and reading."""
    return {"best": paired.paired_t(a["best_by_seed"], b["best_by_seed"]),
            "sensitivity": paired.paired_t(a["sensitivity_by_seed"], b["sensitivity_by_seed"])}


def judge(rows: Sequence[dict[str, Any]], floor: float, margin: float = MARGIN) -> dict[str, Any]:
    """Every curve (by optimizer, width, treatment), each treatment against ``none`` and ``qk-norm`` of its optimizer
    and width, and ``alarm-clip`` against ``clip`` as an equivalence test at ±``margin`` on best loss."""
    groups: dict[tuple[str, int], dict[str, list]] = {}
    for r in rows:
        groups.setdefault((r["optimizer"], r["d_model"]), {}).setdefault(r["treatment"], []).append(r)
    out = []
    for (opt, width), by_t in sorted(groups.items()):
        grid = sorted({r["lr"] for rs in by_t.values() for r in rs})  # a treatment missing a rate has no whole seed
        curves = {t: curve(rs, floor, lrs=grid) for t, rs in by_t.items()}
        against = {}
        for t, c in curves.items():
            against[t] = {ref: compare(c, curves[ref]) for ref in ("none", "qk-norm") if ref in curves and ref != t}
        eq = None
        if "alarm-clip" in curves and "clip" in curves:
            eq = paired.equivalence(curves["alarm-clip"]["best_by_seed"], curves["clip"]["best_by_seed"], margin)
        out.append({"optimizer": opt, "d_model": width, "curves": curves, "against": against,
                    "alarm_clip_vs_clip": eq})
    return {"floor": floor, "within": WITHIN, "margin": margin, "groups": out}


def alarm_readings(rows: Sequence[dict[str, Any]], level: float = aj.LEVEL) -> dict[str, Any]:
    """The alarm at ``level`` (the first probe after step 0 over it) in one group's ``none`` runs, read after the fact,
    not one of the study's endpoints: per rate, the runs that never learnt, broke mid-run or held, and how many of
    each it fired in; over the grid, ``alarm_judging``'s sensitivity among the breakers (both datings) and its
    false-alarm share among the holders, with Wilson intervals, at ``level`` and at every level of its ladder (where
    a level chosen under one optimizer may not suit another)."""
    none = [{**r, "arm": "A"} for r in rows if r["treatment"] == "none"]

    def fired(rs):
        return sum(aj.alarm_step(r, level) is not None for r in rs)

    per = []
    for lr in sorted({r["lr"] for r in none}):
        at = [r for r in none if r["lr"] == lr]
        never = [r for r in at if r["outcome"]["learned_at"] is None]
        broke = [r for r in at if failed(r) and r["outcome"]["learned_at"] is not None]
        held = [r for r in at if not failed(r)]
        per.append({"lr": lr, "runs": len(at), "never_learned": len(never), "broke": len(broke), "held": len(held),
                    "fired_broke": fired(broke), "fired_held": fired(held), "fired_never": fired(never)})

    def at(lv):
        fa = aj.false_alarms(none, lv)  # its seeds repeat across rates here: left out
        return {"sensitivity": aj.sensitivity(none, lv),
                "false_alarms": {k: fa[k] for k in ("k", "n", "share", "interval", "median_step")}}

    return {"level": level, "by_rate": per, **at(level),
            "ladder": [{"level": lv, **at(lv)} for lv in aj.LADDER]}
