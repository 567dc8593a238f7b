"""The report section "Does attention warn before a learned run breaks?", from the recipe study's records.

``blocks(runs)`` finds the study's runs (``experiments.recipe_study.GROUP``) and the pilot the study
kept beside them (``recipe_study.PILOT_FILE``), judges them again (``recipe_study.judged``: the
numbers are ``analysis.recipe_judging``'s) and words them: the outcome counts per cell, each
detector's judged numbers in the chosen rungs' cells, and the defaults' rule applied.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnscale.analysis.recipe_judging import hits_text, lead_text, per_1000_text
from attnscale.report.blocks import Block, Bullets, Image, Para, Table, opening

__all__ = ["TITLE", "blocks", "section", "example", "threshold_for", "hits_text", "per_1000_text", "lead_text"]

TITLE = "Does attention warn before a learned run breaks?"


def _auc_text(got: dict[str, Any]) -> str:
    if got["auc"] is None:
        return "—"
    ci = got["ci"]
    return f"{got['auc']:.2f}" + (" (no interval)" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


EXAMPLE_PNG = "warn-recipe-example"
EXAMPLE_DETECTORS = ("max_score>1000", "loss_spike", "grad_norm_spike")  # drawn on the example run


def blocks(runs, out: Path | None = None, pngs: dict[str, Path] | None = None) -> list[Block]:
    """The section (none without a run of the study or the pilot it kept); with ``out``, its example
    figure is drawn there and named in ``pngs``."""
    from attnscale.experiments import recipe_study

    mine = [t for t in runs.train if t.group == recipe_study.GROUP]
    pilot = recipe_study.read_kept_pilot(runs.root)
    if not mine or pilot is None:
        return []
    probe_every = mine[0].train_config.record_every
    unfinished = [t.run_id for t in mine if t.status not in ("done", "diverged")]
    rows = recipe_study.rows_of(mine, probe_every)
    result = recipe_study.judged(rows, pilot, probe_every)
    b = section(result, unfinished)
    if out is not None and pngs is not None:
        b += example(rows, result, out, pngs)
    return b


def threshold_for(result: dict[str, Any], name: str, seed: int) -> float | None:
    """The threshold detector ``name`` judged ``seed``'s runs at: the one chosen on the other half."""
    return next(f["threshold"] for f in result["folds"][name] if seed in f["judged_seeds"])


def example(rows, result: dict[str, Any], out: Path, pngs: dict[str, Path]) -> list[Block]:
    """One mid-run break of the first chosen rung that has one, in the first arm (qk-norm off, no z-loss):
    its loss, largest max |score| and fewest effective words over steps, with the alarms it was judged by."""
    from attnscale.analysis import recipe_judging as rs
    from attnscale.report import warn_plots

    broke = [(r, o) for r, o in zip(rows, result["outcomes"]) if o["broke"] is not None
             and o["lr"] in result["pilot"]["chosen"]]
    if not broke:
        return []
    row, o = min(broke, key=lambda ro: (list(dict.fromkeys(r["arm"] for r in rows)).index(ro[0]["arm"]),
                                        ro[0]["lr"], ro[0]["seed"]))
    outcome = rs.outcome_of(row, result["level"], result["floor"], math.inf)
    by = {d.name: d for d in rs.STUDY_DETECTORS}
    marks = {}
    for name in EXAMPLE_DETECTORS:
        w = rs.watched(row, outcome, by[name], threshold_for(result, name, row["seed"]))
        marks[name] = w.alarm if w is not None and w.alarm is not None and w.alarm < o["broke"] else None
    path = out / f"{EXAMPLE_PNG}.png"
    pngs[EXAMPLE_PNG] = warn_plots.example_run(row["series"], marks, o["broke"], path,
                                               f"{row['arm']}, lr {row['lr']:g}, seed {row['seed']}")
    return [Image(f"{EXAMPLE_PNG}.png", f"One mid-run break ({row['arm']} at {row['lr']:g}, seed {row['seed']}): the "
                  "training loss, the largest max |score| and the fewest effective words of any head over steps; dashed, "
                  "the first alarm before the break of " + ", ".join(EXAMPLE_DETECTORS) + " at the thresholds the run "
                  "was judged by (none drawn: no alarm before the break); grey, the break.")]


def section(result: dict[str, Any], unfinished=()) -> list[Block]:
    """The blocks for ``recipe_study.judged``'s ``result``."""
    p = result["pilot"]
    chosen = " and ".join(f"{lr:g}" for lr in p["chosen"])
    seeds = len(result["halves"]["first"]) + len(result["halves"]["second"])
    b: list[Block] = opening(TITLE, (
        "Wortsman et al. 2023's small-scale recipe in four arms (qk-norm off/on × z-loss 0/1e-4) over a learning-rate "
        f"ladder, {seeds} seeds on the rungs its pilot chose ({chosen}) and fewer elsewhere. A run *learned* when its 20-step "
        f"mean loss went under {p['level']:.3f} nats (halfway from the no-attention floor, {p['floor']:.3f}, to the "
        f"pilot's best run, {p['best']:.3f}); a *mid-run break* is a learned run whose 20-step mean rose 0.5 nats above "
        "its running minimum and stayed 0.3 above it for 50 steps, or whose loss went non-finite. Each detector is "
        "judged within a cell (arm × rate), at thresholds chosen on the other half of the seeds; a hit is an alarm "
        "strictly before the break. Rules: docs/warn-study.md, fixed before the study's seeds ran."))
    if unfinished:
        b.append(Para(f"{len(unfinished)} runs are not finished; the numbers below leave them out."))
    b.append(Table(("arm", "lr", "runs", "learned", "broke mid-run (seed halves)", "degraded", "never learned"),
                   [[c["arm"], f"{c['lr']:g}", c["runs"], c["learned"],
                     f"{c['mid_run_breaks']} ({c['mid_run_breaks_by_half']['first']} + "
                     f"{c['mid_run_breaks_by_half']['second']})", c["degraded"], c["never_learned"]]
                    for c in result["cells"]]))
    folds = result["folds"]
    for c in result["cells"]:
        if c["lr"] not in p["chosen"]:
            continue
        rows = []
        for name, d in c["detectors"].items():
            v = c["versus"]["loss_spike"].get(name)
            thresholds = "/".join("none" if f["threshold"] is None else f"{f['threshold']:g}" for f in folds[name])
            rows.append([name, thresholds, hits_text(d["hits"]), per_1000_text(d["false_alarms"]), lead_text(d["lead"]),
                         "—" if v is None else v["verdict"] + (" (Holm holds)" if v["holds"] else ""),
                         _auc_text(d["predicts_degraded"]["0.25"])])
        b.append(Para(f"{c['arm']} at {c['lr']:g}: mid-run breaks {c['mid_run_breaks']} of {c['learned']} learned "
                      f"runs ({c['runs']} runs)."))
        b.append(Table(("detector", "thresholds (fold 1/2)", "hits [95% Wilson]", "false alarms / 1,000 steps [95%]",
                        "median lead, steps [95%]", "vs the loss's spike", "AUC for a degraded end at 25%"), rows))
    v = result["verdict"]
    b.append(Para("The defaults' rule: " + v["rule"]))
    reasons = [f"{name}: " + "; ".join(d["why_not"]) for name, d in v["detectors"].items() if not d["qualifies"]]
    if v["defaults"]:
        b.append(Para(f"Met by: {', '.join(v['defaults'])}."))
    if reasons:
        b.append(Bullets("Not met:", reasons))
    return b
