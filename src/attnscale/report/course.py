"""The course's claims as data, and how ours are read from the run records.

Each ``Claim`` holds the chapter's words (course-chapter-9), its figure, the
tolerance we judge by (stated in words, because the reader must be able to
disagree with it), and a function that reads our number from the records and
returns a verdict: "agrees"; "partly" where the direction of the claim holds
and its size does not (spread grows, but not to the course's figure; the scale
helps, but by fewer points); "differs"; or "not run" when the records needed
are absent. Nothing here runs an experiment or reads a file: ``runs`` is
anything shaped like ``RunsView`` (the report's ``Runs``), and the numbers
(means, SEs, the gap table) come from ``analysis``.

Tolerances, and why:
- spread: the estimate's own noise, 3 standard errors. For q·k with unit
  entries the relative SE of the sample std is ½·sqrt((2 + 6/d)/n), ≈0.5% at
  n = 20,000. The course's "about 2, 8, 16, 32" equal sqrt(d) exactly, so we
  compare with sqrt(d) and its rounding adds no slack.
- counts of rows ("seven in ten"): the rounding interval of the words, widened
  by 3 binomial SE over the rows measured.
- single rows ("roughly 35 words"): the course quotes one row, so a figure
  agrees if it is a typical single row, inside our p10–p90 range.
- perplexity gaps: the rounding interval, widened by 3 SE of the gap where the
  seeds give one (≥ 2 seeds per cell); with one seed there is no noise estimate.
  Where the course gives a direction (the scale helps; at d=32 the unscaled run
  is slightly ahead) the sign is part of the claim: a gap of the wrong sign
  differs however small it is.
- the spread at the start of training: the course measured its first layer's
  head, so layer 0 is judged; the mean over all layers is shown beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from attnscale.report import analysis

__all__ = ["AGREES", "PARTLY", "DIFFERS", "NOT_RUN", "VERDICTS", "Claim", "Verdict", "CLAIMS", "RunsView",
           "TrainView", "evaluate", "reasons", "scoreboard", "spread_se", "sweep_rows", "gap_by_width", "gap_start", "fmt_gap"]

AGREES, PARTLY, DIFFERS, NOT_RUN = "agrees", "partly", "differs", "not run"
VERDICTS = (AGREES, PARTLY, DIFFERS, NOT_RUN)
SCALED = "inv_sqrt_d"
COURSE_WIDTH = 1024  # the width of the course's end-of-training claims
COURSE_WIDTHS = {4: "about 2", 64: "8", 256: "16", 1024: "32"}


class TrainView(Protocol):
    """What the claims read from one training run (the report's ``TrainRun``)."""

    run_id: str
    width: int
    scale: str
    seed: Any
    lr: float | None
    status: str
    perplexity: float | None  # None unless the run is "done"
    diverged_at: int | None

    def line(self, which: str) -> dict[str, Any] | None: ...  # "first"/"last" recorded step: {"step", "layers"}

    def diag_mean(self, which: str, key: str) -> float: ...

    def layer_means(self, which: str, key: str) -> list[float]: ...


class RunsView(Protocol):
    """What the claims read from a folder of runs (the report's ``Runs``)."""

    spread_rows: list[dict[str, Any]]
    fresh_rows: dict[tuple[str, int, str], dict[str, Any]]

    @property
    def dynamics(self) -> Sequence[TrainView]: ...

    @property
    def sweep(self) -> Sequence[TrainView]: ...


@dataclass(frozen=True)
class Verdict:
    experiment: str
    claim: str
    course: str
    ours: str
    tolerance: str
    verdict: str
    beside: str = ""  # the same measure under another setting (the model's own init)
    note: str = ""
    key: str = ""  # ``Claim.key``
    name: str = ""  # ``Claim.title``: the claim in words that stand alone

    @property
    def title(self) -> str:
        return self.name or self.claim


@dataclass(frozen=True)
class Claim:
    experiment: str
    claim: str  # the chapter's words
    course: str  # the chapter's figure
    tolerance: str
    judge: Callable[[RunsView], tuple[str, str, str, str]]  # runs -> (ours, verdict, beside, note)
    key: str = ""  # the end-of-training claims: the name the setup study judges them by
    # where ``claim`` leans on the row above it in a table ("… grows to over 5,000"), the same
    # claim in words that stand alone, for a list or a terminal line read out of that table
    name: str = ""

    @property
    def title(self) -> str:
        return self.name or self.claim

    def evaluate(self, runs: RunsView) -> Verdict:
        ours, verdict, beside, note = self.judge(runs)
        return Verdict(self.experiment, self.claim, self.course, ours, self.tolerance, verdict, beside, note, self.key,
                       self.title)


def _not_run(what: str) -> tuple[str, str, str, str]:
    return "—", NOT_RUN, "", what


def _ok(cond: bool) -> str:
    return AGREES if cond else DIFFERS


# ---- spread ------------------------------------------------------------------


def spread_se(row: dict) -> float:
    """SE of a row's raw spread: the record's, else ``analysis.spread_se`` of its width and pairs."""
    if row.get("raw_spread_se") is not None:
        return float(row["raw_spread_se"])
    return analysis.spread_se(row["width"], row["pairs"])


def _raw_rows(runs: RunsView) -> dict[int, dict]:
    return {int(r["width"]): r for r in runs.spread_rows}


def _raw_at(width: int):
    def judge(runs):
        row = _raw_rows(runs).get(width)
        if row is None:
            return _not_run(f"no spread row at width {width}")
        raw, se = float(row["raw_spread"]), spread_se(row)
        return f"{raw:.3f} ± {se:.3f}", _ok(abs(raw - math.sqrt(width)) <= 3 * se), "", f"{row['pairs']:,} pairs"
    return judge


def _raw_elsewhere(runs):
    rows = [r for w, r in sorted(_raw_rows(runs).items()) if w not in COURSE_WIDTHS]
    if not rows:
        return _not_run("no other widths measured")
    off = [r for r in rows if abs(float(r["raw_spread"]) - math.sqrt(r["width"])) > 3 * spread_se(r)]
    ours = "; ".join(f"d={r['width']}: {float(r['raw_spread']):.2f} (√d={math.sqrt(r['width']):.2f})" for r in rows)
    return ours, _ok(not off), "", ("outside: " + ", ".join(f"d={r['width']}" for r in off)) if off else ""


def _scaled_one(runs):
    rows = sorted((r for r in runs.spread_rows if r.get("scale") == SCALED), key=lambda r: r["width"])
    if not rows:
        return _not_run(f"no spread rows with scale {SCALED}")
    se = [spread_se(r) * float(r["factor"]) for r in rows]
    vals = [float(r["scaled_spread"]) for r in rows]
    off = [r["width"] for r, v, s in zip(rows, vals, se) if abs(v - 1) > 3 * s]
    ours = f"{min(vals):.3f} – {max(vals):.3f} over {len(rows)} widths (SE ≈ {max(se):.3f})"
    return ours, _ok(not off), "", ("outside: d=" + ", ".join(map(str, off))) if off else ""


# ---- fresh head --------------------------------------------------------------


def _fresh(runs, init: str, width: int, scale: str) -> dict | None:
    return runs.fresh_rows.get((init, width, scale))


def _fresh_claim(width: int, scale: str, fmt: Callable[[dict], str], test: Callable[[dict], bool], note: str = ""):
    def judge(runs):
        row = _fresh(runs, "unit", width, scale)
        model = _fresh(runs, "model", width, scale)
        beside = f"model init: {fmt(model)}" if model else "model init: not run"
        if row is None:
            return "—", NOT_RUN, beside, f"no fresh row (init unit, d={width}, scale {scale})"
        extra = note
        if row.get("words") not in (None, 64):
            extra = f"{note} Our rows are over {row['words']} words, the course's over 64.".strip()
        return fmt(row), _ok(test(row)), beside, extra
    return judge


def _one_word(r):
    return (f"median {r['effective_words_median']:.2f} effective words, mean max weight "
            f"{r['max_weight_mean']:.3f}; e.g. {r.get('example', '')}")


def _spread_rows_words(r):
    return (f"single rows p10–p90: {r['effective_words_p10']:.1f} – {r['effective_words_p90']:.1f} "
            f"effective words (median {r['effective_words_median']:.1f})")


def _rows_counted(r) -> int:
    return int(r.get("sequences") or 1) * int(r.get("words") or 64)


def _frozen(r):
    p, n = float(r["frozen_fraction"]), _rows_counted(r)
    return f"{100 * p:.1f}% of {n:,} rows frozen (SE {100 * analysis.binomial_se(p, n):.1f} pts)"


def _seven_in_ten(r):
    p, n = float(r["frozen_fraction"]), _rows_counted(r)
    se = analysis.binomial_se(p, n)
    return 0.65 - 3 * se <= p <= 0.75 + 3 * se


# ---- dynamics ----------------------------------------------------------------


def _dyn(runs, scale: str, width: int = 1024):
    return [t for t in runs.dynamics if t.width == width and t.scale == scale and t.line("first")]


def _dyn_missing(runs, scale: str):
    widths = sorted({t.width for t in runs.dynamics})
    return _not_run(f"no dynamics run at width 1024 with scale {scale}"
                    + (f" (dynamics ran at d={', '.join(map(str, widths))})" if widths else ""))


def _dyn_note(got) -> str:
    note = f"mean of {len(got)} seeds" if len(got) > 1 else ""
    if any(t.status != "done" for t in got):
        note = (note + "; " if note else "") + "status: " + ", ".join(sorted({t.status for t in got}))
    return note


def _dyn_claim(scale: str, which: str, key: str, test: Callable[[float], bool], fmt: str = "{:.1f}",
               grows: bool = False):
    """A claim on the mean over layers and heads of ``key`` at the first or last step.

    ``grows``: the claim also says which way training moves ``key`` (up); where
    it moved up but did not reach the course's figure the verdict is "partly"."""
    def judge(runs):
        got = _dyn(runs, scale)
        if not got:
            return _dyn_missing(runs, scale)
        value = analysis.mean(t.diag_mean(which, key) for t in got)
        steps = sorted({t.line(which)["step"] for t in got})
        ours = fmt.format(value) + f" at step {', '.join(map(str, steps))}"
        if len(got) == 1:  # the verdict uses the mean; the layers show where it comes from
            ours += " (by layer: " + ", ".join(fmt.format(v) for v in got[0].layer_means(which, key)) + ")"
        note = _dyn_note(got)
        if test(value):
            return ours, AGREES, "", note
        first = analysis.mean(t.diag_mean("first", key) for t in got)
        if grows and value > first:
            moved = f"up from {fmt.format(first)} at the start, but short of the course's figure"
            return ours, PARTLY, "", (note + "; " if note else "") + moved
        return ours, DIFFERS, "", note
    return judge


START_SPREAD, START_TOLERANCE = 21.0, 0.10
# the course's end of training at d = 1,024, as the claims below judge it (the setup study reads the same)
END_SPREAD = 5000.0  # without the scale: "over 5,000"
COURSE_END_FROZEN = 0.999  # the course's figure, "99.9% of rows" (what a plot marks)
END_FROZEN = 0.99  # and what agrees with it: at least 99%
SCALED_SPREAD, SCALED_TOLERANCE = 3.4, 0.30  # with the scale: "settled around 3.4", ±30%
BIG_GAP = (16.5, 18.5)  # "17 to 18 points" and its rounding


def _start_spread(runs):
    """"About 21 at the start": the course's figure is its first layer's head, so
    layer 0 (mean over its heads, and over seeds) is judged; all layers shown beside."""
    got = _dyn(runs, "none")
    if not got:
        return _dyn_missing(runs, "none")
    layer0 = analysis.mean(t.layer_means("first", "spread")[0] for t in got)
    overall = analysis.mean(t.diag_mean("first", "spread") for t in got)
    steps = sorted({t.line("first")["step"] for t in got})
    layers = len(got[0].layer_means("first", "spread"))
    ours = f"{layer0:.1f} in layer 0 at step {', '.join(map(str, steps))} ({overall:.1f} over all {layers} layers)"
    note = _dyn_note(got)
    return ours, _ok(analysis.within(layer0, START_SPREAD, START_TOLERANCE)), "", note


def _not_recovering(runs):
    got = _dyn(runs, "none")
    if not got:
        return _not_run("no dynamics run at width 1024 without the scale")
    first = analysis.mean(t.diag_mean("first", "frozen_fraction") for t in got)
    last = analysis.mean(t.diag_mean("last", "frozen_fraction") for t in got)
    return f"{100 * first:.1f}% → {100 * last:.1f}% frozen", _ok(last >= first), "", ""


# ---- width sweep -------------------------------------------------------------


def sweep_rows(runs: RunsView) -> list[dict[str, Any]]:
    """The sweep's runs as ``analysis.gap_table`` rows (``analysis.run_rows``)."""
    return analysis.run_rows(runs.sweep)


def _gap_table(runs: RunsView) -> dict:
    """The same paired-seed gaps and "where the gap starts" rule that ``attnscale sweep`` prints."""
    return analysis.gap_table(sweep_rows(runs), reference=SCALED)


def gap_by_width(runs: RunsView) -> dict[int, tuple[float, float | None, int]]:
    """width -> (ppl without scale − ppl with it, SE of that gap or None, seeds).

    Means over paired seeds, SE of the per-seed differences (needs ≥ 2 seeds).
    Where a sweep varied the learning rate, the claims read the first learning
    rate's rows. Diverged runs have no perplexity and are left out here; the run
    table says which."""
    return analysis.gap_by_width(_gap_table(runs))


def fmt_gap(gap, se, n) -> str:
    return f"{gap:+.2f}" + (f" ± {se:.2f} ({n} seeds)" if se is not None else " (1 seed, no noise estimate)")


def _gap_claim(select: Callable[[int], bool], lo: float, hi: float, sign: int, what: str):
    """Every selected width's gap inside [lo, hi] (widened by 3 SE where there is one).

    ``sign``: the direction the course gives (+1: the scale helps; −1: the
    unscaled run is ahead). A gap of that sign beyond its noise but outside the
    band is "partly"; a gap of the other sign (or lost in noise) differs."""
    def judge(runs):
        gaps = {w: g for w, g in gap_by_width(runs).items() if select(w)}
        shares = analysis.share_by_width(_gap_table(runs))
        if not gaps:
            return _not_run(f"no sweep pair (with and without the scale) at {what}")
        parts, size_ok, direction_ok = [], True, True
        for w, (gap, se, n) in gaps.items():
            slack = 3 * se if se is not None else 0.0
            inside = lo - slack <= gap <= hi + slack
            size_ok &= inside
            direction_ok &= inside or sign * gap > slack
            share = f", {shares[w]:.0%} of the scaled ppl" if w in shares else ""
            parts.append(f"d={w}: {fmt_gap(gap, se, n)}{share}")
        if size_ok:
            return "; ".join(parts), AGREES, "", ""
        if direction_ok:
            lead = "the scale helps" if sign > 0 else "the unscaled run is ahead"
            return "; ".join(parts), PARTLY, "", f"the direction holds ({lead}), the size does not"
        signs = {(g > 0) - (g < 0) for g, _, _ in gaps.values()}
        lead = ("the scaled run is ahead" if sign < 0 else
                "the unscaled run is ahead" if -1 in signs else "the gap is not beyond its noise")
        return "; ".join(parts), DIFFERS, "", f"the direction does not hold: {lead}"
    return judge


def gap_start(runs: RunsView) -> int | None:
    """Where the gap starts, by ``analysis.GAP_RULE``."""
    return analysis.first_start(_gap_table(runs))


def _starts(runs):
    gaps = gap_by_width(runs)
    if len(gaps) < 2:
        return _not_run("fewer than two widths with both schemes in the sweep")
    w = gap_start(runs)
    if w is None:
        return f"no gap above 1 point up to d={max(gaps)}", DIFFERS, "", ""
    return f"from d={w}", _ok(32 < w <= 128), "", "the rule attnscale sweep uses: " + analysis.GAP_RULE


# ---- the claims --------------------------------------------------------------

_TOL_SE = "|ours − √d| ≤ 3 SE of our estimate"
CLAIMS: list[Claim] = [
    *(Claim("spread", f"raw score spread at d={d} is √d", f"{fig} (√{d} = {math.sqrt(d):g})", _TOL_SE, _raw_at(d))
      for d, fig in COURSE_WIDTHS.items()),
    Claim("spread", "… and √d at every other width", "√d", _TOL_SE, _raw_elsewhere,
          name="raw score spread is √d at every other width"),
    Claim("spread", "divided by √d, the spread is about 1 at every width", "about 1",
          "|ours − 1| ≤ 3 SE at each width", _scaled_one),
    Claim("fresh", "d=256, no scale: a row puts all its weight on one word out of 64", "1 word",
          "median row < 1.5 effective words", _fresh_claim(256, "none", _one_word, lambda r: r["effective_words_median"] < 1.5)),
    Claim("fresh", "d=256, with the scale: that row spreads across roughly 35 words", "≈ 35 words",
          "35 inside our p10–p90 of single rows", _fresh_claim(
              256, SCALED, _spread_rows_words, lambda r: r["effective_words_p10"] <= 35 <= r["effective_words_p90"],
              "The course quotes one row, so we ask whether 35 is a typical single row.")),
    Claim("fresh", "d=1024, no scale: seven rows in ten frozen before training", "70%",
          "65–75% (rounding of 'seven in ten') ± 3 binomial SE", _fresh_claim(1024, "none", _frozen, _seven_in_ten)),
    Claim("fresh", "d=1024, with the scale: none frozen", "0%", "< 0.5% of rows",
          _fresh_claim(1024, SCALED, _frozen, lambda r: r["frozen_fraction"] < 0.005)),
    Claim("dynamics", "d=1024, no scale: spread about 21 at the start", "≈ 21 (its first layer's head)",
          f"layer 0 within ±{START_TOLERANCE:.0%} of 21", _start_spread),
    Claim("dynamics", f"… grows to over {END_SPREAD:,.0f} by the end", f"> {END_SPREAD:,.0f}", f"> {END_SPREAD:,.0f}",
          _dyn_claim("none", "last", "spread", lambda v: v > END_SPREAD, "{:,.0f}", grows=True), "end_spread",
          f"d=1024, no scale: the spread grows to over {END_SPREAD:,.0f} by the end"),
    Claim("dynamics", f"… and {COURSE_END_FROZEN:.1%} of rows end frozen", f"{COURSE_END_FROZEN:.1%}",
          f"≥ {END_FROZEN:.0%}",
          _dyn_claim("none", "last", "frozen_fraction", lambda v: v >= END_FROZEN, "{:.1%}", grows=True), "end_frozen",
          f"d=1024, no scale: {COURSE_END_FROZEN:.1%} of rows end frozen"),
    Claim("dynamics", "frozen heads do not recover; they get worse", "worse", "frozen share at the end ≥ at the start",
          _not_recovering, "not_recovering", "d=1024, no scale: frozen heads do not recover; they get worse"),
    Claim("dynamics", f"d=1024, with the scale: the spread settles around {SCALED_SPREAD:g}", f"≈ {SCALED_SPREAD:g}",
          f"within ±{SCALED_TOLERANCE:.0%} of {SCALED_SPREAD:g}",
          _dyn_claim(SCALED, "last", "spread", lambda v: analysis.within(v, SCALED_SPREAD, SCALED_TOLERANCE), "{:.2f}"),
          "scaled_spread"),
    Claim("sweep", "d=32: no difference (unscaled very slightly ahead)", "≈ 0, gap ≤ 0",
          "−1 ≤ gap ≤ 0 points (+ 3 SE); the sign is part of the claim",
          _gap_claim(lambda w: w == 32, -1.0, 0.0, -1, "d=32")),
    Claim("sweep", "d=128: the scale helps by about 2 points", "≈ 2", "1.5–2.5 points (+ 3 SE)",
          _gap_claim(lambda w: w == 128, 1.5, 2.5, +1, "d=128")),
    Claim("sweep", "d ≥ 256: worth 17 to 18 points", "17–18", "16.5–18.5 points (+ 3 SE) at each width",
          _gap_claim(lambda w: w >= 256, *BIG_GAP, +1, "d ≥ 256"), "big_gap"),
    Claim("sweep", "where 'large' starts: after 32, by 128", "32 < d ≤ 128", "narrowest width from which every wider one has a gap > 1 point", _starts),
]


def evaluate(runs: RunsView) -> list[Verdict]:
    """Every claim judged against the records in ``runs``."""
    return [c.evaluate(runs) for c in CLAIMS]


def reasons(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per claim that does not agree: the claim, both figures, and why."""
    out = []
    for v in verdicts:
        if v.verdict in (AGREES, NOT_RUN):
            continue
        note = f"; {v.note}" if v.note else ""
        out.append(f"{v.title} — {v.verdict} (tolerance {v.tolerance}): course {v.course}, ours {v.ours}{note}")
    return out


SAID = {AGREES: "agree", PARTLY: "partly", DIFFERS: "differ", NOT_RUN: "not run"}


def scoreboard(verdicts: Sequence[Verdict], figures: bool = True) -> tuple[str, list[str]]:
    """The count of verdicts in one line ("14 agree, 3 partly, 2 differ of 19 claims"; "not run"
    only where some claim was not), and one short line per claim that does not agree: its name,
    verdict and (``figures``) both figures. What a reader, or a terminal, sees before any explanation."""
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    shown = [k for k in VERDICTS if counts[k] or k in (AGREES, PARTLY, DIFFERS)]
    head = ", ".join(f"{counts[k]} {SAID[k]}" for k in shown) + f" of {len(verdicts)} claims"
    lines = [f"{v.title}: {v.verdict}" + (f" (course {v.course}, ours {v.ours})" if figures else "")
             for v in verdicts if v.verdict in (PARTLY, DIFFERS)]
    return head, lines
