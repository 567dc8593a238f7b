"""The course's claims as data, and how ours are read from the run records.

Each ``Claim`` holds the chapter's words (course-chapter-9), its figure, the
tolerance we judge by (stated in words, because the reader must be able to
disagree with it), and a function that reads our number from the records and
returns a verdict: "agrees"; "partly" where the direction of the claim holds
and its size does not (spread grows, but not to the course's figure; the scale
helps, but by fewer points); "inconclusive" where the seeds' interval covers
both answers; "differs"; or "not run" when the records needed are absent. Nothing here runs an experiment or reads a file: ``runs`` is
anything shaped like ``RunsView`` (the report's ``Runs``), and the numbers
(means, SEs, the gap table) come from ``analysis`` (``estimates``, ``gaps``).

Tolerances, and why:
- spread: the estimate's own noise, 3 standard errors. For q·k with unit
  entries the relative SE of the sample std is ½·sqrt((2 + 6/d)/n), ≈0.5% at
  n = 20,000. The course's "about 2, 8, 16, 32" equal sqrt(d) exactly, so we
  compare with sqrt(d) and its rounding adds no slack.
- counts of rows ("seven in ten"): the rounding interval of the words, widened
  by 3 binomial SE over the rows measured.
- single rows ("roughly 35 words"): the course quotes one row, so a figure
  agrees if it is a typical single row, inside our p10–p90 range.
- perplexity gaps and the dynamics' figures: the rule of ``judging``, on the
  95% t interval over seeds (n − 1 degrees of freedom, ``intervals``): a size
  ("about 2 points": the rounding interval 1.5–2.5) agrees where the interval
  meets it; a direction (the scale helps; at d=32 the unscaled run is ahead or
  level; "over 5,000") must be established by the whole interval, and is
  "inconclusive" where the interval covers both answers. With one seed there is
  no interval and the figure alone decides: a gap of the wrong sign differs
  however small it is. (A band widened by 3 SE would let a gap of the wrong
  sign agree, and with 2 seeds 3 SE covers about 80%, not 99.7%.)
- one convention for the dynamics: the course's figures are one head's, its
  first layer's, so every dynamics claim, at the start and at the end, reads
  layer 0 (mean over its heads); the mean over all layers is shown beside it.
  Spread is the head's pooled spread (over all its scores that count); the
  report's dynamics section says how it relates to the within-row spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from attnscale.analysis import estimates, intervals, judging
from attnscale.analysis import gaps as gap_tables
from attnscale.analysis.course_figures import (BIG_GAP, COURSE_END_FROZEN, COURSE_LAYER, COURSE_WIDTH, END_FROZEN,
                                               END_SPREAD, SCALED, SCALED_SPREAD, SCALED_TOLERANCE)
from attnscale.analysis.judging import AGREES, DIFFERS, INCONCLUSIVE, NOT_RUN, PARTLY, VERDICTS

__all__ = ["AGREES", "PARTLY", "DIFFERS", "INCONCLUSIVE", "NOT_RUN", "VERDICTS", "Claim", "Verdict", "CLAIMS", "RunsView",
           "TrainView", "evaluate", "reasons", "scoreboard", "spread_se", "sweep_rows", "gap_by_head_dim", "gap_start", "fmt_gap"]

COURSE_WIDTHS = {4: "about 2", 64: "8", 256: "16", 1024: "32"}


class TrainView(Protocol):
    """What the claims read from one training run (the report's ``TrainRun``)."""

    run_id: str
    head_dim: int
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
    """SE of a row's raw spread: the record's, else ``analysis.estimates.spread_se`` of its width and pairs."""
    if row.get("raw_spread_se") is not None:
        return float(row["raw_spread_se"])
    return estimates.spread_se(row["head_dim"], row["pairs"])


def _raw_rows(runs: RunsView) -> dict[int, dict]:
    return {int(r["head_dim"]): r for r in runs.spread_rows}


def _raw_at(head_dim: int, runs):
    row = _raw_rows(runs).get(head_dim)
    if row is None:
        return _not_run(f"no spread row at width {head_dim}")
    raw, se = float(row["raw_spread"]), spread_se(row)
    return f"{raw:.3f} ± {se:.3f}", _ok(abs(raw - math.sqrt(head_dim)) <= 3 * se), "", f"{row['pairs']:,} pairs"


def _raw_elsewhere(runs):
    rows = [r for w, r in sorted(_raw_rows(runs).items()) if w not in COURSE_WIDTHS]
    if not rows:
        return _not_run("no other widths measured")
    off = [r for r in rows if abs(float(r["raw_spread"]) - math.sqrt(r["head_dim"])) > 3 * spread_se(r)]
    ours = "; ".join(f"d={r['head_dim']}: {float(r['raw_spread']):.2f} (√d={math.sqrt(r['head_dim']):.2f})" for r in rows)
    return ours, _ok(not off), "", ("outside: " + ", ".join(f"d={r['head_dim']}" for r in off)) if off else ""


def _scaled_one(runs):
    rows = sorted((r for r in runs.spread_rows if r.get("scale") == SCALED), key=lambda r: r["head_dim"])
    if not rows:
        return _not_run(f"no spread rows with scale {SCALED}")
    se = [spread_se(r) * float(r["factor"]) for r in rows]
    vals = [float(r["scaled_spread"]) for r in rows]
    off = [r["head_dim"] for r, v, s in zip(rows, vals, se) if abs(v - 1) > 3 * s]
    ours = f"{min(vals):.3f} – {max(vals):.3f} over {len(rows)} widths (SE ≈ {max(se):.3f})"
    return ours, _ok(not off), "", ("outside: d=" + ", ".join(map(str, off))) if off else ""


# ---- fresh head --------------------------------------------------------------


def _fresh(runs, init: str, head_dim: int, scale: str) -> dict | None:
    return runs.fresh_rows.get((init, head_dim, scale))


def _fresh_claim(head_dim: int, scale: str, fmt: Callable[[dict], str], test: Callable[[dict], bool], runs,
                 note: str = ""):
    row = _fresh(runs, "unit", head_dim, scale)
    model = _fresh(runs, "model", head_dim, scale)
    beside = f"model init: {fmt(model)}" if model else "model init: not run"
    if row is None:
        return "—", NOT_RUN, beside, f"no fresh row (init unit, d={head_dim}, scale {scale})"
    extra = note
    if row.get("words") not in (None, 64):
        extra = f"{note} Our rows are over {row['words']} words, the course's over 64.".strip()
    return fmt(row), _ok(test(row)), beside, extra


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
    if p in (0.0, 1.0):  # a binomial SE of 0 says nothing: the rule of three gives the 95% bound instead
        bound = f"under {300 / n:.2g}%" if p == 0 else f"over {100 - 300 / n:.4g}%"
        return f"{100 * p:.0f}% of {n:,} rows frozen (95% bound: {bound})"
    se = 100 * estimates.binomial_se(p, n)
    d = max(1, -math.floor(math.log10(se)))  # the SE's first digit shows: 0.04 points, not 0.0
    return f"{100 * p:.{d}f}% of {n:,} rows frozen (SE {se:.{d}f} pts)"


def _seven_in_ten(r):
    p, n = float(r["frozen_fraction"]), _rows_counted(r)
    se = estimates.binomial_se(p, n)
    return 0.65 - 3 * se <= p <= 0.75 + 3 * se


# ---- dynamics ----------------------------------------------------------------


def _dyn(runs, scale: str, head_dim: int = 1024):
    return [t for t in runs.dynamics if t.head_dim == head_dim and t.scale == scale and t.line("first")]


def _dyn_missing(runs, scale: str):
    head_dims = sorted({t.head_dim for t in runs.dynamics})
    return _not_run(f"no dynamics run at width 1024 with scale {scale}"
                    + (f" (dynamics ran at d={', '.join(map(str, head_dims))})" if head_dims else ""))


def _dyn_note(got) -> str:
    if any(t.status != "done" for t in got):
        return "status: " + ", ".join(sorted({t.status for t in got}))
    return ""


def _estimate(values: Sequence[float], share: bool = False) -> tuple[float, float | None, int, float, float]:
    """(mean, SE or None, n, and the 95% t interval's ends: the mean itself where there is none) over seeds;
    ``share``: the interval is kept inside [0, 1]."""
    m, se = estimates.mean_se(list(values))
    ci = intervals.interval(m, se, len(values)) or (m, m)
    if share:
        ci = (max(0.0, ci[0]), min(1.0, ci[1]))
    return m, se, len(values), ci[0], ci[1]


def with_interval(est: tuple[float, float | None, int, float, float], fmt: str) -> tuple[str, str]:
    """An ``_estimate`` in words, the figure and its uncertainty apart: ("4.06 ± 0.16", "2 seeds, 95%
    interval 2.03 – 6.09"); ("4.06", "n=1, no interval") for one seed."""
    m, se, n, lo, hi = est
    if se is None:
        return fmt.format(m), f"n={n}, no interval"
    return estimates.plus_minus(m, se, fmt), f"{n} seeds, {intervals.LEVEL:.0%} interval {fmt.format(lo)} – {fmt.format(hi)}"


def _layer(t, which: str, key: str) -> float:
    return t.layer_means(which, key)[COURSE_LAYER]


def _dyn_ours(got, which: str, key: str, fmt: str) -> tuple[tuple, str]:
    """The estimate over seeds of ``key`` in the course's layer, and it in words with the mean over all
    layers beside it (the other convention, so a reader sees how much the choice of layer moves it)."""
    est = _estimate([_layer(t, which, key) for t in got], share=key == "frozen_fraction")
    overall = estimates.mean(t.diag_mean(which, key) for t in got)
    steps = sorted({t.line(which)["step"] for t in got})
    layers = len(got[0].layer_means(which, key))
    figure, noise = with_interval(est, fmt)
    return est, (f"{figure} in layer {COURSE_LAYER} at step {', '.join(map(str, steps))} ({noise}; "
                 f"mean over all {layers} layers: {fmt.format(overall)})")


def _dyn_claim(scale: str, which: str, key: str, fmt: str, runs, *, above: float | None = None,
               band: tuple[float, float] | None = None, grows: bool = False):
    """A claim on ``key`` in the course's layer (mean over its heads, then over seeds) at the first or
    last step: one-sided (``above``: the value is at least that) or about a figure (``band``).

    ``grows``: the claim also says training moves ``key`` up (its direction); where the rise is
    established (the interval of last − first per seed above 0) and the figure is not reached, "partly"."""
    got = _dyn(runs, scale)
    if not got:
        return _dyn_missing(runs, scale)
    (_, _, _, lo, hi), ours = _dyn_ours(got, which, key, fmt)
    size = judging.side(lo, hi, lambda v: v >= above) if above is not None else judging.overlaps(lo, hi, band)
    direction, note = None, _dyn_note(got)
    if grows and size != judging.HOLDS:  # the figure reached is the claim whole, however it got there
        rise = _estimate([_layer(t, "last", key) - _layer(t, "first", key) for t in got])
        direction = judging.side(rise[3], rise[4], lambda v: v > 0)
        first = fmt.format(estimates.mean(_layer(t, "first", key) for t in got))
        moved = {judging.HOLDS: f"up from {first} at the start, but short of the course's figure",
                 judging.UNDECIDED: f"from {first} at the start; the rise is not beyond its noise",
                 judging.FAILS: f"not up from {first} at the start"}[direction]
        note = "; ".join(x for x in (note, moved) if x)
    return ours, judging.verdict(size, direction), "", note


START_SPREAD, START_TOLERANCE = 21.0, 0.10
# the end of training at d = 1,024 (END_SPREAD, END_FROZEN, SCALED_SPREAD, BIG_GAP): ``analysis.course_figures``


def _band(figure: float, relative: float) -> tuple[float, float]:
    return figure * (1 - relative), figure * (1 + relative)


def _not_recovering(runs):
    """"Frozen heads do not recover": the frozen share in the course's layer at the end is at least the
    start's, read from the per-seed differences (end − start) and their interval."""
    got = _dyn(runs, "none")
    if not got:
        return _not_run("no dynamics run at width 1024 without the scale")
    first = estimates.mean(_layer(t, "first", "frozen_fraction") for t in got)
    last = estimates.mean(_layer(t, "last", "frozen_fraction") for t in got)
    rise = _estimate([_layer(t, "last", "frozen_fraction") - _layer(t, "first", "frozen_fraction") for t in got])
    m, se, n, lo, hi = rise  # in points of percentage
    figure, noise = with_interval((100 * m, None if se is None else 100 * se, n, 100 * lo, 100 * hi), "{:+.1f}")
    ours = f"{100 * first:.1f}% → {100 * last:.1f}% frozen in layer {COURSE_LAYER} (change {figure} pts; {noise})"
    return ours, judging.verdict(judging.side(rise[3], rise[4], lambda v: v >= 0)), "", ""


# ---- width sweep -------------------------------------------------------------


def sweep_rows(runs: RunsView) -> list[dict[str, Any]]:
    """The sweep's runs as ``analysis.gaps.gap_table`` rows (``analysis.gaps.run_rows``)."""
    return gap_tables.run_rows(runs.sweep)


def _gap_table(runs: RunsView) -> dict:
    """The same paired-seed gaps and "where the gap starts" rule that ``attnscale sweep`` prints."""
    return gap_tables.gap_table(sweep_rows(runs), reference=SCALED)


def gap_by_head_dim(runs: RunsView) -> dict[int, tuple[float, float | None, int]]:
    """width -> (ppl without scale − ppl with it, SE of that gap or None, seeds).

    Means over paired seeds, SE of the per-seed differences (needs ≥ 2 seeds).
    Where a sweep varied the learning rate, the claims read the first learning
    rate's rows. Diverged runs have no perplexity and are left out here; the run
    table says which."""
    return gap_tables.gap_by_head_dim(_gap_table(runs))


def fmt_gap(gap, se, n) -> str:
    """A gap in words: "+2.10 ± 0.30 (3 seeds, 95% interval 0.81 – 3.39)", "+0.44 (1 seed, no noise estimate)"."""
    if se is None:
        return f"{gap:+.2f} (1 seed, no noise estimate)"
    lo, hi = intervals.interval(gap, se, n)
    return f"{estimates.plus_minus(gap, se, '{:+.2f}')} ({n} seeds, {intervals.LEVEL:.0%} interval {lo:+.2f} – {hi:+.2f})"


def _gap_claim(select: Callable[[int], bool], lo: float, hi: float, sign: int, what: str, runs):
    """Every selected width's gap consistent with [lo, hi] (its 95% t interval over seeds meets the band)
    and of the course's sign (``sign``: +1, the scale helps, gap > 0; −1, the unscaled run is ahead or
    level, gap ≤ 0), the sign established by the whole interval (``judging``). With one seed the gap
    alone decides, and a gap of the wrong sign differs however small it is."""
    gaps = {w: g for w, g in gap_by_head_dim(runs).items() if select(w)}
    shares = gap_tables.share_by_head_dim(_gap_table(runs))
    if not gaps:
        return _not_run(f"no sweep pair (with and without the scale) at {what}")
    parts, verdicts, directions = [], [], []
    for w, (gap, se, n) in gaps.items():
        a, b = intervals.interval(gap, se, n) or (gap, gap)
        direction = judging.side(a, b, (lambda x: x > 0) if sign > 0 else (lambda x: x <= 0))
        verdicts.append(judging.verdict(judging.overlaps(a, b, (lo, hi)), direction))
        directions.append(direction)
        # a width with a gap has a share: gap_table gives both, or neither where a side diverged
        parts.append(f"d={w}: {fmt_gap(gap, se, n)}, {shares[w]:.0%} of the scaled ppl")
    verdict = judging.worst(verdicts)
    lead = "the scale helps" if sign > 0 else "the unscaled run is ahead or level"
    note = {judging.PARTLY: f"the direction holds ({lead}), the size does not",
            judging.INCONCLUSIVE: f"the interval covers both signs: whether {lead} is not settled by these seeds",
            judging.DIFFERS: ("the direction does not hold: " + ("the scaled run is ahead" if sign < 0 else
                                                                  "the unscaled run is ahead or level")
                              if judging.FAILS in directions
                              else "the size does not hold, and the direction is not settled")}.get(verdict, "")
    return "; ".join(parts), verdict, "", note


def gap_start(runs: RunsView, undecided_counts: bool = False) -> int | None:
    """Where the gap starts, by ``analysis.gaps.GAP_RULE``; ``undecided_counts``: if every gap above
    1 point whose interval still reaches 0 were real."""
    return gap_tables.first_start(_gap_table(runs), undecided_counts)


def _starts(runs):
    gaps = gap_by_head_dim(runs)
    if len(gaps) < 2:
        return _not_run("fewer than two widths with both schemes in the sweep")
    sure, maybe = gap_start(runs), gap_start(runs, undecided_counts=True)
    ok = [w is not None and 32 < w <= 128 for w in (sure, maybe)]
    ours = f"from d={sure}" if sure is not None else f"no gap beyond its noise up to d={max(gaps)}"
    note = "the rule attnscale sweep uses: " + gap_tables.GAP_RULE
    if maybe != sure:
        ours += f" (from d={maybe} if the gaps not yet beyond their noise are real)"
    verdict = (judging.AGREES if all(ok) else judging.DIFFERS if not any(ok) else judging.INCONCLUSIVE)
    return ours, verdict, "", note


# ---- the claims --------------------------------------------------------------

_TOL_SE = "|ours − √d| ≤ 3 SE of our estimate"
CLAIMS: list[Claim] = [
    *(Claim("spread", f"raw score spread at d={d} is √d", f"{fig} (√{d} = {math.sqrt(d):g})", _TOL_SE, partial(_raw_at, d))
      for d, fig in COURSE_WIDTHS.items()),
    Claim("spread", "… and √d at every other width", "√d", _TOL_SE, _raw_elsewhere,
          name="raw score spread is √d at every other width"),
    Claim("spread", "divided by √d, the spread is about 1 at every width", "about 1",
          "|ours − 1| ≤ 3 SE at each width", _scaled_one),
    Claim("fresh", "d=256, no scale: a row puts all its weight on one word out of 64", "1 word",
          "median row < 1.5 effective words", partial(_fresh_claim, 256, "none", _one_word, lambda r: r["effective_words_median"] < 1.5)),
    Claim("fresh", "d=256, with the scale: that row spreads across roughly 35 words", "≈ 35 words",
          "35 inside our p10–p90 of single rows", partial(
              _fresh_claim, 256, SCALED, _spread_rows_words, lambda r: r["effective_words_p10"] <= 35 <= r["effective_words_p90"],
              note="The course quotes one row, so we ask whether 35 is a typical single row.")),
    Claim("fresh", "d=1024, no scale: seven rows in ten frozen before training", "70%",
          "65–75% (rounding of 'seven in ten') ± 3 binomial SE", partial(_fresh_claim, 1024, "none", _frozen, _seven_in_ten)),
    Claim("fresh", "d=1024, with the scale: none frozen", "0%", "< 0.5% of rows",
          partial(_fresh_claim, 1024, SCALED, _frozen, lambda r: r["frozen_fraction"] < 0.005)),
    Claim("dynamics", "d=1024, no scale: spread about 21 at the start", "≈ 21 (its first layer's head)",
          f"layer 0's interval meets ±{START_TOLERANCE:.0%} of 21",
          partial(_dyn_claim, "none", "first", "spread", "{:.1f}", band=_band(START_SPREAD, START_TOLERANCE))),
    Claim("dynamics", f"… grows to over {END_SPREAD:,.0f} by the end", f"> {END_SPREAD:,.0f}",
          f"layer 0's 95% interval over {END_SPREAD:,.0f}",
          partial(_dyn_claim, "none", "last", "spread", "{:,.0f}", above=END_SPREAD, grows=True), "end_spread",
          f"d=1024, no scale: the spread grows to over {END_SPREAD:,.0f} by the end"),
    Claim("dynamics", f"… and {COURSE_END_FROZEN:.1%} of rows end frozen", f"{COURSE_END_FROZEN:.1%}",
          f"layer 0's 95% interval at or over {END_FROZEN:.0%}",
          partial(_dyn_claim, "none", "last", "frozen_fraction", "{:.1%}", above=END_FROZEN, grows=True), "end_frozen",
          f"d=1024, no scale: {COURSE_END_FROZEN:.1%} of rows end frozen"),
    Claim("dynamics", "frozen heads do not recover; they get worse", "worse",
          "layer 0's frozen share at the end ≥ at the start (95% interval of the change per seed)",
          _not_recovering, "not_recovering", "d=1024, no scale: frozen heads do not recover; they get worse"),
    Claim("dynamics", f"d=1024, with the scale: the spread settles around {SCALED_SPREAD:g}", f"≈ {SCALED_SPREAD:g}",
          f"layer 0's 95% interval meets ±{SCALED_TOLERANCE:.0%} of {SCALED_SPREAD:g}",
          partial(_dyn_claim, SCALED, "last", "spread", "{:.2f}", band=_band(SCALED_SPREAD, SCALED_TOLERANCE)),
          "scaled_spread"),
    Claim("sweep", "d=32: no difference (unscaled very slightly ahead)", "≈ 0, gap ≤ 0",
          "95% interval meets −1 to 0 points, and lies at or below 0 (the sign is part of the claim)",
          partial(_gap_claim, lambda w: w == 32, -1.0, 0.0, -1, "d=32")),
    Claim("sweep", "d=128: the scale helps by about 2 points", "≈ 2", "95% interval meets 1.5–2.5 points and lies above 0",
          partial(_gap_claim, lambda w: w == 128, 1.5, 2.5, +1, "d=128")),
    Claim("sweep", "d ≥ 256: worth 17 to 18 points", "17–18", "95% interval meets 16.5–18.5 points and lies above 0, at each width",
          partial(_gap_claim, lambda w: w >= 256, *BIG_GAP, +1, "d ≥ 256"), "big_gap"),
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


SAID = {AGREES: "agree", PARTLY: "partly", INCONCLUSIVE: "inconclusive", DIFFERS: "differ", NOT_RUN: "not run"}


def scoreboard(verdicts: Sequence[Verdict], figures: bool = True) -> tuple[str, list[str]]:
    """The count of verdicts in one line ("14 agree, 3 partly, 2 differ of 19 claims"; "inconclusive"
    and "not run" only where some claim was), and one short line per claim that does not agree: its name,
    verdict and (``figures``) both figures. What a reader, or a terminal, sees before any explanation."""
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    shown = [k for k in VERDICTS if counts[k] or k in (AGREES, PARTLY, DIFFERS)]
    head = ", ".join(f"{counts[k]} {SAID[k]}" for k in shown) + f" of {len(verdicts)} claims"
    lines = [f"{v.title}: {v.verdict}" + (f" (course {v.course}, ours {v.ours})" if figures else "")
             for v in verdicts if v.verdict in (PARTLY, INCONCLUSIVE, DIFFERS)]
    return head, lines
