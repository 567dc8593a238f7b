"""The Watch's arguments checked as it is made, each mistake one ``ConfigError`` naming the fix: sinks and alerts
of their kinds (a path is no sink, a class no instance), a MaxScore that would fight QK-Clip, ``qk_clip_check``
without a clip, a step that is no int; and an exception said in one line."""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError
from attnscale.watch.actions import Action, ClipQK
from attnscale.watch.alerts import Alert, MaxScore
from attnscale.watch.logs.sinks import Sink

__all__ = ["outputs", "clip_fights", "check_clip_check", "step_number", "one_line"]


def _wrap(item: Any, kind: type, example: str) -> str:
    if isinstance(item, type) and issubclass(item, kind):  # the class given for an instance
        return f"{item.__name__}(...)"
    return f"{type(item).__name__}(...)" if isinstance(item, kind) else example  # the instance, in a list


def _no_class(item: Any, kind: type, what: str) -> None:
    """A ConfigError naming the fix where ``item`` is a class of ``kind`` given for an instance of it."""
    if isinstance(item, type) and issubclass(item, kind):
        raise ConfigError(f"{what} takes instances, not the class {item.__name__}: give {item.__name__}(...)")


def outputs(sinks: Any, alerts: Any) -> tuple[list[Sink], tuple[Alert, ...] | None]:
    """The sinks and alerts as sequences of their kinds, or a ConfigError saying what to give instead: a path
    is no sink and a name is no alert (each would fail only at the first probe, deep in the run)."""
    sink_example = f"JsonlSink({str(sinks)!r})" if isinstance(sinks, (str, Path)) else "JsonlSink('watch.jsonl')"
    if isinstance(sinks, (str, Path, Sink)) or not isinstance(sinks, (list, tuple)):
        raise ConfigError(f"sinks takes a list of sinks, got {sinks!r}; wrap it: "
                          f"sinks=[{_wrap(sinks, Sink, sink_example)}]")
    for sink in sinks:
        _no_class(sink, Sink, "sinks")
        if not isinstance(sink, Sink):
            example = f"JsonlSink({str(sink)!r})" if isinstance(sink, (str, Path)) else "JsonlSink('watch.jsonl')"
            raise ConfigError(f"a sink is one of attnscale.watch's sinks, got {sink!r}; wrap it: sinks=[{example}]")
        if sink.closed:  # another watch's, closed when it ended: every probe of this one would fail to write
            raise ConfigError(f"a sink is closed ({sink!r}): a watch closes its sinks when it ends; give each Watch "
                              "sinks of its own")
    if alerts is None:
        return list(sinks), None
    alert_example = "MaxScore(tau=100), NonFinite()"
    if isinstance(alerts, (str, Alert)) or not isinstance(alerts, (list, tuple)):
        raise ConfigError(f"alerts takes a list of alerts, got {alerts!r}; give alerts=[{_wrap(alerts, Alert, alert_example)}]")
    for alert in alerts:
        _no_class(alert, Alert, "alerts")
        if not isinstance(alert, Alert):
            raise ConfigError(f"an alert is one of attnscale.watch's alerts, got {alert!r}; give e.g. "
                              f"alerts=[{alert_example}] (or Collapsed(...), Frozen(...), Spike(...))")
    return list(sinks), tuple(alerts)


def clip_fights(alerts: Any, qk_clip: float | None) -> None:
    """A ConfigError for a MaxScore at or under a QK-Clip's tau (``qk_clip=``, or any alert's ClipQK): the clip
    brings the scores of each step's own batch back to tau, but the next update may pass it by that update's size
    and the probe reads the weights after it, so the alert would fire probe after probe while the clip holds. A
    MaxScore whose action acts on the run (ClipQK, ScaleLR, SkipStep) acts once, and is left alone."""
    if not isinstance(alerts, (list, tuple)):
        return
    taus = ([] if qk_clip is None else [float(qk_clip)]) + [
        float(a.action.tau) for a in alerts if isinstance(getattr(a, "action", None), ClipQK)]
    for alert in alerts:
        if isinstance(alert, MaxScore) and not isinstance(alert.action, Action) and taus and alert.tau <= max(taus):
            clip = max(taus)
            raise ConfigError(
                f"MaxScore(tau={alert.tau:g}) and QK-Clip at tau={clip:g} would fight: the clip brings the scores of "
                f"each step's own batch back to {clip:g}, but the next update may pass that by its own size (1.6% on "
                f"SmolLM2 at tau 30) and the probe reads the weights after it, so the alert would fire at probe after "
                f"probe while the clip holds; give MaxScore a tau above the clip's (e.g. {2 * clip:g}: the clip lost "
                f"hold of a head), or leave it out (the record's qk_clip s_max says what the clip read, and "
                f"qk_clip_check=True measures the scores after each update)")


def check_clip_check(check: Any, qk_clip: float | None, alerts: Any) -> None:
    if not isinstance(check, bool):
        raise ConfigError(f"qk_clip_check takes True or False, got {check!r}")
    listed = alerts if isinstance(alerts, (list, tuple)) else ()  # another kind is refused by its own check
    clips = qk_clip is not None or any(isinstance(getattr(a, "action", None), ClipQK) for a in listed)
    if check and not clips:
        raise ConfigError("qk_clip_check=True measures QK-Clip's scores after each update: give qk_clip= (or an "
                          "alert whose action is ClipQK)")


def step_number(step: Any) -> int:
    """``step`` as an int, or a ConfigError naming it (a step of another type would make every probe fail)."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise ConfigError(f"Watch.step takes the step's number, an int, got {step!r} ({type(step).__name__}); "
                          "give the optimizer step's count, e.g. watch.step(int(step))")
    return int(step)


def one_line(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
