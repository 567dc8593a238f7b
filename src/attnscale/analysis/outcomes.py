"""What happened to a run, decided from its loss series alone, by rules fixed before the study's seeds run.

The warning study (``experiments.warn_study``) asks whether an alert fires before a run that had
learnt breaks. That needs the event defined without looking at any detector, and apart from runs
that never learnt at all (a run stuck on the unigram plateau has no moment at which it "broke").
Every rule here is a pure function of plain numbers: the training loss at every step (None or NaN
where it was not finite) and the corpus's floors.

- *learned*: the mean loss of the last ``WINDOW`` (20) steps went below ``level`` (``learned_level``:
  a point set in advance between the no-attention floor and the best run, so that a learned run
  uses its context beyond the previous token).
- *mid-run break*: a learned run whose loss goes non-finite, or whose 20-step mean rises at least
  ``RISE`` (0.5 nats) above its running minimum and stays at least ``HOLD`` (0.3) above that
  minimum for ``HOLD_STEPS`` (50) steps. A slow divergence counts as well as a spike (Wortsman et
  al. 2023 study slow divergence). The break step is where the rise began: the step after the last
  one before the crossing whose own loss was within ``BEGIN`` (0.1 nats) of the minimum (the raw loss,
  not the mean, so that a jump dates from its own step, not from when the mean had caught up with it).
- *degraded*: the held-out loss at the end is above the no-attention floor, or more than
  ``DEGRADED_MARGIN`` above the best learning rate of the run's arm, or missing (the run diverged).
- *never learned*: not learned; tallied apart and never pooled with breaks.

This is the one definition of a break the project judges by. The first round of the warning study
(``analysis.alarms``) broke runs by another rule, withdrawn since (most of its "breaks" were runs that
never left the unigram plateau): ``FirstRoundRule`` and ``first_round_break`` keep it here, beside the
rule that replaced it, only so that its published numbers can be drawn again from its records; a run
it does not break is what that round called *healthy*. No new study reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from attnscale.errors import ConfigError

__all__ = ["MAD_TO_SD", "SD_FLOOR", "robust_z", "FirstRoundRule", "first_round_break", "WINDOW", "RISE", "HOLD", "HOLD_STEPS", "BEGIN", "LEARNED_SHARE", "DEGRADED_MARGIN", "window_means",
           "learned_level", "no_attention_floor", "bigram_loss", "learned_at", "rise_of", "mid_run_break", "Break",
           "degraded", "arm_best", "RunOutcome", "classify", "tally"]

WINDOW = 20  # steps in the running mean that every rule reads: one step's loss is too noisy to judge
RISE = 0.5  # nats above the running minimum that start a break
HOLD = 0.3  # nats above that minimum the mean must keep ...
HOLD_STEPS = 50  # ... for this many steps from the crossing, so a spike that heals is no break
BEGIN = 0.1  # nats: the rise began after the last step whose loss was this close to the minimum
LEARNED_SHARE = 0.5  # the learned level lies this share of the way from the no-attention floor to the best run
DEGRADED_MARGIN = 0.1  # nats above the best learning rate of the arm that make a run degraded
MAD_TO_SD = 1.4826  # a normal distribution's SD over its median absolute deviation
SD_FLOOR = 1e-3  # nats: a loss history flatter than this still needs a jump of sigmas × 1e-3 to count


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def window_means(losses: Sequence[float | None], window: int = WINDOW) -> list[float | None]:
    """The mean of the last ``window`` losses at each step (None before step ``window`` − 1, and from
    the first non-finite loss on: a mean over a NaN says nothing)."""
    out: list[float | None] = []
    total, bad = 0.0, False
    for i, x in enumerate(losses):
        bad = bad or not _finite(x)
        if bad:
            out.append(None)
            continue
        total += x
        if i >= window:
            total -= losses[i - window]
        out.append(total / window if i >= window - 1 else None)
    return out


def learned_level(floor: float, best: float, share: float = LEARNED_SHARE) -> float:
    """The loss a run must go below to count as learned: ``floor`` − ``share`` × (``floor`` − ``best``),
    ``floor`` the no-attention floor (``no_attention_floor``) and ``best`` the lowest held-out loss of
    the pilot's runs. At the default share, half of what attention can add over the floor."""
    if not (_finite(floor) and _finite(best)) or best >= floor:
        raise ConfigError(f"the best run's loss ({best!r}) must be below the no-attention floor ({floor!r}) "
                          "to set a learned level; train the pilot longer or at more learning rates")
    if not 0 < share < 1:
        raise ConfigError(f"the learned level's share must lie in (0, 1), got {share!r}")
    return floor - share * (floor - best)


def no_attention_floor(bigram: float, uniform: float | None = None) -> float:
    """The lowest held-out loss reachable without attention: a bigram model's, or, where given, that
    of a model of the same shape trained with uniform attention, whichever is lower."""
    return bigram if uniform is None else min(bigram, uniform)


def bigram_loss(train_ids: Iterable[int], valid_ids: Sequence[int], vocab_size: int) -> float:
    """Held-out cross-entropy (nats per token) of a bigram model fitted on ``train_ids`` with add-one
    smoothing, p(b | a) = (count(a, b) + 1) / (count(a) + V), as ``schemes.unigram_loss`` smooths; the
    first held-out token has no predecessor and is not scored. What a model needing no attention scores."""
    train = [int(t) for t in train_ids]
    pairs: dict[tuple[int, int], int] = {}
    firsts = [0] * vocab_size
    for a, b in zip(train, train[1:]):
        pairs[a, b] = pairs.get((a, b), 0) + 1
        firsts[a] += 1
    valid = [int(t) for t in valid_ids]
    if len(valid) < 2:
        raise ConfigError("the held-out split needs at least two tokens for a bigram loss")
    return math.fsum(-math.log((pairs.get((a, b), 0) + 1) / (firsts[a] + vocab_size))
                     for a, b in zip(valid, valid[1:])) / (len(valid) - 1)


def learned_at(losses: Sequence[float | None], level: float, window: int = WINDOW) -> int | None:
    """The first step whose ``window``-step mean is below ``level`` (the window's last step), or None."""
    for i, m in enumerate(window_means(losses, window)):
        if m is not None and m < level:
            return i
    return None


@dataclass(frozen=True)
class Break:
    """A break: the step it began and why ("non-finite" or "rise"; by the first round's rule, "non-finite",
    "spike" or "floor")."""

    step: int
    reason: str


def _bad_from(losses: Sequence[float | None]) -> int:
    return next((i for i, x in enumerate(losses) if not _finite(x)), len(losses))


def rise_of(losses: Sequence[float | None], level: float, window: int = WINDOW) -> tuple[int, float] | None:
    """The first held rise of a learned run: (the step its ``window``-step mean first stood ``RISE`` above its
    running minimum from the step it learnt, that minimum), or None. Held: the mean stays ``HOLD`` above the
    minimum for ``HOLD_STEPS`` steps from the crossing, or the loss goes non-finite during them; a hold the
    series' end cuts short is none."""
    start = learned_at(losses, level, window)
    if start is None:
        return None
    means = window_means(losses, window)
    bad = _bad_from(losses)
    low = math.inf
    for c in range(start, bad):
        low = min(low, means[c])
        if means[c] >= low + RISE and _holds(means, c, low, bad):
            return c, low
    return None


def mid_run_break(losses: Sequence[float | None], level: float, window: int = WINDOW,
                  begin: float = BEGIN) -> Break | None:
    """The break of a learned run (the module's docstring), or None: for a run that never learnt, or
    learnt and held. A rise whose hold is cut short by the end of the series is no break (it cannot
    be told from a spike that heals); one cut short by a non-finite loss is, from where it began: the
    step after the last one before the crossing whose own loss was within ``begin`` of the minimum."""
    if learned_at(losses, level, window) is None:
        return None
    rise = rise_of(losses, level, window)
    if rise is not None:
        c, low = rise
        # the minimum is a mean of losses, so one of them lies at or under it: the set is not empty
        return Break(max(i for i in range(c) if losses[i] <= low + begin) + 1, "rise")
    bad = _bad_from(losses)
    return Break(bad, "non-finite") if bad < len(losses) else None


def _holds(means, c: int, low: float, bad: int) -> bool:
    for j in range(c, c + HOLD_STEPS):
        if j >= bad:
            return j < len(means)  # a non-finite loss during the hold: the run blew up mid-rise
        if means[j] < low + HOLD:
            return False
    return True


def degraded(final_loss: float | None, floor: float, best_of_arm: float, margin: float = DEGRADED_MARGIN) -> bool:
    """Whether a run ended degraded: its held-out loss above the no-attention ``floor``, or more than
    ``margin`` above ``best_of_arm`` (``arm_best``), or missing or not finite (the run diverged)."""
    if not _finite(final_loss):
        return True
    return final_loss > floor or final_loss > best_of_arm + margin


def arm_best(finals_by_lr: dict[float, Sequence[float | None]]) -> float:
    """The best learning rate's loss in one arm: the lowest, over learning rates, of the median held-out
    loss of its runs (a diverged run counts as +inf, so a rung where most diverge cannot be best)."""
    values = [_median([x if _finite(x) else math.inf for x in xs]) for xs in finals_by_lr.values() if xs]
    if not values or not math.isfinite(min(values)):
        raise ConfigError("no learning rate of the arm has a finite median loss: its best rate is unknown")
    return min(values)


@dataclass(frozen=True)
class RunOutcome:
    """One run's outcome: when it learnt (None: never), its mid-run break, and whether it ended degraded."""

    learned_at: int | None
    broke: Break | None
    degraded: bool

    @property
    def kind(self) -> str:
        """"never learned", "mid-run break" or "learned, held"."""
        if self.learned_at is None:
            return "never learned"
        return "mid-run break" if self.broke is not None else "learned, held"


def classify(losses: Sequence[float | None], final_loss: float | None, level: float, floor: float,
             best_of_arm: float, margin: float = DEGRADED_MARGIN) -> RunOutcome:
    """Every rule applied to one run."""
    return RunOutcome(learned_at(losses, level), mid_run_break(losses, level), degraded(final_loss, floor, best_of_arm,
                                                                                          margin))


def tally(outcomes: Iterable[RunOutcome]) -> dict[str, int]:
    """Counts a reader checks first: runs, learned, mid-run breaks, degraded, and never learned, apart."""
    out = {"runs": 0, "learned": 0, "mid_run_breaks": 0, "degraded": 0, "never_learned": 0}
    for o in outcomes:
        out["runs"] += 1
        out["degraded"] += o.degraded
        if o.learned_at is None:
            out["never_learned"] += 1
        else:
            out["learned"] += 1
            out["mid_run_breaks"] += o.broke is not None
    return out


# ---- the first round's rule, withdrawn: kept to draw that round's numbers again -----------------------


@dataclass(frozen=True)
class FirstRoundRule:
    """The first round's break rule (withdrawn; ``first_round_break``), with its knobs."""

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


def first_round_break(losses: Sequence[float | None], final_loss: float | None, floor: float | None,
                      rule: FirstRoundRule = FirstRoundRule()) -> Break | None:
    """A run's break by the first round's ``rule``, or None for what that round called a healthy run: broken at
    the first step where (a) the loss is not finite, or (b) the loss passes ``sigmas`` robust SDs (1.4826 × MAD)
    above the median of its last ``window`` steps and does not come back under that line within ``recover``
    steps, or, when its held-out loss ``final_loss`` ends above ``floor`` − ``plateau`` (``floor``: a unigram
    model's held-out loss), (c) from the step after which the mean loss of the last ``floor_window`` steps
    never again falls below that line."""
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
    if line is not None and not bad and final_loss is not None and final_loss > line:
        w = rule.floor_window
        means = [sum(losses[i - w + 1:i + 1]) / w for i in range(w - 1, len(losses))]
        below = [i for i, m in enumerate(means) if m < line]
        start = below[-1] + 1 if below else 0  # the first window after the last one under the floor
        found.append(Break(min(start + w - 1, len(losses) - 1), "floor"))
    return min(found, key=lambda b: b.step) if found else None
