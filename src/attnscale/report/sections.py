"""The report's document: one function per section, each returning blocks (``render.py``).

``document(runs, verdicts, out, experiments)`` assembles them in order and draws
the figures into ``out``. ``runs`` is the report's ``Runs`` (``assemble.py``),
read only through its attributes; nothing here opens a file but the figures it writes.

The header comes first and carries what a reader must know before any number:
which preset made the records (compared with ``lm.presets.budget``), so that a
quick report is never taken for the full one, and which claims do not agree,
each with its reason.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from attnscale.core.scales import FLOORS, display_name
from attnscale.report.blocks import Block, Heading, Para, Banner, Scoreboard, Details, Bullets, Image, Table, opening
from attnscale.report import (course, end_state_section, frozen_section, recipe_section, schemes_section, setup_section,
                              warn_section)

__all__ = ["document", "preset_of"]

QUICK, DEFAULT, FULL, CUSTOM = "quick", "default", "full", "custom"
# what the presets fix and a run's record keeps; batch is left out (the full preset
# halves it on a word-level vocabulary), as are threads, dtype and checkpoints
_PRESET_TRAIN = ("steps", "lr", "warmup", "eval_batches", "record_every")
_PRESET_MODEL = ("context", "d_model", "n_layers", "n_heads", "init", "norm")
# the stages of reproduce by their runs' group, as the budget table names them
STAGES = {"dynamics": "4. training dynamics", "sweep": "5. width sweep",
          schemes_section.GROUP: "beyond the course: scheme study"}
SETUP_STAGE = "beyond the course: setup study"


def _f(x: Any, fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _verdict_table(verdicts: list[course.Verdict], beside: str | None = None) -> Table:
    head = ["claim (the course's words)", "course", "ours", "tolerance", "verdict", "note"]
    rows = [[v.claim, v.course, v.ours, v.tolerance, v.verdict, v.note] for v in verdicts]
    if beside:
        head.insert(3, beside)
        for v, r in zip(verdicts, rows):
            r.insert(3, v.beside.split(": ", 1)[-1])
    return Table(head, rows)


# ---- the header: preset, sources, claims that differ ---------------------------


def _preset_settings(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from dataclasses import asdict

    from attnscale.lm.presets import budget

    b = budget(name)
    return {k: b.model.get(k) for k in _PRESET_MODEL}, {k: asdict(b.train)[k] for k in _PRESET_TRAIN}


def preset_of(runs) -> tuple[str, str]:
    """(QUICK | DEFAULT | FULL | CUSTOM | "", description) from the training runs' configs.

    A run matches a preset when every setting that preset fixes is the one the
    run recorded; the folder is "quick", "default" or "full" only if every run of the
    course's experiments (dynamics and sweep; studies beyond the course keep their
    own budgets) matches the same one, "" when it holds no training run."""
    course_runs = [*runs.dynamics, *runs.sweep] or runs.train
    if not course_runs:
        return "", "no training runs in these records, so no training preset"
    wanted = {p: _preset_settings(p) for p in (QUICK, DEFAULT, FULL)}
    seen = set()
    for t in course_runs:
        got = ({k: getattr(t.model_config, k, None) for k in _PRESET_MODEL}, {k: getattr(t.train_config, k) for k in _PRESET_TRAIN})
        seen.add(next((p for p, w in wanted.items() if w == got), CUSTOM))
    m, tr = wanted[QUICK]
    def_m, def_tr = wanted[DEFAULT]
    full_tr = wanted[FULL][1]
    evals = lambda t: "the whole held-out split" if t["eval_batches"] is None else f"{t['eval_batches']} held-out batches"  # noqa: E731
    seeds = len({t.seed for t in runs.sweep}) or 1
    # the preset is the course's experiments' budget; a study beyond them keeps its own (the stage table)
    ours = "of the course's experiments (sections 4 and 5)"
    if seen == {QUICK}:
        return QUICK, (f"Quick preset (attnscale reproduce --quick): {tr['steps']} steps per run {ours}, context "
                       f"{m['context']}, perplexity on {evals(tr)}. A smoke test, not the full reproduction: "
                       f"the default preset trains {def_tr['steps']} steps, context {def_m['context']}, "
                       f"perplexity on {evals(def_tr)}; run attnscale reproduce (or --full) for that.")
    if seen == {DEFAULT}:
        return DEFAULT, (f"Default preset (attnscale reproduce): {def_tr['steps']} steps per run {ours}, context "
                         f"{def_m['context']}, perplexity on {evals(def_tr)}, {seeds} seed{'s' if seeds != 1 else ''}. "
                         f"The course's end of training is judged by the full preset (attnscale reproduce --full: "
                         f"{full_tr['steps']:,} steps a run).")
    if seen == {FULL}:
        study = " The setup study's runs are in these records too." if setup_section.study_runs(runs) else ""
        return FULL, (f"Full preset (attnscale reproduce --full): {full_tr['steps']:,} steps per run {ours}, context "
                      f"{def_m['context']}, perplexity on {evals(full_tr)}, {seeds} seed{'s' if seeds != 1 else ''}."
                      + study)
    return CUSTOM, ("Custom settings: the training runs match " + ("neither preset" if seen == {CUSTOM} else "no single preset")
                    + " of attnscale reproduce (see the runs' settings below); compare with care.")


def _shared(runs) -> list:
    """Records copied from another stage (the sweep's widest pair is the dynamics pair)."""
    return [rec for _, rec in runs.records if rec.copied_from]


def _stage(t) -> str:
    """The stage a training run belongs to, as the budget table names it."""
    from attnscale.lm.study_axes import is_study

    return STAGES.get(t.group) or (SETUP_STAGE if is_study(t) else t.group)


def _budgets(runs) -> Table:
    """Each stage's own budget, read from its runs' records (the scheme study's is not the preset's)."""
    from attnscale.analysis.budget import budget, span_text
    from attnscale.lm.study_axes import lr_text

    stages: dict[str, list] = {}
    for t in runs.train:
        stages.setdefault(_stage(t), []).append(t)
    order = [*STAGES.values(), SETUP_STAGE]
    rows = []
    for name in sorted(stages, key=lambda s: (order.index(s) if s in order else len(order), s)):
        b = budget(stages[name])
        rows.append([name, b["runs"], span_text(b["steps"]), span_text(b["context"]), span_text(b["batch"]),
                     len(b["seeds"]), span_text(b["head_dims"]), span_text([lr_text(x) for x in b["lrs"]], "{}")])
    return Table(["stage", "runs", "steps a run", "context", "batch", "seeds", "widths", "learning rate"], rows)


def _header(runs, verdicts: list[course.Verdict], experiments: dict[str, str]) -> list[Block]:
    preset, words = preset_of(runs)
    title = "The score scale in attention: the course's figures beside ours"
    head, lines = course.scoreboard(verdicts, figures=False)  # the figures follow, with the reasons
    # the scoreboard first: how the course's claims fared, before any paragraph explains it
    b: list[Block] = [Heading(1, title + (f" ({preset} preset)" if preset in (QUICK, DEFAULT, FULL) else "")),
                      Scoreboard(f"Scoreboard: {head} of the course", lines),
                      Banner(words)]
    if runs.train:
        b.append(Para("What each stage trained, as its records say (a study beyond the course keeps its own "
                       "budget):"))
        b.append(_budgets(runs))
    finished = [rec.finished for _, rec in runs.records if rec.finished]
    when = (" to ".join(dict.fromkeys(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
                                      for t in (min(finished), max(finished)))) if finished else "?")
    shared = _shared(runs)
    # the folder by its name: an absolute path is one machine's, and the report travels
    source = (f"Built from {len(runs.records) - len(shared)} run records in the folder {runs.root.resolve().name}/ "
              f"(finished {when})")
    if shared:
        source += (f"; {len(shared)} runs are copies of runs another stage trained (the sweep's widest pairs are "
                   "the dynamics runs; the setup study copies the runs of its setups that reproduce trained), "
                   "counted once")
    b.append(Para(f"{source}. The course is chapter 9, 'Scaled attention'."))
    reasons = course.reasons(verdicts)
    if reasons:
        b.append(Bullets("Claims that do not agree, and why:", reasons))
    missing = [f"{e}: {desc}" for e, desc in experiments.items() if e not in runs.present()]
    if missing:
        b.append(Bullets("Not in the records, so not judged:", missing))
    if runs.notes:
        b.append(Bullets("Records skipped or not used:", runs.notes))
    return b


# ---- one section per experiment ------------------------------------------------

# each experiment's section opens with its heading and a paragraph: what was run, how it is measured and read
_OPENINGS = {
    "spread": ("1. Wider means louder: the spread of q·k",
               "Random pairs of vectors with independent N(0, 1) entries (`attnscale spread`). The "
               "spread is the standard deviation of q·k; SE is the standard error of our estimate "
               "(sample std over the pairs)."),
    "fresh": ("3. A fresh head, before any training",
              "Verdicts use the footnote's assumption (q and k entries with unit variance, 'unit' "
              "init: `attnscale fresh --init unit`); the tiny model's own initialisation is shown beside "
              "them (`--init model`). Effective words of a "
              "row = exp(entropy); a row is frozen when its largest weight exceeds the threshold. The "
              "course quotes one row for 'roughly 35 words', not an average, so we ask whether 35 "
              "lies inside our p10–p90 range of single rows."),
    "dynamics": ("4. What happens during training",
                 "The tiny model trained with and without the scale (`attnscale dynamics`). "
                 "The course's figures are one head's, its first layer's, so every claim below, at the start "
                 "and at the end, reads layer 0 (the mean over its heads, then over seeds, with the 95% "
                 "t interval over seeds), the mean over all layers beside it. A head's spread is the "
                 "standard deviation of all its scaled, unmasked scores, pooled over rows: softmax "
                 "ignores a shift common to a row, so the pooled figure also counts differences "
                 "between rows' mean scores and sits at or above the rows' RMS within-row spread (pooled "
                 "variance = mean within-row variance + variance of the row means); it is the course's "
                 "measure, so it is the one judged. "
                 "Plots show the mean over layers (thick) and each layer where layers differ by over "
                 "10% (thin, a lighter shade per layer). A short CPU run may not reach the course's end "
                 "state; then the verdict says 'partly', 'inconclusive' or 'differs' and both numbers "
                 "are shown."),
    "sweep": ("5. Where 'large' starts: held-out perplexity by width",
              "The tiny model trained at each width with and without the scale (`attnscale sweep`). "
              "Gap = perplexity without the scale − with it (positive: the scale helps), means over "
              "seeds; SE from the seeds where each cell has two or more. The gap in points depends on "
              "the corpus and tokenizer, and the course's corpus is not the one here, so compare "
              "shapes first."),
}


def _spread(runs, verdicts, out: Path, pngs: dict) -> list[Block]:
    from attnscale.report import plots

    b = opening(*_OPENINGS["spread"])
    if not runs.spread_rows:
        return b + [Para("Not run.")]
    b.append(_verdict_table(verdicts))
    pngs["spread"] = plots.spread_plot(runs.spread_rows, out / "spread.png")
    b.append(Image("spread.png", "Spread of raw and scaled scores against width, log–log, with the √d line"))
    b.append(Table(["width d", "scale", "raw spread", "SE", "√d", "factor", "scaled spread"],
              [[r["head_dim"], display_name(r["scale"]), _f(r["raw_spread"], "{:.3f}"), _f(course.spread_se(r), "{:.3f}"),
                _f(r["sqrt_d"], "{:.3f}"), _f(r["factor"], "{:.5f}"), _f(r["scaled_spread"], "{:.3f}")]
               for r in sorted(runs.spread_rows, key=lambda r: (r["head_dim"], r["scale"]))]))
    return b


def _illustration(runs, out: Path, pngs: dict) -> list[Block]:
    from attnscale.report import plots

    ill = runs.illustration
    if not ill:
        return []
    pngs["illustration"] = plots.illustration(ill, out / "illustration.png")
    return [Heading(2, "2. Why loud scores freeze attention"),
            Para((f"One row of {len(ill['scores'])} N(0, 1) scores, multiplied by growing factors before softmax. "
                   "Small gaps give a soft blend across many words; the same gaps blown up give a hard choice. "
                   "×1 is what the scale gives at any width; without it the scores are √d louder: ×16 at d=256, "
                   "×32 at d=1024.")),
            Image("illustration.png", "Weights of one row at several score scales")]


def _fresh(runs, verdicts, out: Path, pngs: dict) -> list[Block]:
    from attnscale.report import plots

    b = opening(*_OPENINGS["fresh"])
    if not runs.fresh_rows:
        return b + [Para("Not run.")]
    b.append(_verdict_table(verdicts, beside="model's own init"))
    pngs["fresh"] = plots.fresh_plot(list(runs.fresh_rows.values()), out / "fresh.png")
    b.append(Image("fresh.png", "Effective words and frozen rows against width at init"))
    b.append(Table(["init", "width d", "scale", "eff. words median", "p10", "p90", "max weight", "frozen",
                        "push median", "example row"],
              [[i, w, display_name(s), _f(r["effective_words_median"], "{:.2f}"), _f(r["effective_words_p10"], "{:.2f}"),
                _f(r["effective_words_p90"], "{:.2f}"), _f(r["max_weight_mean"], "{:.3f}"),
                _f(r["frozen_fraction"], "{:.1%}"), _f(r.get("push_median"), "{:.4f}"), r.get("example", "")]
               for (i, w, s), r in sorted(runs.fresh_rows.items(), key=lambda x: (x[0][0] != "unit", x[0]))]))
    return b


def _dyn_row(runs, t) -> list:
    def fl(key, fmt):
        if t.line("first") is None:
            return "—"
        return f"{fmt.format(t.diag_mean('first', key))} → {fmt.format(t.diag_mean('last', key))}"
    return [t.path.relative_to(runs.root).as_posix(), t.head_dim, display_name(t.scale), t.seed, t.status, t.steps_done,
            fl("spread", "{:,.1f}"), fl("frozen_fraction", "{:.1%}"), fl("effective_words", "{:.1f}"),
            _f(t.perplexity, "{:.2f}")]


def _targets() -> dict[str, list[tuple[float, str, str]]]:
    """The course's end of training at d=1,024, as its claims hold the figures (``course``), for the plots."""
    none, scaled = display_name("none"), display_name(course.SCALED)
    return {"spread": [(course.END_SPREAD, f"course: over {course.END_SPREAD:,.0f} ({none})", "none"),
                       (course.SCALED_SPREAD, f"course: about {course.SCALED_SPREAD:g} ({scaled})", course.SCALED)],
            "frozen_fraction": [(course.COURSE_END_FROZEN, f"course: {course.COURSE_END_FROZEN:.1%} ({none})", "none")]}


def _dynamics(runs, verdicts, out: Path, pngs: dict) -> list[Block]:
    from attnscale.report import plots

    b = opening(*_OPENINGS["dynamics"]) + [_verdict_table(verdicts)]
    for w in sorted({t.head_dim for t in runs.dynamics}):
        series = [(f"{display_name(t.scale)}, seed {t.seed}", t.scale, t.recorded) for t in runs.dynamics
                  if t.head_dim == w and t.recorded]
        if series:
            name = f"dynamics-d{w}.png"
            pngs[f"dynamics-d{w}"] = plots.training(series, out / name, f"Training at head width d={w}",
                                                    _targets() if w == course.COURSE_WIDTH else None)
            b.append(Image(name, f"Spread, frozen rows, effective words and loss per step at d={w}"))
    if runs.dynamics:
        b.append(Table(["run", "d", "scale", "seed", "status", "steps", "spread first → last", "frozen first → last",
                            "eff. words first → last", "held-out ppl"], [_dyn_row(runs, t) for t in runs.dynamics]))
        b += frozen_section.blocks(runs)
    return b


def _sweep(runs, verdicts, out: Path, pngs: dict) -> list[Block]:
    from attnscale.analysis.estimates import mean_se
    from attnscale.analysis.gaps import gap_table, share_by_head_dim
    from attnscale.report import plots

    b = opening(*_OPENINGS["sweep"]) + [_verdict_table(verdicts)]
    if not runs.sweep:
        return b
    cells: dict[tuple[int, str], list[float]] = {}
    for t in runs.sweep:
        if t.perplexity is not None and t.scale not in FLOORS:  # the floor has its own table
            cells.setdefault((t.head_dim, t.scale), []).append(float(t.perplexity))
    gaps, start = course.gap_by_head_dim(runs), course.gap_start(runs)
    if cells:
        pngs["sweep"] = plots.perplexity_vs_head_dim(cells, gaps, start, out / "sweep.png")
        b.append(Image("sweep.png", "Held-out perplexity and the gap against width"))
    scales = sorted({s for _, s in cells})
    shares = share_by_head_dim(gap_table(course.sweep_rows(runs), reference=course.SCALED))
    rows = []
    for w in sorted({w for w, _ in cells}):
        ppl = [mean_se(cells.get((w, s), [])) for s in scales]
        gap = gaps.get(w)
        rows.append([w, *[_f(m, "{:.2f}") + ("" if e is None else f" ± {e:.2f}") for m, e in ppl],
                     "—" if gap is None else f"{gap[0]:+.2f}", _f(gap[1] if gap else None, "{:.2f}"),
                     _f(shares.get(w), "{:.0%}"), gap[2] if gap else len(cells.get((w, scales[0]), []))])
    b.append(Table(["width d", *[f"ppl {display_name(s)}" for s in scales], "gap", "SE of gap", "gap / ppl with the scale",
                        "seeds"], rows))
    bad = [f"{t.path.relative_to(runs.root).as_posix()}: {t.status}"
           + (f" at step {t.diverged_at}" if t.diverged_at is not None else "")
           for t in runs.sweep if t.status != "done"]
    b += end_state_section.floor_blocks(runs)
    if bad:
        b.append(Bullets("Sweep runs without a perplexity (not counted):", bad))
    return b


# ---- the runs and what they ran on ---------------------------------------------


def _kv(d: dict | None, keys: tuple[str, ...] | None = None) -> str:
    d = d or {}
    return ", ".join(f"{k}={d[k]}" for k in (keys or tuple(d)) if k in d and not isinstance(d[k], (dict, list)))


_THREADS = "torch_threads"


def _precision(env: dict) -> str:
    """Whether the CPU computes bf16 natively, as a record's environment says (older records do not)."""
    native = env.get("cpu_native_bf16")
    return "native bf16 in the CPU: " + ("not recorded" if native is None else "yes" if native else "no")


def _trained_in(rec) -> str | None:
    """The precision a training run computed in ("fp32", "bf16", …), from its results; None for other records."""
    if rec.experiment != "train":
        return None
    results = rec.results if isinstance(rec.results, dict) else {}
    return results.get("dtype") or (results.get("device") or {}).get("dtype")


def _environments(runs) -> list[str]:
    """One line per distinct software and hardware, with the precisions its training runs computed in;
    lines that differ only in the thread count are one line, with the counts and what they mean."""
    groups: dict[str, set] = {}
    trained: dict[str, set] = {}
    for _, rec in runs.records:
        env = dict(rec.environment)
        threads = env.pop(_THREADS, None)
        device = env.pop("device", None) or {}  # where a training run computed: said once, with its precision
        key = json.dumps(env, sort_keys=True)
        groups.setdefault(key, set()).add(threads)
        if _trained_in(rec):
            where = f"{device.get('type', '?')}" + (f" ({device['name']})" if device.get("name") else "")
            trained.setdefault(key, set()).add(f"{_trained_in(rec)} on {where}")
    lines = []
    for key in sorted(groups):
        env = json.loads(key)
        text = _kv({k: v for k, v in env.items() if k != "cpu_native_bf16"}) or "not recorded"
        threads = sorted(t for t in groups[key] if t is not None)
        if len(threads) == 1:
            text += f", {_THREADS}={threads[0]}"
        elif threads:
            text += (f", {_THREADS}={' or '.join(map(str, threads))} (threads per process on the same machine: "
                     "training runs that run side by side, -j N, share the cores)")
        text += "; " + _precision(env)
        if key in trained:
            text += "; trained in " + " and ".join(sorted(trained[key]))
        lines.append(text)
    return lines


def _metadata(runs) -> list[Block]:
    rows = []
    for d, rec in runs.records:
        cfg = rec.config
        if rec.experiment == "train":
            setting = (_kv(cfg.get("model"), ("d_model", "n_layers", "n_heads", "head_dim", "context", "scale", "init", "norm"))
                       + "; " + _kv(cfg.get("train"), ("steps", "batch", "lr", "seed")))
        else:
            setting = _kv(cfg)
        if rec.copied_from:
            # relative to the records' folder, even where it lies outside it: no machine's absolute path
            source = Path(os.path.relpath(Path(rec.copied_from), runs.root))
            setting += f"; a copy of {source.as_posix()} (not retrained)"
        rows.append([d.relative_to(runs.root).as_posix() or ".",
                     rec.experiment + (f" ({rec.group})" if rec.group else ""),
                     rec.status, _f(rec.duration_s, "{:.1f}"), _trained_in(rec) or "—",
                     _precision(rec.environment).split(": ")[1], setting])
    corpora = {json.dumps(t.corpus, sort_keys=True) for t in runs.train}
    b: list[Block] = [Heading(2, "6. The runs")]
    if corpora:
        b.append(Bullets("Corpora and tokenizers:", [_kv(json.loads(c)) or "not recorded" for c in sorted(corpora)]))
    b.append(Bullets("Software and hardware:", _environments(runs)))
    # the longest table of the page, folded: a reader who wants one run opens it
    b.append(Details(f"Every run ({len(rows)} records): settings, precision, duration",
              [Table(["run", "experiment", "status", "duration (s)", "precision", "native bf16 in the CPU",
                          "settings (model; training)"], rows)]))
    return b


def document(runs, verdicts: list[course.Verdict], out: Path,
             experiments: dict[str, str]) -> tuple[list[Block], dict[str, Path]]:
    """Every section's blocks, in order, and the figures drawn for them ({name: png path})."""
    pngs: dict[str, Path] = {}
    by = {e: [v for v in verdicts if v.experiment == e] for e in experiments}
    blocks = [*_header(runs, verdicts, experiments),
              *_spread(runs, by["spread"], out, pngs),
              *_illustration(runs, out, pngs),
              *_fresh(runs, by["fresh"], out, pngs),
              *_dynamics(runs, by["dynamics"], out, pngs),
              *_sweep(runs, by["sweep"], out, pngs),
              *end_state_section.blocks(runs),  # the course's end state, decided by a rule stated first
              *schemes_section.blocks(runs, out, pngs),  # beyond the course: which scale?
              *setup_section.blocks(runs, out, pngs),  # beyond the course: which setup?
              *warn_section.blocks(runs, out, pngs),  # does the watch warn before a run breaks?
              *recipe_section.blocks(runs, out, pngs),  # ... before a learned run breaks, in Wortsman et al.'s recipe
              *_metadata(runs)]
    return blocks, pngs
