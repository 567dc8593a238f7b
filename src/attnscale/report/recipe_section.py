"""The report section "Does attention warn before a learned run breaks?", from the recipe study's records.

``blocks(runs)`` finds the study's runs (``experiments.recipe_study.GROUP``) and the pilot the study
kept beside them (``recipe_study.PILOT_FILE``), judges them again (``recipe_study.judged``: the
numbers are ``analysis.recipe_judging``'s) and words them: the outcome counts per cell, each
detector's judged numbers in the chosen rungs' cells, and the defaults' rule applied.
"""

from __future__ import annotations

from typing import Any

from attnscale.report.blocks import Block, Bullets, Para, Table, opening

__all__ = ["TITLE", "blocks", "section", "hits_text", "per_1000_text", "lead_text"]

TITLE = "Does attention warn before a learned run breaks?"


def hits_text(hits: dict[str, Any]) -> str:
    """"k/n [lo%, hi%]" (Wilson), or "—" without a break to warn of."""
    if not hits["breaks"]:
        return "—"
    lo, hi = hits["ci"]
    return f"{hits['hits']}/{hits['breaks']} [{100 * lo:.0f}%, {100 * hi:.0f}%]"


def per_1000_text(fa: dict[str, Any]) -> str:
    """False alarms per 1,000 at-risk steps with its seed-bootstrap interval ("—" where no run held)."""
    if fa["per_1000"] is None:
        return "—"
    ci = fa["ci"]
    return f"{fa['per_1000']:.2f}" + (" (no interval)" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def lead_text(lead: dict[str, Any]) -> str:
    """Median lead in steps with its seed-bootstrap interval ("—" without a hit; one hit has no interval)."""
    if lead["median"] is None:
        return "—"
    ci = lead["ci"]
    if ci is None:
        return f"{lead['median']:g} (one run)" if lead.get("hits") == 1 else f"{lead['median']:g} (no interval)"
    return f"{lead['median']:g} [{ci[0]:g}, {ci[1]:g}]"


def _auc_text(got: dict[str, Any]) -> str:
    if got["auc"] is None:
        return "—"
    ci = got["ci"]
    return f"{got['auc']:.2f}" + (" (no interval)" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def blocks(runs) -> list[Block]:
    """The section (none without a run of the study or the pilot it kept)."""
    from attnscale.experiments import recipe_study

    mine = [t for t in runs.train if t.group == recipe_study.GROUP]
    pilot = recipe_study.read_kept_pilot(runs.root)
    if not mine or pilot is None:
        return []
    probe_every = int(mine[0].train.get("record_every", 10))
    unfinished = [t.run_id for t in mine if t.status not in ("done", "diverged")]
    return section(recipe_study.judged(recipe_study.rows_of(mine, probe_every), pilot, probe_every), unfinished)


def section(result: dict[str, Any], unfinished=()) -> list[Block]:
    """The blocks for ``recipe_study.judged``'s ``result``."""
    p = result["pilot"]
    chosen = " and ".join(f"{lr:g}" for lr in p["chosen"])
    b: list[Block] = opening(TITLE, (
        "Wortsman et al. 2023's small-scale recipe in four arms (qk-norm off/on × z-loss 0/1e-4) over a learning-rate "
        f"ladder, 16 seeds on the rungs its pilot chose ({chosen}) and fewer elsewhere. A run *learned* when its 20-step "
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
