"""The learning-rate study's printout: per optimizer and width, each treatment's best loss, best rate, LR
sensitivity and stable range, then per rate its mean loss with the breaks and never-learned runs."""

from __future__ import annotations

from typing import Any

from attnscale.analysis import paired
from attnscale.experiments.alarm_study_text import share_text

__all__ = ["format_result", "mean_text"]


def mean_text(m: dict[str, Any]) -> str:
    """A mean with its t interval at the precision its SE sets (never "± 0.00"); "n=1, no interval" for one seed."""
    return paired.estimate_text(m["mean"], m["se"], m["n"], m["interval"], alike="every seed alike")


def _group(g: dict[str, Any]) -> list[str]:
    from attnscale.terminal import table

    state = "interim" if g["interim"] else "final"
    lines = [f"{g['optimizer']}, d_model {g['d_model']} ({state}: seeds "
             f"{', '.join(str(s) for s in next(iter(g['curves'].values()))['seeds']) or 'none whole'})"]
    rows = []
    for t, c in g["curves"].items():
        st = c.get("stable")
        rows.append([t, mean_text(c["best"]), "—" if "best_lr" not in c else f"{c['best_lr']:g}",
                     mean_text(c["sensitivity"]),
                     "—" if st is None else f"{st['low']:g}–{st['high']:g} (×{st['ratio']:g})"])
    lines += table(("treatment", "best loss [95%]", "best rate", "LR sensitivity [95%]", "within 0.05 nats"), rows, "<<><<")
    lrs = sorted({p["lr"] for c in g["curves"].values() for p in c["per_rate"]})
    per = []
    for t, c in g["curves"].items():
        at = {p["lr"]: p for p in c["per_rate"]}
        per.append([t] + ["—" if lr not in at or at[lr]["mean"] is None else
                          f"{at[lr]['mean']:.3f} b{at[lr]['mid_run_breaks']} n{at[lr]['never_learned']}" for lr in lrs])
    lines += table(("mean loss (b: breaks, n: never learned)", *[f"{lr:g}" for lr in lrs]), per, "<" + ">" * len(lrs))
    eq = g.get("alarm_clip_vs_clip")
    if eq is not None and eq["diff"] is not None:
        ci = eq["interval_90"]
        spread = ("the same on every seed" if eq["se"] == 0 else
                  f"90% {'—' if ci is None else f'[{ci[0]:+.4f}, {ci[1]:+.4f}]'}")
        lines.append(f"alarm-clip − clip, best loss: {eq['diff']:+.4f} nats, {spread}: {eq['verdict']} at ±{eq['margin']:g}")
    if g.get("alarm") and g["alarm"]["by_rate"]:
        lines += _alarm(g["alarm"])
    return lines


def _alarm(a: dict[str, Any]) -> list[str]:
    """The alarm in the none runs (read after the fact): over the grid, then fired/runs per rate and outcome."""
    def at(p):
        parts = [f"{what} {p['fired_' + what]}/{p[what]}" for what in ("broke", "held") if p[what]]
        return f"{p['lr']:g}: " + ", ".join(parts + ([f"never learnt {p['fired_never']}/{p['never_learned']}"]
                                                     if p["never_learned"] else []))

    per = " · ".join(at(p) for p in a["by_rate"])
    return [f"the alarm (max |score| > {a['level']:g}) in the none runs, read after the fact: ahead of the break "
            f"{share_text(a['sensitivity']['study'])}; in the runs that held {share_text(a['false_alarms'])}",
            f"  fired in/runs, by rate: {per}",
            "  by level: ahead of k (smoothed dating: k') of the breaks; in k of the runs that held: " + " · ".join(
                f"{x['level']:g}: {x['sensitivity']['study']['k']} ({x['sensitivity']['smoothed']['k']}') of "
                f"{x['sensitivity']['study']['n']}; {x['false_alarms']['k']} of {x['false_alarms']['n']}"
                for x in a["ladder"])]


def format_result(result: dict[str, Any]) -> str:
    if result.get("pilot"):
        g = result["grid"]
        r1 = "none" if g["r1"] is None else f"{g['r1']:g}"
        return (f"Muon pilot: {len(result['rows'])} runs; r1 = {r1} ({g['why']}); Muon's grid: "
                f"{', '.join(f'{x:g}' for x in g['lrs'])}")
    if "groups" not in result:  # a block trained: its rows, judged as they stand
        from attnscale.experiments.lr_study import block

        result = block(result["rows"])
    lines = []
    for g in result["groups"]:
        lines += _group(g) + [""]
    if result.get("muon_pilot"):
        lines += _pilot(result["muon_pilot"])
    return "\n".join(lines).rstrip() or "no finished runs"


def _pilot(p: dict[str, Any]) -> list[str]:
    """The Muon pilot's held-out loss at each rate (b: broke mid-run at that step, n: never learned) and its grid."""
    from attnscale.terminal import table

    def cell(r):
        loss = "—" if r["valid_loss"] is None else f"{r['valid_loss']:.3f}"
        return loss + (" n" if r["learned_at"] is None else "" if r["break_step"] is None else f" b{r['break_step']}")

    lrs = sorted({r["lr"] for r in p["runs"]})
    at = {(r["treatment"], r["lr"]): r for r in p["runs"]}
    per = [[t] + [cell(at[t, lr]) if (t, lr) in at else "—" for lr in lrs]
           for t in sorted({r["treatment"] for r in p["runs"]}, key=lambda t: t != "none")]
    g = p["grid"]
    r1 = "none" if g["r1"] is None else f"{g['r1']:g}"
    return ([f"Muon pilot, seed {p['seed']} ({'whole' if p['whole'] else 'interim: not every run finished'})"]
            + table(("held-out loss (b: broke at, n: never learned)", *[f"{lr:g}" for lr in lrs]), per,
                    "<" + ">" * len(lrs))
            + [f"r1 = {r1}; Muon's grid: {', '.join(f'{x:g}' for x in g['lrs'])}"])
