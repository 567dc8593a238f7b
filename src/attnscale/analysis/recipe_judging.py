"""Judging the recipe study's detectors within each cell: does an alert fire before a learned run breaks?

The study (``experiments.warn_study``: Wortsman et al. 2023's recipe, four arms × a learning-rate
ladder × seeds) gives each run its loss at every step and, every ``PROBE_EVERY`` steps, every head's
measures, the gradient norm, the output logits' mean log Z and the q/k weight RMS
(``detectors.Series``). What happened to each run is ``analysis.outcomes`` (the one definition of a
break); its detectors' alarms are ``detectors``' pure functions. The study's judging lives here, each rule fixed before the study's seeds ran
(docs/warn-study.md):

- ``STUDY_DETECTORS``: what each detector reads from a run, the thresholds it is judged at, and
  whether it is a baseline (the loss's spike detector, the gradient-norm spike, log Z drift). The
  literature's max |score| levels are judged as they are; every other threshold is chosen on data.
- ``Watched``: one learned run under one detector at one threshold: at risk from the step it learnt
  to its break (or its end), and its first alarm in that span; ``watched`` makes one from a run.
- judging one detector within a cell: ``hit_rate`` (Wilson's interval), ``false_alarms_per_1000``
  (at-risk steps of the runs that held), ``choose_threshold`` (the most hits under the budget),
  ``paired_lead`` with ``sign_test`` against a baseline, ``holm`` across detectors, ``cross_fit``,
  and ``auc``/``auc_interval`` of an early reading for the final outcome.
- ``judge``: cross-fitting (thresholds chosen on one half of the seeds, pooled over the cells, judged
  on the other half, then swapped), then per cell (arm × learning rate, never pooled across rates)
  each detector's hit rate, false alarms per 1,000 at-risk steps, median lead, its lead paired
  against each baseline with Holm's correction across the detectors, and the AUC of its reading at
  10% and 25% of the steps for predicting a degraded end.
- ``verdict``: the rule that decides ``watch.alerts.default_alerts()`` from the judged numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from attnscale.analysis import detectors as det
from attnscale.analysis import outcomes as oc
from attnscale.errors import ConfigError

__all__ = ["Watched", "hit_rate", "false_alarms_per_1000", "FALSE_ALARMS_PER_1000", "choose_threshold", "sign_test",
           "paired_lead", "holm", "cross_fit", "auc", "auc_interval", "StudyDetector", "STUDY_DETECTORS", "BASELINES", "ATTENTION", "EARLY", "points", "watched", "reading",
           "outcome_of", "judge", "verdict", "DEFAULT_RULE",
           "hits_text", "per_1000_text", "lead_text"]

EARLY = (0.10, 0.25)  # shares of a run's steps at which a detector's reading predicts a degraded end


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---- judging within a cell: one detector over one cell's learned runs -----------------------------------


@dataclass(frozen=True)
class Watched:
    """One learned run under one detector: its seed, the span at risk [``start``, ``end``) (from where it
    learnt to its break, or to its last step), its break step (None: it held) and the detector's first
    alarm in the span (None: silent). A hit is an alarm strictly before the break: a warning at the
    break's own step leaves no time to act on it."""

    seed: int
    start: int
    end: int
    broke: int | None
    alarm: int | None

    @property
    def hit(self) -> bool:
        return self.broke is not None and self.alarm is not None and self.alarm < self.broke

    @property
    def lead(self) -> int | None:
        return self.broke - self.alarm if self.hit else None

    @property
    def false_alarm(self) -> bool:
        return self.broke is None and self.alarm is not None


def hit_rate(runs: Sequence[Watched]) -> dict:
    """Hits of the mid-run breaks in ``runs`` (one cell: one run a seed, so the runs are independent)
    with Wilson's interval."""
    broke = [r for r in runs if r.broke is not None]
    hits = sum(r.hit for r in broke)
    return {"hits": hits, "breaks": len(broke), "rate": hits / len(broke) if broke else None,
            "ci": det.wilson(hits, len(broke))}


def false_alarms_per_1000(runs: Sequence[Watched]) -> dict:
    """False alarms per 1,000 at-risk steps of the runs that held (each alarms at most once: its first),
    with a percentile interval from resampling seeds (``bootstrap``). With none at all, every resample
    gives 0, so the interval is instead the exact Poisson one for 0 events, [0, −ln(0.025) / steps]:
    no alarm in few steps is not a rate shown to be 0."""
    held = [r for r in runs if r.broke is None]
    count, steps = sum(r.false_alarm for r in held), sum(r.end - r.start for r in held)
    ci = (0.0, 1000 * -math.log(0.025) / steps) if steps and not count else det.bootstrap(runs, _per_1000)
    return {"false_alarms": count, "at_risk_steps": steps, "per_1000": _per_1000(runs), "ci": ci}


def _per_1000(runs: Sequence[Watched]) -> float | None:
    held = [r for r in runs if r.broke is None]
    steps = sum(r.end - r.start for r in held)
    return 1000 * sum(r.false_alarm for r in held) / steps if steps else None


FALSE_ALARMS_PER_1000 = 0.05  # a threshold chosen on data may false-alarm at most this often on its choosing half


def choose_threshold(by_threshold: Mapping[float, Sequence[Watched]],
                     max_per_1000: float = FALSE_ALARMS_PER_1000) -> float | None:
    """The threshold (in ``by_threshold``'s order: the runs under each) with the most hits among those
    whose false alarms per 1,000 at-risk steps are at most ``max_per_1000``; ties go to the longer median
    lead, then to the earlier threshold. None where none qualifies. Meant for the choosing half only."""
    best, key = None, None
    for threshold, runs in by_threshold.items():
        rate = _per_1000(runs)
        if rate is None or rate > max_per_1000:
            continue
        # the median lead is None exactly where there is no hit, so it is only ever compared with another None
        k = (sum(r.hit for r in runs), det.quantile([r.lead for r in runs if r.hit], 0.5))
        if key is None or k > key:  # strictly: of equal keys the earlier threshold stays
            best, key = threshold, k
    return best


def sign_test(differences: Sequence[float]) -> float | None:
    """Two-sided exact sign test of a zero median: 2 · P(Binomial(n, ½) ≤ min(positives, negatives)),
    capped at 1, zeros dropped; None with no non-zero difference."""
    pos, neg = sum(d > 0 for d in differences), sum(d < 0 for d in differences)
    n = pos + neg
    if not n:
        return None
    tail = math.fsum(math.comb(n, i) for i in range(min(pos, neg) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_lead(a: Sequence[Watched], b: Sequence[Watched]) -> dict:
    """Lead of detector ``a`` minus that of baseline ``b`` on the same broken runs (the lists in the same
    run order; a miss counts 0, no warning): median with a seed-bootstrap interval, a sign test over the
    seeds' mean differences (a seed's runs share batches and init), and "earlier", "later" or
    "inconclusive" by the interval."""
    if [(x.seed, x.broke) for x in a] != [(y.seed, y.broke) for y in b]:
        raise ValueError("paired_lead needs the same runs, in the same order, under both detectors")
    pairs = [(x.seed, (x.lead or 0) - (y.lead or 0)) for x, y in zip(a, b) if x.broke is not None]

    def median(sample):
        return det.quantile([d for _, d in sample], 0.5)

    by_seed: dict[int, list[float]] = {}
    for s, d in pairs:
        by_seed.setdefault(s, []).append(d)
    ci = det.bootstrap(pairs, median, seed_of=lambda p: p[0])
    return {"runs": len(pairs), "median": median(pairs), "ci": ci, "verdict": det.lead_verdict(ci),
            "p": sign_test([sum(ds) / len(ds) for ds in by_seed.values()])}


def holm(pvalues: Mapping[str, float | None], alpha: float = 0.05) -> dict[str, dict]:
    """Holm's step-down correction across detectors: sorted p₍₁₎ ≤ … ≤ p₍ₘ₎, adjusted p₍ᵢ₎ =
    max over j ≤ i of min(1, (m − j + 1) p₍ⱼ₎); a detector's test holds where its adjusted p ≤ ``alpha``.
    A detector without a p (no test) keeps None and is not counted in m."""
    ranked = sorted((p, name) for name, p in pvalues.items() if p is not None)
    m, running, out = len(ranked), 0.0, {}
    for j, (p, name) in enumerate(ranked):
        running = max(running, min(1.0, (m - j) * p))
        out[name] = {"p": p, "p_holm": running, "holds": running <= alpha}
    for name, p in pvalues.items():
        if p is None:
            out[name] = {"p": None, "p_holm": None, "holds": False}
    return out


def cross_fit(items: Sequence, choose: Callable[[list], object], judge_with: Callable[[list, object], list],
              seed_of: Callable = lambda o: o.seed) -> dict:
    """Choose on one half of the seeds (``split_seeds``), judge on the other, then swap: every item is
    judged by a choice made without it. ``choose(items) -> choice``; ``judge_with(items, choice) -> list``.
    Returns both folds' choices and the judged lists joined."""
    first, second = det.split_seeds([seed_of(x) for x in items])
    folds, judged = [], []
    for pick, held in ((first, second), (second, first)):
        choice = choose([x for x in items if seed_of(x) in pick])
        judged += judge_with([x for x in items if seed_of(x) in held], choice)
        folds.append({"choosing_seeds": pick, "judged_seeds": held, "choice": choice})
    return {"folds": folds, "judged": judged}


def auc(scored: Sequence[tuple[float, bool]]) -> float | None:
    """Area under the ROC curve of (score, positive) pairs: the share of (positive, negative) pairs the
    score orders rightly, ties counting half (Mann–Whitney); None without both kinds."""
    pos = [s for s, y in scored if y]
    neg = [s for s, y in scored if not y]
    if not pos or not neg:
        return None
    right = math.fsum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return right / (len(pos) * len(neg))


def auc_interval(scored: Sequence[tuple[int, float, bool]], draws: int = 1000) -> dict:
    """``auc`` of (seed, score, positive) triples with a percentile interval from resampling seeds, each
    seed bringing all its runs (runs of one seed share init and batches)."""
    def stat(sample):
        return auc([(s, y) for _, s, y in sample])

    return {"auc": stat(scored), "ci": det.bootstrap(scored, stat, seed_of=lambda t: t[0], draws=draws)}


# ---- the study's detectors, read from its runs ---------------------------------------------------------


def points(series: det.Series, key: str, how: Callable[[Sequence[float]], float]) -> list[tuple[int, float]]:
    """(step, ``how`` of the probe's ``key`` values) at every probe that has them; NaN where any value
    is not finite (which fires every detector: ``detectors._first``)."""
    out = []
    for step, m in series.probes:
        vs = m.get(key)
        if vs:
            out.append((step, how(vs) if all(_finite(v) for v in vs) else math.nan))
    return out


@dataclass(frozen=True)
class StudyDetector:
    """A detector of the study: ``read(series)`` its points (a spike detector's: its scores, computed once),
    ``alarm(points, threshold, start)`` its first firing step at or after ``start``; ``thresholds`` judged (``fixed``: each as it is, one
    detector per level; else one chosen on data by cross-fitting); ``baseline``: a signal a user already has."""

    name: str
    text: str
    read: Callable[[det.Series], Any]
    alarm: Callable[..., int | None]
    thresholds: tuple[float, ...]
    fixed: bool = False
    baseline: bool = False
    attention: bool = False
    alert: str = ""  # the watch's alert that carries the rule, where one does


def _max_score(s):
    return points(s, "max_score", max)


def _words(s):
    return points(s, "effective_words", min)


def _qk_rms(s):
    return points(s, "qk_rms", max)


def _grad_norm(s):
    return points(s, "grad_norm", max)


def _log_z(s):
    return points(s, "log_z", max)


def _loss_z(s):
    return det.spike_scores(list(enumerate(s.losses)), det.LOSS_WINDOW)


def _grad_z(s):
    return det.spike_scores(_grad_norm(s), det.GRAD_WINDOW)


def _over(scores, threshold: float, start: int = 0) -> int | None:
    """The first step at or after ``start`` whose spike score (``detectors.spike_scores``) is above ``threshold``."""
    return next((t for t, z in scores if t >= start and z > threshold), None)


STUDY_DETECTORS: tuple[StudyDetector, ...] = (
    *(StudyDetector(f"max_score>{level:g}", f"largest max |score| of any head above {level:g} (the literature's level)",
                    _max_score, det.max_score_alarm, (level,), fixed=True, attention=True, alert=f"MaxScore({level:g})")
      for level in det.LITERATURE_LEVELS),
    StudyDetector("max_score", "largest max |score| of any head above a level chosen on data", _max_score,
                  det.max_score_alarm, (10, 30, 100, 300, 1e3, 3e3, 1e4, 3e4, 1e5), attention=True, alert="MaxScore(tau)"),
    StudyDetector("entropy_collapse", "lowest head's effective words (exp of its attention entropy) under a share of "
                  "its first probe's", _words,
                  det.entropy_collapse_alarm, (0.05, 0.1, 0.2, 0.3, 0.5, 0.7), attention=True),
    StudyDetector("qk_rms_growth", "largest q or k weight RMS above a factor of its first probe's", _qk_rms,
                  det.qk_rms_growth_alarm, (1.1, 1.25, 1.5, 2, 3, 5, 10), attention=True),
    StudyDetector("loss_spike", "the loss more than k robust SDs above the median of its last 50 steps (every step)",
                  _loss_z, _over, (3, 4, 5, 6, 8, 10, 15), baseline=True),
    StudyDetector("grad_norm_spike", "the gradient norm more than k robust SDs above the median of its last 20 probes",
                  _grad_z, _over, (3, 4, 5, 6, 8, 10, 15), baseline=True),
    StudyDetector("log_z_drift", "the output logits' mean log Z moved more than x nats from its first probe's",
                  _log_z, det.log_z_drift_alarm, (0.25, 0.5, 1, 2, 4, 8), baseline=True),
)
BASELINES = tuple(d.name for d in STUDY_DETECTORS if d.baseline)
ATTENTION = tuple(d.name for d in STUDY_DETECTORS if d.attention)
_BY_NAME = {d.name: d for d in STUDY_DETECTORS}


def outcome_of(run: Mapping[str, Any], level: float, floor: float, best_of_arm: float) -> oc.RunOutcome:
    """``outcomes.classify`` of one study row (its ``series``)."""
    s: det.Series = run["series"]
    return oc.classify(s.losses, s.final_loss, level, floor, best_of_arm)


def watched(run: Mapping[str, Any], outcome: oc.RunOutcome, d: StudyDetector, threshold: float | None,
            read: Any = None) -> Watched | None:
    """The learned run under ``d`` at ``threshold`` (None: a detector with no threshold of its own, silent),
    at risk from the step it learnt to its break or its last step; None for a run that never learnt."""
    if outcome.learned_at is None:
        return None
    s: det.Series = run["series"]
    end = outcome.broke.step if outcome.broke is not None else s.steps
    read = d.read(s) if read is None else read
    alarm = None if threshold is None else d.alarm(read, threshold, outcome.learned_at)
    if alarm is not None and outcome.broke is None and alarm >= end:
        alarm = None
    return Watched(run["seed"], outcome.learned_at, end, None if outcome.broke is None else outcome.broke.step, alarm)


def reading(run: Mapping[str, Any], d: StudyDetector, share: float) -> float | None:
    """``d``'s number at the last probe (the last step, for the loss) within the first ``share`` of the
    run's planned steps: what it says early about the end. Oriented so that larger means "worse":
    max |score|, gradient norm and q/k RMS growth as they are; effective words as their fall from the first probe;
    log Z as its distance from the first probe's; the loss as its 20-step mean. None where the run
    has no reading by then; +inf where it is not finite (a run already blown up)."""
    s: det.Series = run["series"]
    cut = math.floor(share * run["steps"])
    if d.name == "loss_spike":
        got = [x for x in s.losses[: cut + 1]][-oc.WINDOW:]
        if not got:
            return None
        return math.inf if not all(_finite(x) for x in got) else math.fsum(got) / len(got)
    pts = [(t, v) for t, v in (_grad_norm(s) if d.name == "grad_norm_spike" else d.read(s)) if t <= cut]
    if not pts:
        return None
    v, first = pts[-1][1], pts[0][1]
    if not _finite(v):
        return math.inf
    if d.name == "entropy_collapse":
        return first - v
    if d.name == "qk_rms_growth":
        return v / first if _finite(first) and first > 0 else None
    if d.name == "log_z_drift":
        return abs(v - first) if _finite(first) else None
    return v


def _lead_summary(runs: Sequence[Watched]) -> dict:
    """The hits' median lead and its seed-bootstrap interval; no interval from fewer than two hits (every
    resample would give the one lead back)."""
    leads = [r.lead for r in runs if r.hit]
    ci = det.bootstrap(runs, lambda sample: det.quantile([r.lead for r in sample if r.hit], 0.5)) if len(leads) > 1 else None
    return {"hits": len(leads), "median": det.quantile(leads, 0.5), "ci": ci}


def judge(rows: Sequence[Mapping[str, Any]], level: float, floor: float,
          max_per_1000: float = FALSE_ALARMS_PER_1000) -> dict[str, Any]:
    """Every rule of the study applied to ``rows`` (each: arm, lr, seed, steps, series), the learned level
    and no-attention floor from the pilot. Returns per arm the outcome counts, the cross-fitting folds'
    chosen thresholds, and per cell every detector's judged numbers (module docstring)."""
    rows = list(rows)
    # the best learning rate of each arm: its lowest median held-out loss (outcomes.arm_best)
    best: dict[str, float] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        by_lr: dict[float, list] = {}
        for r in rows:
            if r["arm"] == arm:
                by_lr.setdefault(r["lr"], []).append(r["series"].final_loss)
        try:
            best[arm] = oc.arm_best(by_lr)
        except ConfigError:  # no rate of the arm ends finite: only the floor marks a run degraded
            best[arm] = math.inf
    outs = [outcome_of(r, level, floor, best[r["arm"]]) for r in rows]
    reads = {d.name: [d.read(r["series"]) for r in rows] for d in STUDY_DETECTORS}
    learned = [i for i, o in enumerate(outs) if o.learned_at is not None]

    def under(d: StudyDetector, t: float | None, idx: Sequence[int]) -> dict[int, Watched]:
        return {i: watched(rows[i], outs[i], d, t, reads[d.name][i]) for i in idx}

    # cross-fitting: a detector's threshold chosen on one half of the seeds (every cell's learned runs of
    # those seeds), each run judged at the threshold chosen on the other half
    first, second = det.split_seeds(sorted({r["seed"] for r in rows}))
    judged: dict[str, dict[int, Watched]] = {}
    folds: dict[str, list[dict]] = {}
    for d in STUDY_DETECTORS:
        judged[d.name], folds[d.name] = {}, []
        for pick, held in ((first, second), (second, first)):
            if d.fixed:
                choice = d.thresholds[0]
            else:
                choosing = [i for i in learned if rows[i]["seed"] in pick]
                choice = choose_threshold({t: list(under(d, t, choosing).values()) for t in d.thresholds},
                                              max_per_1000)
            judged[d.name].update(under(d, choice, [i for i in learned if rows[i]["seed"] in held]))
            folds[d.name].append({"choosing_seeds": list(pick), "judged_seeds": list(held), "threshold": choice})

    cells = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        for lr in sorted({r["lr"] for r in rows if r["arm"] == arm}):
            idx = [i for i, r in enumerate(rows) if (r["arm"], r["lr"]) == (arm, lr)]
            mine = [i for i in idx if i in judged[STUDY_DETECTORS[0].name]]
            tally = oc.tally(outs[i] for i in idx)
            halves = {"first": sum(1 for i in idx if outs[i].broke is not None and rows[i]["seed"] in first),
                      "second": sum(1 for i in idx if outs[i].broke is not None and rows[i]["seed"] in second)}
            per: dict[str, Any] = {}
            for d in STUDY_DETECTORS:
                ws = [judged[d.name][i] for i in mine]
                per[d.name] = {"hits": hit_rate(ws), "false_alarms": false_alarms_per_1000(ws),
                               "lead": _lead_summary(ws),
                               "predicts_degraded": {f"{share:g}": auc_interval(
                                   [(rows[i]["seed"], x, outs[i].degraded) for i in idx
                                    for x in [reading(rows[i], d, share)] if x is not None]) for share in EARLY}}
            versus = {}
            for b in BASELINES:
                base = [judged[b][i] for i in mine]
                tests = {d.name: paired_lead([judged[d.name][i] for i in mine], base)
                         for d in STUDY_DETECTORS if d.name != b}
                adjusted = holm({n: t["p"] for n, t in tests.items()})
                versus[b] = {n: {**t, **adjusted[n]} for n, t in tests.items()}
            cells.append({"arm": arm, "lr": lr, "seeds": len({rows[i]["seed"] for i in idx}), **tally,
                          "mid_run_breaks_by_half": halves, "detectors": per, "versus": versus})
    arms = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        idx = [i for i, r in enumerate(rows) if r["arm"] == arm]
        arms[arm] = {"seeds": len({rows[i]["seed"] for i in idx}), **oc.tally(outs[i] for i in idx),
                     "mid_run_breaks_by_half": {
                         "first": sum(1 for i in idx if outs[i].broke is not None and rows[i]["seed"] in first),
                         "second": sum(1 for i in idx if outs[i].broke is not None and rows[i]["seed"] in second)},
                     "best_valid_loss": None if math.isinf(best[arm]) else best[arm]}
    return {"level": level, "floor": floor, "max_false_alarms_per_1000": max_per_1000, "halves":
            {"first": list(first), "second": list(second)}, "arms": arms, "folds": folds, "cells": cells,
            "outcomes": [{"arm": r["arm"], "lr": r["lr"], "seed": r["seed"], "kind": o.kind,
                          "learned_at": o.learned_at, "broke": None if o.broke is None else o.broke.step,
                          "reason": None if o.broke is None else o.broke.reason, "degraded": o.degraded}
                         for r, o in zip(rows, outs)]}


# ---- what the defaults follow from (fixed before the study's seeds ran) ---------------------------------

DEFAULT_RULE = (
    "An attention detector becomes a default alert of the watch (action warn) only if, in every qk-norm-off cell "
    "of the study's chosen rungs that has mid-run breaks, its judged hit rate is at least 50% and its judged false "
    "alarms are at most 0.05 per 1,000 at-risk steps, and in at least half of those cells its lead paired against "
    "the loss's own spike detector is 'earlier' with Holm's correction holding. Otherwise default_alerts() stays "
    "NonFinite alone.")


def verdict(result: Mapping[str, Any], rungs: Sequence[float], qk_off: Sequence[str] = ("qk-off-z0", "qk-off-z1e-4"),
            min_hit: float = 0.5, max_per_1000: float = FALSE_ALARMS_PER_1000) -> dict[str, Any]:
    """``DEFAULT_RULE`` applied: per attention detector whether it qualifies, and why not; the cells it read."""
    cells = [c for c in result["cells"] if c["arm"] in qk_off and c["lr"] in rungs and c["mid_run_breaks"]]
    out: dict[str, Any] = {"rule": DEFAULT_RULE, "cells": [(c["arm"], c["lr"]) for c in cells], "detectors": {}}
    for name in ATTENTION:
        why = []
        if not cells:
            why.append("no qk-norm-off cell of the chosen rungs has a mid-run break")
        earlier = 0
        for c in cells:
            d = c["detectors"][name]
            rate, fa = d["hits"]["rate"], d["false_alarms"]["per_1000"]
            where = f"{c['arm']} at {c['lr']:g}"
            if rate is None or rate < min_hit:
                why.append(f"{where}: hit rate {'—' if rate is None else f'{rate:.0%}'} under {min_hit:.0%}")
            if fa is not None and fa > max_per_1000:
                why.append(f"{where}: {fa:.2f} false alarms per 1,000 steps, over {max_per_1000:g}")
            v = c["versus"]["loss_spike"][name]
            earlier += v["verdict"] == "earlier" and v["holds"]
        if cells and 2 * earlier < len(cells):
            why.append(f"earlier than the loss's spike detector (Holm) in {earlier} of {len(cells)} cells, under half")
        out["detectors"][name] = {"qualifies": not why, "why_not": why}
    out["defaults"] = [n for n, d in out["detectors"].items() if d["qualifies"] and _BY_NAME[n].alert]
    return out


# ---- the numbers as text, one way for the printout and the report ------------------------------------


def hits_text(hits: dict[str, Any], empty: str = "—") -> str:
    """"k/n [lo%, hi%]" (Wilson), or ``empty`` without a break to warn of."""
    if not hits["breaks"]:
        return empty
    lo, hi = hits["ci"]
    return f"{hits['hits']}/{hits['breaks']} [{100 * lo:.0f}%, {100 * hi:.0f}%]"


def per_1000_text(fa: dict[str, Any], empty: str = "—") -> str:
    """False alarms per 1,000 at-risk steps with its interval (``empty`` where no run held)."""
    if fa["per_1000"] is None:
        return empty
    ci = fa["ci"]
    return f"{fa['per_1000']:.2f}" + (" (no interval)" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def lead_text(lead: dict[str, Any]) -> str:
    """Median lead in steps with its seed-bootstrap interval ("—" without a hit; one hit has no interval). The
    interval's ends, percentiles that fall between whole steps, are widened to the whole steps around them."""
    if lead["median"] is None:
        return "—"
    ci = lead["ci"]
    if ci is None:
        return f"{lead['median']:g} (one run)" if lead.get("hits") == 1 else f"{lead['median']:g} (no interval)"
    return f"{lead['median']:g} [{math.floor(ci[0])}, {math.ceil(ci[1])}]"
