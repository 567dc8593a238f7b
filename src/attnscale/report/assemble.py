"""The report: the course's figures beside ours, built only from run records.

``build(runs_dir)`` reads every record under ``runs_dir`` (layout and schema in
``runs.py``), judges the chapter's claims (``course.py``), lays out the sections
(``sections.py``), draws the figures (``plots.py``) and writes (``render.py``) one self-contained HTML file (images
inline as data URIs, inline CSS, no script, so it opens offline and nothing in a
record can run) and a Markdown file with the PNGs beside it. Nothing is retrained, so the report
can be rebuilt at any time from whatever subset of experiments is on disk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscale.report import course, render, sections
from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.errors import ConfigError
from attnscale.runs.store import find_records, read_record

__all__ = ["Runs", "TrainRun", "load_runs", "build"]

EXPERIMENTS = {
    "spread": "spread of q·k vs width (`attnscale spread --out DIR/spread`)",
    "fresh": "fresh head (`attnscale fresh --init unit` and `--init model`)",
    "dynamics": "training dynamics (train runs with group \"dynamics\")",
    "sweep": "width sweep (train runs with group \"sweep\")",
}




def _as_layers(line: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl line, {"spread": [[per head] per layer], ...}, as {"layers": [{"layer": i, "spread": [...]}]}."""
    if not isinstance(line.get("spread"), list):
        return line
    layers = [{"layer": i, **{k: line[k][i] for k in HEAD_MEASURES if k in line}} for i in range(len(line["spread"]))]
    return {**{k: v for k, v in line.items() if k not in HEAD_MEASURES}, "layers": layers}


@dataclass
class TrainRun:
    """One training run: its record and the lines of its metrics.jsonl."""

    path: Path
    record: dict[str, Any]
    lines: list[dict[str, Any]] = field(default_factory=list)
    results: dict[str, Any] = field(init=False, default_factory=dict)  # the report's view, set in __post_init__

    model = property(lambda self: self.record.get("config", {}).get("model", {}))
    scale = property(lambda self: self.model.get("scale", "?"))
    seed = property(lambda self: self.record.get("config", {}).get("train", {}).get("seed", self.record.get("seed")))
    group = property(lambda self: self.record.get("group", "train"))  # "dynamics", "sweep", or a plain run
    status = property(lambda self: self.record.get("status", "?"))

    def __post_init__(self):
        # The report's view of a train.py record (schema in runs.py): each recorded
        # step as per-layer dicts, and the first and last of them beside the results.
        res = dict(self.record.get("results") or {})
        self.lines = [_as_layers(x) for x in (self.lines or res.get("history") or [])]
        res["valid_ppl"] = res.get("perplexity")
        res["train_loss_last"] = res.get("final_train_loss")
        diag = [x for x in self.lines if x.get("layers")]
        if diag:
            res["first"] = {"step": diag[0]["step"], "layers": diag[0]["layers"]}
            res["last"] = {"step": diag[-1]["step"], "layers": diag[-1]["layers"]}
        self.results = res

    @property
    def width(self) -> int:
        m = self.model
        return int(m.get("head_dim") or m["d_model"] // m["n_heads"])

    def diag_mean(self, which: str, key: str) -> float:
        """Mean over layers and heads of ``key`` in results[which] ("first" or "last")."""
        vals = [v for layer in self.results[which]["layers"] for v in layer[key]]
        return sum(vals) / len(vals)

    def layer_means(self, which: str, key: str) -> list[float]:
        """Mean over heads of ``key``, one value per layer, in results[which]."""
        return [sum(layer[key]) / len(layer[key]) for layer in self.results[which]["layers"]]


@dataclass
class Runs:
    root: Path
    records: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)  # every record used
    spread_rows: list[dict[str, Any]] = field(default_factory=list)
    fresh_rows: dict[tuple[str, int, str], dict[str, Any]] = field(default_factory=dict)
    illustration: dict[str, Any] | None = None
    train: list[TrainRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # records skipped or ignored, and why

    @property
    def dynamics(self) -> list[TrainRun]:
        return [t for t in self.train if t.group == "dynamics"]

    @property
    def sweep(self) -> list[TrainRun]:
        return [t for t in self.train if t.group == "sweep"]

    def present(self) -> set[str]:
        have = {"spread"} if self.spread_rows else set()
        have |= {"fresh"} if self.fresh_rows else set()
        return have | {g for g in ("dynamics", "sweep") if getattr(self, g)}


def _read_lines(path: Path) -> tuple[list[dict], int]:
    lines, bad = [], 0
    if path.exists():
        for text in path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                bad += 1  # a run killed mid-write leaves a partial last line
    return lines, bad


def _natural(text: str) -> list:
    """Sort key that puts d32 before d128."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def load_runs(runs_dir: Path) -> Runs:
    """Every record under ``runs_dir``, sorted into experiments. The newest spread
    record and the newest fresh record per init are used; older ones are noted."""
    runs_dir = Path(runs_dir)
    dirs = find_records(runs_dir) if runs_dir.is_dir() else []
    if not dirs:
        raise ConfigError(f"no run records (record.json) under {str(runs_dir)!r}; "
                          "run `attnscale reproduce --out DIR` or an experiment with --out first")
    runs, latest = Runs(runs_dir), {}
    for d in dirs:
        rel = d.relative_to(runs_dir).as_posix() or "."
        try:
            rec = read_record(d)
        except (OSError, ValueError) as e:
            runs.notes.append(f"{rel}: unreadable record, skipped ({e})")
            continue
        if not isinstance(rec, dict):
            runs.notes.append(f"{rel}: record.json is not a run record (not a JSON object), skipped")
            continue
        exp = rec.get("experiment")
        if exp == "train":
            lines, bad = _read_lines(d / "metrics.jsonl")
            if bad:
                runs.notes.append(f"{rel}: {bad} unreadable line(s) in metrics.jsonl, skipped")
            runs.train.append(TrainRun(d, rec, lines))
            runs.records.append((d, rec))
        elif exp in ("spread", "fresh"):
            key = exp if exp == "spread" else f"fresh/{rec.get('config', {}).get('init', 'unit')}"
            if key in latest and latest[key][1].get("finished", 0) >= rec.get("finished", 0):
                runs.notes.append(f"{rel}: an older {key} record, not used")
                continue
            if key in latest:
                runs.notes.append(f"{latest[key][0].relative_to(runs_dir).as_posix()}: an older {key} record, not used")
            latest[key] = (d, rec)
        else:
            runs.notes.append(f"{rel}: experiment {exp!r} is not part of this report, skipped")
    for key, (d, rec) in sorted(latest.items()):
        runs.records.append((d, rec))
        if key == "spread":
            runs.spread_rows = list(rec["results"])
            continue
        res = rec["results"]
        for r in res["rows"]:
            init = r.get("init", rec["config"].get("init", "unit"))
            runs.fresh_rows[(init, int(r["width"]), r["scale"])] = r
        if res.get("illustration") and (runs.illustration is None or key == "fresh/unit"):
            runs.illustration = res["illustration"]
    order = list(EXPERIMENTS)  # the report's order: spread, fresh, dynamics, sweep, then other training runs
    rank = {k: i for i, k in enumerate(order)}
    runs.records.sort(key=lambda x: (rank.get(x[1].get("group", x[1].get("experiment")), len(order)),
                                     _natural(x[0].relative_to(runs_dir).as_posix())))
    runs.train.sort(key=lambda t: (t.group, t.width, t.scale, _natural(str(t.seed))))
    return runs


def build(runs_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """Write index.html, report.md and PNGs for the records under ``runs_dir``.

    Returns {"html", "markdown", <plot name>: png path}. Raises ConfigError when
    ``runs_dir`` holds no record, or none that can be read."""
    runs = load_runs(Path(runs_dir))
    if not runs.records:  # every record skipped: an empty report would look like a result
        raise ConfigError(f"none of the records under {str(runs_dir)!r} could be used ({len(runs.notes)} skipped; "
                          f"first: {runs.notes[0] if runs.notes else '?'})")
    out = Path(out_dir) if out_dir is not None else Path(runs_dir) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        blocks, pngs = sections.document(runs, course.evaluate(runs), out, EXPERIMENTS)
        images = {p.name: p.read_bytes() for p in pngs.values()}
        paths = {"html": out / "index.html", "markdown": out / "report.md", **pngs}
        paths["html"].write_text(render.to_html(blocks, images), encoding="utf-8")
        paths["markdown"].write_text(render.to_markdown(blocks), encoding="utf-8")
    except PermissionError as e:
        raise ConfigError(f"cannot write the report to {str(out)!r} ({e.strerror}); give a writable --out") from None
    return paths
