"""The watch log's record: one typed, versioned line per probe step, and the only code that reads or writes it.

A watch log (``JsonlSink``) is JSON Lines; each line is one ``WatchLine``:

    {"schema": "attnscale.watch", "version": 1, "step": 200, "time": 1764556800.0,
     "measures": ["spread", ...], "values": [[[...heads] ...measures] ...layers],
     "rows": [[...heads] ...layers], "summary": {"attn/max_score": ...},
     "alerts": [{"alert": "max_score", "layer": 0, "head": 3, "step": 200, "value": 131.2,
                 "action": "warn", "message": "..."}],
     "watch": {"seconds": 0.012, "total_seconds": 0.05, "share": 0.004},
     "probe": {"sequences": 4, "tokens": 64, "methods": ["replay", ...]}, "threshold": 0.99,
     "qk_clip": {"tau": 100.0, "layers": ["model.layers.0.self_attn", ...], "gamma": [[...heads] ...layers],
                 "s_max": [[...]], "clipped_steps": [[...]], "method": ["exact", ...]}}

``values`` is ``HeadStats.values_LMH`` as nested lists (layer, measure, head);
``watch`` is the watch's own cost: this probe's seconds, its seconds so far and
their share of the wall time since it started; ``probe``, what was measured: the
probe batch's sequences and tokens, or, measured in the training forward
(``in_training_forward``), the step's ``forwards`` and their sequences together, and per layer how its
measures were had (``methods``: "replay", every score replayed; "fused", effective words from the fused
call's log-sum-exp and the rest from the sampled rows, ``capture/fused.py``), and ``lm_head``, only where the
probe spared it: "logits_to_keep=1" (a transformers causal LM asked for one position's logits a sequence,
``capture.probe.one_logit``). ``bias``, only where a layer adds
a bias to its scores (ALiBi, a float mask's finite part): per layer and head the
smallest and largest bias over the visible keys (null: none). ``qk_clip``, only where QK-Clip
is on (``qk_clip.py``): per layer and query head since the probe before, the
smallest factor the clip put on the head's scores, the largest S_max of its
training forwards and the steps that clipped, and per layer how its S_max were had
(``method``: "exact", every score over the visible keys); with ``qk_clip_check``, ``s_max_after``: per
layer and head the largest S_max of a step's batch read again after the update and the clip. ``kinds``, on the
baseline record only (the first probe of a run, read on its probe batch): per layer and head "sink",
"previous" (a previous-token head) or "" (``core/head_kinds.py``'s rule). Non-finite numbers are written as
null (strict JSON, as run records do); an alert keeps the value it saw in its
message. A line of a newer version than this attnscale knows is refused with a
one-line ``ConfigError`` naming both versions, as is a record whose fields are not
what a Watch writes (a string among the numbers, ``Infinity``), naming its line.

``read_watch_log`` reads a log as it is found on disk: the last line of a run
killed mid-write is cut short, and is set aside (``WatchLog.cut``) rather than
refusing the records before it; a ``JsonlSink`` appends, so one file may hold
several runs, told apart where the steps stop increasing or the table changes
shape (``WatchLog.runs``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError

__all__ = ["SCHEMA", "VERSION", "WatchLine", "WatchLog", "EmptyLogError", "read_log", "read_watch_log"]

SCHEMA = "attnscale.watch"
VERSION = 1
KINDS = ("sink", "previous", "")  # a head's kind on the baseline record (``core/head_kinds.py``)


def _finite_or_none(x: Any) -> Any:
    """Nested lists and dicts of numbers with NaN and ±inf as None (JSON null)."""
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass(frozen=True)
class WatchLine:
    """One probe step: the per-head table, the model-wide summaries, alerts fired, the watch's own time."""

    step: int
    time: float  # unix seconds when the probe was measured
    measures: tuple[str, ...]
    values: list  # [layer][measure][head]
    rows: list  # [layer][head]: rows counted
    summary: dict[str, float]
    alerts: list[dict] = field(default_factory=list)
    watch: dict[str, float] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)
    threshold: float | None = None
    qk_clip: dict = field(default_factory=dict)
    bias: list = field(default_factory=list)  # [layer][head][min, max] over the visible keys, where a layer has a bias
    actions: list = field(default_factory=list)  # the actions an alert took at this step (``watch/actions.py``)
    kinds: list = field(default_factory=list)  # [layer][head]: "sink", "previous" or "", on the baseline record

    @property
    def layers(self) -> int:
        return len(self.values)

    @property
    def heads(self) -> int:
        return len(self.values[0][0]) if self.values and self.values[0] else 0

    def grid(self, measure: str) -> list[list[float | None]]:
        """One measure as [layer][head]."""
        m = self.measures.index(measure)
        return [layer[m] for layer in self.values]

    def to_json(self) -> dict[str, Any]:
        clip = {"qk_clip": self.qk_clip} if self.qk_clip else {}  # a field of runs with QK-Clip only
        clip.update({"bias": self.bias} if self.bias else {})  # of models with a score bias only
        clip.update({"actions": self.actions} if self.actions else {})  # of steps where an alert acted only
        clip.update({"kinds": self.kinds} if self.kinds else {})  # of the baseline record only
        return _finite_or_none({"schema": SCHEMA, "version": VERSION, "step": self.step, "time": self.time,
                                "measures": list(self.measures), "values": self.values, "rows": self.rows,
                                "summary": self.summary, "alerts": self.alerts, "watch": self.watch,
                                "probe": self.probe, "threshold": self.threshold, **clip})

    def to_line(self) -> str:
        return json.dumps(self.to_json(), allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, data: Any, where: str = "watch log") -> "WatchLine":
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ConfigError(f"{where} is not an attnscale watch record (no \"schema\": \"{SCHEMA}\"); "
                              "give the JSONL file a Watch's JsonlSink wrote")
        version = data.get("version")
        if not isinstance(version, int) or not 1 <= version <= VERSION:
            raise ConfigError(f"{where} is watch log version {version!r}; this attnscale reads versions 1 to "
                              f"{VERSION}: upgrade attnscale to read it")
        try:
            _check_fields(data)
            record = cls(step=int(data["step"]), time=float(data["time"]), measures=tuple(data["measures"]),
                         values=data["values"], rows=data["rows"], summary=dict(data["summary"]),
                         alerts=list(data.get("alerts", [])), watch=dict(data.get("watch", {})),
                         probe=dict(data.get("probe", {})), threshold=data.get("threshold"),
                         qk_clip=dict(data.get("qk_clip") or {}), bias=list(data.get("bias") or []),
                         actions=list(data.get("actions") or []), kinds=list(data.get("kinds") or []))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where} lacks a well-formed field ({str(e)[:200]}); give an unedited watch log") from None
        if not record.values or any(len(layer) != len(record.measures) for layer in record.values):
            raise ConfigError(f"{where} has a table that does not match its measures; give an unedited watch log")
        return record

    def shape(self) -> tuple:
        """What tells one model's records from another's: the measures, and the heads of every layer."""
        return self.measures, tuple(len(layer[0]) if layer else 0 for layer in self.values)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _numbers_or_null(x: Any, name: str) -> None:
    """Nested lists of numbers or null, as ``to_json`` writes them; a TypeError naming ``name`` otherwise."""
    if isinstance(x, list):
        for v in x:
            _numbers_or_null(v, name)
    elif x is not None and not _is_number(x):
        raise TypeError(f"{name!r} holds {x!r} where a number or null belongs")


def _check_fields(data: dict) -> None:
    """The fields the page and the tables read, of the types a Watch writes: a hand-edited or foreign
    record is refused here, in one line, rather than failing later in a plot."""
    step, time = data["step"], data["time"]
    if not _is_number(step) or step < 0 or step != int(step):  # Infinity and NaN never get here (parse_constant)
        raise ValueError(f"'step' is {step!r}, not a whole step")
    if not _is_number(time):
        raise ValueError(f"'time' is {time!r}, not a number of seconds")
    if not isinstance(data["measures"], list) or not all(isinstance(m, str) for m in data["measures"]):
        raise TypeError("'measures' is not a list of names")
    for name in ("values", "rows"):
        if not isinstance(data[name], list) or not all(isinstance(layer, list) for layer in data[name]):
            raise TypeError(f"{name!r} is not a list of layers")
        _numbers_or_null(data[name], name)
    if not isinstance(data["summary"], dict):
        raise TypeError("'summary' is not an object")
    _numbers_or_null(list(data["summary"].values()), "summary")
    alerts = data.get("alerts", [])
    if not isinstance(alerts, list) or not all(isinstance(a, dict) for a in alerts):
        raise TypeError("'alerts' is not a list of objects")
    for a in alerts:
        if not (isinstance(a.get("alert"), str) and all(_is_number(a.get(k)) for k in ("layer", "head", "step"))):
            raise TypeError(f"an alert lacks its name, layer, head or step: {a!r}"[:200])
        _numbers_or_null(a.get("value"), "alerts")
    kinds = data.get("kinds") or []
    if not isinstance(kinds, list) or len(kinds) not in (0, len(data["values"])) or not all(
            isinstance(layer, list) and all(k in KINDS for k in layer) for layer in kinds):
        raise TypeError(f"'kinds' is not a list of layers of {', '.join(map(repr, KINDS))}"[:200])
    if data.get("threshold") is not None and not _is_number(data["threshold"]):
        raise TypeError(f"'threshold' is {data['threshold']!r}, not a number")


class EmptyLogError(ConfigError):
    """A watch log with no complete record yet: wait for the run's first probe, or give another file."""


def _refuse_constant(name: str):
    raise ValueError(name)  # NaN and ±Infinity: a Watch writes null, never these


@dataclass(frozen=True)
class WatchLog:
    """A watch log as found on disk: its complete records, the line each was read from, and the lines
    cut short by a run killed mid-write (the last line; or, where a run appended after such a kill,
    the start of the line its first record was glued to)."""

    path: Path
    records: list[WatchLine]
    lines: list[int]
    cut: tuple[int, ...] = ()

    def runs(self) -> list[list[int]]:
        """The records' indices, one list per run. A record whose table changes shape starts a new run
        (another model); so does one whose step is not above the run's first step (a run started again,
        appending to the same file). A step that goes back but stays above the run's first step is the
        same run resumed from a checkpoint: the records it supersedes (those at or past its step) leave
        the run, which goes on from there."""
        runs: list[list[int]] = []
        for i, record in enumerate(self.records):
            run = runs[-1] if runs else None
            if run is None or record.shape() != self.records[run[-1]].shape() \
                    or record.step <= self.records[run[0]].step:
                runs.append([i])
                continue
            while record.step <= self.records[run[-1]].step:
                run.pop()
            run.append(i)
        return runs

    def last_run(self) -> "WatchLog":
        run = self.runs()[-1]
        return WatchLog(self.path, [self.records[i] for i in run], [self.lines[i] for i in run],
                        tuple(n for n in self.cut if n >= self.lines[run[0]]))

    def cut_note(self) -> str | None:
        """One line naming the lines cut short, if any."""
        if not self.cut:
            return None
        return (f"{self.path}: line{'s' if len(self.cut) > 1 else ''} {', '.join(map(str, self.cut))} "
                f"{'were' if len(self.cut) > 1 else 'was'} cut short (a run killed while writing); "
                f"read the {len(self.records)} complete records")

    def runs_note(self) -> str | None:
        """One line saying that the log holds several runs and which one ``last_run`` is, if it does."""
        runs = self.runs()
        if len(runs) == 1:
            return None
        first, last = runs[-1][0], runs[-1][-1]
        return (f"{self.path} holds {len(runs)} runs (the steps start again, or the table changes shape, at "
                f"line{'s' if len(runs) > 2 else ''} {', '.join(str(self.lines[run[0]]) for run in runs[1:])}); "
                f"shown: the last, lines {self.lines[first]} to {self.lines[last]}, steps "
                f"{self.records[first].step} to {self.records[last].step}; give each run its own log "
                "to see the others")

    def notes(self) -> list[str]:
        """One line for each thing a reader of this log should know: lines cut short, and several runs."""
        return [n for n in (self.cut_note(), self.runs_note()) if n is not None]


def read_watch_log(path: Path | str) -> WatchLog:
    """Every complete record of a watch log, in file order, and the lines cut short by a killed run.
    A line that is not a record is one ``ConfigError`` naming it; a log without a complete record,
    ``EmptyLogError``."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"a watch log's path takes the JSONL file a Watch wrote (a str or Path), got {path!r}")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (an editor's save) is not a cut line
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ConfigError(f"cannot read watch log {str(path)!r} ({reason}); give the JSONL file a Watch wrote") from None
    records, numbers, cut = [], [], []
    lines = text.split("\n")  # the last item: what follows the last newline, "" in a log written whole
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line, parse_constant=_refuse_constant)
        except json.JSONDecodeError:
            # a record the writer never finished: at the very end, or with the next run's first record glued on
            glued = line.rfind('{"schema": ')
            if n == len(lines):
                cut.append(n)
                continue
            if glued > 0:
                cut.append(n)
                data = _glued(line[glued:], f"{path}:{n}")
            else:
                raise ConfigError(f"{path}:{n} is not JSON; give the JSONL file a Watch wrote") from None
        except ValueError as e:
            raise ConfigError(f"{path}:{n} holds {e}, which a Watch never writes (it writes null); "
                              "give an unedited watch log") from None
        records.append(WatchLine.from_json(data, where=f"{path}:{n}"))
        numbers.append(n)
    if not records:
        raise EmptyLogError(f"watch log {str(path)!r} holds no record yet; train until the first probe step "
                            "and retry")
    return WatchLog(path, records, numbers, tuple(cut))


def _glued(tail: str, where: str) -> Any:
    try:
        return json.loads(tail, parse_constant=_refuse_constant)
    except ValueError:
        raise ConfigError(f"{where} is not JSON; give the JSONL file a Watch wrote") from None


def read_log(path: Path | str) -> list[WatchLine]:
    """Every complete record of a watch log, in file order (``read_watch_log`` also says which lines were cut
    and where another run begins); a bad file is one ``ConfigError`` naming the line."""
    return read_watch_log(path).records
