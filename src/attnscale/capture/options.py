"""The options of a probe and of a watch, defined once and checked when they are made.

``measure``/``measure_heads``, ``Watch`` and both training callbacks take the same options; each builds a
``WatchOptions`` from them, so a type or a range is written and checked here only, and a mistake is one
``ConfigError`` naming the option and what it takes, raised where the option was given, before any training
step (a watch that accepted a bad option would raise at its first probe, deep inside the user's run).
``check_batch`` does the same for a probe batch: its kind, its keys, integer ids, and at least one token.

The sinks and alerts of a watch are checked beside these, in ``watch/loop.py``: their classes live on the
watch floor, above this one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnscale.capture.adapter import Adapter
from attnscale.capture.batch import container, tensors_in
from attnscale.capture.ranks import TensorParallel
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.capture.route import CAPTURES
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError

__all__ = ["DETAILS", "EVERY", "ON_ERROR", "PROBE_SEQUENCES", "WatchOptions", "check_batch", "check_detail",
           "check_flag", "check_model", "check_options"]

# One probe costs about one forward of PROBE_SEQUENCES sequences: 1 in 100 steps keeps a watch under 1% of training.
EVERY = 100
PROBE_SEQUENCES = 4
DETAILS = ("heads", "layers", "summary")
# what a probe that fails during training does: tell and try again next time, tell and stop measuring, or raise
ON_ERROR = ("warn", "stop", "raise")


@dataclass(frozen=True)
class WatchOptions:
    """Every option of a probe and a watch, checked when made (``check_options``). ``measure_heads`` uses the
    probe's (threshold, capture, adapter, memory, sample_rows, tensor_parallel) and leaves the rest at their
    defaults. ``probe``: the batch a watch was given, kept only to check that it fits the other options."""

    every: int = EVERY
    threshold: float = FROZEN_THRESHOLD
    probe_sequences: int = PROBE_SEQUENCES
    capture: str = "auto"
    adapter: Adapter | None = None
    drop_keys: tuple[str, ...] = ("labels",)
    qk_clip: float | None = None
    memory: int = DEFAULT_MEMORY
    sample_rows: int | None = None
    detail: str = "heads"
    in_training_forward: bool = False
    stage: int | None = None
    layer_offset: int | None = None
    tensor_parallel: TensorParallel | None = None
    on_error: str = "warn"
    probe: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        check_options(self)

    def kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments of ``Watch``."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def check_flag(name: str, value: Any) -> None:
    """A ConfigError naming ``name`` unless ``value`` is True or False (1, "yes" or None would read as one)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} takes True or False, got {value!r}")


def check_model(model: Any, who: str, what: str = "the torch.nn.Module being trained") -> None:
    """A ConfigError naming ``who``'s model unless it is a module; a module's class given for one names the fix."""
    if isinstance(model, nn.Module):
        return
    got = (f"the class {model.__name__}: give the model itself, an instance" if isinstance(model, type)
           else type(model).__name__)
    raise ConfigError(f"{who}'s model takes {what}, got {got}")


def _positive_int(name: str, value: Any, least: int = 1, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        takes = "a positive integer" if least == 1 else f"an integer of at least {least}"
        raise ConfigError(f"{name} takes {takes}{why}, got {value!r}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_detail(detail: Any) -> None:
    """A ConfigError naming the option, for a detail no logger takes."""
    if not isinstance(detail, str) or detail not in DETAILS:
        raise ConfigError(f"detail takes one of {', '.join(map(repr, DETAILS))}, got {detail!r}")


def check_options(o: WatchOptions) -> None:
    """A ConfigError naming the first option of ``o`` no probe or watch can run with, and what it takes."""
    _positive_int("every", o.every)
    _positive_int("probe_sequences", o.probe_sequences)
    _positive_int("memory", o.memory, why=" (bytes)")
    if o.sample_rows is not None:
        _positive_int("sample_rows", o.sample_rows, 2, " (None: every row; a standard error needs two rows)")
    if not _number(o.threshold) or not 0 < o.threshold < 1:
        raise ConfigError(f"threshold takes a number between 0 and 1 (the max weight above which a row is frozen), "
                          f"got {o.threshold!r}")
    if not isinstance(o.capture, str) or o.capture not in CAPTURES:
        raise ConfigError(f"capture must be one of {', '.join(CAPTURES)}, got {o.capture!r}")
    if o.adapter is not None and not isinstance(o.adapter, Adapter):
        raise ConfigError(f"adapter takes attnscale.watch.Adapter(modules, read), got {o.adapter!r}")
    if o.capture == "adapter" and o.adapter is None:
        raise ConfigError("capture='adapter' needs an adapter: attnscale.watch.Adapter(modules, read)")
    if o.tensor_parallel is not None and not isinstance(o.tensor_parallel, TensorParallel):
        raise ConfigError(f"tensor_parallel takes an attnscale.watch.TensorParallel, got "
                          f"{type(o.tensor_parallel).__name__} {o.tensor_parallel!r}")
    if isinstance(o.drop_keys, str) or not all(isinstance(k, str) for k in o.drop_keys):
        raise ConfigError(f"drop_keys takes a tuple of keyword names, e.g. ('labels',), got {o.drop_keys!r}")
    if o.qk_clip is not None and (not _number(o.qk_clip) or o.qk_clip <= 0):
        raise ConfigError(f"qk_clip takes a positive number (tau, the largest score a head may keep; Kimi K2 used 100), "
                          f"got {o.qk_clip!r}")
    check_detail(o.detail)
    if not isinstance(o.on_error, str) or o.on_error not in ON_ERROR:
        raise ConfigError(f"on_error takes one of {', '.join(map(repr, ON_ERROR))} (what a probe that fails during "
                          f"training does), got {o.on_error!r}")
    check_flag("in_training_forward", o.in_training_forward)
    if o.in_training_forward and o.probe is not None:
        raise ConfigError("in_training_forward=True measures the training forward's own batches: give no probe=")
    for name, value in (("stage", o.stage), ("layer_offset", o.layer_offset)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(f"{name} takes a non-negative integer (None: no pipeline), got {value!r}")
    if o.layer_offset is not None and o.stage is None:
        raise ConfigError("layer_offset places a pipeline stage's layers: give stage= too")
    if o.stage is not None and not o.in_training_forward:
        raise ConfigError("a pipeline stage cannot run a whole-model probe: give in_training_forward=True with stage=")
    if o.probe is not None:
        check_batch(o.probe)


def _parts(batch: Any) -> tuple[list, dict]:
    """(positional values, keyword values) of a probe batch, as ``probe.forward`` would call the model."""
    if torch.is_tensor(batch):
        return [batch], {}
    if isinstance(batch, Mapping):
        return [], dict(batch)
    if isinstance(batch, (tuple, list)):
        return list(batch), {}
    args, kwargs = getattr(batch, "args", None), getattr(batch, "kwargs", None)  # probe.Inputs
    if isinstance(args, tuple) and isinstance(kwargs, dict):
        return list(args), kwargs
    if container(batch):  # a dataclass: the forward's first argument
        return [batch], {}
    raise ConfigError(f"a probe batch is a tensor, a dict, tuple, list or dataclass of tensors, or "
                      f"attnscale.watch.Inputs, got {type(batch).__name__}")


def _refuse_unknown_keys(model: nn.Module, keys: list[str]) -> None:
    """A dict's keys must be arguments of the model's forward, unless that forward takes **kwargs."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # a forward with no readable signature: the trial run says the rest
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = [k for k in keys if k not in names]
    if unknown:
        raise ConfigError(f"the probe's keys {', '.join(map(repr, unknown))} are no arguments of "
                          f"{type(model).__name__}.forward (it takes {', '.join(names) or 'no keyword'}); "
                          "give a batch with its argument names")


def check_batch(batch: Any, model: nn.Module | None = None) -> None:
    """A ConfigError for a probe batch no model can be measured on: not a tensor, dict, tuple, list or
    ``Inputs``; string keys only (and, with ``model``, keys its forward takes); token ids (a ``*_ids`` key)
    of an integer type; and at least one sequence of one token (an empty batch has no row to measure)."""
    args, kwargs = _parts(batch)
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise ConfigError(f"a probe dict's keys are the forward's keyword arguments (strings), got {key!r}")
        if key.endswith("_ids") and torch.is_tensor(value) and (value.is_floating_point() or value.is_complex()
                                                                 or value.dtype == torch.bool):
            raise ConfigError(f"the probe's {key} holds {value.dtype} values; token ids are integers: give "
                              f"{key}.long()")
    tensors = list(tensors_in((args, kwargs)))  # at any depth: a dict or tuple the forward takes whole
    if not tensors:
        raise ConfigError(f"the probe batch holds no tensor ({type(batch).__name__}); give the model's input ids")
    first = next((v for v in tensors if v.ndim >= 2), tensors[0])
    if first.numel() == 0 or first.ndim == 0:
        raise ConfigError(f"the probe batch is empty (shape {tuple(first.shape)}); give at least one sequence of "
                          "one token")
    if model is not None and kwargs:
        _refuse_unknown_keys(model, list(kwargs))
