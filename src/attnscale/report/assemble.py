"""The report: the course's figures beside ours, built only from run records.

``build(runs_dir)`` reads every record under ``runs_dir`` (layout and schema in
``runs.record``), judges the chapter's claims (``course.py``), lays out the sections
(``sections.py``), draws the figures (``plots.py``) and writes (``render.py``) one self-contained HTML file (images
inline as data URIs, inline CSS, no script, so it opens offline and nothing in a
record can run) and a Markdown file with the PNGs beside it. Nothing is retrained, so the report
can be rebuilt at any time from whatever subset of experiments is on disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscale.report import course, plots, render, sections
from attnscale.errors import ConfigError
from attnscale.runs import record
from attnscale.runs.record import Floors, Record, TrainRun

__all__ = ["Runs", "TrainRun", "load_runs", "verdicts", "build"]

EXPERIMENTS = {
    "spread": "spread of q·k vs width (`attnscale spread --out DIR/spread`)",
    "fresh": "fresh head (`attnscale fresh --init unit` and `--init model`)",
    "dynamics": "training dynamics (train runs with group \"dynamics\")",
    "sweep": "width sweep (train runs with group \"sweep\")",
}




@dataclass
class Runs:
    root: Path
    records: list[tuple[Path, Record]] = field(default_factory=list)  # every record used
    spread_rows: list[dict[str, Any]] = field(default_factory=list)
    fresh_rows: dict[tuple[str, int, str], dict[str, Any]] = field(default_factory=dict)
    illustration: dict[str, Any] | None = None
    train: list[TrainRun] = field(default_factory=list)
    floors: Floors | None = None  # the sweep's counted no-attention floors (None in sweeps written before)
    notes: list[str] = field(default_factory=list)  # records skipped or ignored, and why

    @property
    def dynamics(self) -> list[TrainRun]:
        return [t for t in self.train if t.group == "dynamics"]

    @property
    def sweep(self) -> list[TrainRun]:
        return [t for t in self.train if t.group == "sweep"]

    @property
    def end_state(self) -> list[TrainRun]:
        """The runs of ``attnscale reproduce --end-state``."""
        return [t for t in self.train if t.group == "end-state"]

    def present(self) -> set[str]:
        have = {"spread"} if self.spread_rows else set()
        have |= {"fresh"} if self.fresh_rows else set()
        return have | {g for g in ("dynamics", "sweep") if getattr(self, g)}


def _natural(text: str) -> list:
    """Sort key that puts d32 before d128."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def _floors(runs_dir: Path, notes: list[str]) -> Floors | None:
    """The counted floors a sweep (or the end-state run) wrote under ``runs_dir``: the width sweep's where
    there are several (one corpus, one count), None where there are none."""
    found = sorted(runs_dir.rglob(record.FLOORS), key=lambda p: (p.parent.name != "sweep", _natural(p.as_posix())))
    for path in found:
        try:
            return record.read_floors(path.parent)
        except record.RecordError as e:
            notes.append(f"{path.relative_to(runs_dir).as_posix()}: skipped ({e})")
    return None


def load_runs(runs_dir: Path) -> Runs:
    """Every record under ``runs_dir``, sorted into experiments. The newest spread
    record and the newest fresh record per init are used; older ones are noted.
    Raises ConfigError when there is no record, or none can be read."""
    runs_dir = Path(runs_dir)
    dirs = record.find(runs_dir) if runs_dir.is_dir() else []
    if not dirs:
        raise ConfigError(f"no run records (record.json) under {str(runs_dir)!r}; "
                          "run `attnscale reproduce --out DIR` or an experiment with --out first")
    runs, latest = Runs(runs_dir), {}
    for d in dirs:
        rel = d.relative_to(runs_dir).as_posix() or "."
        try:
            rec = record.read(d)
            run = TrainRun.load(d, rec) if rec.experiment == "train" else None
        except record.RecordError as e:
            runs.notes.append(f"{rel}: skipped ({str(e).replace(str(d / record.RECORD), 'record.json')})")
            continue
        if run is not None:
            if run.unreadable_lines:
                runs.notes.append(f"{rel}: {run.unreadable_lines} unreadable line(s) in metrics.jsonl, skipped")
            runs.train.append(run)
            runs.records.append((d, rec))
        elif rec.experiment in ("spread", "fresh"):
            key = rec.experiment if rec.experiment == "spread" else f"fresh/{rec.config.get('init', 'unit')}"
            if key in latest and latest[key][1].finished >= rec.finished:
                runs.notes.append(f"{rel}: an older {key} record, not used")
                continue
            if key in latest:
                runs.notes.append(f"{latest[key][0].relative_to(runs_dir).as_posix()}: an older {key} record, not used")
            latest[key] = (d, rec)
        else:
            runs.notes.append(f"{rel}: experiment {rec.experiment!r} is not part of this report, skipped")
    for key, (d, rec) in sorted(latest.items()):
        runs.records.append((d, rec))
        if key == "spread":
            runs.spread_rows = list(rec.results)
            continue
        for r in rec.results["rows"]:
            init = r.get("init", rec.config.get("init", "unit"))
            runs.fresh_rows[(init, int(r["head_dim"]), r["scale"])] = r
        if rec.results.get("illustration") and (runs.illustration is None or key == "fresh/unit"):
            runs.illustration = rec.results["illustration"]
    runs.floors = _floors(runs_dir, runs.notes)
    if not runs.records:
        raise ConfigError(f"none of the records under {str(runs_dir)!r} could be used ({len(runs.notes)} skipped; "
                          f"first: {runs.notes[0]}); rerun the experiments into a new --out")
    order = list(EXPERIMENTS)  # the report's order: spread, fresh, dynamics, sweep, then other training runs
    rank = {k: i for i, k in enumerate(order)}
    runs.records.sort(key=lambda x: (rank.get(x[1].group or x[1].experiment, len(order)),
                                     _natural(x[0].relative_to(runs_dir).as_posix())))
    runs.train.sort(key=lambda t: (t.group, t.head_dim, t.scale, _natural(str(t.seed))))
    return runs


def verdicts(runs: Runs) -> list[course.Verdict]:
    """The claims judged; an end-of-training claim that does not agree carries, in its note,
    what the setup study measured about it (where the records hold a study)."""
    from dataclasses import replace

    from attnscale.report import end_state_section, setup_section

    study = setup_section.notes(runs)
    decided = end_state_section.notes(runs)
    out = []
    for v in course.evaluate(runs):
        if v.verdict in (course.PARTLY, course.DIFFERS) and v.key in study:
            v = replace(v, note="; ".join(x for x in (v.note, study[v.key]) if x))
        if v.key in decided:
            v = replace(v, note="; ".join(x for x in (v.note, decided[v.key]) if x))
        out.append(v)
    return out


FILES = ("index.html", "report.md", "*.png")  # what a report folder holds: the page marks it as the report's


def check_out(out: Path) -> None:
    """A ``ConfigError`` where ``out`` holds files the report did not write (``runs.writers.check_out``), or
    only files that are not attnscale's (``runs.writers.check_folder``)."""
    from attnscale.runs import writers

    writers.check_folder(out, "report")
    writers.check_out(out, "report", FILES)


def build(runs_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """Write index.html, report.md and PNGs for the records under ``runs_dir``.

    Returns {"html", "markdown", <plot name>: png path}. Raises ConfigError when
    ``runs_dir`` holds no record, or none that can be read, and before anything is written where ``out_dir``
    holds files the report did not write (``runs.writers``: its index.html is marked as the report's)."""
    out = Path(out_dir) if out_dir is not None else Path(runs_dir) / "report"
    check_out(out)
    runs = load_runs(Path(runs_dir))  # every record skipped is an error there: an empty report would look like a result
    try:
        out.mkdir(parents=True, exist_ok=True)
        blocks, pngs = sections.document(runs, verdicts(runs), out, EXPERIMENTS)
        images = {p.name: p.read_bytes() for p in pngs.values()}
        paths = {"html": out / "index.html", "markdown": out / "report.md", **pngs}
        # no figure shown so small that its smallest text falls under 9 px (plots.SMALLEST_SHOWN)
        paths["html"].write_text(render.to_html(blocks, images, plots.SMALLEST_SHOWN, generator="report"),
                                 encoding="utf-8")
        paths["markdown"].write_text(render.to_markdown(blocks), encoding="utf-8")
    except PermissionError as e:
        raise ConfigError(f"cannot write the report to {str(out)!r} ({e.strerror}); give a writable --out") from None
    return paths
