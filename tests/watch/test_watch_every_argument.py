"""Every argument of every public constructor and function of ``attnscale.watch`` is checked when it is given: a
wrong type, a class where an instance is meant, NaN, 0, a negative number or an empty value is one ConfigError
naming the argument, before any training.

As ``tests/cli/test_every_flag.py`` walks the parser, this walks the signatures themselves (``attnscale.watch``'s
``__all__``, the callbacks beside them): an argument added later that ``KINDS`` does not know fails the walk with
its name and the table to fill. What cannot be derived from a signature is in the tables: each argument's kind
(``KINDS``), the bad values of each kind (``BAD``), the call that reaches each name (``CALLS``), and the names that
are records the library builds, not options a user gives (``RECORDS``)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import attnscale.watch as watch_api
from attnscale.errors import ConfigError
from watch_models import IDS, _model


class _Thing:
    """An object of no kind the watch takes."""


def _classes():
    from attnscale.watch import Adapter, JsonlSink, MaxScore, SkipStep, TensorParallel

    return Adapter, JsonlSink, MaxScore, SkipStep, TensorParallel


def _bad(kind: str) -> list:
    """The mistaken values of each kind of argument: a wrong type, a class for an instance, NaN, 0, negative, empty."""
    Adapter, JsonlSink, MaxScore, SkipStep, TensorParallel = _classes()
    number = ["3", True, _Thing()]
    return {
        "pos_int": [*number, 2.5, math.nan, 0, -1],
        "nonneg_int": [*number, 2.5, math.nan, -1],
        "pos_float": [*number, math.nan, math.inf, 0, -1.0],
        "share": [*number, math.nan, -0.5, 1.5],  # a share of rows: 0 to 1
        "above_one": [*number, math.nan, 0, -1.0, 1.0],  # effective words: a row spreads over one or more
        "flag": ["yes", 1, None, _Thing()],
        "choice": ["", "bogus", 3, None],
        "sink_detail": ["", "bogus", 3],  # None: the watch's detail
        "measure": ["", "bogus", 3, None],
        "alerts": ["max_score", MaxScore, [MaxScore], [_Thing()], MaxScore()],
        "sinks": ["watch.jsonl", JsonlSink, [JsonlSink], [_Thing()]],
        "action": ["", "bogus", 3, SkipStep, _Thing()],
        "adapter": ["x", 3, Adapter],
        "tensor_parallel": ["tp", 3, TensorParallel],
        "optimizer": ["adam", 3, torch.optim.SGD],
        "model": ["model", None, torch.nn.Linear],
        "drop_keys": ["labels", [3]],
        "probe": ["text", 3, _Thing()],
        "path": ["", 3, None],
        "group": ["tp", 3],
        "heads": ["x", {"layers.0": [-1]}, {"layers.0": "01"}],
        "modules": ["", 3, (), [3]],
        "read": [3, "read"],
        "images": ["yes", 3, [3]],
    }[kind]


# (name in attnscale.watch, argument) -> its kind; the callbacks by their module
WATCH_OPTIONS = {
    "every": "pos_int", "probe": "probe", "sinks": "sinks", "alerts": "alerts", "threshold": "share",
    "probe_sequences": "pos_int", "capture": "choice", "adapter": "adapter", "drop_keys": "drop_keys",
    "qk_clip": "pos_float", "memory": "pos_int", "sample_rows": "pos_int", "detail": "choice",
    "in_training_forward": "flag", "stage": "nonneg_int", "layer_offset": "nonneg_int",
    "tensor_parallel": "tensor_parallel", "on_error": "choice", "resume_actions": "choice", "qk_clip_check": "flag"}
THRESHOLD_ALERT = {"relative": "flag", "factor": "pos_float", "action": "action"}
KINDS = {
    "Watch": {"model": "model", **WATCH_OPTIONS, "optimizer": "optimizer"},
    "Attached": WATCH_OPTIONS,
    "hf.WatchCallback": {**WATCH_OPTIONS, "report": "flag"},  # Attached's options, and report
    "lightning.WatchCallback": {**WATCH_OPTIONS, "report": "flag"},
    "measure_heads": {"model": "model", "threshold": "share", "capture": "choice", "adapter": "adapter",
                      "across_ranks": "flag", "head_kinds": "flag", "memory": "pos_int", "sample_rows": "pos_int",
                      "tensor_parallel": "tensor_parallel"},
    "QKClip": {"model": "model", "tau": "pos_float", "capture": "choice", "adapter": "adapter", "memory": "pos_int",
               "tensor_parallel": "tensor_parallel"},
    "MaxScore": {"tau": "pos_float", **THRESHOLD_ALERT},
    "Collapsed": {"words": "above_one", **THRESHOLD_ALERT},
    "Frozen": {"limit": "share", **THRESHOLD_ALERT},
    "NonFinite": {"action": "action"},
    "Spike": {"action": "action", "measure": "measure", "sigmas": "pos_float", "window": "pos_int",
              "min_history": "pos_int", "direction": "choice"},
    "default_alerts": {"action": "action"},
    "Alerts": {"alerts": "alerts"},
    "ClipQK": {"tau": "pos_float"},
    "ScaleLR": {"factor": "pos_float", "steps": "pos_int"},
    "SkipStep": {"steps": "pos_int"},
    "TensorParallel": {"group": "group", "heads": "heads"},
    "JsonlSink": {"path": "path"},
    "CsvSink": {"path": "path", "detail": "sink_detail"},
    "TensorBoardSink": {"log_dir": "path", "detail": "sink_detail", "images": "images"},
    "WandbSink": {"step": "flag", "detail": "sink_detail", "images": "images"},
    "read_log": {"path": "path"},
    "Adapter": {"modules": "modules", "read": "read"},
}
# the names that are no option a user gives: records and bases the library builds or subclasses, and the capture
# context managers, whose one option is the model and the function handed each call (measure_heads checks both)
RECORDS = {"AttentionCall", "HeadStats", "Inputs", "Firing", "WatchLine", "Alert", "Action", "capture_adapter",
           "capture_hooks", "capture_sdpa", "capture_weights", "capturing", "capture_hf", "capture_flex",
           "capture_flash", "measure", "WatchCallback"}


def _target(name: str):
    if name == "hf.WatchCallback":
        pytest.importorskip("transformers")
        from attnscale.watch.callbacks.hf import WatchCallback
        return WatchCallback
    if name == "lightning.WatchCallback":
        pytest.importorskip("lightning")
        from attnscale.watch.callbacks.lightning import WatchCallback
        return WatchCallback
    return getattr(watch_api, name)


def _call(name: str, arg: str, value, tmp_path):
    """``name`` called with ``arg=value`` and what else it needs to get that far; whatever it made is closed."""
    target = _target(name)
    given = {arg: value}
    if name in ("Watch", "QKClip", "measure_heads") and arg != "model":
        given = {"model": _model(), **given}
    if name == "measure_heads":
        given.setdefault("batch", IDS)
    if name == "QKClip":
        given.setdefault("tau", 10.0)
    if name in ("CsvSink",) and arg != "path":
        given.setdefault("path", tmp_path / "w.csv")
    if name == "TensorBoardSink" and arg != "log_dir":
        given.setdefault("log_dir", tmp_path / "tb")
    if name == "Adapter":
        given = {"modules": "attn", "read": lambda *a: None, **given}
    made = target(**given)
    for closing in ("close",):
        if callable(getattr(made, closing, None)):
            made.close()


def _walk():
    names = [n for n in watch_api.__all__ if n not in RECORDS] + ["hf.WatchCallback", "lightning.WatchCallback"]
    missing = [n for n in names if n not in KINDS]
    cases = []
    for name in names:
        if name in missing:
            continue
        target = getattr(watch_api, name) if "." not in name else None
        params = [] if target is None else [p for p in inspect.signature(target).parameters.values()
                                            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        for p in params:
            if name in ("measure_heads",) and p.name in ("batch", "route"):
                continue  # the batch is walked by Watch's probe; route is what earlier probes learned
            cases.append((name, p.name))
        if target is None:  # a callback takes Attached's options (**options) and its own report
            cases += [(name, p) for p in [*inspect.signature(watch_api.Attached).parameters, "report"]]
    return missing, cases


MISSING, CASES = _walk()


def test_every_public_name_is_walked_or_said_to_be_a_record():
    assert not MISSING, f"add these names of attnscale.watch to KINDS (or RECORDS): {MISSING}"
    unknown = [(n, a) for n, a in CASES if a not in KINDS[n]]
    assert not unknown, f"add these arguments to KINDS with their kind: {unknown}"


@pytest.mark.parametrize("name, arg", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_each_mistaken_value_is_one_config_error_naming_the_argument(name, arg, tmp_path):
    if arg not in KINDS[name]:
        pytest.fail(f"{name}'s {arg} has no kind in KINDS")
    said = arg
    wrong = []
    for value in _bad(KINDS[name][arg]):
        try:
            _call(name, arg, value, tmp_path)
        except ConfigError as e:
            if said not in str(e):
                wrong.append(f"{value!r}: ConfigError not naming {said!r}: {e}")
        except Exception as e:  # anything else is a traceback, not one line
            wrong.append(f"{value!r}: {type(e).__name__}: {str(e)[:200]}")
        else:
            wrong.append(f"{value!r}: accepted")
    assert not wrong, f"{name}({arg}=...):\n" + "\n".join(wrong)
