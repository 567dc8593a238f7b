"""The setup study's analysis: how each end-of-training claim of the course depends on the setup.

Pure functions of plain rows, shared by ``attnscale study`` and the report.
``run_row`` reads one training run (a ``runs.record.TrainRun``, by its
attributes only); everything after it works on plain numbers.

A setup is the base, or the base with one setting changed (an axis and its
value, ``lm.study_axes``) or several together (a combined axis); a run's axis is its record group ``study:<axis>``, its value
is read from its recorded config. Per setup and scale: the end of training as
the dynamics claims read it (layer 0, ``course_figures.COURSE_LAYER``, mean over its
heads, at the last recorded step; the mean over all layers kept beside) of the
runs that finished ("done"; a diverged run's last recorded step is not an end
of training, so it is counted apart), averaged over seeds with the SE of that
mean (``estimates.mean_se``). One study is one base setup at one width: rows of
several are refused (the report keeps each study folder apart). Per setup, four
of the course's claims, each judged twice with the report's own thresholds and
rule (``course_figures``, ``judging``: on the 95% t interval over seeds, so each part
is established, contradicted or undecided): its direction (training moves the
measure the way the course says) and its size (the course's figure is reached):

- end_spread: without the scale the spread grows (end > start); size > 5,000;
- end_frozen: without the scale the frozen share does not fall (end ≥ start); size ≥ 99%;
- scaled_spread: with the scale the end spread is below the unscaled run's; size 3.4 ± 30%;
- big_gap: the scale helps (perplexity gap > 0); size 16.5–18.5 points; pairs by seed throughout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from attnscale.analysis import course_figures as figures, estimates, intervals, judging
from attnscale.lm.study_axes import AXES, GROUP_PREFIX, combined, label, parts, setting_text, value_of

__all__ = ["run_row", "summary_rows", "setups", "pair", "gap", "claims", "setup_name", "value_text", "explain", "format_text", "CLAIM_WORDS"]

SCALED = figures.SCALED
CLAIM_WORDS = {
    "end_spread": ("without the scale the spread grows", "over 5,000"),
    "end_frozen": ("without the scale rows stay frozen or freeze more", "≥ 99% of rows frozen"),
    "scaled_spread": ("with the scale the spread stays below the unscaled run's", "around 3.4 (± 30%)"),
    "big_gap": ("the scale helps perplexity", "by 16.5–18.5 points"),
}


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def run_row(t: Any) -> dict[str, Any]:
    """One study run as plain numbers: its axis, value, scale, seed, status, and the diagnostics
    at the first and last recorded step in the course's layer (mean over its heads), the spread over all
    layers beside it (their mean, and per layer at the end)."""
    axis = t.group[len(GROUP_PREFIX):]
    row = {"run": t.run_id, "axis": axis, "value": None if axis == "base" else value_of(axis, t.model, t.train),
           "scale": t.scale, "seed": t.seed, "head_dim": t.head_dim, "status": t.status, "steps_done": t.steps_done,
           "perplexity": t.perplexity, "settings": {a: value_of(a, t.model, t.train) for a in AXES}}  # every axis
    has = t.line("first") is not None
    for key in ("spread", "frozen_fraction", "effective_words"):
        row[f"start_{key}"] = t.layer_means("first", key)[figures.COURSE_LAYER] if has else None
        row[f"end_{key}"] = t.layer_means("last", key)[figures.COURSE_LAYER] if has else None
    row["end_spread_all_layers"] = t.diag_mean("last", "spread") if has else None
    row["end_spread_by_layer"] = t.layer_means("last", "spread") if has else []
    return row


def _key(row: Mapping[str, Any]) -> tuple[str, str]:
    return row["axis"], "base" if row["axis"] == "base" else label(row["axis"], row["value"])


def setups(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(axis, value label) of every setup in ``rows``, the base first, then the axes in ``AXES`` order by
    value, then the combinations by the axes they combine."""
    keys = {_key(r): r for r in rows}
    order = {a: i for i, a in enumerate(["base", *AXES])}

    def sort(k):
        v = keys[k]["value"]
        if combined(k[0]):
            return len(order), tuple(order[a] for a in parts(k[0])), (1, 0, k[1])
        return order.get(k[0], len(order)), (), (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
    return sorted(keys, key=sort)


def summary_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per setup and scale: seeds, runs done and diverged, and mean ± SE over the finished
    seeds of the end of training. ``rows`` are one study's: a ValueError where they mix widths or
    two runs claim one setup, scale and seed (two studies in one list)."""
    if len({r["head_dim"] for r in rows}) > 1:
        raise ValueError(f"setup-study rows of several widths ({sorted({r['head_dim'] for r in rows})}); "
                         "summarise one study at a time")
    seen = [(_key(r), r["scale"], r["seed"]) for r in rows]
    if len(set(seen)) != len(seen):
        raise ValueError("two setup-study runs of the same setup, scale and seed; summarise one study at a time")
    out = []
    for setup in setups(rows):
        for scale in dict.fromkeys(r["scale"] for r in rows):
            mine = [r for r in rows if _key(r) == setup and r["scale"] == scale]
            if not mine:
                continue
            done = [r for r in mine if r["status"] == "done"]
            s: dict[str, Any] = {"axis": setup[0], "value": setup[1], "scale": scale, "seeds": len(mine),
                                 "done": len(done), "head_dim": mine[0]["head_dim"],
                                 "diverged": [(r["seed"], r["steps_done"]) for r in mine if r["status"] == "diverged"],
                                 "steps": max((r["steps_done"] or 0) for r in mine),
                                 "settings": mine[0]["settings"]}
            for key in ("start_spread", "end_spread", "start_frozen_fraction", "end_frozen_fraction",
                        "end_effective_words", "perplexity", "end_spread_all_layers"):
                values = _finite(r.get(key) for r in done)
                s[key], s[f"{key}_se"] = estimates.mean_se(values)
                s[f"{key}_n"] = len(values)
            s["_by_seed"] = {key: {r["seed"]: r[key] for r in done if r[key] is not None}
                             for key in ("start_spread", "end_spread", "start_frozen_fraction", "end_frozen_fraction")}
            layers = [r["end_spread_by_layer"] for r in done if r["end_spread_by_layer"]]
            s["end_spread_max_layer"] = max((max(_finite(ls)) for ls in layers if _finite(ls)), default=None)
            s["_ppl_by_seed"] = {r["seed"]: r["perplexity"] for r in done if r["perplexity"] is not None}
            out.append(s)
    return out


def pair(summary: Sequence[Mapping[str, Any]], setup: tuple[str, str]) -> tuple[Mapping | None, Mapping | None]:
    got = {r["scale"]: r for r in summary if (r["axis"], r["value"]) == setup}
    return got.get("none"), got.get(SCALED)


def gap(none: Mapping | None, scaled: Mapping | None) -> tuple[float | None, float | None, int, float | None]:
    """ppl(none) − ppl(scaled) over the seeds both finished (paired), its SE, those seeds, and the
    scaled model's mean perplexity over the same seeds (what a share of the gap divides by)."""
    if none is None or scaled is None:
        return None, None, 0, None
    seeds = sorted(set(none["_ppl_by_seed"]) & set(scaled["_ppl_by_seed"]), key=str)
    diffs = [none["_ppl_by_seed"][s] - scaled["_ppl_by_seed"][s] for s in seeds]
    m, se = estimates.mean_se(diffs)
    ref = estimates.mean_se([scaled["_ppl_by_seed"][s] for s in seeds])[0]
    return m, se, len(diffs), ref


def _ends(row: Mapping[str, Any], key: str) -> tuple[float, float]:
    """The 95% t interval over seeds of ``row[key]`` (the value itself where there is none)."""
    m = row[key]
    return intervals.interval(m, row[f"{key}_se"], row[f"{key}_n"]) or (m, m)


def _paired_side(a: Mapping[str, float], b: Mapping[str, float], holds) -> str | None:
    """Whether ``holds`` of a − b paired by seed, on its 95% t interval (None without a common seed)."""
    d = intervals.paired(a, b)
    if d["diff"] is None:
        return None
    lo, hi = d["interval"] or (d["diff"], d["diff"])
    return judging.side(lo, hi, holds)


def _judge(key: str, none: Mapping | None, scaled: Mapping | None) -> tuple[str | None, str | None]:
    """(direction, size) of one claim in one setup, each ``judging.HOLDS``, ``FAILS`` or ``UNDECIDED``
    on the 95% t interval over seeds (paired by seed where two measures are compared); None where the
    runs needed are missing."""
    if key in ("end_spread", "end_frozen"):
        measure = "spread" if key == "end_spread" else "frozen_fraction"
        if none is None or none[f"end_{measure}"] is None:
            return None, None
        lo, hi = _ends(none, f"end_{measure}")
        size = judging.side(lo, hi, (lambda v: v > figures.END_SPREAD) if key == "end_spread"
                            else (lambda v: v >= figures.END_FROZEN))
        grew = None if none[f"start_{measure}"] is None else _paired_side(
            none["_by_seed"][f"end_{measure}"], none["_by_seed"][f"start_{measure}"],
            (lambda v: v > 0) if key == "end_spread" else (lambda v: v >= 0))
        return grew, size
    if key == "scaled_spread":
        if scaled is None or scaled["end_spread"] is None:
            return None, None
        lo, hi = _ends(scaled, "end_spread")
        below = None if none is None or none["end_spread"] is None else _paired_side(
            none["_by_seed"]["end_spread"], scaled["_by_seed"]["end_spread"], lambda v: v > 0)
        band = (figures.SCALED_SPREAD * (1 - figures.SCALED_TOLERANCE), figures.SCALED_SPREAD * (1 + figures.SCALED_TOLERANCE))
        return below, judging.overlaps(lo, hi, band)
    g, se, n, _ = gap(none, scaled)
    if g is None:
        return None, None
    lo, hi = intervals.interval(g, se, n) or (g, g)
    return judging.side(lo, hi, lambda v: v > 0), judging.overlaps(lo, hi, figures.BIG_GAP)


def claims(summary: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per claim key: {"setups": [setups where its size could be judged], "size": [... where it holds],
    "size_undecided": [... where the seeds' interval covers both answers], "direction_setups": [... where
    its direction could be judged], "direction": [... where it holds], "direction_undecided": [...]};
    a setup is (axis, value label)."""
    out = {}
    for key in CLAIM_WORDS:
        c: dict[str, list] = {"setups": [], "size": [], "size_undecided": [], "direction_setups": [],
                              "direction": [], "direction_undecided": []}
        for setup in dict.fromkeys((r["axis"], r["value"]) for r in summary):
            d, s = _judge(key, *pair(summary, setup))
            for part, got in (("size", s), ("direction", d)):
                if got is None:
                    continue
                c["setups" if part == "size" else "direction_setups"].append(setup)
                if got == judging.HOLDS:
                    c[part].append(setup)
                elif got == judging.UNDECIDED:
                    c[f"{part}_undecided"].append(setup)
        out[key] = c
    return out


def setup_name(setup: tuple[str, str]) -> str:
    return setting_text(*setup)


def value_text(summary, setup, key: str) -> str:
    none, scaled = pair(summary, setup)
    if key == "big_gap":
        g, se, n, ref = gap(none, scaled)  # ref, a mean perplexity (≥ 1), exists wherever g does
        if g is None:
            return "—"
        return estimates.plus_minus(g, se, "{:+.2f}") + f", {100 * g / ref:.0f}% of the scaled model's {ref:.2f}"
    row, measure, fmt = ((scaled, "end_spread", "{:,.2f}") if key == "scaled_spread" else
                         (none, "end_spread", "{:,.0f}") if key == "end_spread" else
                         (none, "end_frozen_fraction", "{:.1%}"))
    if row is None or row[measure] is None:
        return "—"
    se = row[f"{measure}_se"]
    return estimates.plus_minus(row[measure], se, fmt)


def explain(key: str, summary: Sequence[Mapping[str, Any]], judged: Mapping[str, Mapping[str, Any]]) -> str:
    """One sentence for a verdict's note: in how many setups the claim's size and direction hold, and where."""
    c = judged.get(key)
    if not c or not c["setups"]:
        return ""
    n = len(c["setups"])
    where = [f"{setup_name(s)}: {value_text(summary, s, key)}" for s in c["size"]]
    base = next((s for s in c["setups"] if s[0] == "base"), None)
    seeds = max((r["seeds"] for r in summary), default=0)
    head_dim = f"{summary[0]['head_dim']:,}" if summary else "?"  # no rows, no width to name
    undecided = [f", {len(c[f'{part}_undecided'])} undecided" if c.get(f"{part}_undecided") else ""
                 for part in ("size", "direction")]
    text = (f"setup study (d={head_dim}, {n} setup{'s' if n != 1 else ''}, {seeds} seed{'s' if seeds != 1 else ''}): the size "
            f"({CLAIM_WORDS[key][1]}) holds in {len(c['size'])} of {n}" + (f" ({'; '.join(where)})" if where else "")
            + undecided[0] + f", the direction ({CLAIM_WORDS[key][0]}) in {len(c['direction'])} of "
            f"{len(c['direction_setups'])}" + undecided[1])
    if base is not None:
        text += f"; base setup {value_text(summary, base, key)}"
    return text


def format_text(summary: Sequence[Mapping[str, Any]], judged: Mapping[str, Mapping[str, Any]]) -> str:
    """The terminal table of ``attnscale study``: one line per setup and scale (named as readers see
    it, ``core.scales.display_name``), then the claims."""
    from attnscale.core.scales import display_name

    from attnscale.terminal import table

    def pm(mean, se, fmt):
        return estimates.plus_minus(mean, se, fmt, terminal=True)

    lines = table(
        ("setup", "scale", "end spread", "max layer", "frozen", "eff. words", "valid ppl", "seeds"),
        ([setup_name((r["axis"], r["value"])), display_name(r["scale"]), pm(r["end_spread"], r["end_spread_se"], "{:,.1f}"),
          pm(r["end_spread_max_layer"], None, "{:,.0f}"),
          pm(r["end_frozen_fraction"], r["end_frozen_fraction_se"], "{:.1%}"),
          pm(r["end_effective_words"], None, "{:.2f}"), pm(r["perplexity"], r["perplexity_se"], "{:.2f}"),
          f"{r['done']}/{r['seeds']}"] for r in summary),
        "<<>>>>><")
    lines.append("end of training: layer 0 (mean over its heads) at the last recorded step, ± SE over seeds; "
                 "max layer: the largest layer's spread")
    for key, c in judged.items():
        if c["setups"]:
            lines.append(f"{CLAIM_WORDS[key][0]} — size {CLAIM_WORDS[key][1]}: in {len(c['size'])} of "
                         f"{len(c['setups'])} setups; direction: in {len(c['direction'])} of {len(c['direction_setups'])}")
    return "\n".join(lines)
