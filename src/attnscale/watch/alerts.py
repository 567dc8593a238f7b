"""Alerts on a head's measurements, each with an action: warn, stop, a function of yours, or an action on the
run (``ClipQK``, ``ScaleLR``, ``SkipStep``: ``actions.py``).

What each alert watches, and why its default:
- ``MaxScore(tau=100)``: the largest |scaled score| of a head above tau. 100 is the
  cap Kimi K2's QK-Clip puts on each head's max logit (Moonshot AI 2025); logit growth
  is what broke ViT-22B (Dehghani et al. 2023) and high-learning-rate runs
  (Wortsman et al. 2023).
- ``Collapsed(words=2)``: a head whose rows spread over fewer than 2 effective words
  on average, i.e. attends to about one word: entropy collapse (Zhai et al. 2023).
- ``Frozen(limit=0.5)``: a head whose share of frozen rows (max weight above the
  watch's threshold) is above ``limit``: softmax no longer moves under a nudge.
- ``NonFinite()``: a NaN or inf among a head's measures, or a head with no row left to
  count (every score of a row non-finite drops the row), the usual first sign of a blow-up.
- ``relative=True`` on ``MaxScore``, ``Collapsed`` and ``Frozen``: the alert fires only on a head that is
  past its line *and* has moved from its own baseline (its reading at the watch's first probe, the baseline
  record at step 0) by ``factor`` (default 2) the way the alert watches: its max |score| grew ``factor``-fold,
  its effective words fell ``factor``-fold, or its share of rows not frozen fell ``factor``-fold. A trained
  model's sink and previous-token heads sit under 2 effective words from the start (SmolLM2-135M has 7-31
  such heads): ``Collapsed()`` names them at the first probe, ``Collapsed(relative=True)`` only if they fall
  further, or a healthy head falls to them. 2 is a change of kind rather than of degree (a head's reading
  halved or doubled on the same probe batch); a run that drifts more while healthy takes a larger factor.
- ``Spike(measure, sigmas=6, window=20)``: a value more than ``sigmas`` standard
  deviations away from the mean of the head's own last ``window`` probe values,
  as OLMo's spike score does for the loss: an alarm relative to the run's history,
  for runs where no absolute threshold fits.

A firing is said (logged at WARNING on the ``attnscale.watch`` logger, or handed to
the action function) once per alert, layer and head: a head that stays collapsed for
10,000 steps is named once, with its layer, head, step and value. Every firing still
goes into the watch log's record of its step. ``stop`` also sets ``Alerts.should_stop``.

An alert whose action acts on the run (``MaxScore(tau=1000, action=ClipQK(100))``) is said as a warning
too, and its action is taken once per alert: at the first probe at which it fires on any head (the first
head in layer, then head order), on every rank. ``Alerts.due`` lists the (action, firing) pairs a check
took; the ``Watch`` carries them out from the next optimizer step and records each one.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.errors import ConfigError
from attnscale.watch.actions import Action

__all__ = ["Firing", "Alert", "MaxScore", "Collapsed", "Frozen", "NonFinite", "Spike", "Alerts", "default_alerts",
           "ACTIONS", "LOGGER"]

ACTIONS = ("warn", "stop")
LOGGER = logging.getLogger("attnscale.watch")


@dataclass(frozen=True)
class Firing:
    """One alert on one head at one probe step."""

    alert: str
    layer: int
    head: int
    step: int
    value: float
    action: str  # "warn", "stop", "call", or the name of an Action ("clip_qk", "scale_lr", "skip_step")
    message: str

    def to_json(self) -> dict:
        return {"alert": self.alert, "layer": self.layer, "head": self.head, "step": self.step,
                "value": self.value, "action": self.action, "message": self.message}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_action(action) -> None:
    if isinstance(action, type):  # a class is callable, and would have been "called" with each Firing
        fix = (f"action={action.__name__}()" if issubclass(action, Action) else
               f"a function of one Firing (or an instance of {action.__name__})")
        raise ConfigError(f"an alert's action takes an action, not the class {action.__name__}: give {fix}")
    if not (isinstance(action, Action) or callable(action) or (isinstance(action, str) and action in ACTIONS)):
        raise ConfigError(f"an alert's action is 'warn', 'stop', a function of one Firing, or ClipQK(...), "
                          f"ScaleLR(...) or SkipStep(...), got {action!r}")


@dataclass(frozen=True)
class Alert:
    """Base of the alerts: ``hits(values_MH, rows_H, measures)`` gives (head, value) pairs of one layer."""

    action: str | Callable[[Firing], None] | Action = "warn"

    name = "alert"

    def __post_init__(self):
        _check_action(self.action)

    def hits(self, layer: int, values_MH: torch.Tensor, rows_H: torch.Tensor, measures: Sequence[str]):
        raise NotImplementedError

    def describe(self, value: float) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class _Threshold(Alert):
    """An alert where one measure of a head passes a fixed limit, strictly: a subclass names the
    ``measure``, the field that holds its limit (``limit_field``), and whether under it fires (``below``)."""

    measure = ""
    limit_field = ""
    below = False
    # the range a limit may take: past it the alert could never fire (or would fire on every head)
    lowest, highest, lowest_allowed = 0.0, math.inf, False
    relative: bool = field(default=False, kw_only=True)  # fire only on a head moved ``factor``-fold from its baseline
    factor: float = field(default=2.0, kw_only=True)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.relative, bool):
            raise ConfigError(f"{type(self).__name__}'s relative takes True or False, got {self.relative!r}")
        if not _finite(self.factor) or not self.factor > 1:
            raise ConfigError(f"{type(self).__name__}'s factor takes a finite number above 1 (how many-fold a head "
                              f"must move from its baseline), got {self.factor!r}")
        limit = getattr(self, self.limit_field)
        if not _finite(limit) or not (limit >= self.lowest if self.lowest_allowed else limit > self.lowest) \
                or not limit < self.highest:
            bound = (f"of at least {self.lowest:g}" if self.lowest_allowed else f"above {self.lowest:g}") + (
                "" if self.highest == math.inf else f" and below {self.highest:g}")
            raise ConfigError(f"{type(self).__name__}'s {self.limit_field} takes a finite number {bound}, got {limit!r}")

    def hits(self, layer, values_MH, rows_H, measures):
        values_H, limit = values_MH[measures.index(self.measure)], getattr(self, self.limit_field)
        hit = values_H < limit if self.below else values_H > limit
        return [(int(h), float(values_H[h])) for h in torch.nonzero(hit).flatten()]

    def moved(self, value: float, base: float) -> bool:
        """Whether ``value`` has moved ``factor``-fold from the head's baseline ``base``, the way this alert
        watches (a baseline that is not finite moves nowhere: ``NonFinite`` names it)."""
        if not math.isfinite(base):
            return False
        return value * self.factor < base if self.below else value > self.factor * base


@dataclass(frozen=True)
class MaxScore(_Threshold):
    tau: float = 100.0
    name = measure = "max_score"
    limit_field = "tau"

    def describe(self, value):
        return f"max |score| {value:.4g} above tau = {self.tau:g}"


@dataclass(frozen=True)
class Collapsed(_Threshold):
    words: float = 2.0
    name, measure, limit_field, below = "collapsed", "effective_words", "words", True
    lowest = 1.0  # a row spreads over at least one effective word

    def describe(self, value):
        return f"collapsed onto {value:.3g} effective words (fewer than {self.words:g})"


@dataclass(frozen=True)
class Frozen(_Threshold):
    limit: float = 0.5
    name, measure, limit_field = "frozen", "frozen_fraction", "limit"
    lowest, highest, lowest_allowed = 0.0, 1.0, True  # a share: 0 fires on any frozen row, 1 never could

    def describe(self, value):
        return f"{100 * value:.1f}% of rows frozen (above {100 * self.limit:g}%)"

    def moved(self, value: float, base: float) -> bool:
        """The share of rows not frozen fell ``factor``-fold (a share of 0.6 cannot grow 2-fold; what is left
        unfrozen can shrink)."""
        return math.isfinite(base) and (1 - value) * self.factor < 1 - base


@dataclass(frozen=True)
class NonFinite(Alert):
    name = "non_finite"

    def hits(self, layer, values_MH, rows_H, measures):
        bad_H = ~torch.isfinite(values_MH).all(0) | (rows_H <= 0)
        worst = values_MH[measures.index("max_score")]
        return [(int(h), float(worst[h]) if rows_H[h] > 0 else float("nan")) for h in torch.nonzero(bad_H).flatten()]

    def describe(self, value):
        return f"a NaN or inf score (max |score| {value}, or no finite row left)"


@dataclass(frozen=True)
class Spike(Alert):
    measure: str = "max_score"
    sigmas: float = 6.0
    window: int = 20
    min_history: int = 5
    direction: str = "up"  # "up", "down" or "both": a collapse is a drop in effective words
    name = "spike"

    def __post_init__(self):
        super().__post_init__()
        if self.measure not in HEAD_MEASURES:
            raise ConfigError(f"Spike's measure takes one of {', '.join(HEAD_MEASURES)}, got {self.measure!r}")
        if not _finite(self.sigmas) or self.sigmas <= 0:
            raise ConfigError(f"Spike's sigmas takes a finite positive number, got {self.sigmas!r}")
        if self.direction not in ("up", "down", "both"):
            raise ConfigError(f"Spike direction is 'up', 'down' or 'both', got {self.direction!r}")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (self.min_history, self.window)) \
                or not 2 <= self.min_history <= self.window:
            raise ConfigError(f"Spike needs integers 2 <= min_history <= window, got {self.min_history!r} and {self.window!r}")

    def z(self, history: Sequence[float], value: float) -> float:
        """Standard deviations from the history's mean (population SD, floored at 1e-6 of |mean| and 1e-12:
        a flat history makes any change a spike, but never a division by zero)."""
        n = len(history)
        mean = sum(history) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in history) / n)
        return (value - mean) / max(sd, 1e-6 * abs(mean), 1e-12)

    def describe(self, value):
        return f"{self.measure} {value:.4g} jumped more than {self.sigmas:g} SD from its last {self.window} probes"


def default_alerts(action: str | Callable[[Firing], None] = "warn") -> tuple[Alert, ...]:
    """``NonFinite`` alone, with one action ("warn" unless told): a NaN or inf score is a broken run
    whatever else is true, so it is the one alert that needs no study to stand on.

    The attention alerts (``MaxScore``, ``Collapsed``, ``Frozen``, ``Spike``) stay opt-in, and so do the
    actions. Without qk-norm at a high rate a max |score| over 1e4 marks a regime, not a run: in the act
    study every learned run of that regime without an action broke, and with qk-norm no run went past 1e2
    (docs/warn-study.md, its re-read). Acting on the alarm, ``MaxScore(tau=1e4, action=ClipQK(100))``,
    stopped all 27 breaks of the act study's 32 paired seeds but changes the weights the user trains and ended
    0.16-0.23 nats above qk-norm (docs/act-study.md): a choice to make knowingly, not a default. Where some runs
    hold (5.48e-2, docs/alarm-study.md) the alarm fired in every run, in the 47 of 47 that held too (Wilson
    [92%, 100%]): it marks the rate, not the run. There, halving the rate ended 0.10 nats below acting on the
    alarm, qk-norm 0.009 below that, and acting on the alarm 0.018 above QK-Clip from step 0. Under Muon the
    alarm at 1e4 fired in none of the 12 runs that held but came after the break in 5 of the 6 that broke
    (docs/lr-study.md, block 2): its level, chosen on AdamW runs, comes too late there. So: qk-norm where you
    can, else a lower rate. Tried on one model only: d_model 64, AdamW (rates 5e-3 to 1.6e-1) and Muon (2.5e-3
    to 8e-2), 1,500 and 3,000 steps (docs/watch.md); a wider model is the learning-rate study's blocks 3 and 4."""
    return (NonFinite(action),)


class Alerts:
    """Checks a set of alerts on each probe's ``HeadStats``; says each (alert, layer, head) once."""

    def __init__(self, alerts: Sequence[Alert] = ()):
        if not isinstance(alerts, (list, tuple)) or not all(isinstance(a, Alert) for a in alerts):
            given = [alerts] if not isinstance(alerts, (list, tuple)) else alerts
            cls = next((a for a in given if isinstance(a, type) and issubclass(a, Alert)), None)
            fix = f"give {cls.__name__}(...), not the class" if cls is not None else "e.g. [MaxScore(tau=100), NonFinite()]"
            raise ConfigError(f"Alerts' alerts takes a list of alerts ({fix}), got {alerts!r}")
        self.alerts = tuple(alerts)
        self.said: set[tuple[int, int, int]] = set()  # (alert index, layer, head)
        self.should_stop = False
        self._history: dict[tuple[int, int, int], deque] = {}
        self.taken: set[int] = set()  # the alerts (by index) whose Action was taken
        self.due: list[tuple[Action, Firing]] = []  # the actions the last check took, in order
        self.baseline: torch.Tensor | None = None  # values_LMH of the first check: what relative=True moves from

    def check(self, stats, step: int, say: bool = True, act: bool = True) -> list[Firing]:
        """Every firing at this step; each is said or acted on the first time for its alert, layer and head
        (``say=False``: neither, but a stop still stops; a rank other than 0 checks so). ``act=False`` (the
        baseline record's check): said and returned, but no action is taken and a stop does not stop."""
        values_LMH, rows_LH, measures = stats.values_LMH, stats.rows_LH, tuple(stats.measures)
        # where layers differ in heads the table is as wide as the widest: a head a layer lacks is no alarm
        heads = getattr(stats, "layer_heads", ()) or (values_LMH.shape[2],) * values_LMH.shape[0]
        fired, self.due = [], []
        if self.baseline is None:
            self.baseline = values_LMH.detach().clone()
        for i, alert in enumerate(self.alerts):
            for layer, n in enumerate(heads):
                if isinstance(alert, Spike):
                    hits = self._spikes(i, alert, layer, values_LMH[layer, measures.index(alert.measure), :n])
                else:
                    hits = alert.hits(layer, values_LMH[layer, :, :n], rows_LH[layer, :n], measures)
                relative = getattr(alert, "relative", False)
                if relative:
                    base_H = self.baseline[layer, measures.index(alert.measure)].tolist()
                    hits = [(head, value) for head, value in hits if alert.moved(value, base_H[head])]
                for head, value in hits:
                    acts = isinstance(alert.action, Action)
                    action = alert.action.name if acts else alert.action if isinstance(alert.action, str) else "call"
                    taking = act and acts and i not in self.taken
                    message = (f"attention alert at step {step}: layer {layer} head {head}: {alert.describe(value)}"
                               + (f", {alert.factor:g}-fold from its baseline {base_H[head]:.4g}" if relative else "")
                               + (" (stopping)" if action == "stop" else "")
                               + (f" (acting: {alert.action!r} from the next step)" if taking else ""))
                    firing = Firing(alert.name, layer, head, step, value, action, message)
                    fired.append(firing)
                    stopping = alert.action == "stop" and act and not self.should_stop
                    if stopping:
                        self.should_stop = True
                    if taking:  # on every rank: the ranks' runs stay one run
                        self.taken.add(i)
                        self.due.append((alert.action, firing))
                    if say and ((i, layer, head) not in self.said or taking or stopping):  # said at a baseline:
                        # the stop or action it takes later is said again
                        self.said.add((i, layer, head))
                        alert.action(firing) if callable(alert.action) and not acts else LOGGER.warning(message)
        return fired

    def state_dict(self) -> dict:
        """What the checks so far leave for the next (a resumed run's): heads said, the stop, Spike's windows,
        the actions taken, the baseline."""
        return {"alerts": [alert.name for alert in self.alerts], "said": sorted(list(k) for k in self.said),
                "should_stop": self.should_stop, "taken": sorted(self.taken),
                "history": [[*key, list(values)] for key, values in self._history.items()],
                "baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        names = [alert.name for alert in self.alerts]
        if state["alerts"] != names:
            raise ConfigError(f"the checkpoint's watch had the alerts {state['alerts']}, this one {names}; resume "
                              "with the alerts the run started with")
        self.said = {tuple(k) for k in state["said"]}
        self.should_stop = bool(state["should_stop"])
        self.taken = set(state["taken"])
        self._history = {(i, layer, head): deque(values, maxlen=self.alerts[i].window)
                         for i, layer, head, values in state["history"]}
        self.baseline = state.get("baseline")  # a state saved before baselines: the next check's reading

    def _spikes(self, i: int, alert: Spike, layer: int, values_H: torch.Tensor) -> list[tuple[int, float]]:
        hits = []
        for head, value in enumerate(values_H.tolist()):
            history = self._history.setdefault((i, layer, head), deque(maxlen=alert.window))
            if not math.isfinite(value):
                continue  # NonFinite's business; a NaN would poison the window
            if len(history) >= alert.min_history:
                z = alert.z(history, value)
                if {"up": z > alert.sigmas, "down": -z > alert.sigmas, "both": abs(z) > alert.sigmas}[alert.direction]:
                    hits.append((head, value))
            history.append(value)
        return hits
