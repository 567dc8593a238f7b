"""The report section "Warning before the break", from the divergence study's run records (``attnscale warn-study``).

``blocks(runs, out, pngs)`` returns blocks like the other sections and draws its figures into ``out``.
The numbers are ``analysis.alarms.analyse`` of the records (the first round's break rule is
``analysis.outcomes.first_round_break``, the detectors ``analysis.detectors``); this module only words and draws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscale.analysis import detectors as det
from attnscale.analysis import alarms
from attnscale.report.blocks import Block, Bullets, Heading, Image, Para, Table, opening

__all__ = ["GROUP", "TITLE", "blocks", "section", "reading", "rule_rows", "example"]

GROUP = alarms.GROUP
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
    for n, r in result.get("former", {}).items():
        out.append({"key": n if n != "together" else "combined", "name": f"former default: {alarms.rule_text(r['parts'])}"
                    if n != "together" else "former defaults together", **r, "versus": None, "former": True})
    return out


def _table(result) -> Table:
    head = ["detector", "rule (threshold chosen on the choosing seeds)", "hits (held out) [95%]",
            "false alarms (held out) [95%]", "median lead, steps [95%]", "lead quartiles", "median lead, share of run",
            "lead − the loss's, median [95%]"]
    rows = []
    for r in (r for r in rule_rows(result) if not r.get("former")):
        v = r["versus"]
        rows.append([r["name"], alarms.rule_text(r["parts"]), f"{r['hits']} of {r['broken']}, {_pct(r['hit_rate'], r['hit_rate_ci'])}",
                     f"{r['false_alarms']} of {r['healthy']}, {_pct(r['false_alarm_rate'], r['false_alarm_rate_ci'])}",
                     _num(r["lead_median"], r["lead_median_ci"]),
                     "—" if r["lead_q1"] is None else f"{r['lead_q1']:g}–{r['lead_q3']:g}",
                     _pct(r["lead_share_median"], r["lead_share_median_ci"]),
                     "baseline" if r["key"] == alarms.BASELINE else "—" if v is None else
                     v["verdict"] if v["median"] is None else f"{_num(v['median'], v['ci'])}: {v['verdict']}"])
    for n, r in result["former"].items():
        rows.append([f"former default: {n}", alarms.rule_text(r["parts"]),
                     f"{r['hits']} of {r['broken']}, {_pct(r['hit_rate'], r['hit_rate_ci'])}",
                     f"{r['false_alarms']} of {r['healthy']}, {_pct(r['false_alarm_rate'], r['false_alarm_rate_ci'])}",
                     _num(r["lead_median"], r["lead_median_ci"]),
                     "—" if r["lead_q1"] is None else f"{r['lead_q1']:g}–{r['lead_q3']:g}",
                     _pct(r["lead_share_median"], r["lead_share_median_ci"]), "—"])
    missing = [n for n, d in result["detectors"].items() if d["warn"] is None]
    for n in missing:
        rows.append([n, f"no threshold fires on at most {100 * alarms.TARGET_FALSE_ALARMS:g}% of the choosing seeds' healthy runs",
                     "—", "—", "—", "—", "—", "—"])
    return Table(head, rows)


def _cells(result) -> Table:
    cells = alarms.breaks_by_cell(result)
    lrs = sorted({c["lr"] for c in cells})
    groups: dict[tuple, dict] = {}
    for c in cells:
        groups.setdefault((c["scale"], c["norm"], c["warmup"]), {})[c["lr"]] = c
    rows = []
    for (scale, norm, warmup), by in groups.items():
        rows.append([scale, f"{norm}-LN" if norm in ("pre", "post") else norm, warmup] + [
            "—" if lr not in by else f"{by[lr]['broken']} of {by[lr]['runs']}"
            + (f" ({', '.join(f'{k} {v}' for k, v in sorted(by[lr]['reasons'].items()))})" if by[lr]["reasons"] else "")
            for lr in lrs])
    return Table(["scale", "norm", "warm-up steps"] + [f"lr {lr:g}: broken" for lr in lrs], rows)


def reading(result: dict[str, Any]) -> list[str]:
    """What the numbers say, in sentences generated from them."""
    lines = []
    best = result["best"]
    base = result["detectors"][alarms.BASELINE]["warn"]
    if base is not None:
        lines.append(f"The loss's own spike detector ({alarms.rule_text(base['parts'])}, chosen the same way) warns {base['hits']} "
                     f"of {base['broken']} held-out broken runs ({_pct(base['hit_rate'], base['hit_rate_ci'])}) and fires "
                     f"on {base['false_alarms']} of {base['healthy']} healthy ones "
                     f"({_pct(base['false_alarm_rate'], base['false_alarm_rate_ci'])}).")
    if best is None:
        lines.append(f"No alert of the watch warns any broken run of the choosing seeds while firing on at most "
                     f"{100 * alarms.TARGET_FALSE_ALARMS:g}% of their healthy runs: at that false-alarm rate the watch "
                     "gives no warning here.")
    else:
        lines.append(f"Best rule of the watch on the choosing seeds: {alarms.rule_text(best['parts'])}; on the held-out seeds it "
                     f"warns {best['hits']} of {best['broken']} broken runs ({_pct(best['hit_rate'], best['hit_rate_ci'])}), a "
                     f"median {_num(best['lead_median'], best['lead_median_ci'])} steps before the break, and fires on "
                     f"{best['false_alarms']} of {best['healthy']} healthy runs "
                     f"({_pct(best['false_alarm_rate'], best['false_alarm_rate_ci'])}).")
    by = {v: [n for n, x in result["versus_loss"].items() if x["verdict"] == v]
          for v in ("earlier", "inconclusive", "later", "neither warns")}
    if by["earlier"]:
        lines.append(f"Earlier than the loss's own spike detector, each chosen at the same false-alarm target (the 95% "
                     f"interval of the median paired lead difference, a miss counting 0, above 0): {', '.join(by['earlier'])}.")
    if by["inconclusive"] or by["later"] or by["neither warns"]:
        lines.append("Not shown earlier than the loss: " + "; ".join(
            f"{', '.join(by[v])} ({ {'inconclusive': 'interval covering 0: inconclusive', 'later': 'later'}.get(v, 'neither it nor the loss warned a held-out broken run at its chosen threshold')})"
            for v in ("inconclusive", "later", "neither warns") if by[v]) + ". There the watch is not shown to warn before the loss does.")
    early = [r for r in result["rows"] if r["break"] is not None and r["break"].step == result["rule"].floor_window - 1]
    broken = [r for r in result["rows"] if r["break"] is not None]
    if early:
        lines.append(f"{len(early)} of the {len(broken)} broken runs never got off the unigram plateau: their break is the "
                     f"end of the first {result['rule'].floor_window}-step window (step {result['rule'].floor_window - 1}), "
                     f"so a probe every {result['probe_every']} steps can lead it by "
                     f"{', '.join(str(result['rule'].floor_window - 1 - s) for s in range(result['probe_every'], result['rule'].floor_window, result['probe_every']))} steps "
                     "at most: a lead interval such as [14, 14] is that grid, every resample of seeds giving the same median.")
    d = result["default"]
    lines.append(f"The watch's default alerts from this study ({alarms.rule_text(d['parts'])}): on the held-out seeds they "
                 f"fire on {d['false_alarms']} of {d['healthy']} healthy runs ({_pct(d['false_alarm_rate'], d['false_alarm_rate_ci'])}) "
                 f"and warn {d['hits']} of {d['broken']} broken ones ({_pct(d['hit_rate'], d['hit_rate_ci'])})"
                 + (f", a median {_num(d['lead_median'], d['lead_median_ci'])} steps ahead." if d["lead_median"] is not None else "."))
    f = result["former"]["together"]
    lines.append(f"The watch's defaults before this study ({alarms.rule_text(f['parts'])}) warn {f['hits']} of {f['broken']} "
                 f"held-out broken runs ({_pct(f['hit_rate'], f['hit_rate_ci'])})"
                 + (f", a median {_num(f['lead_median'], f['lead_median_ci'])} steps ahead," if f["lead_median"] is not None else ",")
                 + f" and fire on {f['false_alarms']} of {f['healthy']} healthy ones ({_pct(f['false_alarm_rate'], f['false_alarm_rate_ci'])}).")
    stops = [(n, d["stop"]) for n, d in result["detectors"].items() if d["stop"] is not None and n != alarms.BASELINE
             and d["stop"]["false_alarm_rate"] is not None and d["stop"]["false_alarm_rate"] < alarms.STOP_FALSE_ALARMS
             and d["stop"]["hits"] > 0]
    if stops:
        lines.append("Rules below 1% false alarms on the held-out seeds, with hits, for which \"stop\" could be used: "
                     + "; ".join(f"{alarms.rule_text(s['parts'])} ({s['false_alarms']} of {s['healthy']} false alarms, "
                                 f"{s['hits']} of {s['broken']} hits)" for n, s in stops) + ".")
    else:
        lines.append("No rule with hits stays below 1% false alarms on the held-out seeds: \"stop\" is not recommended.")
    return lines


def example(result: dict[str, Any]):
    """A held-out broken run the best rule warned (the former defaults where the study has no rule), its lead
    nearest the median: (row, that rule's alarm), or None."""
    best = result["best"] if result["best"] is not None else result["former"]["together"]
    if best["lead_median"] is None:
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
    families = [f for f in alarms.FAMILIES if any(alarms.family_of(t) == f for t in study)]
    results = []
    for f in families:
        runs_f = [t for t in study if alarms.family_of(t) == f]
        unfinished = [t.run_id for t in runs_f if t.status not in ("done", "diverged")]
        results.append((alarms.analyse(runs_f, unigram(runs_f), family=f), unfinished))
    if len(results) == 1:
        return section(results[0][0], out, pngs, results[0][1])
    b: list[Block] = [Heading(2, TITLE), Para(
        "The divergence study (`attnscale warn-study`) per model family: each trained to the edge, judged by one "
        "break rule, its thresholds chosen on half its seeds and read on the other half. The families' numbers are "
        "apart: a rule chosen on one family is not judged on the other.")]
    for result, unfinished in results:
        b += section(result, out, pngs, unfinished, heading=3)
    return b


def _figure(name: str, result: dict[str, Any]) -> str:
    """A figure's name: the tiny LM's as the section always drew them, another family's with its key."""
    return name if result["key"] == "tiny" else f"{name}-{result['key']}"


def section(result: dict[str, Any], out: Path, pngs: dict[str, Path], unfinished=(), heading: int = 2) -> list[Block]:
    """The section's blocks for ``alarms.analyse``'s ``result`` (under the section's title, or with ``heading=3``
    under its family's name, a part of the section); its figures drawn into ``out``."""
    from attnscale.report import warn_plots

    text = (
        f"The divergence study (`attnscale warn-study`): the {result['family']} trained to the edge over a ladder of "
        "learning rates, without warm-up and with, every alert read as a detector at a probe every "
        f"{result['probe_every']} steps and the loss at every step. A run is {result['rule'].text()}"
        + (f" ({result['floor']:.3f} nats here)." if result["floor"] is not None else ".")
        + " A hit is a broken run whose first alarm comes at or before its break; a false alarm, a healthy run with any "
        f"alarm. Thresholds are chosen on seeds {', '.join(map(str, result['choosing_seeds']))} for at most "
        f"{100 * alarms.TARGET_FALSE_ALARMS:g}% false alarms; every rate and lead below is read on the held-out seeds "
        f"{', '.join(map(str, result['held_out_seeds']))}: rates with 95% Wilson intervals, leads with 95% percentile "
        "intervals from resampling seeds (each seed with all its runs).")
    b = opening(TITLE, text) if heading == 2 else [Heading(3, f"The {result['family']}"), Para(text)]
    if unfinished:
        b.append(Bullets("Study runs not finished (not counted):", unfinished[:20]))
    if not result["rows"]:
        return b
    b.append(_cells(result))
    b.append(Bullets("What the records show (generated from the numbers below):", reading(result)))
    b.append(_table(result))
    curves, leads, example_png = (_figure(n, result) for n in ("warn-curves", "warn-leads", "warn-example"))
    pngs[curves] = warn_plots.curves(result["detectors"], out / f"{curves}.png",
                                     f"{result['family']}: each alert over its thresholds (held-out seeds)")
    b.append(Image(f"{curves}.png", "Hit rate against false-alarm rate over each detector's thresholds on the held-out "
                                      "seeds; the square is the threshold chosen on the other seeds, with its 95% "
                                      "Wilson intervals on both axes"))
    pngs[leads] = warn_plots.leads(rule_rows(result), out / f"{leads}.png",
                                   f"{result['family']}: lead before the break at the chosen thresholds")
    b.append(Image(f"{leads}.png", "Median lead of each rule's held-out hits (dot), its 95% bootstrap interval over "
                                     "seeds (thick) and the quartiles (thin)"))
    ex = example(result)
    if ex is not None:
        row, alarm = ex
        rule = result["best"] or result["former"]["together"]
        marks = {("combined" if result["best"] else "former defaults") if len(rule["parts"]) > 1 else rule["parts"][0][0]: alarm}
        base = result["detectors"]["loss_spike"]["warn"]
        if base is not None:
            marks["loss_spike"] = det.first_alarm(row["signals"]["loss_spike"], base["parts"][0][1])
        pngs[example_png] = warn_plots.example_run(row["series"], marks, row["break"].step, out / f"{example_png}.png",
                                                   f"{row['run']}: broken at {row['break'].step} ({row['break'].reason})")
        b.append(Image(f"{example_png}.png", f"One held-out run ({row['run']}) over steps: the loss, the largest max |score| "
                                           "and the fewest effective words of any head, the first alarm of "
                                           + ("the best rule" if result["best"] else "the former defaults together")
                                           + " and of the loss baseline (dashed), and the break (grey)"))
    return b
