"""The watch log's record: one typed, versioned line per probe step, and the only code that reads or writes it.

A watch log (``JsonlSink``) is JSON Lines; each line is one ``WatchLine``:

    {"schema": "attnscale.watch", "version": 1, "step": 200, "time": 1764556800.0,
     "measures": ["spread", ...], "values": [[[...heads] ...measures] ...layers],
     "rows": [[...heads] ...layers], "summary": {"attn/max_score": ...},
     "alerts": [{"alert": "max_score", "layer": 0, "head": 3, "step": 200, "value": 131.2,
                 "action": "warn", "message": "..."}],
     "watch": {"seconds": 0.012, "total_seconds": 0.05, "share": 0.004},
     "probe": {"sequences": 4, "tokens": 64}, "threshold": 0.99,
     "qk_clip": {"tau": 100.0, "layers": ["model.layers.0.self_attn", ...], "gamma": [[...heads] ...layers],
                 "s_max": [[...]], "clipped_steps": [[...]]}}

``values`` is ``HeadStats.values_LMH`` as nested lists (layer, measure, head);
``watch`` is the watch's own cost: this probe's seconds, its seconds so far and
their share of the wall time since it started; ``probe``, what was measured: the
probe batch's sequences and tokens, or, measured in the training forward
(``in_training_forward``), the step's ``forwards`` and their sequences together. ``bias``, only where a layer adds
a bias to its scores (ALiBi, a float mask's finite part): per layer and head the
smallest and largest bias over the visible keys (null: none). ``qk_clip``, only where QK-Clip
is on (``qk_clip.py``): per layer and query head since the probe before, the
smallest factor the clip put on the head's scores, the largest S_max of its
training forwards and the steps that clipped. Non-finite numbers are written as
null (strict JSON, as run records do); an alert keeps the value it saw in its
message. A line of a newer version than this attnscale knows is refused with a
one-line ``ConfigError`` naming both versions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError

__all__ = ["SCHEMA", "VERSION", "WatchLine", "read_log"]

SCHEMA = "attnscale.watch"
VERSION = 1


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
    probe: dict[str, int] = field(default_factory=dict)
    threshold: float | None = None
    qk_clip: dict = field(default_factory=dict)
    bias: list = field(default_factory=list)  # [layer][head][min, max] over the visible keys, where a layer has a bias

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
            record = cls(step=int(data["step"]), time=float(data["time"]), measures=tuple(data["measures"]),
                         values=data["values"], rows=data["rows"], summary=dict(data["summary"]),
                         alerts=list(data.get("alerts", [])), watch=dict(data.get("watch", {})),
                         probe=dict(data.get("probe", {})), threshold=data.get("threshold"),
                         qk_clip=dict(data.get("qk_clip") or {}), bias=list(data.get("bias") or []))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where} lacks a well-formed field ({e}); give an unedited watch log") from None
        if not record.values or any(len(layer) != len(record.measures) for layer in record.values):
            raise ConfigError(f"{where} has a table that does not match its measures; give an unedited watch log")
        return record


def read_log(path: Path | str) -> list[WatchLine]:
    """Every record of a watch log, in file order; a bad file is one ``ConfigError`` naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ConfigError(f"cannot read watch log {str(path)!r} ({reason}); give the JSONL file a Watch wrote") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{n} is not JSON; give the JSONL file a Watch wrote") from None
        records.append(WatchLine.from_json(data, where=f"{path}:{n}"))
    if not records:
        raise ConfigError(f"watch log {str(path)!r} holds no record; train until the first probe step and retry")
    return records
