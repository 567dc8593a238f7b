"""What an alert can do to the run beside warning and stopping: ``ClipQK``, ``ScaleLR``, ``SkipStep``.

    Watch(model, alerts=[MaxScore(tau=1000, action=ClipQK(100))], optimizer=opt)

An action is taken once per alert, at the first probe step k at which its alert fires on any head
(the first head in layer, then head order), and acts from the next optimizer step, k + 1:

- ``ClipQK(tau)``: QK-Clip (``clip/qk_clip.py``) of every head at ``tau`` after every optimizer step
  from k + 1 to the end of the run.
- ``ScaleLR(factor, steps=None)``: every param group's lr multiplied by ``factor`` inside the optimizer's
  step, for ``steps`` optimizer steps (None: to the end of the run). The group's own lr is put back after
  the step, so a scheduler and a checkpoint see their own value; the factor is on top of theirs.
- ``SkipStep(steps=1)``: optimizer steps k + 1 .. k + ``steps`` make no update: the optimizer's step is
  not run (a closure it was handed still is: the forward and backward happen), weights and optimizer
  state stay as they were.

``Acting`` holds what is in force and wraps the optimizer's ``step`` for the run only (``close`` puts it back).
"""

from __future__ import annotations

import logging
import math
import types
from dataclasses import dataclass
from typing import Any

import torch

from attnscale.errors import ConfigError

__all__ = ["Action", "ClipQK", "ScaleLR", "SkipStep", "Acting", "in_force"]

LOGGER = logging.getLogger("attnscale.watch")  # the watch's logger (``alerts.LOGGER``)


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@dataclass(frozen=True)
class Action:
    """An alert's action on the run; ``name`` says which in the records, ``to_json`` gives its numbers."""

    name = "action"
    needs_optimizer = False

    def to_json(self) -> dict:
        raise NotImplementedError


@dataclass(frozen=True)
class ClipQK(Action):
    tau: float = 100.0
    name = "clip_qk"

    def __post_init__(self):
        if not _positive(self.tau):
            raise ConfigError(f"ClipQK's tau takes a finite positive number (the largest score a head may keep; "
                              f"Kimi K2 used 100), got {self.tau!r}")

    def to_json(self) -> dict:
        return {"tau": float(self.tau)}


@dataclass(frozen=True)
class ScaleLR(Action):
    factor: float = 0.5
    steps: int | None = None
    name = "scale_lr"
    needs_optimizer = True

    def __post_init__(self):
        if not _positive(self.factor):
            raise ConfigError(f"ScaleLR's factor takes a finite positive number (0.5 halves the rate), got "
                              f"{self.factor!r}")
        if self.steps is not None and not _positive_int(self.steps):
            raise ConfigError(f"ScaleLR's steps takes a positive integer, or None for the rest of the run, got "
                              f"{self.steps!r}")

    def to_json(self) -> dict:
        return {"factor": float(self.factor), "steps": self.steps}


@dataclass(frozen=True)
class SkipStep(Action):
    steps: int = 1
    name = "skip_step"
    needs_optimizer = True

    def __post_init__(self):
        if not _positive_int(self.steps):
            raise ConfigError(f"SkipStep's steps takes a positive integer, got {self.steps!r}")

    def to_json(self) -> dict:
        return {"steps": self.steps}


def check_optimizer(optimizer) -> None:
    if optimizer is not None and not (callable(getattr(optimizer, "step", None))
                                      and isinstance(getattr(optimizer, "param_groups", None), list)):
        raise ConfigError(f"the watch's optimizer takes a torch.optim.Optimizer (one with step() and "
                          f"param_groups), got {type(optimizer).__name__}")


class Acting:
    """The rate factors and skips in force on one optimizer, counted in calls of its ``step``: each call is
    one optimizer step. ``lr``: [factor, steps left (None: to the end)] per ScaleLR taken; ``skip``: steps left
    to skip. The wrapper goes on the optimizer at the first action that needs it and comes off at ``close``."""

    def __init__(self, optimizer=None):
        check_optimizer(optimizer)
        self.optimizer = optimizer
        self.lr: list[list] = []
        self.skip = 0
        self._had: Any = None  # what the optimizer's instance held as ``step`` before the wrapper (a scheduler's)
        self._wrapped = False

    def take(self, action: Action) -> None:
        if isinstance(action, ScaleLR):
            self.lr.append([float(action.factor), action.steps])
        elif isinstance(action, SkipStep):
            self.skip = max(self.skip, action.steps)
        self.wrap()

    def wrap(self) -> None:
        if self._wrapped or not (self.lr or self.skip):
            return
        opt = self.optimizer
        self._had = opt.__dict__.get("step")
        inner = opt.step  # bound: the class's step, or what a scheduler put on the instance

        def step(this, *args, **kwargs):
            return self._step(inner, *args, **kwargs)

        opt.step = types.MethodType(step, opt)  # a bound method, as a scheduler's own wrapper expects to find
        self._wrapped = True

    def _step(self, inner, *args, **kwargs):
        factor = math.prod(f for f, _ in self.lr)
        skip = self.skip > 0
        self.skip = max(0, self.skip - 1)
        self.lr = [[f, None if left is None else left - 1] for f, left in self.lr if left is None or left > 1]
        if skip:
            closure = kwargs.get("closure", args[0] if args else None)
            if closure is not None:  # the step's forward and backward still run (Lightning's loop is in it)
                with torch.enable_grad():
                    return closure()
            return None
        if factor == 1.0:
            return inner(*args, **kwargs)
        groups = self.optimizer.param_groups
        before = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = g["lr"] * factor
        try:
            return inner(*args, **kwargs)
        finally:
            for g, lr in zip(groups, before):
                g["lr"] = lr

    def state_dict(self) -> dict:
        return {"lr": [list(x) for x in self.lr], "skip": self.skip}

    def load_state_dict(self, state: dict) -> None:
        self.lr = [list(x) for x in state.get("lr", [])]
        self.skip = int(state.get("skip", 0))
        self.wrap()

    def close(self) -> None:
        """Take the wrapper off. What was still in force (a rate cut, steps to skip) ends with it: said on the
        ``attnscale.watch`` logger at the optimizer's first step after the close, where there is one (a run that
        ends with the watch hears nothing)."""
        if not self._wrapped:
            return
        if self._had is None:
            del self.optimizer.step  # the class's step again
        else:
            self.optimizer.step = self._had
        self._wrapped = False
        ending = in_force(self.state_dict())
        if ending and callable(getattr(self.optimizer, "register_step_pre_hook", None)):
            _say_once_at_next_step(self.optimizer, f"the watch was closed with {ending} in force; the optimizer "
                                                   "steps at its own rate from here (close the watch after the "
                                                   "last step to keep its actions to the end)")


def in_force(acting: dict) -> str:
    """What an ``Acting.state_dict()`` holds in force, in words ("" for nothing): said where it ends."""
    said = [f"the rate times {f:g} " + ("to the end of the run" if left is None else f"for {left} more step(s)")
            for f, left in acting.get("lr", [])]
    if acting.get("skip"):
        said.append(f"{acting['skip']} step(s) left to skip")
    return "; ".join(said)


def _say_once_at_next_step(optimizer, message: str) -> None:
    def say(*_):
        handle.remove()
        LOGGER.warning(message)

    handle = optimizer.register_step_pre_hook(say)
