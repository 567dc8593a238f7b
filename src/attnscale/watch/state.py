"""The watch's saved state as plain data, and the plan a resumed run must keep.

A checkpoint is a file a user hands back, so nothing read from it may run code: the watch's state
(``Watch.state_dict``) holds tensors, numbers, strings, lists and dicts only, what
``torch.load(..., weights_only=True)`` reads (and Lightning's and transformers' own safe loads). The probe
batch (an ``Inputs``; dicts, tuples, lists and dataclasses of tensors) is written as tagged dicts
(``plain_probe``) and made again on resume (``probe_of``) as plain dicts, tuples and lists: no type named in
the file is made. Where the resumed run's own first batch has the same structure, the saved tensors are put in
its containers (``probe_like``: a ``BatchEncoding``, a named tuple, a dataclass), types from the live batch.

The plan (``plan_of``): each alert's full configuration with its action's, and ``qk_clip=``, as JSON. A
resumed run whose plan is another is refused, naming both (``resumes``), unless its watch says
``resume_actions="new"``: the checkpoint's alerts' state is then left behind, and what its actions had in force
(a rate cut, steps to skip, a clip) ends, said on the ``attnscale.watch`` logger.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import torch

from attnscale.capture.batch import map_tensors, tensors_in
from attnscale.capture.probe import Inputs
from attnscale.errors import ConfigError
from attnscale.watch.actions import Action
from attnscale.watch.actions import in_force as acting_in_force
from attnscale.watch.alerts import LOGGER

__all__ = ["RESUME_ACTIONS", "check_resume_actions", "in_force", "plain_probe", "probe_like", "probe_of", "plan_of",
           "resumes"]

# ``resume_actions``: "same" (a checkpoint's watch must have had this plan) or "new" (this plan replaces it)
RESUME_ACTIONS = ("same", "new")
_TAGS = ("inputs", "dict", "tuple", "list", "fields")


def check_resume_actions(value: Any) -> None:
    if not (isinstance(value, str) and value in RESUME_ACTIONS):
        raise ConfigError(f"resume_actions takes 'same' (a resumed run keeps the alerts and actions it started with) "
                          f"or 'new' (this watch's replace them), got {value!r}")


class _NotPlain(Exception):
    pass


def _plain(x: Any) -> Any:
    if torch.is_tensor(x) or x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, Inputs):
        return {"inputs": [[_plain(v) for v in x.args], {str(k): _plain(v) for k, v in x.kwargs.items()}]}
    if isinstance(x, Mapping) and all(isinstance(k, str) for k in x):
        return {"dict": {k: _plain(v) for k, v in x.items()}}
    if isinstance(x, (tuple, list)):
        return {"tuple" if isinstance(x, tuple) else "list": [_plain(v) for v in x]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"fields": {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    raise _NotPlain(type(x).__name__)


def plain_probe(probe: Any) -> Any:
    """The probe batch as tensors, numbers, strings and tagged lists and dicts; None (said) where it holds
    something else (an object a checkpoint cannot keep as data): a resumed run then probes its own first batch."""
    try:
        return _plain(probe)
    except _NotPlain as e:
        LOGGER.warning(f"the watch's probe batch holds a {e} that a checkpoint keeps only as data it cannot read "
                       "safely; it is not saved, and a resumed run probes its own first batch")
        return None


def probe_of(plain: Any) -> Any:
    """The probe ``plain_probe`` wrote, made again (a state written before it, holding the batch itself, too)."""
    if isinstance(plain, dict) and len(plain) == 1 and next(iter(plain)) in _TAGS:
        (tag, value), = plain.items()
        if tag == "inputs":
            return Inputs(tuple(probe_of(v) for v in value[0]), {k: probe_of(v) for k, v in value[1].items()})
        if tag in ("dict", "fields"):
            return {k: probe_of(v) for k, v in value.items()}
        return (tuple if tag == "tuple" else list)(probe_of(v) for v in value)
    return plain


def _skeleton(x: Any) -> Any:
    """``x``'s structure, whatever its containers' types: tensors and other values as leaves."""
    if torch.is_tensor(x):
        return "tensor"
    if isinstance(x, Mapping):
        return {str(k): _skeleton(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _skeleton(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (tuple, list)):
        return [_skeleton(v) for v in x]
    return "value"


def probe_like(saved: Any, batch: Any) -> Any:
    """The saved probe's tensors in the containers of ``batch`` (the resumed run's first batch, as caught) where
    the two have one structure, so the forward gets the types it was written for; else the saved probe."""
    if _skeleton(saved) != _skeleton(batch):
        return saved
    tensors = iter(list(tensors_in(saved)))
    return map_tensors(batch, lambda _: next(tensors))


def _action(action: Any) -> Any:
    if isinstance(action, str):
        return action
    if isinstance(action, Action):
        return {"action": type(action).__name__, **action.to_json()}
    return {"function": f"{getattr(action, '__module__', '')}.{getattr(action, '__qualname__', type(action).__name__)}"}


def plan_of(alerts, qk_clip: float | None) -> dict:
    """Every alert's configuration (its fields, its action's), in order, and qk_clip=, as JSON values."""
    entries = []
    for alert in alerts:
        fields = {f.name: getattr(alert, f.name) for f in dataclasses.fields(alert) if f.name != "action"}
        fields = json.loads(json.dumps(fields, default=repr))
        entries.append({"alert": type(alert).__name__, **fields, "action": _action(alert.action)})
    return {"alerts": entries, "qk_clip": None if qk_clip is None else float(qk_clip)}


def _named(entry: Any) -> str:
    """One alert or action of a plan as the code that makes it: MaxScore(tau=1000, action=ClipQK(tau=100.0))."""
    if isinstance(entry, str):
        return repr(entry)
    if "function" in entry:
        return entry["function"]
    kind = entry.get("alert") or entry.get("action")
    defaults = _defaults(kind) if "alert" in entry else {}  # an action's few fields are all said
    args = ", ".join(f"{k}={_named(v) if isinstance(v, (dict, str)) and k == 'action' else repr(v)}"
                     for k, v in entry.items() if k != "alert" and not (k == "action" and v == kind)
                     and not (k in defaults and defaults[k] == v))
    return f"{kind}({args})"


def _defaults(kind: str) -> dict:
    """The defaults of the fields of attnscale's alert ``kind`` but its action ({} for another name): a plan names
    an alert's options only where they are given otherwise."""
    from attnscale.watch import alerts

    cls = getattr(alerts, kind, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return {}
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
            and f.name != "action"}


def _said(plan: dict) -> str:
    alerts = "[" + ", ".join(_named(a) for a in plan["alerts"]) + "]"
    return alerts + ("" if plan.get("qk_clip") is None else f" with qk_clip={plan['qk_clip']:g}")


def resumes(saved: Mapping, plan: dict, names: list[str], resume_actions: str) -> bool:
    """Whether a resumed watch of ``plan`` (its alerts ``names``) goes on with the state ``saved`` (the
    checkpoint's): True where the plans are one; False under resume_actions="new" where they differ, what the old
    actions had in force said to end; a ConfigError naming both plans otherwise. A state from before plans were
    kept is read by its alerts' names (``Alerts.load_state_dict``)."""
    before = saved.get("plan")
    if before is None:
        return resume_actions != "new" or saved["alerts"]["alerts"] == names
    if before == plan:
        return True
    if resume_actions != "new":
        raise ConfigError(f"the checkpoint's watch had the alerts {_said(before)}, this one {_said(plan)}; resume "
                          "with the alerts and actions the run started with, or give the watch resume_actions='new' "
                          "to end the old ones and start these")
    ending = in_force(saved)
    LOGGER.warning(f"resume_actions='new': the checkpoint's watch had the alerts {_said(before)}, this one "
                   f"{_said(plan)}; the old alerts' state is left behind"
                   + (f", and what their actions had in force ends here: {ending}" if ending else ""))
    return False


def in_force(saved: Mapping | None) -> str:
    """What a saved watch's actions had in force, in words ("" for nothing): said where it ends."""
    acting, clip = (saved or {}).get("acting") or {}, (saved or {}).get("clip")
    said = [text for text in (acting_in_force(acting),) if text]  # computed once: "" where nothing is in force
    if clip is not None and clip.get("since") is not None:
        said.append(f"QK-Clip at tau {clip['tau']:g} since step {clip['since']}")
    return "; ".join(said)
