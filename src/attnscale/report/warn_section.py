"""The report section "Warning before the break", from the divergence study's run records (``attnscale warn-study``).

``blocks(runs, out, pngs)`` returns blocks like the other sections and draws its figures into ``out``.
The numbers are ``experiments.warn_study.analyse`` of the records (the break rule and the detectors
are ``analysis.detectors``); this module only words and draws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscale.analysis import detectors as det
from attnscale.experiments import warn_study as ws
from attnscale.report.blocks import Block, Bullets, Image, Para, Table, opening

__all__ = ["GROUP", "TITLE", "blocks", "section", "reading", "rule_rows", "example"]

GROUP = ws.GROUP
TITLE = "Warning before the break"


def _pct(x, ci=None) -> str:
    if x is None:
        return "—"
    return f"{100 * x:.0f}%" + (f" [{100 * ci[0]:.0f}%, {100 * ci[1]:.0f}%]" if ci else " (no interval)")


def _num(x, ci=None) -> str:
    if x is None:
        return "—"
    return f"{x:g}" + (f" [{ci[0]:g}, {ci[1]:g}]" if ci else " (no interval)")


def rule_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every detector's warn rule, then the combined one where it beats them: its held-out numbers, keyed for the tables."""
    out = []
    for name, d in result["detectors"].items():
        if d["warn"] is not None:
            out.append({"key": name, "name": name, **d["warn"], "versus": result["versus_loss"].get(name)})
    if result["combined"] is not None:
        out.append({"key": "combined", "name": "combined", **result["combined"], "versus": None})
    return out


def _table(result) -> Table:
    head = ["detector", "rule (threshold chosen on the choosing seeds)", "hits (held out) [95%]",
            "false alarms (held out) [95%]", "median lead, steps [95%]", "lead quartiles", "median lead, share of run",
            "lead − the loss's, median [95%]"]
    rows = []
    for r in rule_rows(result):
        v = r["versus"]
        rows.append([r["name"], ws.rule_text(r["parts"]), f"{r['hits']} of {r['broken']}, {_pct(r['hit_rate'], r['hit_rate_ci'])}",
                     f"{r['false_alarms']} of {r['healthy']}, {_pct(r['false_alarm_rate'], r['false_alarm_rate_ci'])}",
                     _num(r["lead_median"], r["lead_median_ci"]),
                     "—" if r["lead_q1"] is None else f"{r['lead_q1']:g}–{r['lead_q3']:g}",
                     _pct(r["lead_share_median"], r["lead_share_median_ci"]),
                     "baseline" if r["key"] == "loss_spike" else "—" if v is None else
                     f"{_num(v['median'], v['ci'])}: {v['verdict']}"])
    missing = [n for n, d in result["detectors"].items() if d["warn"] is None]
    for n in missing:
        rows.append([n, f"no threshold fires on at most {100 * ws.TARGET_FALSE_ALARMS:g}% of the choosing seeds' healthy runs",
                     "—", "—", "—", "—", "—", "—"])
    return Table(head, rows)


def _cells(result) -> Table:
    cells = ws.breaks_by_cell(result)
    lrs = sorted({c["lr"] for c in cells})
    groups: dict[tuple, dict] = {}
    for c in cells:
        groups.setdefault((c["scale"], c["norm"], c["warmup"]), {})[c["lr"]] = c
    rows = []
    for (scale, norm, warmup), by in groups.items():
        rows.append([scale, f"{norm}-LN", warmup] + [
            "—" if lr not in by else f"{by[lr]['broken']} of {by[lr]['runs']}"
            + (f" ({', '.join(f'{k} {v}' for k, v in sorted(by[lr]['reasons'].items()))})" if by[lr]["reasons"] else "")
            for lr in lrs])
    return Table(["scale", "norm", "warm-up steps"] + [f"lr {lr:g}: broken" for lr in lrs], rows)


def reading(result: dict[str, Any]) -> list[str]:
    """What the numbers say, in sentences generated from them."""
    lines = []
    best = result["best"]
    if best is None:
        return ["No rule fires on few enough of the choosing seeds' healthy runs: the study names no rule."]
    lines.append(f"Best rule on the choosing seeds: {ws.rule_text(best['parts'])}; on the held-out seeds it warns "
                 f"{best['hits']} of {best['broken']} broken runs ({_pct(best['hit_rate'], best['hit_rate_ci'])}), a median "
                 f"{_num(best['lead_median'], best['lead_median_ci'])} steps before the break, and fires on "
                 f"{best['false_alarms']} of {best['healthy']} healthy runs ({_pct(best['false_alarm_rate'], best['false_alarm_rate_ci'])}).")
    later = [n for n, v in result["versus_loss"].items() if v["verdict"] != "earlier"]
    earlier = [n for n, v in result["versus_loss"].items() if v["verdict"] == "earlier"]
    if earlier:
        lines.append(f"Earlier than the loss's own spike detector at the same false-alarm target (the interval of the "
                     f"paired lead difference above 0): {', '.join(earlier)}.")
    if later:
        lines.append(f"Not earlier than the loss (interval covering 0, or below it): {', '.join(later)}. "
                     "There the watch gives no more warning than watching the loss.")
    stops = [(n, d["stop"]) for n, d in result["detectors"].items() if d["stop"] is not None
             and d["stop"]["false_alarm_rate"] is not None and d["stop"]["false_alarm_rate"] < ws.STOP_FALSE_ALARMS
             and d["stop"]["hits"] > 0]
    if stops:
        lines.append("Rules below 1% false alarms on the held-out seeds, with hits, for which \"stop\" could be used: "
                     + "; ".join(f"{ws.rule_text(s['parts'])} ({s['false_alarms']} of {s['healthy']} false alarms, "
                                 f"{s['hits']} of {s['broken']} hits)" for n, s in stops) + ".")
    else:
        lines.append("No rule with hits stays below 1% false alarms on the held-out seeds: \"stop\" is not recommended.")
    return lines


def example(result: dict[str, Any]):
    """A held-out broken run the best rule warned, its lead nearest the median: (row, that rule's alarm), or None."""
    best = result["best"]
    if best is None or best["lead_median"] is None:
        return None
    held = [r for r in result["rows"] if r["seed"] in result["held_out_seeds"] and r["break"] is not None]
    scored = []
    for r in held:
        alarm = det.combine_alarms(*(det.first_alarm(r["signals"][n], th, next(d.below for d in det.DETECTORS if d.name == n))
                                     for n, th in best["parts"]))
        if alarm is not None and alarm <= r["break"].step:
            scored.append((abs(r["break"].step - alarm - best["lead_median"]), r["run"], r, alarm))
    return min(scored, key=lambda x: x[:2])[2:] if scored else None


def blocks(runs, out: Path, pngs: dict[str, Path]) -> list[Block]:
    """The section's blocks (none without a run of the study); its figures are drawn into ``out``."""
    from attnscale.report.schemes_section import unigram

    study = [t for t in runs.train if t.group == GROUP]
    if not study:
        return []
    unfinished = [t.run_id for t in study if t.status not in ("done", "diverged")]
    return section(ws.analyse(study, unigram(study)), out, pngs, unfinished)


def section(result: dict[str, Any], out: Path, pngs: dict[str, Path], unfinished=()) -> list[Block]:
    """The section's blocks for ``warn_study.analyse``'s ``result``; its figures drawn into ``out``."""
    from attnscale.report import warn_plots

    b = opening(TITLE, (
        f"The divergence study (`attnscale warn-study`): the {result['family']} trained to the edge over a ladder of "
        "learning rates, without warm-up and with, every alert read as a detector at a probe every "
        f"{result['probe_every']} steps and the loss at every step. A run is {result['rule'].text()}"
        + (f" ({result['floor']:.3f} nats here)." if result["floor"] is not None else ".")
        + " A hit is a broken run whose first alarm comes at or before its break; a false alarm, a healthy run with any "
        f"alarm. Thresholds are chosen on seeds {', '.join(map(str, result['choosing_seeds']))} for at most "
        f"{100 * ws.TARGET_FALSE_ALARMS:g}% false alarms; every rate and lead below is read on the held-out seeds "
        f"{', '.join(map(str, result['held_out_seeds']))}: rates with 95% Wilson intervals, leads with 95% percentile "
        "intervals from resampling seeds (each seed with all its runs)."))
    if unfinished:
        b.append(Bullets("Study runs not finished (not counted):", unfinished[:20]))
    if not result["rows"]:
        return b
    b.append(_cells(result))
    b.append(Bullets("What the records show (generated from the numbers below):", reading(result)))
    b.append(_table(result))
    pngs["warn-curves"] = warn_plots.curves(result["detectors"], out / "warn-curves.png",
                                            f"{result['family']}: each alert over its thresholds (held-out seeds)")
    b.append(Image("warn-curves.png", "Hit rate against false-alarm rate over each detector's thresholds on the held-out "
                                      "seeds; the square is the threshold chosen on the other seeds, with its 95% "
                                      "Wilson intervals on both axes"))
    pngs["warn-leads"] = warn_plots.leads(rule_rows(result), out / "warn-leads.png",
                                          f"{result['family']}: lead before the break at the chosen thresholds")
    b.append(Image("warn-leads.png", "Median lead of each rule's held-out hits (dot), its 95% bootstrap interval over "
                                     "seeds (thick) and the quartiles (thin)"))
    ex = example(result)
    if ex is not None:
        row, alarm = ex
        marks = {"combined" if len(result["best"]["parts"]) > 1 else result["best"]["parts"][0][0]: alarm}
        base = result["detectors"]["loss_spike"]["warn"]
        if base is not None:
            marks["loss_spike"] = det.first_alarm(row["signals"]["loss_spike"], base["parts"][0][1])
        pngs["warn-example"] = warn_plots.example_run(row["series"], marks, row["break"].step, out / "warn-example.png",
                                                      f"{row['run']}: broken at {row['break'].step} ({row['break'].reason})")
        b.append(Image("warn-example.png", f"One held-out run ({row['run']}) over steps: the loss, the largest max |score| "
                                           "and the fewest effective words of any head, the best rule's first alarm "
                                           "and the loss baseline's (dashed), and the break (grey)"))
    return b
