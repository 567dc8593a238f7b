"""The setup study's definitions: its axes, its schedules, and how a setting reads.

A setup is the base, or the base with one setting changed (an axis and its value),
or with several changed together: a combined axis, its axes joined by ``+`` in
``AXES`` order ("schedule+weight_decay"), whose value is the tuple of theirs.
These names sit beside the presets, below every reader: the study that trains
the setups (``experiments.setup_study``), the command line that takes ``--axis``,
and the report that reads the runs back (``analysis.setups``). A run's
axis is its record group, ``study:<axis>`` (``study:base`` for the base setup);
its value is read from its recorded config (``value_of``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnscale.lm.train import TrainConfig

__all__ = ["GROUP_PREFIX", "AXES", "AXIS_NAMES", "SCHEDULES", "JOIN", "parts", "combined", "combine", "known",
           "value_of", "label", "setting_text", "lr_text", "is_study"]

GROUP_PREFIX = "study:"
# axis -> (where in the config, the field it sets)
AXES: dict[str, tuple[str, str]] = {
    "lr": ("train", "lr"),
    "schedule": ("train", "min_lr_ratio"),
    "weight_decay": ("train", "weight_decay"),
    "init": ("model", "init"),
    "norm": ("model", "norm"),
    "steps": ("train", "steps"),
}
AXIS_NAMES = {"lr": "learning rate", "schedule": "schedule", "weight_decay": "weight decay", "init": "init",
              "norm": "norm placement", "steps": "training steps"}
# min_lr_ratio of each schedule: cosine decays to a tenth of the peak (the presets'), constant never decays
SCHEDULES = {"cosine": TrainConfig().min_lr_ratio, "constant": 1.0}
JOIN = "+"  # a combined axis: "schedule+weight_decay"
_BETWEEN = " + "  # between the settings of a combined setup as tables read it


def parts(axis: str) -> list[str]:
    """The axes a (possibly combined) axis changes: ["lr"], ["schedule", "weight_decay"]."""
    return axis.split(JOIN)


def combined(axis: str) -> bool:
    return JOIN in axis


def combine(settings: Mapping[str, Any]) -> tuple[str, tuple]:
    """{axis: value} changed together as one setup: (combined axis, its value), in ``AXES`` order, so
    {"weight_decay": 0, "schedule": "constant"} and its reverse are one setup."""
    order = [a for a in AXES if a in settings]
    return JOIN.join(order), tuple(settings[a] for a in order)


def known(axis: str) -> bool:
    """An axis, or a combination of distinct axes in ``AXES`` order (what ``combine`` writes)."""
    names = parts(axis)
    return names == [a for a in AXES if a in names]  # an unknown or repeated name cannot match


def value_of(axis: str, model: Mapping[str, Any], train: Mapping[str, Any]) -> Any:
    """The value of ``axis`` in a run's recorded config: the learning rate, "cosine"/"constant", ...;
    of a combined axis, the tuple of its axes' values."""
    if combined(axis):
        return tuple(value_of(a, model, train) for a in parts(axis))
    where, name = AXES[axis]
    got = (model if where == "model" else train).get(name)
    if axis == "schedule":
        return "constant" if got is not None and float(got) >= 1.0 else "cosine"
    return got


def lr_text(lr: float) -> str:
    """A learning rate as run ids, tables and the report write it: 3e-3, 9.5e-4."""
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def label(axis: str, value: Any) -> str:
    """``value`` as run ids and tables write it: 1e-2, 0, constant, pre, 1200; "constant + 0" for a combined axis."""
    if combined(axis):
        return _BETWEEN.join(label(a, v) for a, v in zip(parts(axis), value))
    if isinstance(value, float) and axis == "lr":
        return lr_text(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def setting_text(axis: str, value_label: str) -> str:
    """A setup as tables name it: "base", "learning rate 9e-3", "schedule constant + weight decay 0"."""
    if axis == "base":
        return "base"
    if combined(axis):
        return _BETWEEN.join(f"{AXIS_NAMES[a]} {v}" for a, v in zip(parts(axis), value_label.split(_BETWEEN)))
    return f"{AXIS_NAMES.get(axis, axis)} {value_label}"


def is_study(run: Any) -> bool:
    """A run of a setup study: group ``study:<axis>`` with an axis (or a combination) this attnscale knows."""
    group = str(getattr(run, "group", ""))
    axis = group[len(GROUP_PREFIX):]
    return group.startswith(GROUP_PREFIX) and (axis == "base" or known(axis))
