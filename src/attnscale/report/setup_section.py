"""The report section "Beyond the course: how the end of training depends on the setup".

``blocks(runs, out, pngs)`` returns block tuples (``render.py``) from the setup
studies' run records (groups ``study:<axis>``), one part per study (a folder of
them, at one width: two studies are never pooled), and draws their figures into
``out``; ``notes(runs)`` gives, per end-of-training claim key
(``course.Claim.key``), the sentence a verdict that does not agree carries, from
the studies at the course's width, 1,024. The numbers come from ``analysis.setups``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscale.report import course
from attnscale.report.blocks import Block, Heading, Para, Bullets, Image, Table, opening
from attnscale.analysis.estimates import plus_minus
from attnscale.lm import study_axes as axes
from attnscale.analysis import setups as sa

__all__ = ["TITLE", "COURSE_WIDTH", "study_runs", "studies", "summary", "notes", "blocks"]

TITLE = "Beyond the course: how the end of training depends on the setup"
COURSE_WIDTH = course.COURSE_WIDTH  # the course's end-of-training claims are at d=1,024


def study_runs(runs) -> list:
    return [t for t in runs.train if axes.is_study(t)]


def studies(runs) -> dict[tuple[str, int], list]:
    """The study runs by (folder, width): one study each."""
    out: dict[tuple[str, int], list] = {}
    for t in study_runs(runs):
        out.setdefault((t.path.parent.relative_to(runs.root).as_posix() or ".", t.head_dim), []).append(t)
    return out


def summary(study: list) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """(summary rows, claims across setups) of one study's finished runs; empty where none finished."""
    rows = [sa.run_row(t) for t in study]
    finished = [r for r in rows if r["status"] in ("done", "diverged")]
    if not finished:
        return [], {}
    table = sa.summary_rows(finished)
    return table, sa.claims(table)


def notes(runs) -> dict[str, str]:
    """Claim key -> what the setup studies at width 1,024 measured about it ({} without one)."""
    out: dict[str, list[str]] = {}
    mine = {k: v for k, v in studies(runs).items() if k[1] == COURSE_WIDTH}
    for (folder, _), study in mine.items():
        table, judged = summary(study)
        for key in sa.CLAIM_WORDS:
            text = sa.explain(key, table, judged)
            if text:
                out.setdefault(key, []).append(text + (f" [{folder}]" if len(mine) > 1 else ""))
    return {k: "; ".join(v) for k, v in out.items()}


def _table(table: list[dict[str, Any]]) -> tuple:
    head = ["setup", "spread, no scale", "max layer", "frozen, no scale", "eff. words, no scale", "ppl, no scale",
            "spread, 1/√d", "frozen, 1/√d", "ppl, 1/√d", "gap (points; share of 1/√d ppl)",
            "runs done (no scale + 1/√d)"]
    rows = []
    for setup in dict.fromkeys((r["axis"], r["value"]) for r in table):
        none, scaled = sa.pair(table, setup)
        n, s = none or {}, scaled or {}
        g, se, k, ref = sa.gap(none, scaled)
        share = f" ({100 * g / ref:.0f}%)" if g is not None and ref else ""
        rows.append([sa.setup_name(setup),
                     plus_minus(n.get("end_spread"), n.get("end_spread_se"), "{:,.0f}"),
                     plus_minus(n.get("end_spread_max_layer"), None, "{:,.0f}"),
                     plus_minus(n.get("end_frozen_fraction"), n.get("end_frozen_fraction_se"), "{:.1%}"),
                     plus_minus(n.get("end_effective_words"), n.get("end_effective_words_se"), "{:.2f}"),
                     plus_minus(n.get("perplexity"), n.get("perplexity_se"), "{:.2f}"),
                     plus_minus(s.get("end_spread"), s.get("end_spread_se"), "{:.2f}"),
                     plus_minus(s.get("end_frozen_fraction"), s.get("end_frozen_fraction_se"), "{:.1%}"),
                     plus_minus(s.get("perplexity"), s.get("perplexity_se"), "{:.2f}"),
                     "—" if g is None else plus_minus(g, se, "{:+.2f}") + share,
                     f"{n.get('done', 0)}+{s.get('done', 0)} of {n.get('seeds', 0)}+{s.get('seeds', 0)}"])
    return Table(head, rows)


def _claims_table(table, judged) -> tuple:
    head = ["the course's claim at d=1,024", "direction holds in", "size holds in", "setups where the size holds"]
    rows = []
    for key, (direction, size) in sa.CLAIM_WORDS.items():
        c = judged.get(key)
        if not c or not c["setups"]:
            continue
        n = len(c["setups"])
        def undecided(part):
            k = len(c.get(f"{part}_undecided", []))
            return f" ({k} undecided)" if k else ""

        rows.append([f"{direction}; {size}",
                     f"{len(c['direction'])} of {len(c['direction_setups'])}" + undecided("direction"),
                     f"{len(c['size'])} of {n}" + undecided("size"),
                     "; ".join(f"{sa.setup_name(s)}: {sa.value_text(table, s, key)}" for s in c["size"]) or "none"])
    return Table(head, rows)


def _panels(table) -> dict[str, list[tuple[str, dict[str, tuple]]]]:
    """Per axis: the base's value and the axis's values, in order, with each scheme's end spread."""
    base = [r for r in table if r["axis"] == "base"]
    out: dict[str, list] = {}
    for axis in axes.AXES:
        mine = [r for r in table if r["axis"] == axis]
        if not mine:
            continue
        points: dict[Any, dict[str, tuple]] = {}
        raw = {}
        for r in base:
            v = r["settings"][axis]
            raw[axes.label(axis, v)] = v
            points.setdefault(axes.label(axis, v), {})[r["scale"]] = (r["end_spread"], r["end_spread_se"])
        for r in mine:
            raw[r["value"]] = r["settings"][axis]
            points.setdefault(r["value"], {})[r["scale"]] = (r["end_spread"], r["end_spread_se"])
        order = sorted(points, key=lambda k: (0, raw[k], "") if isinstance(raw[k], (int, float)) else (1, 0, str(raw[k])))
        base_label = axes.label(axis, base[0]["settings"][axis]) if base else None
        out[axes.AXIS_NAMES[axis]] = [(f"{k} (base)" if k == base_label else k, points[k]) for k in order]
    return out


def blocks(runs, out: Path, pngs: dict[str, Path]) -> list[Block]:
    """The section's blocks (none without a run of a study): one part per study."""
    found = studies(runs)
    if not found:
        return []
    b = opening(TITLE, (
        "The course's end of training at width 1,024 (spread over 5,000 and 99.9% of rows frozen without the "
        "scale; around 3.4 with it; 17–18 points of perplexity) depends on how the model is trained. The setup "
        "study (`attnscale study`, run on its own; `reproduce --full` prints the command) trains a base setup and "
        "the same with one setting changed at a time (or several together, `--combine`), with and without the scale, "
        "over seeds. End of training: "
        "layer 0 (mean over its heads) at the last recorded step, as the claims above read it, of the runs that "
        "finished, ± SE over seeds; max layer: the largest layer's spread. A claim's direction holds where "
        "training moves the measure the course's way; its size, where the course's figure is reached (the "
        "tolerances of the claims above); each on the 95% t interval over seeds, and undecided where that "
        "interval covers both answers."))
    for (folder, head_dim), study in found.items():
        b += _one(folder, head_dim, study, len(found) > 1, out, pngs)
    return b


def _one(folder: str, head_dim: int, study: list, several: bool, out: Path, pngs: dict[str, Path]) -> list[Block]:
    from attnscale.report import plots

    b: list[Block] = []
    base = next((t for t in study if t.group == axes.GROUP_PREFIX + "base"), None)
    if several:
        b.append(Heading(3, f"The study in {folder}, d={head_dim:,}"))
    if base is None:
        b.append(Para(f"Its base runs are not in the records, so the setups below have nothing to compare with "
                       f"({folder})."))
    else:
        settings = ", ".join(f"{axes.AXIS_NAMES[a]} {axes.label(a, axes.value_of(a, base.model, base.train))}"
                             for a in axes.AXES)
        b.append(Para(f"Width {head_dim:,}; base setup: {settings}" + ("" if folder == "." else f" ({folder}/)") + "."))
    unfinished = [f"{t.run_id}: {t.status}" for t in study if t.status not in ("done", "diverged")]
    if unfinished:
        b.append(Bullets("Study runs not finished (not counted):", unfinished))
    diverged = [f"{t.run_id}: diverged at step {t.diverged_at}" for t in study if t.status == "diverged"]
    if diverged:
        b.append(Bullets("Study runs that diverged (left out of the end-of-training means):", diverged))
    table, judged = summary(study)
    if not table:
        return b
    b.append(_claims_table(table, judged))
    panels = _panels(table)
    if panels:
        name = f"study-end-spread-{len(pngs)}" if several else "study-end-spread"
        lines = {"5,000": (course.END_SPREAD, "none"), "3.4": (course.SCALED_SPREAD, course.SCALED)}
        pngs[name] = plots.end_spread_by_setup(panels, lines, out / f"{name}.png",
                                               f"Spread at the end of training, d={head_dim:,}, by setup")
        b.append(Image(f"{name}.png", "End-of-training spread against each setting, one panel per axis "
                                        "(base marked), without and with the scale, ± 1 SE over seeds"))
    b.append(_table(table))
    return b
