"""The report: the course's figures beside ours, built only from run records.

``build(runs_dir)`` reads every record under ``runs_dir`` (layout and schema in
``runs.py``), judges the chapter's claims (``course.py``), draws the figures
(``plots.py``) and writes (``render.py``) one self-contained HTML file (images
inline as data URIs, inline CSS, no script, so it opens offline and nothing in a
record can run) and a Markdown file with the PNGs beside it. Nothing is retrained, so the report
can be rebuilt at any time from whatever subset of experiments is on disk.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscale.report import course
from attnscale.report import render
from attnscale.errors import ConfigError
from attnscale.runs import record
from attnscale.runs.record import Record, TrainRun

__all__ = ["Runs", "TrainRun", "load_runs", "build"]

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


def _natural(text: str) -> list:
    """Sort key that puts d32 before d128."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


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
            runs.fresh_rows[(init, int(r["width"]), r["scale"])] = r
        if rec.results.get("illustration") and (runs.illustration is None or key == "fresh/unit"):
            runs.illustration = rec.results["illustration"]
    if not runs.records:
        raise ConfigError(f"none of the {len(dirs)} run record(s) under {str(runs_dir)!r} can be used "
                          f"(first: {runs.notes[0]}); rerun the experiments into a new --out")
    order = list(EXPERIMENTS)  # the report's order: spread, fresh, dynamics, sweep, then other training runs
    rank = {k: i for i, k in enumerate(order)}
    runs.records.sort(key=lambda x: (rank.get(x[1].group or x[1].experiment, len(order)),
                                     _natural(x[0].relative_to(runs_dir).as_posix())))
    runs.train.sort(key=lambda t: (t.group, t.width, t.scale, _natural(str(t.seed))))
    return runs


# ---- the document, as blocks rendered twice (HTML and Markdown) --------------


def _f(x: Any, fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _verdict_table(verdicts: list[course.Verdict], beside: str | None = None) -> tuple:
    head = ["claim (the course's words)", "course", "ours", "tolerance", "verdict", "note"]
    rows = [[v.claim, v.course, v.ours, v.tolerance, v.verdict, v.note] for v in verdicts]
    if beside:
        head.insert(3, beside)
        for v, r in zip(verdicts, rows):
            r.insert(3, v.beside.split(": ", 1)[-1])
    return ("table", head, rows)


def _sections(runs: Runs, verdicts: list[course.Verdict], out: Path) -> tuple[list[tuple], dict[str, Path]]:
    from attnscale.report import plots

    pngs: dict[str, Path] = {}
    by = {e: [v for v in verdicts if v.experiment == e] for e in EXPERIMENTS}
    counts = {k: sum(v.verdict == k for v in verdicts) for k in (course.AGREES, course.DIFFERS, course.NOT_RUN)}
    finished = [rec.finished for _, rec in runs.records if rec.finished]
    when = " to ".join(dict.fromkeys(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) for t in (min(finished), max(finished)))) if finished else "?"
    b: list[tuple] = [("h1", "The score scale in attention: the course's figures beside ours"),
                      ("p", (f"Built from {len(runs.records)} run records under {runs.root} (finished {when}). "
                            f"The course is chapter 9, 'Scaled attention'. Of {len(verdicts)} claims: "
                            f"{counts['agrees']} agree, {counts['differs']} differ, {counts['not run']} not run."))]
    missing = [f"{e}: {desc}" for e, desc in EXPERIMENTS.items() if e not in runs.present()]
    if missing:
        b.append(("list", "Not in the records, so not judged:", missing))
    if runs.notes:
        b.append(("list", "Records skipped or not used:", runs.notes))

    b += [("h2", "1. Wider means louder: the spread of q·k"),
          ("p", ("Random pairs of vectors with independent N(0, 1) entries. The spread is the standard deviation of "
                "q·k; SE is the standard error of our estimate (sample std over the pairs)."))]
    if runs.spread_rows:
        b.append(_verdict_table(by["spread"]))
        pngs["spread"] = plots.spread_plot(runs.spread_rows, out / "spread.png")
        b.append(("img", "spread.png", "Spread of raw and scaled scores against width, log–log, with the √d line"))
        b.append(("table", ["width d", "scale", "raw spread", "SE", "√d", "factor", "scaled spread"],
                  [[r["width"], r["scale"], _f(r["raw_spread"], "{:.3f}"), _f(course.spread_se(r), "{:.3f}"),
                    _f(r["sqrt_d"], "{:.3f}"), _f(r["factor"], "{:.4g}"), _f(r["scaled_spread"], "{:.3f}")]
                   for r in sorted(runs.spread_rows, key=lambda r: (r["width"], r["scale"]))]))
    else:
        b.append(("p", "Not run."))

    if runs.illustration:
        ill = runs.illustration
        b += [("h2", "2. Why loud scores freeze attention"),
              ("p", (f"One row of {len(ill['scores'])} N(0, 1) scores, multiplied by growing factors before softmax. "
                    "Small gaps give a soft blend across many words; the same gaps blown up give a hard choice. "
                    "×1 is what the scale gives at any width; without it the scores are √d louder: ×16 at d=256, "
                    "×32 at d=1024."))]
        pngs["illustration"] = plots.illustration(ill, out / "illustration.png")
        b.append(("img", "illustration.png", "Weights of one row at several score scales"))

    b += [("h2", "3. A fresh head, before any training"),
          ("p", ("Verdicts use the footnote's assumption (q and k entries with unit variance, 'unit' init); the "
                "tiny model's own initialisation is shown beside them. Effective words of a row = exp(entropy); "
                "a row is frozen when its largest weight exceeds the threshold. The course quotes one row for "
                "'roughly 35 words', not an average, so we ask whether 35 lies inside our p10–p90 range of single rows."))]
    if runs.fresh_rows:
        b.append(_verdict_table(by["fresh"], beside="model's own init"))
        pngs["fresh"] = plots.fresh_plot(list(runs.fresh_rows.values()), out / "fresh.png")
        b.append(("img", "fresh.png", "Effective words and frozen rows against width at init"))
        b.append(("table", ["init", "width d", "scale", "eff. words median", "p10", "p90", "max weight", "frozen", "push median", "example row"],
                  [[i, w, s, _f(r["effective_words_median"], "{:.2f}"), _f(r["effective_words_p10"], "{:.2f}"),
                    _f(r["effective_words_p90"], "{:.2f}"), _f(r["max_weight_mean"], "{:.3f}"),
                    _f(r["frozen_fraction"], "{:.1%}"), _f(r.get("push_median"), "{:.3g}"), r.get("example", "")]
                   for (i, w, s), r in sorted(runs.fresh_rows.items(), key=lambda x: (x[0][0] != "unit", x[0]))]))
    else:
        b.append(("p", "Not run."))

    b += [("h2", "4. What happens during training"),
          ("p", ("Spread, frozen share and effective words at a step are the mean over all layers and heads "
                "(each head's spread is over its scaled, unmasked scores). Plots show the mean (thick) and each "
                "layer where layers differ by over 10% (thin). A short CPU run may not reach the course's "
                "end state; then the verdict says 'differs' and both numbers are shown."))]
    b.append(_verdict_table(by["dynamics"]))
    for w in sorted({t.width for t in runs.dynamics}):
        group = [t for t in runs.dynamics if t.width == w]
        series = [(f"{t.scale} s{t.seed}", t.scale, t.recorded) for t in group if t.recorded]
        if series:
            name = f"dynamics-d{w}.png"
            pngs[f"dynamics-d{w}"] = plots.training(series, out / name, f"Training at head width d={w}")
            b.append(("img", name, f"Spread, frozen rows, effective words and loss per step at d={w}"))
    if runs.dynamics:
        b.append(("table", ["run", "d", "scale", "seed", "status", "steps", "spread first → last", "frozen first → last",
                            "eff. words first → last", "held-out ppl"], [_dyn_row(runs, t) for t in runs.dynamics]))

    b += [("h2", "5. Where 'large' starts: held-out perplexity by width"),
          ("p", ("Gap = perplexity without the scale − with it (positive: the scale helps), means over seeds; "
                "SE from the seeds where each cell has two or more. The gap in points depends on the corpus and "
                "tokenizer, and the course's corpus is not the one here, so compare shapes first."))]
    b.append(_verdict_table(by["sweep"]))
    if runs.sweep:
        cells: dict[tuple[int, str], list[float]] = {}
        for t in runs.sweep:
            if t.perplexity is not None:
                cells.setdefault((t.width, t.scale), []).append(float(t.perplexity))
        gaps, start = course.gap_by_width(runs), course.gap_start(runs)
        if cells:
            pngs["sweep"] = plots.perplexity_vs_width(cells, gaps, start, out / "sweep.png")
            b.append(("img", "sweep.png", "Held-out perplexity and the gap against width"))
        b.append(("table", ["width d", *[f"ppl {s}" for s in sorted({s for _, s in cells})], "gap", "seeds"],
                  [[w, *[", ".join(f"{v:.2f}" for v in cells.get((w, s), [])) or "—" for s in sorted({s for _, s in cells})],
                    course.fmt_gap(*gaps[w]) if w in gaps else "—", gaps[w][2] if w in gaps else "—"]
                   for w in sorted({w for w, _ in cells})]))
        bad = [f"{t.path.relative_to(runs.root).as_posix()}: {t.status}" + (f" at step {t.diverged_at}" if t.diverged_at is not None else "")
               for t in runs.sweep if t.status != "done"]
        if bad:
            b.append(("list", "Sweep runs without a perplexity (not counted):", bad))
    from attnscale.report import schemes_section

    b += schemes_section.blocks(runs, out, pngs)  # "Beyond the course: which scale?"
    b += _metadata(runs)
    return b, pngs


def _dyn_row(runs: Runs, t: TrainRun) -> list:
    def fl(key, fmt):
        if t.line("first") is None:
            return "—"
        return f"{fmt.format(t.diag_mean('first', key))} → {fmt.format(t.diag_mean('last', key))}"
    return [t.path.relative_to(runs.root).as_posix(), t.width, t.scale, t.seed, t.status, t.steps_done,
            fl("spread", "{:.3g}"), fl("frozen_fraction", "{:.1%}"), fl("effective_words", "{:.3g}"), _f(t.perplexity, "{:.2f}")]


def _kv(d: dict | None, keys: tuple[str, ...] | None = None) -> str:
    d = d or {}
    return ", ".join(f"{k}={d[k]}" for k in (keys or tuple(d)) if k in d and not isinstance(d[k], (dict, list)))


def _metadata(runs: Runs) -> list[tuple]:
    rows = []
    for d, rec in runs.records:
        cfg = rec.config
        if rec.experiment == "train":
            setting = (_kv(cfg.get("model"), ("d_model", "n_layers", "n_heads", "head_dim", "context", "scale", "init", "norm"))
                       + "; " + _kv(cfg.get("train"), ("steps", "batch", "lr", "seed")))
        else:
            setting = _kv(cfg)
        rows.append([d.relative_to(runs.root).as_posix() or ".", rec.experiment + (f" ({rec.group})" if rec.group else ""),
                     rec.status, _f(rec.duration_s, "{:.1f} s"), setting])
    corpora = {json.dumps(t.corpus, sort_keys=True) for t in runs.train}
    envs = {json.dumps(rec.environment, sort_keys=True) for _, rec in runs.records}
    b = [("h2", "6. The runs"),
         ("table", ["run", "experiment", "status", "duration", "settings (model; training)"], rows)]
    if corpora:
        b.append(("list", "Corpora and tokenizers:", [_kv(json.loads(c)) or "not recorded" for c in sorted(corpora)]))
    b.append(("list", "Software and hardware:", [_kv(json.loads(e)) or "not recorded" for e in sorted(envs)]))
    return b


def build(runs_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """Write index.html, report.md and PNGs for the records under ``runs_dir``.

    Returns {"html", "markdown", <plot name>: png path}. Raises ConfigError when
    ``runs_dir`` holds no record."""
    runs = load_runs(Path(runs_dir))
    out = Path(out_dir) if out_dir is not None else Path(runs_dir) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        blocks, pngs = _sections(runs, course.evaluate(runs), out)
        images = {p.name: p.read_bytes() for p in pngs.values()}
        paths = {"html": out / "index.html", "markdown": out / "report.md", **pngs}
        paths["html"].write_text(render.to_html(blocks, images), encoding="utf-8")
        paths["markdown"].write_text(render.to_markdown(blocks), encoding="utf-8")
    except PermissionError as e:
        raise ConfigError(f"cannot write the report to {str(out)!r} ({e.strerror}); give a writable --out") from None
    return paths
