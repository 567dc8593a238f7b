"""Does a warning come before the break? Alerts judged as detectors: pure functions on plain series.

A run is a ``Series``: the training loss at every step, the watch's per-head measures at its
probe steps, and the held-out loss at the end. Everything here is arithmetic on those numbers:

- the break rule (``break_point``), written once: a run is broken at the first step where
  (a) the loss is not finite, or (b) the loss passes ``sigmas`` robust standard deviations
  (1.4826 × the median absolute deviation) above the median of its last ``window`` steps and
  does not come back under that line within ``recover`` steps, or, when its held-out loss at
  the end is above ``floor`` − ``plateau`` (``floor``: a unigram model's held-out loss; within
  ``plateau`` of it the run has learnt little beyond token frequencies), (c) from the step after
  which the mean loss of the last ``floor_window`` steps never again falls below that line. A run
  with none of these is healthy.
- each alert as a detector (``signal``): one number per probe step (per step for the loss's own
  spike detector), and its first alarm at a threshold (``first_alarm``): the first step whose
  number passes the threshold (under it, for the ``below`` detectors).
- judged over runs (``judge``): a hit is a broken run whose first alarm comes at or before its
  break; its lead is break step − alarm step (and that share of the run's steps); a false alarm
  is a healthy run with any alarm. ``sweep`` gives a curve of (false-alarm rate, hit rate) points
  over thresholds, ``choose`` the threshold a target false-alarm rate allows, ``combine`` a rule
  that fires when either of two does.
- uncertainty: ``wilson`` for a rate (hits of the broken runs, alarms of the healthy ones), ``bootstrap``
  for a lead time: it resamples seeds (each seed carries all its runs, since runs of one
  seed share their init and batches) for percentile intervals; ``split_seeds`` holds half the seeds
  out, so a threshold is chosen on one half and its rates read on the other.

References: entropy collapse (Zhai et al. 2023), attention-logit growth (Wortsman et al. 2023;
Dehghani et al. 2023), loss spikes against the run's own history (OLMo, Groeneveld et al. 2024).

The recipe study (issue 42; ``analysis.outcomes`` decides its breaks) reads its detectors as first
firing steps (``max_score_alarm`` … ``grad_norm_spike_alarm``) and judges them within a cell (arm ×
learning rate): hit rate on mid-run breaks, false alarms per 1,000 at-risk steps, lead paired against a
baseline, thresholds cross-fitted over halves of the seeds, Holm's correction across detectors, and the
AUC of an early reading for the final outcome with a seed-clustered interval.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

__all__ = ["Series", "BreakRule", "Break", "Detector", "DETECTORS", "break_point", "robust_z", "signal", "first_alarm",
           "Outcome", "judge", "lead_verdict", "sweep", "choose", "combine_alarms", "quantile", "bootstrap",
           "split_seeds", "wilson", "MAD_TO_SD",
           # the recipe study's detectors and their judging within a cell
           "LITERATURE_LEVELS", "max_score_alarm", "entropy_collapse_alarm", "qk_rms_growth_alarm",
           "log_z_drift_alarm", "spike_scores", "spike_alarm", "loss_spike_alarm", "grad_norm_spike_alarm", "Watched", "hit_rate",
           "false_alarms_per_1000", "FALSE_ALARMS_PER_1000", "choose_threshold", "sign_test", "paired_lead", "holm", "cross_fit", "auc", "auc_interval"]

MAD_TO_SD = 1.4826  # a normal distribution's SD over its median absolute deviation
SD_FLOOR = 1e-3  # nats: a loss history flatter than this still needs a jump of sigmas × 1e-3 to count


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Series:
    """One run's numbers. ``losses[i]``: the training loss at step i (None where not finite);
    ``probes``: (step, {measure: values over every head of every layer}) at each probe step;
    ``final_loss``: held-out loss at the end, None where the run diverged."""

    losses: tuple[float | None, ...]
    probes: tuple[tuple[int, Mapping[str, Sequence[float]]], ...] = ()
    final_loss: float | None = None

    @property
    def steps(self) -> int:
        return len(self.losses)


@dataclass(frozen=True)
class BreakRule:
    sigmas: float = 6.0
    window: int = 50
    recover: int = 20
    min_history: int = 20
    floor_window: int = 20
    plateau: float = 0.1  # nats: analysis.schemes.PLATEAU_NATS, the unigram plateau of the scheme study

    @property
    def _plateau_text(self) -> str:
        return f"within {self.plateau:g} nats of a unigram model's or above it" if self.plateau else "above a unigram model's"

    def text(self) -> str:
        return (f"broken at the first step where the training loss is not finite, or where it rises more than "
                f"{self.sigmas:g} robust SDs (1.4826 × MAD) above the median of its last {self.window} steps and "
                f"does not come back under that line within {self.recover} steps, or, for a run whose held-out "
                f"loss at the end is {self._plateau_text} (on the unigram plateau: it has learnt little beyond token "
                f"frequencies), from the step after which the mean training loss of the last {self.floor_window} "
                f"steps never again falls under that line; healthy otherwise")


@dataclass(frozen=True)
class Break:
    step: int
    reason: str  # "non-finite", "spike" or "floor"


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def robust_z(history: Sequence[float], value: float) -> float:
    """(value − median) / (1.4826 × MAD) of ``history``, the SD floored at ``SD_FLOOR``."""
    med = _median(history)
    sd = max(MAD_TO_SD * _median([abs(x - med) for x in history]), SD_FLOOR)
    return (value - med) / sd


def _limit(history: Sequence[float], sigmas: float) -> float:
    med = _median(history)
    return med + sigmas * max(MAD_TO_SD * _median([abs(x - med) for x in history]), SD_FLOOR)


def break_point(series: Series, floor: float | None, rule: BreakRule = BreakRule()) -> Break | None:
    """The run's break by ``rule`` (the module's docstring), or None for a healthy run."""
    losses = series.losses
    found: list[Break] = []
    bad = [i for i, x in enumerate(losses) if not _finite(x)]
    if bad:
        found.append(Break(bad[0], "non-finite"))
    end = bad[0] if bad else len(losses)
    for t in range(rule.min_history, end - rule.recover):  # a spike needs `recover` steps after it to be judged
        history = losses[max(0, t - rule.window):t]
        line = _limit(history, rule.sigmas)
        if losses[t] > line and all(x > line for x in losses[t + 1:t + 1 + rule.recover]):
            found.append(Break(t, "spike"))
            break
    line = None if floor is None else floor - rule.plateau
    if line is not None and not bad and series.final_loss is not None and series.final_loss > line:
        w = rule.floor_window
        means = [sum(losses[i - w + 1:i + 1]) / w for i in range(w - 1, len(losses))]
        below = [i for i, m in enumerate(means) if m < line]
        start = below[-1] + 1 if below else 0  # the first window after the last one under the floor
        found.append(Break(min(start + w - 1, len(losses) - 1), "floor"))
    return min(found, key=lambda b: b.step) if found else None


# ---- detectors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detector:
    """An alert as a detector: ``name``, the thresholds swept, whether it fires under them
    (``below``), what its number is, and the watch alert it stands for (``alert``)."""

    name: str
    thresholds: tuple[float, ...]
    below: bool = False
    text: str = ""
    alert: str = ""


GROWTH_LAG = 4  # probes: the growth rate compares a head's max score with its own 4 probes before
SPIKE_WINDOW, SPIKE_MIN = 20, 5  # watch.alerts.Spike's defaults: its last 20 probes, after 5
LOSS_WINDOW = 50  # steps of loss history the loss's own spike detector compares with

DETECTORS: tuple[Detector, ...] = (
    Detector("max_score", (10, 30, 100, 300, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 3e5),
             text="largest max |score| of any head above the threshold", alert="MaxScore(tau)"),
    Detector("growth", (1.25, 1.5, 2, 3, 5, 10, 30, 100),
             text=f"a head's max |score| grown by more than the factor over its last {GROWTH_LAG} probes",
             alert="(none yet)"),
    Detector("fewest_words", (1.001, 1.003, 1.01, 1.03, 1.1, 1.3, 2, 3), below=True,
             text="fewest effective words of any head under the threshold", alert="Collapsed(words)"),
    Detector("frozen", (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999),
             text="largest frozen share of any head above the threshold", alert="Frozen(limit)"),
    Detector("head_spike", (3, 4, 6, 8, 10, 15, 20, 50),
             text=f"a head's max |score| more than the threshold SDs above the mean of its last {SPIKE_WINDOW} probes",
             alert="Spike('max_score', sigmas)"),
    Detector("non_finite", (0.5,), text="a NaN or inf among a head's measures", alert="NonFinite()"),
    Detector("loss_spike", (3, 4, 5, 6, 8, 10, 15),
             text=f"the training loss more than the threshold robust SDs above the median of its last {LOSS_WINDOW} "
                  "steps (every step: the baseline)", alert="(the loss's own)"),
)
_BY_NAME = {d.name: d for d in DETECTORS}


def _spike_z(history: Sequence[float], value: float) -> float:
    """watch.alerts.Spike.z: SDs from the history's mean, population SD floored at 1e-6 of |mean| and 1e-12."""
    n = len(history)
    mean = sum(history) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in history) / n)
    return (value - mean) / max(sd, 1e-6 * abs(mean), 1e-12)


def signal(name: str, series: Series) -> list[tuple[int, float]]:
    """The detector's number at each step it is read: (step, value). A value is left out where its
    measures are not finite (``non_finite``'s business), except for the loss's, where a non-finite
    loss reads as +inf."""
    if name == "loss_spike":
        out, losses = [], series.losses
        for t in range(SPIKE_MIN, len(losses)):
            if not _finite(losses[t]):
                out.append((t, math.inf))
                continue
            history = [x for x in losses[max(0, t - LOSS_WINDOW):t] if _finite(x)]
            if len(history) >= SPIKE_MIN:
                out.append((t, robust_z(history, losses[t])))
        return out
    out = []
    heads: dict[int, list[float]] = {}  # head -> its max scores so far (growth, head_spike)
    for step, m in series.probes:
        if name == "non_finite":
            out.append((step, float(any(not _finite(v) for vs in m.values() for v in vs))))
        elif name in ("max_score", "frozen", "fewest_words"):
            key = {"max_score": "max_score", "frozen": "frozen_fraction", "fewest_words": "effective_words"}[name]
            vs = [v for v in m[key] if _finite(v)]
            if vs:
                out.append((step, min(vs) if name == "fewest_words" else max(vs)))
        else:
            best = None
            for h, v in enumerate(m["max_score"]):
                past = heads.setdefault(h, [])
                if not _finite(v):
                    continue
                if name == "growth" and len(past) >= GROWTH_LAG and past[-GROWTH_LAG] > 0:
                    x = v / past[-GROWTH_LAG]
                elif name == "head_spike" and len(past) >= SPIKE_MIN:
                    x = _spike_z(past[-SPIKE_WINDOW:], v)
                else:
                    x = None
                past.append(v)
                if x is not None:
                    best = x if best is None else max(best, x)
            if best is not None:
                out.append((step, best))
    return out


def first_alarm(points: Sequence[tuple[int, float]], threshold: float, below: bool = False) -> int | None:
    """The first step whose value passes ``threshold`` strictly (under it where ``below``), or None."""
    for step, v in points:
        if (v < threshold) if below else (v > threshold):
            return step
    return None


def combine_alarms(*alarms: int | None) -> int | None:
    """The first alarm of a rule that fires when any of its parts does."""
    got = [a for a in alarms if a is not None]
    return min(got) if got else None


# ---- judging -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One run as a detector's judge sees it: its seed, length, break (None: healthy) and first alarm."""

    seed: int
    steps: int
    broken_at: int | None
    alarm: int | None
    cell: str = ""

    @property
    def hit(self) -> bool:
        return self.broken_at is not None and self.alarm is not None and self.alarm <= self.broken_at

    @property
    def false_alarm(self) -> bool:
        return self.broken_at is None and self.alarm is not None

    @property
    def lead(self) -> int | None:
        return self.broken_at - self.alarm if self.hit else None


def quantile(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default); None if empty."""
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def judge(out: Sequence[Outcome]) -> dict:
    """Counts and rates of ``out``: hits of the broken runs, false alarms of the healthy ones, and the
    hits' lead in steps and as a share of their run (median and quartiles)."""
    broken = [o for o in out if o.broken_at is not None]
    healthy = [o for o in out if o.broken_at is None]
    hits = [o for o in broken if o.hit]
    fa = sum(o.false_alarm for o in healthy)
    leads = [o.lead for o in hits]
    shares = [o.lead / o.steps for o in hits]
    return {"broken": len(broken), "healthy": len(healthy), "hits": len(hits), "false_alarms": fa,
            "hit_rate": len(hits) / len(broken) if broken else None,
            "false_alarm_rate": fa / len(healthy) if healthy else None,
            "lead_median": quantile(leads, 0.5), "lead_q1": quantile(leads, 0.25), "lead_q3": quantile(leads, 0.75),
            "lead_share_median": quantile(shares, 0.5)}


def sweep(runs, name: str, thresholds: Sequence[float] | None = None) -> list[dict]:
    """``judge`` of detector ``name`` at each of its thresholds: the points of its (false alarms, hits) curve.
    ``runs``: (seed, steps, break, {detector: signal points}) per run."""
    d = _BY_NAME[name]
    points = []
    for th in thresholds if thresholds is not None else d.thresholds:
        out = [Outcome(seed, steps, None if b is None else b.step, first_alarm(sig[name], th, d.below))
               for seed, steps, b, sig in runs]
        points.append({"detector": name, "threshold": th, **judge(out)})
    return points


def choose(points: Sequence[dict], max_false_alarms: float) -> dict | None:
    """The point with the most hits among those whose false-alarm rate is at most ``max_false_alarms``;
    ties go to the longer median lead, then to the earlier point (the list's order). None if none qualifies."""
    ok = [(i, p) for i, p in enumerate(points)
          if p["false_alarm_rate"] is not None and p["false_alarm_rate"] <= max_false_alarms]
    if not ok:
        return None
    return max(ok, key=lambda ip: (ip[1]["hit_rate"] or 0.0, ip[1]["lead_median"] if ip[1]["lead_median"] is not None
                                   else -math.inf, -ip[0]))[1]


# ---- uncertainty -------------------------------------------------------------------------------


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson's score interval for a share of ``k`` in ``n`` (None for n = 0): unlike a bootstrap it is
    not a point at 0 of n or n of n (0 of 15 gives [0, 0.204])."""
    if n <= 0:
        return None
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def split_seeds(seeds: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(seeds to choose thresholds on, seeds to report on): alternate seeds in sorted order, the first to choosing."""
    s = sorted(set(seeds))
    return tuple(s[0::2]), tuple(s[1::2])


def bootstrap(items: Sequence, stat: Callable[[list], float | None], seed_of: Callable = lambda o: o.seed,
              draws: int = 1000, level: float = 0.95, rng_seed: int = 0) -> tuple[float, float] | None:
    """Percentile interval of ``stat`` over ``draws`` resamples of the seeds (with replacement, each
    seed bringing all its items); None where fewer than two seeds or no resample gives a number."""
    by_seed: dict = {}
    for it in items:
        by_seed.setdefault(seed_of(it), []).append(it)
    keys = sorted(by_seed)
    if len(keys) < 2:
        return None
    rng = random.Random(rng_seed)
    values = []
    for _ in range(draws):
        sample = [it for k in (rng.choice(keys) for _ in keys) for it in by_seed[k]]
        v = stat(sample)
        if v is not None:
            values.append(v)
    if not values:
        return None
    tail = (1 - level) / 2
    return quantile(values, tail), quantile(values, 1 - tail)


# ---- the recipe study: each detector's first firing, over one run's per-probe series -------------
# A series is (step, value) points at the probe's cadence (the loss: every step). Each detector returns
# the first step at or after ``start`` (where the run became at risk: it had learnt) at which it fires,
# or None. A value that is not finite fires every detector: a NaN or inf is past any threshold.

LITERATURE_LEVELS = (1e2, 1e3, 1e4)  # max |score|: Wortsman et al. 2023 saw every run past 1e4 diverge
GRAD_WINDOW = 20  # points of gradient-norm history a spike is measured against (OLMo 2's spikes)


def _first(points: Sequence[tuple[int, float | None]], fires: Callable[[float], bool], start: int) -> int | None:
    for step, v in points:
        if step >= start and (not _finite(v) or fires(v)):
            return step
    return None


def _reference(points) -> float | None:
    """The series' first finite value: the run's own starting point, whatever ``start`` is."""
    return next((v for _, v in points if _finite(v)), None)


def max_score_alarm(points, level: float, start: int = 0) -> int | None:
    """The first probe whose largest max |score| over heads is above ``level``."""
    return _first(points, lambda v: v > level, start)


def entropy_collapse_alarm(points, fraction: float, start: int = 0) -> int | None:
    """The first probe whose lowest head's attention entropy is below ``fraction`` of its value at the
    run's first probe (entropy collapse: Zhai et al. 2023)."""
    ref = _reference(points)
    return _first(points, lambda v: ref is not None and v < fraction * ref, start)


def qk_rms_growth_alarm(points, factor: float, start: int = 0) -> int | None:
    """The first probe whose largest q or k projection weight RMS is above ``factor`` times its value
    at the first probe (the growth Wortsman et al. 2023 see behind attention-logit divergence)."""
    ref = _reference(points)
    return _first(points, lambda v: ref is not None and v > factor * ref, start)


def log_z_drift_alarm(points, nats: float, start: int = 0) -> int | None:
    """The first probe whose mean log Z of the output logits has moved more than ``nats`` from its value
    at the first probe, either way (output-logit divergence, which z-loss holds back)."""
    ref = _reference(points)
    return _first(points, lambda v: ref is not None and abs(v - ref) > nats, start)


def spike_scores(points, window: int, min_history: int = SPIKE_MIN) -> list[tuple[int, float]]:
    """(step, robust z of the point against the median of the ``window`` finite points before it) for
    every point once ``min_history`` of them exist; +inf for a point that is not finite. Computed
    once, then read at any number of thresholds."""
    history: list[float] = []
    out = []
    for step, v in points:
        if not _finite(v):
            out.append((step, math.inf))
            continue
        if len(history) >= min_history:
            out.append((step, robust_z(history[-window:], v)))
        history.append(v)
    return out


def spike_alarm(points, sigmas: float, window: int, start: int = 0, min_history: int = SPIKE_MIN,
                scores: Sequence[tuple[int, float]] | None = None) -> int | None:
    """The first point at or after ``start`` more than ``sigmas`` robust SDs (``robust_z``) above the
    median of the ``window`` finite points before it, once ``min_history`` of them exist (``scores``:
    ``spike_scores`` of the points, where already computed)."""
    for step, z in spike_scores(points, window, min_history) if scores is None else scores:
        if step >= start and z > sigmas:
            return step
    return None


def loss_spike_alarm(losses: Sequence[float | None], sigmas: float, start: int = 0) -> int | None:
    """The loss's own spike detector, every step: ``spike_alarm`` over its last ``LOSS_WINDOW`` steps."""
    return spike_alarm(list(enumerate(losses)), sigmas, LOSS_WINDOW, start)


def grad_norm_spike_alarm(points, sigmas: float, start: int = 0) -> int | None:
    """A gradient-norm spike (OLMo 2 report them before loss spikes): ``spike_alarm`` over ``GRAD_WINDOW`` points."""
    return spike_alarm(points, sigmas, GRAD_WINDOW, start)


# ---- the recipe study: judging within a cell --------------------------------------------------------


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
            "ci": wilson(hits, len(broke))}


def false_alarms_per_1000(runs: Sequence[Watched]) -> dict:
    """False alarms per 1,000 at-risk steps of the runs that held (each alarms at most once: its first),
    with a percentile interval from resampling seeds (``bootstrap``). With none at all, every resample
    gives 0, so the interval is instead the exact Poisson one for 0 events, [0, −ln(0.025) / steps]:
    no alarm in few steps is not a rate shown to be 0."""
    held = [r for r in runs if r.broke is None]
    count, steps = sum(r.false_alarm for r in held), sum(r.end - r.start for r in held)
    ci = (0.0, 1000 * -math.log(0.025) / steps) if steps and not count else bootstrap(runs, _per_1000)
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
        k = (sum(r.hit for r in runs), quantile([r.lead for r in runs if r.hit], 0.5))
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


def lead_verdict(ci: tuple[float, float] | None) -> str:
    """A lead difference's verdict by its interval: "earlier" where it lies above 0, "later" where below,
    "inconclusive" where it holds 0 or there is none."""
    return "inconclusive" if ci is None else "earlier" if ci[0] > 0 else "later" if ci[1] < 0 else "inconclusive"


def paired_lead(a: Sequence[Watched], b: Sequence[Watched]) -> dict:
    """Lead of detector ``a`` minus that of baseline ``b`` on the same broken runs (the lists in the same
    run order; a miss counts 0, no warning): median with a seed-bootstrap interval, a sign test over the
    seeds' mean differences (a seed's runs share batches and init), and "earlier", "later" or
    "inconclusive" by the interval."""
    if [(x.seed, x.broke) for x in a] != [(y.seed, y.broke) for y in b]:
        raise ValueError("paired_lead needs the same runs, in the same order, under both detectors")
    pairs = [(x.seed, (x.lead or 0) - (y.lead or 0)) for x, y in zip(a, b) if x.broke is not None]

    def median(sample):
        return quantile([d for _, d in sample], 0.5)

    by_seed: dict[int, list[float]] = {}
    for s, d in pairs:
        by_seed.setdefault(s, []).append(d)
    ci = bootstrap(pairs, median, seed_of=lambda p: p[0])
    return {"runs": len(pairs), "median": median(pairs), "ci": ci, "verdict": lead_verdict(ci),
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
    first, second = split_seeds([seed_of(x) for x in items])
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

    return {"auc": stat(scored), "ci": bootstrap(scored, stat, seed_of=lambda t: t[0], draws=draws)}
