"""Does acting on the watch save a run? The act study (docs/act-study.md, its rules fixed before any seed ran).

Two cells of the warning study's recipe that break (qk-norm off, z-loss 0 and 1e-4, learning rate 8e-2),
runs of 3,000 steps, five arms on the same seeds (the same seed: the same initial weights and batches):
A nothing; B QK-Clip at tau 100 from step 0; C QK-Clip switched on by the alarm; D the rate halved by the
alarm; E qk-norm, the reference. The alarm is the first probe whose max |score| is over a level L chosen on
the pilot's seeds (``choose_level``); the watch probes the very sequence the run's records probe, so the
alarm reads the number the published series holds.

``run_pilot`` trains arm A on the pilot seeds and chooses L; ``run_study`` reads the pilot's L and trains
the study seed by seed (every arm of one seed of both cells, then the next seed), so that a study cut short
has whole pairs. Each arm's watch travels to the worker as plain data (``RunSpec.watch``: ``watch_spec``),
from which the worker builds its ``Attached``. The judging is ``analysis.act_judging``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnscale.analysis.act_judging import BEST_OF_ARM, FLOOR, LADDER, LEARNED_LEVEL
from attnscale.errors import ConfigError
from attnscale.experiments import warn_study as ws
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.train import TrainConfig
from attnscale.runs.runner import RunSpec, execute

__all__ = ["GROUP", "PILOT_GROUP", "CELLS", "LR", "ARMS", "ACTION_ARMS", "STEPS", "WARMUP", "PILOT_SEEDS", "BLOCKS",
           "ALL_SEEDS", "LEVELS", "DEFAULT_LEVEL", "MIN_LEAD", "TAU", "LR_FACTOR", "FLOOR", "LEARNED_LEVEL", "BEST_OF_ARM",
           "SIZES", "ActConfig", "preset", "watch_spec", "pilot_specs", "study_specs", "run_rows", "choose_level",
           "pilot_summary", "run_pilot", "read_pilot", "run_study", "PILOT_FILE"]

GROUP = "act-study"
PILOT_GROUP = "act-pilot"
CELLS = {"z0": 0.0, "z1e-4": 1e-4}  # cell -> z-loss; both qk-norm off (1/sqrt(d))
LR = 8e-2  # the warning study's rung where 7 of 19 and 10 of 20 learned runs broke
ARMS = ("A", "B", "C", "D", "E")
ACTION_ARMS = ("B", "C", "D")  # the arms judged by the decision rule
STEPS, WARMUP = 3000, 500  # 3,000 >= 2 x the latest break seen (step 1,415)
PILOT_SEEDS = (100, 101, 102, 103)
BLOCKS = ((0, 1, 2, 3), tuple(range(4, 16)))  # block 1, then block 2 (declared before any seed ran)
ALL_SEEDS = BLOCKS[0] + BLOCKS[1]  # the study's reading is final on these alone; on fewer it is interim
LEVELS = LADDER  # the alarm's ladder (analysis.act_judging)
DEFAULT_LEVEL = 1e3  # where no pilot run broke: the warning study's level
MIN_LEAD = 100  # steps: every broken pilot run crossed L at least this long before its break
TAU = 100.0  # QK-Clip's tau (Kimi K2's)
LR_FACTOR = 0.5  # arm D's rate cut
SIZES = ("smoke", "full")
PILOT_FILE = "act-pilot.json"


@dataclass(frozen=True)
class ActConfig(TrainingConfig):
    """Cells × arms × seeds of the recipe's model at head width ``head_dim`` (the pilot: arm A alone)."""

    head_dim: int = 64
    cells: tuple[str, ...] = tuple(CELLS)
    arms: tuple[str, ...] = ARMS
    seeds: tuple[int, ...] = BLOCKS[0]
    lr: float = LR
    level: float | None = None  # the alarm's level L (the study's, from its pilot); None in the pilot
    train: TrainConfig = ws.recipe_train(STEPS, WARMUP)

    def __post_init__(self):
        super().__post_init__()
        for name, known in (("cells", CELLS), ("arms", ARMS)):
            bad = [v for v in getattr(self, name) if v not in known]
            if bad:
                raise ConfigError(f"unknown act-study {name[:-1]} {bad[0]!r}; choose from: {', '.join(known)}")
        self.check_lists(("cells", "arms", "seeds"), "act-study")
        if self.level is not None and not (isinstance(self.level, (int, float)) and 0 < self.level < math.inf):
            raise ConfigError(f"the alarm's level must be a positive number, got {self.level!r}")
        if self.level is None and set(self.arms) & {"C", "D"}:
            raise ConfigError("arms C and D need the alarm's level: run the study on a finished pilot "
                              "(attnscale act-study --study PILOT_DIR)")


def preset(size: str = "full", corpus: str = "default", tokenizer: str | None = None, pilot: bool = False,
           level: float | None = None, block: int = 1) -> ActConfig:
    """The pilot (``pilot``: arm A on the pilot seeds) or the study at ``level``: block 1's seeds, or with
    ``block`` 2 blocks 1 and 2 together (block 1's finished runs are kept, block 2's seeds follow in order);
    "smoke": a 16-wide model, 60 steps, one seed a block, a check that the study works end to end, not a
    measurement."""
    if size not in SIZES:
        raise ConfigError(f"unknown act-study size {size!r}; choose one of: {', '.join(SIZES)}")
    if block not in (1, 2):
        raise ConfigError(f"the act study has blocks 1 and 2, got {block!r}")
    seeds = BLOCKS[0] if block == 1 else ALL_SEEDS
    base = ActConfig(corpus=corpus, tokenizer=tokenizer, model=dict(ws.PilotConfig().model), level=level,
                     arms=("A",) if pilot else ARMS, seeds=PILOT_SEEDS if pilot else seeds)
    if size == "smoke":
        few = base.seeds[:1] if pilot or block == 1 else (BLOCKS[0][0], BLOCKS[1][0])
        base = replace(base, head_dim=8, seeds=few, model={**base.model, "context": 16, "d_model": 16},
                       train=replace(ws.recipe_train(steps=60, warmup=10), batch=2, eval_batches=2, checkpoint_every=0))
    return base


def watch_spec(arm: str, level: float | None, every: int) -> dict[str, Any] | None:
    """The arm's watch as plain data (``runs.trainer.build_watch`` makes the ``Attached`` in the worker):
    None for A and E; B clips from step 0; C and D act on the alarm at ``level``. The probe is the run's
    records' own sequence ("records"), every ``every`` steps."""
    if arm in ("A", "E"):
        return None
    spec: dict[str, Any] = {"every": every, "probe": "records"}
    if arm == "B":
        return {**spec, "qk_clip": TAU}
    action = {"clip_qk": {"tau": TAU}} if arm == "C" else {"scale_lr": {"factor": LR_FACTOR, "steps": None}}
    return {**spec, "alerts": [{"max_score": {"tau": float(level), "action": action}}]}


def _specs(cfg: ActConfig, vocab_size: int, prefix: str, group: str) -> list[RunSpec]:
    """Seed by seed: every cell and arm of the first seed, then the next (a study cut short has whole pairs)."""
    from attnscale.lm.model import ModelConfig

    train = cfg.train if cfg.device is None else replace(cfg.train, device=cfg.device)
    out = []
    for seed in cfg.seeds:
        for cell in cfg.cells:
            for arm in cfg.arms:
                scale = "qk_norm" if arm == "E" else "inv_sqrt_d"
                model = ModelConfig(vocab_size=vocab_size, head_dim=cfg.head_dim, scale=scale,
                                    **{**cfg.model, "norm": "pre"})
                out.append(RunSpec(f"{prefix}-{cell}-{arm}-seed{seed}", model,
                                   replace(train, lr=cfg.lr, seed=seed, z_loss=CELLS[cell]), group,
                                   watch=watch_spec(arm, cfg.level, train.record_every)))
    return out


def pilot_specs(cfg: ActConfig, vocab_size: int) -> list[RunSpec]:
    return _specs(cfg, vocab_size, "pilot", PILOT_GROUP)


def study_specs(cfg: ActConfig, vocab_size: int) -> list[RunSpec]:
    return _specs(cfg, vocab_size, "study", GROUP)


def _parts(run_id: str) -> tuple[str, str, int]:
    """(cell, arm, seed) from a run id ``<prefix>-<cell>-<arm>-seed<seed>``."""
    _, rest = run_id.split("-", 1)
    cell_arm, seed = rest.rsplit("-seed", 1)
    cell, arm = cell_arm.rsplit("-", 1)
    return cell, arm, int(seed)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _flat(line: dict, key: str) -> list:
    return [v for layer in line.get(key) or () for v in layer]


def run_rows(runs, pilot: bool = False, parts=None, outcome=None) -> list[dict[str, Any]]:
    """Each finished run as the series file keeps it (docs/act-study.md): run_id, cell, arm, seed, pilot, the
    loss at every step, per probe its detector values, the held-out loss, the alarm's step and the actions'
    steps (from the record), the outcome (``analysis.act_judging.outcome_of``), and the commit of the code that
    trained it (``code``, from the record's environment; None where it was not in a git checkout). Another
    paired study names its runs its own way: ``parts`` reads (cell, arm, seed) from a run id, ``outcome`` judges
    a row (the act study's by default)."""
    from attnscale.analysis.act_judging import outcome_of

    parts, outcome = parts or _parts, outcome or outcome_of
    rows = []
    for t in runs:
        if t.status not in ("done", "diverged"):
            continue
        cell, arm, seed = parts(t.run_id)
        steps = t.train_config.steps
        every = t.train_config.record_every
        losses = [_number(x) for x in (t.results.losses or [])]
        if t.results.diverged_at is not None and t.results.diverged_at == len(losses):
            losses.append(None)  # the step whose loss was not finite ended the run before it was kept
        probes = []
        for line in t.history:
            s = line.get("step")
            if not isinstance(s, int) or s >= steps or s % every or line.get("max_score") is None:
                continue
            scores = [abs(v) for v in _flat(line, "max_score") if _number(v) is not None]
            words = [v for v in _flat(line, "effective_words") if _number(v) is not None]
            qk = [v for v in (line.get("q_rms") or []) + (line.get("k_rms") or []) if _number(v) is not None]
            probes.append({"step": s, "max_score": max(scores) if scores else None,
                           "min_effective_words": min(words) if words else None,
                           "grad_norm": _number(line.get("grad_norm")), "log_z": _number(line.get("log_z")),
                           "qk_rms_max": max(qk) if qk else None})
        actions = list(getattr(t.results, "actions", None) or [])
        alarm = min((a["step"] for a in actions if a.get("alert")), default=None)
        row = {"run_id": t.run_id, "cell": cell, "arm": arm, "seed": seed, "pilot": pilot, "steps": steps,
               "losses": losses, "probes": probes, "valid_loss": _number(t.results.valid_loss),
               "alarm_step": alarm, "action_steps": sorted({a["step"] for a in actions}), "actions": actions,
               "code": t.record.environment.get("git")}
        row["outcome"] = outcome(row)
        rows.append(row)
    return rows


def choose_level(rows: list[dict[str, Any]], levels=LEVELS, min_lead: int = MIN_LEAD,
                 default: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """The alarm's level by the rule fixed before the pilot: the highest of ``levels`` that every pilot run
    that broke mid-run crossed (a probe's max |score| above it) at least ``min_lead`` steps before its break;
    ``default`` where no run broke; the lowest level where none qualifies. With, per level, each broken
    run's lead (None: never crossed before its break) and how many held runs crossed it."""
    broken = [r for r in rows if r["outcome"]["break_step"] is not None]
    held = [r for r in rows if r["outcome"]["learned_at"] is not None and r["outcome"]["break_step"] is None]

    def first_over(r, level, before=None):
        return next((p["step"] for p in r["probes"] if p["max_score"] is not None and p["max_score"] > level
                     and (before is None or p["step"] < before)), None)

    table = []
    for level in levels:
        leads = []
        for r in broken:
            b = r["outcome"]["break_step"]
            s = first_over(r, level, b)
            leads.append(None if s is None else b - s)
        table.append({"level": level, "leads": leads,
                      "ok": all(x is not None and x >= min_lead for x in leads),
                      "held_crossed": sum(first_over(r, level) is not None for r in held), "held": len(held)})
    if not broken:
        chosen, why = default, "no pilot run broke mid-run"
    else:
        ok = [t["level"] for t in table if t["ok"]]
        chosen, why = (max(ok), "the highest level every break crossed early enough") if ok else (
            min(levels), "no level was crossed early enough by every break: the lowest")
    return {"level": chosen, "why": why, "levels": table, "broken": [r["run_id"] for r in broken],
            "break_steps": [r["outcome"]["break_step"] for r in broken]}


def pilot_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The pilot's outcomes per cell and its chosen level."""
    from attnscale.analysis.act_judging import tally

    return {"pilot": True, "runs": len(rows), "cells": {c: tally([r for r in rows if r["cell"] == c])
                                                        for c in dict.fromkeys(r["cell"] for r in rows)},
            "choice": choose_level(rows),
            "seconds": [r.get("train_seconds") for r in rows]}


def _execute(specs, cfg: ActConfig, out: Path, jobs: int, progress: bool, executor: str, ray_address, corpus):
    return execute(specs, cfg.corpus_spec, Path(out), jobs=jobs, progress=progress, corpus=corpus, executor=executor,
                   ray_address=ray_address, keep_order=True)


def run_pilot(cfg: ActConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
              ray_address: str | None = None) -> dict[str, Any]:
    """Train what is missing of the pilot; its summary and chosen level, kept in ``out/PILOT_FILE``."""
    corpus = cfg.corpus_spec.load()
    runs = _execute(pilot_specs(cfg, corpus.vocab_size), cfg, out, jobs, progress, executor, ray_address, corpus)
    rows = run_rows(runs, pilot=True)
    for r, t in zip(rows, [t for t in runs if t.status in ("done", "diverged")]):
        r["train_seconds"] = t.results.train_seconds
    result = pilot_summary(rows)
    if len(rows) == len(runs):
        keep = {"level": result["choice"]["level"], "runs": len(rows), "size": cfg.head_dim, "corpus": cfg.corpus}
        from attnscale.files import atomic_write_json  # whole or not at all: a cut write leaves no half a pilot

        atomic_write_json(Path(out) / PILOT_FILE, keep)
    result["rows"] = rows
    return result


def _real(x) -> bool:
    """A finite number read from JSON: not a bool (``true`` is no level), not NaN or inf."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_pilot(folder: Path, corpus: str = "default", size: str = "full") -> float:
    """The level the finished pilot in ``folder`` chose, read like any user input: a one-line ConfigError where
    there is none, where its file is not what ``run_pilot`` writes (JSON holding a level of the ladder
    ``LEVELS``, its whole count of runs and its head width), or where it is another study's pilot: another
    corpus than ``corpus`` (a pilot file without one was the default corpus's), or another ``size`` (a smoke
    pilot's level says nothing of the full study's runs, nor the other way round)."""
    path = Path(folder) / PILOT_FILE
    if not path.is_file():
        raise ConfigError(f"no finished pilot in {folder}: run `attnscale act-study --pilot --out {folder}` first")
    again = f"run the pilot again (`attnscale act-study --pilot --out {folder}`)"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError and UnicodeDecodeError
        raise ConfigError(f"{path} cannot be read as the pilot's JSON ({e}): {again}") from None
    if not isinstance(kept, dict):
        raise ConfigError(f"{path} holds no pilot (a JSON object with its level): {again}")
    level = kept.get("level")
    if not _real(level) or float(level) not in LEVELS:
        raise ConfigError(f"{path} holds the level {level!r}, not one of the ladder's "
                          f"{', '.join(f'{x:g}' for x in LEVELS)}: {again}")
    if kept.get("corpus", "default") != corpus:
        raise ConfigError(f"the pilot in {folder} chose its level on --corpus {kept.get('corpus')}, not {corpus}: "
                          "pilot on the study's corpus first")
    def kind(head_dim, runs) -> str | None:  # the size whose pilot trains ``runs`` runs of ``head_dim``
        return next((s for s in SIZES for w in [preset(s, pilot=True)]
                     if (head_dim, runs) == (w.head_dim, len(w.seeds) * len(w.cells))), None)

    got = kind(kept.get("size"), kept.get("runs"))
    if got != size:
        what = {"smoke": "a --quick pilot", "full": "a full pilot"}.get(got) or (
            f"a pilot of {kept.get('runs')!r} runs of head width {kept.get('size')!r}, which no act-study pilot trains")
        raise ConfigError(f"the pilot in {folder} is {what}, not one for the {'--quick' if size == 'smoke' else 'full'} "
                          f"study: run the study as its pilot was run (with --quick or without), or {again}")
    return float(level)


def run_study(cfg: ActConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
              ray_address: str | None = None) -> dict[str, Any]:
    """Train what is missing of the study, seed by seed; judge the seeds whose runs have all finished."""
    corpus = cfg.corpus_spec.load()
    runs = _execute(study_specs(cfg, corpus.vocab_size), cfg, out, jobs, progress, executor, ray_address, corpus)
    rows = run_rows(runs)
    return {"study": True, "level": cfg.level, **_judged(rows, cfg.arms), "rows": rows}


def _judged(rows: list[dict[str, Any]], arms, floor: float = FLOOR) -> dict[str, Any]:
    """``act_judging.judge`` of the whole seeds, interim unless they are every seed of both blocks."""
    from attnscale.analysis import act_judging as aj

    cells = list(dict.fromkeys(r["cell"] for r in rows))
    whole = aj.complete_seeds(rows, arms, cells)
    return aj.judge(rows, floor, arms=arms, interim=tuple(whole) != ALL_SEEDS)


def read_rows(folder: Path, pilot: bool = False) -> list[dict[str, Any]]:
    """The finished runs of ``folder`` as ``run_rows`` gives them (in run-id order): the pilot's with ``pilot``,
    else the study's; never both, so that a study trained into its pilot's folder is not read twice."""
    from attnscale.runs import record as rec

    runs = sorted((rec.TrainRun.load(p) for p in rec.find(Path(folder))), key=lambda t: t.run_id)
    return run_rows([t for t in runs if t.group == (PILOT_GROUP if pilot else GROUP)], pilot=pilot)


SERIES_KEYS = ("run_id", "cell", "arm", "seed", "pilot", "steps", "losses", "probes", "outcome", "valid_loss",
               "alarm_step", "action_steps", "actions", "code")


def write_series(path: Path, rows: list[dict[str, Any]]) -> None:
    """Every run's series as one gzip'd JSON file: {"runs": [...]} with ``SERIES_KEYS`` per run, losses rounded to
    6 significant digits and probe values to 5 (the rules read differences of tenths of a nat)."""
    import gzip

    from attnscale.files import atomic_write_bytes

    def r(x, digits):
        return None if x is None else float(f"{x:.{digits}g}")

    ids = [r["run_id"] for r in rows]
    twice = next((x for x in ids if ids.count(x) > 1), None)
    if twice is not None:  # a run is published once: counted twice it would weigh twice in every figure
        raise ValueError(f"run {twice} is given twice; a series holds each run once")
    runs = []
    for row in rows:
        keep = {k: row.get(k) for k in SERIES_KEYS}
        keep["losses"] = [r(x, 6) for x in row["losses"]]
        keep["probes"] = [{k: (v if k == "step" else r(v, 5)) for k, v in p.items()} for p in row["probes"]]
        runs.append(keep)
    text = json.dumps({"study": "act", "floor": FLOOR, "learned_level": LEARNED_LEVEL, "runs": runs},
                      separators=(",", ":"))
    atomic_write_bytes(Path(path), gzip.compress(text.encode("utf-8"), mtime=0))


def read_series(path: Path) -> dict[str, Any]:
    import gzip

    return json.loads(gzip.decompress(Path(path).read_bytes()).decode("utf-8"))


# ---- the printout ------------------------------------------------------------------------------


def format_pilot(result: dict[str, Any]) -> str:
    from attnscale.terminal import table

    c = result["choice"]
    lines = [f"Pilot: {result['runs']} runs; " + "; ".join(
        f"{cell}: {t['mid_run_breaks']} mid-run breaks of {t['learned']} learned ({t['never_learned']} never learned)"
        for cell, t in result["cells"].items()) + "."]
    rows = [[f"{t['level']:g}", " ".join("—" if x is None else str(x) for x in t["leads"]) or "(no break)",
             "yes" if t["ok"] else "no", f"{t['held_crossed']}/{t['held']}"] for t in c["levels"]]
    lines += table(("level", "leads of the breaks, steps", f"all >= {MIN_LEAD}", "held runs crossing"), rows, "<<<>")
    lines.append(f"Alarm level L = {c['level']:g} ({c['why']}).")
    return "\n".join(lines)


def format_result(result: dict[str, Any]) -> str:
    """The pilot's table and level, or the study's per-arm table and decisions."""
    from attnscale.analysis.act_judging import interval_text, p_text
    from attnscale.terminal import table

    if result.get("pilot"):
        return format_pilot(result)
    rows = []
    for arm, a in result["arms"].items():
        t = a["tally"]
        br = a.get("breaks_vs_A")
        rows.append([arm, t["runs"], t["learned"], t["mid_run_breaks"], t["degraded"], t["never_learned"],
                     "—" if br is None else f"b {br['b']}, c {br['c']}, p {p_text(br['p'])}",
                     "—" if "loss_vs_A" not in a else interval_text(a["loss_vs_A"]),
                     "—" if "loss_vs_E" not in a else interval_text(a["loss_vs_E"]), a.get("decision", "—")])
    level = "—" if result["level"] is None else f"{result['level']:g}"
    lines = [f"Alarm level L = {level}; seeds read: {' '.join(map(str, result['seeds'])) or 'none'}"
             + (" (interim: not every seed of both blocks)" if result.get("interim") else "") + "."]
    lines += table(("arm", "runs", "learned", "broke", "degraded", "never learned", "breaks vs A (exact)",
                    "loss − A [95%]", "loss − E [95%]", "decision"), rows, "<>>>>><<<<")
    return "\n".join(lines)


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers without the runs' series (those go to the series file)."""
    return {k: v for k, v in result.items() if k != "rows"}


# ---- the figures, from the series file alone -----------------------------------------------------


def figures(data: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the act study's section (docs/act-study.md) from a series file's contents alone
    (``read_series``): each run's outcome judged again from its losses and held-out loss, the pilot's level
    table (``choose_level``), the study's per-arm judging (``analysis.act_judging.judge``, on whole seeds), and
    per pair each arm's outcome and alarm step. The step-time ratios are measured, not series: see
    benchmarks/act_step_cost.py."""
    from attnscale.analysis import act_judging as aj

    rows = []
    for run in data["runs"]:
        row = dict(run)
        row["outcome"] = aj.outcome_of(row, data["learned_level"], data["floor"])
        rows.append(row)
    pilot = [r for r in rows if r["pilot"]]
    study = [r for r in rows if not r["pilot"]]
    arms = [a for a in ARMS if any(r["arm"] == a for r in study)]
    judged = _judged(study, arms, data["floor"]) if study else None
    pairs = []
    for cell, seed in sorted({(r["cell"], r["seed"]) for r in study}):
        mine = {r["arm"]: r for r in study if (r["cell"], r["seed"]) == (cell, seed)}
        pairs.append({"cell": cell, "seed": seed, **{a: {"kind": r["outcome"]["kind"], "break_step": r["outcome"]["break_step"],
                                                         "alarm_step": r["alarm_step"], "valid_loss": r["valid_loss"]}
                                                     for a, r in mine.items()}})
    return {"pilot": choose_level(pilot) if pilot else None,
            "pilot_cells": {c: aj.tally(r for r in pilot if r["cell"] == c) for c in dict.fromkeys(r["cell"] for r in pilot)},
            "study": judged, "pairs": pairs}


def format_figures(fig: dict[str, Any]) -> str:
    """The figures as the doc shows them: the pilot's level table, the per-arm table, the seed-as-unit re-read, and
    the pairs."""
    from attnscale.analysis.act_judging import interval_text
    from attnscale.terminal import table

    lines = []
    if fig["pilot"] is not None:
        lines.append(format_pilot({"runs": sum(t["runs"] for t in fig["pilot_cells"].values()),
                                   "cells": fig["pilot_cells"], "choice": fig["pilot"]}))
    if fig["study"] is not None:
        lines += ["", format_result({"study": True, "level": None, **fig["study"]}).split("\n", 1)[1]]
        lines.append(f"Seeds read: {' '.join(map(str, fig['study']['seeds']))}"
                     + (" (interim)" if fig["study"]["interim"] else "") + ".")
        lines += ["", "The seed as the unit (each seed's cells averaged first):"] + table(
            ("arm", "final loss − A, nats [95%]", "final loss − E, nats [95%]"),
            [[arm, *(interval_text(a[k]) if k in a else "—" for k in ("seed_loss_vs_A", "seed_loss_vs_E"))]
             for arm, a in fig["study"]["arms"].items() if arm != "A"], "<<<")
        eq = fig["study"].get("C_vs_B")
        if eq is not None and eq["interval_90"] is not None:
            lines.append(f"C − B: {eq['diff']:+.3f} nats, 90% [{eq['interval_90'][0]:+.3f}, {eq['interval_90'][1]:+.3f}]: "
                         f"{eq['verdict']} at ±{eq['margin']:g}")
        arms = [a for a in ARMS if any(a in p for p in fig["pairs"])]

        def what(o):
            if o is None:
                return "—"
            kind = {"never learned": "never", "mid-run break": f"broke {o['break_step']}", "learned, held": "held"}[o["kind"]]
            return kind + ("" if o["alarm_step"] is None else f", alarm {o['alarm_step']}")

        rows = [[p["cell"], p["seed"], *(what(p.get(a)) for a in arms)] for p in fig["pairs"]]
        lines += [""] + table(("cell", "seed", *arms), rows, "<>" + "<" * len(arms))
    return "\n".join(lines)
