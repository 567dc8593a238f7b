"""The warning study proper: the recipe's four arms on the rungs its pilot chose, judged within each cell.

``attnscale warn-study --study PILOT_DIR`` reads the finished pilot (``warn_study.run_pilot``) in
``PILOT_DIR``: its chosen rungs and its learned level, so that nothing of the study's own runs sets
either. It then trains Wortsman et al. 2023's recipe (``warn_study.recipe_train``) in the four arms
(qk-norm off/on × z-loss 0/1e-4) on every rung of the pilot's ladder: seeds 0–23 on the chosen
rungs, seed 0 on the others. Each run keeps its loss at every step and, every 10 steps, every
head's measures, the gradient norm, log Z and the q/k weight RMS. ``analysis.recipe_judging.judge``
then judges every detector within each cell, with thresholds cross-fitted over the seeds, and
``analysis.recipe_judging.verdict`` applies the rule that decides the watch's default alerts.
The rules are docs/warn-study.md's, fixed before any study seed ran.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError
from attnscale.experiments import warn_study as ws
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.train import TrainConfig
from attnscale.runs.runner import RunSpec, execute
from attnscale.terminal import table

__all__ = ["GROUP", "RUNG_SEEDS", "OTHER_SEEDS", "StudyConfig", "study_preset", "read_pilot", "study_specs",
           "rows_of", "run_study", "format_study", "study_json", "PILOT_FILE", "write_pilot", "read_kept_pilot",
           "judged"]

GROUP = "warn-recipe"
RUNG_SEEDS = tuple(range(24))  # on the rungs the pilot chose
OTHER_SEEDS = (0,)  # on every other rung of the ladder: each arm's best rate, and what the detectors say there


@dataclass(frozen=True)
class StudyConfig(TrainingConfig):
    """The pilot's folder, and the arms × ladder × seeds of the study."""

    pilot: Path = Path("runs/warn-pilot")
    head_dim: int = 64
    arms: tuple[str, ...] = tuple(ws.ARMS)
    rung_seeds: tuple[int, ...] = RUNG_SEEDS
    other_seeds: tuple[int, ...] = OTHER_SEEDS
    pilot_size: str = "full"
    train: TrainConfig = ws.recipe_train()

    def __post_init__(self):
        super().__post_init__()
        unknown = [a for a in self.arms if a not in ws.ARMS]
        if unknown:
            raise ConfigError(f"unknown study arm {unknown[0]!r}; choose from: {', '.join(ws.ARMS)}")
        for name in ("rung_seeds", "other_seeds"):
            values = getattr(self, name)
            if len(set(values)) != len(values) or set(values) - set(ws.STUDY_SEEDS):
                raise ConfigError(f"study {name} must be distinct seeds among 0–{ws.STUDY_SEEDS[-1]}, got {list(values)}")
        if len(self.rung_seeds) < 2:
            raise ConfigError("the study needs at least 2 seeds on its rungs: half choose each threshold, half judge it")


def study_preset(pilot: Path, size: str = "full", corpus: str = "default", tokenizer: str | None = None) -> StudyConfig:
    """"full": the study as docs/warn-study.md fixes it; "smoke": the smoke pilot's arms and sizes on two
    seeds a rung (a check that the study and its table work, not a measurement)."""
    if size not in ws.SIZES:
        raise ConfigError(f"unknown warn-study preset {size!r}; choose one of: {', '.join(ws.SIZES)}")
    pilot_cfg = ws.pilot_preset(size, corpus, tokenizer)
    cfg = StudyConfig(corpus=corpus, tokenizer=tokenizer, pilot=Path(pilot), pilot_size=size,
                      head_dim=pilot_cfg.head_dim, model=pilot_cfg.model, train=pilot_cfg.train)
    return replace(cfg, rung_seeds=(0, 1), other_seeds=(0,)) if size == "smoke" else cfg


def read_pilot(cfg: StudyConfig, corpus) -> dict[str, Any]:
    """The finished pilot in ``cfg.pilot`` summarised (``warn_study.pilot_summary``), with its ladder; a
    one-line ``ConfigError`` where it is missing, unfinished, of another corpus, or chose no rung."""
    from attnscale.analysis.outcomes import bigram_loss
    from attnscale.runs import record as rec

    folder = Path(cfg.pilot)
    if not folder.is_dir():
        raise ConfigError(f"no pilot folder {folder}: run `attnscale warn-study --pilot --out {folder}` first")
    want = ws.pilot_preset(cfg.pilot_size, cfg.corpus, cfg.tokenizer)
    expected = len(want.arms) * len(want.lrs) * len(want.seeds) + len(want.lrs) * len(ws.FLOOR_SEEDS)
    runs = [rec.TrainRun.load(p) for p in rec.find(folder)]
    runs = [t for t in runs if t.group == ws.PILOT_GROUP and t.status in ("done", "diverged")]
    if len(runs) < expected:
        raise ConfigError(f"the pilot in {folder} has {len(runs)} finished runs of {expected}: finish it with "
                          f"`attnscale warn-study --pilot --out {folder}` before any study seed runs")
    ours = (corpus.vocab_size, len(corpus.train), len(corpus.valid))
    theirs = {(t.corpus.get("vocab_size"), t.corpus.get("train_tokens"), t.corpus.get("valid_tokens")) for t in runs}
    if theirs != {ours}:
        raise ConfigError(f"the pilot in {folder} trained on another corpus than --corpus {cfg.corpus}: "
                          "pilot on the study's corpus, or give the pilot's --corpus")
    summary = ws.pilot_summary(ws.pilot_rows(runs), bigram_loss(corpus.train.tolist(), corpus.valid.tolist(),
                                                                 corpus.vocab_size))
    if not summary["chosen"]:
        raise ConfigError(f"the pilot in {folder} chose no rung ({summary.get('note', 'no rung qualifies')}); "
                          "no study seed may run")
    summary["lrs"] = sorted({t.lr for t in runs})
    return summary


def study_specs(cfg: StudyConfig, vocab_size: int, pilot: dict[str, Any]) -> list[RunSpec]:
    """Every arm on every rung of the pilot's ladder: ``rung_seeds`` on the chosen rungs, ``other_seeds`` elsewhere;
    the chosen rungs' runs first, so that a study cut short has its cells whole."""
    from attnscale.lm.model import ModelConfig

    train = cfg.train if cfg.device is None else replace(cfg.train, device=cfg.device)
    chosen, others = [], []
    for arm in cfg.arms:
        scale, z_loss = ws.ARMS[arm]
        model = ModelConfig(vocab_size=vocab_size, head_dim=cfg.head_dim, scale=scale, **{**cfg.model, "norm": "pre"})
        for lr in pilot["lrs"]:
            mine = chosen if lr in pilot["chosen"] else others
            mine += [RunSpec(f"study-{arm}-lr{lr:g}-seed{seed}", model, replace(train, lr=lr, seed=seed, z_loss=z_loss),
                             GROUP) for seed in (cfg.rung_seeds if mine is chosen else cfg.other_seeds)]
    return chosen + others


def rows_of(runs, probe_every: int) -> list[dict[str, Any]]:
    """The finished runs as ``analysis.recipe_judging.judge`` takes them."""
    from attnscale.analysis import alarms

    return [{"arm": ws.arm_of(t), "lr": t.lr, "seed": t.seed, "steps": t.train_config.steps,
             "series": alarms.series_of(t, probe_every)} for t in runs if t.status in ("done", "diverged")]


def run_study(cfg: StudyConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
              ray_address: str | None = None) -> dict[str, Any]:
    """Read the pilot, train what is missing of the study, judge it and apply the defaults' rule."""
    corpus = cfg.corpus_spec.load()
    pilot = read_pilot(cfg, corpus)
    kept = write_pilot(Path(out), pilot)  # the study's folder says which pilot judged it (the report reads it)
    runs = execute(study_specs(cfg, corpus.vocab_size, pilot), cfg.corpus_spec, Path(out), jobs=jobs,
                   progress=progress, corpus=corpus, executor=executor, ray_address=ray_address)
    return judged(rows_of(runs, cfg.train.record_every), kept, cfg.train.record_every)


PILOT_FILE = "warn-pilot.json"
PILOT_KEYS = ("bigram", "uniform", "floor", "best", "level", "chosen", "lrs", "runs")


def write_pilot(out: Path, pilot: dict[str, Any]) -> dict[str, Any]:
    """Keep what the study takes from its pilot in ``out/PILOT_FILE``; a different pilot already kept
    there is refused (a study judged by two pilots would be two studies)."""
    from attnscale.files import atomic_write_json

    kept = {k: pilot[k] for k in PILOT_KEYS}
    path = out / PILOT_FILE
    before = read_kept_pilot(out)
    if before is not None:
        if {k: before.get(k) for k in ("chosen", "level", "floor")} != {k: kept[k] for k in ("chosen", "level", "floor")}:
            raise ConfigError(f"{path} keeps another pilot's rungs and level ({before.get('chosen')}, "
                              f"{before.get('level')}): give the study a fresh --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, kept)  # whole or not at all: a cut write leaves no half a pilot to read back
    return kept


def read_kept_pilot(folder: Path) -> dict[str, Any] | None:
    """What ``write_pilot`` kept in ``folder``, or None where nothing is; a one-line ConfigError where the file
    there is not JSON, or not the object ``write_pilot`` writes."""
    import json

    path = Path(folder) / PILOT_FILE
    if not path.exists():
        return None
    try:
        kept = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError and UnicodeDecodeError
        raise ConfigError(f"{path} cannot be read as the pilot the study keeps ({e}): give the study a fresh "
                          "--out, or move that file away") from None
    if not isinstance(kept, dict):
        raise ConfigError(f"{path} holds no kept pilot (a JSON object with its rungs and level): give the study "
                          "a fresh --out, or move that file away")
    return kept


def judged(rows: list[dict[str, Any]], pilot: dict[str, Any], probe_every: int) -> dict[str, Any]:
    """``analysis.recipe_judging.judge`` of the rows at the pilot's level and floor, and its ``verdict``."""
    from attnscale.analysis import recipe_judging as rs

    result = rs.judge(rows, pilot["level"], pilot["floor"])
    return {"study": True, "pilot": dict(pilot), "probe_every": probe_every, **result,
            "verdict": rs.verdict(result, pilot["chosen"])}


# ---- the printout ------------------------------------------------------------------------------


def format_study(result: dict[str, Any]) -> str:
    """The outcome counts per cell, then per detector on the chosen rungs' cells: judged hits, false alarms
    per 1,000 at-risk steps and median lead (95% intervals), its lead against the loss's spike; the verdict."""
    from attnscale.analysis.recipe_judging import hits_text, lead_text, per_1000_text

    p = result["pilot"]
    lines = [f"Pilot: no-attention floor {p['floor']:.3f} nats, best run {p['best']:.3f}, learned under {p['level']:.3f}; "
             f"chosen rungs {' '.join(f'{lr:g}' for lr in p['chosen'])}."]
    rows = [[c["arm"], f"{c['lr']:g}", c["runs"], c["learned"], c["mid_run_breaks"], c["degraded"], c["never_learned"]]
            for c in result["cells"]]
    lines += table(("arm", "lr", "runs", "learned", "broke mid-run", "degraded", "never learned"), rows, "<>>>>>>")
    for c in result["cells"]:
        if c["lr"] not in p["chosen"]:
            continue
        lines.append("")
        lines.append(f"{c['arm']} at lr {c['lr']:g}: mid-run breaks {c['mid_run_breaks']} of {c['learned']} learned runs")
        rows = []
        for name, d in c["detectors"].items():
            v = c["versus"]["loss_spike"].get(name)
            rows.append([name, hits_text(d["hits"], "— (no break)"), per_1000_text(d["false_alarms"], "— (no run held)"),
                         lead_text(d["lead"]),
                         "—" if v is None else f"{v['verdict']}" + (" (Holm)" if v["holds"] else "")])
        lines += table(("detector", "hits [95% Wilson]", "false alarms / 1,000 steps [95%]", "median lead [95%]",
                        "vs the loss's spike"), rows, "<>>><")
    chosen = {n: [f["threshold"] for f in folds] for n, folds in result["folds"].items()}
    lines.append("")
    lines.append("Thresholds chosen by fold (seeds " + " ".join(map(str, result["halves"]["first"])) + " | "
                 + " ".join(map(str, result["halves"]["second"])) + "): "
                 + "; ".join(f"{n} {'/'.join('none' if t is None else f'{t:g}' for t in ts)}" for n, ts in chosen.items()))
    v = result["verdict"]
    lines.append("Defaults: " + (", ".join(v["defaults"]) + " join NonFinite" if v["defaults"]
                                 else "NonFinite alone (no attention detector met the rule)") + ".")
    return "\n".join(lines)


def study_json(result: dict[str, Any]) -> dict[str, Any]:
    """The study's numbers as --json prints them and docs/warn-study.json keeps them."""
    return result
