"""Does a warning come before the break? Alerts as detectors: pure functions on plain series.

A run is a ``Series``: the training loss at every step, the watch's per-head measures at its
probe steps, and the held-out loss at the end. What a break is lives in ``analysis.outcomes``, once
(the recipe study's rules, and the first round's withdrawn rule kept to redraw its numbers); here are
the detectors that might warn of one:

- each alert of the first round as a detector (``signal``): one number per probe step (per step for
  the loss's own spike detector), and its first alarm at a threshold (``first_alarm``): the first step
  whose number passes the threshold (under it, for the ``below`` detectors);
- the first round's judging over runs: a hit is a broken run whose first alarm comes at or before its
  break; its lead is break step − alarm step (and that share of the run's steps); a false alarm is a
  healthy run with any alarm. ``sweep`` gives a curve of (false-alarm rate, hit rate) points over
  thresholds, ``choose`` the threshold a target false-alarm rate allows;
- uncertainty: ``wilson`` for a rate, ``bootstrap`` for a lead time (it resamples seeds, each seed
  carrying all its runs, since runs of one seed share their init and batches), ``split_seeds`` for
  the halves a threshold is chosen on and judged on;
- the recipe study's detectors as first firing steps at or after the step a run became at risk
  (``max_score_alarm`` … ``grad_norm_spike_alarm``); their judging within a cell is
  ``analysis.recipe_judging``.

References: entropy collapse (Zhai et al. 2023), attention-logit growth (Wortsman et al. 2023;
Dehghani et al. 2023), loss spikes against the run's own history (OLMo, Groeneveld et al. 2024).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from attnscale.analysis.outcomes import MAD_TO_SD, robust_z

__all__ = ["Series", "Detector", "DETECTORS", "robust_z", "signal", "first_alarm",
           "Outcome", "judge", "lead_verdict", "sweep", "choose", "combine_alarms", "quantile", "bootstrap",
           "split_seeds", "wilson", "MAD_TO_SD",
           # the recipe study's detectors
           "LITERATURE_LEVELS", "max_score_alarm", "entropy_collapse_alarm", "qk_rms_growth_alarm",
           "log_z_drift_alarm", "spike_scores", "spike_alarm", "loss_spike_alarm", "grad_norm_spike_alarm"]


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


def lead_verdict(ci: tuple[float, float] | None) -> str:
    """A lead difference's verdict by its interval: "earlier" where it lies above 0, "later" where below,
    "inconclusive" where it holds 0 or there is none."""
    return "inconclusive" if ci is None else "earlier" if ci[0] > 0 else "later" if ci[1] < 0 else "inconclusive"


