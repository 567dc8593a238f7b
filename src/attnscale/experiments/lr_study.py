"""Learning-rate sensitivity of qk-norm, QK-Clip and the alarm, under AdamW and Muon (docs/lr-study.md, its rules
committed before any of its runs trained).

The recipe's tiny LM (the warn and act studies': pre-LN, 2 layers, 4 heads of width 64, 3,000 steps, a 500-step
warm-up, then constant) at d_model 64 and 256, trained under each treatment at every rate of its optimizer's grid
on seeds 0–2: ``none`` (1/sqrt(d)), ``qk-norm``, ``clip`` (QK-Clip at tau 100 from step 0), ``alarm-clip`` (QK-Clip
from the first probe whose max |score| is over 1e4) and ``z-loss`` (1e-4 alone). ``alarm-clip`` is the ``none``
run up to its alarm, so it is trained only where the ``none`` run's records crossed the level; elsewhere its row
is the ``none`` run's, marked ``"same_as": "none"`` in the series.

``block_specs`` lays a block's runs out (rate by rate, seed by seed); ``run_block`` trains what is missing of it,
then the ``alarm-clip`` runs its ``none`` runs call for; ``run_muon_pilot`` and ``muon_grid`` fix Muon's grid;
``rows`` reads the finished runs back; the endpoints are ``analysis.sensitivity``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnscale.analysis.alarm_judging import LEVEL as ALARM_LEVEL, alarm_step
from attnscale.errors import ConfigError
from attnscale.experiments import act_study
from attnscale.experiments import warn_study as ws
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.train import TrainConfig
from attnscale.runs.runner import RunSpec, execute

__all__ = ["GROUP", "PILOT_GROUP", "TREATMENTS", "OPTIMIZERS", "ADAMW_LRS", "MUON_PILOT_LRS", "SEEDS", "PILOT_SEED",
           "LEVEL", "TAU", "Z_LOSS", "STEPS", "WARMUP", "BLOCKS", "LrConfig", "preset", "block_specs", "alarm_specs",
           "crossed", "with_alarm_rows", "run_block", "muon_grid", "run_muon_pilot", "rows", "parse_run_id", "SIZES",
           "narrowed", "width64_grid", "z_loss_configs"]

GROUP, PILOT_GROUP = "lr-study", "lr-muon-pilot"
TREATMENTS = ("none", "qk-norm", "clip", "alarm-clip", "z-loss")
_IN_ID = {"none": "none", "qk-norm": "qknorm", "clip": "clip", "alarm-clip": "alarmclip", "z-loss": "zloss"}
_FROM_ID = {v: k for k, v in _IN_ID.items()}
OPTIMIZERS = ("adamw", "muon")
ADAMW_LRS = (5e-3, 1e-2, 2e-2, 4e-2, 8e-2, 1.6e-1)  # from the warn study's pilots (docs/lr-study.md)
MUON_PILOT_LRS = tuple(2.5e-3 * 2 ** k for k in range(8))  # 2.5e-3 … 3.2e-1
SEEDS = (0, 1, 2)
PILOT_SEED = 100
LEVEL = ALARM_LEVEL  # 1e4: the act study's alarm level, chosen on its pilot
TAU = act_study.TAU
Z_LOSS = 1e-4
STEPS, WARMUP = act_study.STEPS, act_study.WARMUP
SIZES = ("smoke", "full")
# block -> (optimizer, d_model, treatments); blocks 3 and 4 take three rates narrowed from blocks 1 and 2
BLOCKS = {1: ("adamw", 64, ("none", "qk-norm", "clip", "alarm-clip")),
          2: ("muon", 64, ("none", "qk-norm", "clip", "alarm-clip")),
          3: ("adamw", 256, ("none", "qk-norm", "clip", "alarm-clip")),
          4: ("muon", 256, ("none", "qk-norm", "clip", "alarm-clip")),
          5: (None, 64, ("z-loss",))}  # under each optimizer, on its width-64 grid (z_loss_configs)


@dataclass(frozen=True)
class LrConfig(TrainingConfig):
    """Treatments × rates × seeds of the recipe's model under ``optimizer`` at width ``d_model`` (heads of 64)."""

    optimizer: str = "adamw"
    d_model: int = 64
    head_dim: int = 64
    treatments: tuple[str, ...] = BLOCKS[1][2]
    lrs: tuple[float, ...] = ADAMW_LRS
    seeds: tuple[int, ...] = SEEDS
    level: float = LEVEL
    train: TrainConfig = ws.recipe_train(STEPS, WARMUP)

    def __post_init__(self):
        super().__post_init__()
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown lr-study optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        bad = [t for t in self.treatments if t not in TREATMENTS]
        if bad:
            raise ConfigError(f"unknown lr-study treatment {bad[0]!r}; choose from: {', '.join(TREATMENTS)}")
        self.check_lists(("treatments", "lrs", "seeds"), "lr-study")
        for name in ("d_model", "head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"lr-study {name} must be a positive integer, got {v!r}")
        for lr in self.lrs:
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
                raise ConfigError(f"lr-study rates must be positive numbers, got {lr!r}")
        if isinstance(self.level, bool) or not isinstance(self.level, (int, float)) or not 0 < self.level < math.inf:
            raise ConfigError(f"lr-study level must be a positive number, got {self.level!r}")


def preset(block: int = 1, size: str = "full", corpus: str = "default", lrs: tuple[float, ...] | None = None,
           optimizer: str | None = None) -> LrConfig:
    """Block ``block``'s config (docs/lr-study.md), on ``lrs`` where its grid comes from a pilot or an earlier block
    (Muon's, the wider model's, block 5's), under ``optimizer`` for block 5 (z-loss under each); "smoke": a 16-wide
    model (32 for the wider blocks), 60 steps, one seed, two rates: a check that the study works end to end, not a
    measurement."""
    if size not in SIZES:
        raise ConfigError(f"unknown lr-study size {size!r}; choose one of: {', '.join(SIZES)}")
    if isinstance(block, bool) or not isinstance(block, int) or block not in BLOCKS:
        raise ConfigError(f"lr-study trains blocks 1 to 5, got {block!r}")
    fixed, d_model, treatments = BLOCKS[block]
    if fixed is None and optimizer not in OPTIMIZERS:
        raise ConfigError(f"block {block} trains under AdamW and under Muon, one at a time: name one of "
                          f"{', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if fixed is not None and optimizer not in (None, fixed):
        raise ConfigError(f"block {block} trains under {fixed} only, got {optimizer!r}")
    optimizer = fixed or optimizer
    if lrs is None and block != 1:
        raise ConfigError(f"block {block}'s rates come from {'the Muon pilot' if block == 2 else 'an earlier block'}: "
                          "give them")
    base = LrConfig(corpus=corpus, optimizer=optimizer, d_model=d_model, treatments=treatments,
                    lrs=tuple(lrs) if lrs is not None else ADAMW_LRS, model=dict(ws.PilotConfig().model))
    if size == "smoke":
        base = replace(base, d_model=16 if d_model == 64 else 32, head_dim=8, seeds=(0,), lrs=base.lrs[-2:],
                       model={**base.model, "context": 16},
                       train=replace(ws.recipe_train(steps=60, warmup=10), batch=2, eval_batches=2, checkpoint_every=0))
    return base


def _rate(lr: float) -> str:
    return f"{lr:.3g}"


def run_id(prefix: str, optimizer: str, d_model: int, lr: float, treatment: str, seed: int) -> str:
    return f"{prefix}-{optimizer}-w{d_model}-lr{_rate(lr)}-{_IN_ID[treatment]}-seed{seed}"


_ID = re.compile(r"^(?P<prefix>[a-z]+)-(?P<opt>adamw|muon)-w(?P<w>\d+)-lr(?P<lr>[0-9.e+-]+)-(?P<t>[a-z]+)-seed(?P<s>\d+)$")


def parse_run_id(text: str) -> dict[str, Any]:
    """(optimizer, d_model, lr, treatment, seed) of a run id ``run_id`` made; a ConfigError for any other."""
    m = _ID.match(text)
    if m is None or m["t"] not in _FROM_ID:
        raise ConfigError(f"{text!r} is not a run of the lr study (<prefix>-<optimizer>-w<width>-lr<rate>-<treatment>-seed<n>)")
    return {"optimizer": m["opt"], "d_model": int(m["w"]), "lr": float(m["lr"]), "treatment": _FROM_ID[m["t"]],
            "seed": int(m["s"])}


def _spec(cfg: LrConfig, vocab_size: int, prefix: str, group: str, treatment: str, lr: float, seed: int) -> RunSpec:
    from attnscale.lm.model import ModelConfig

    train = cfg.train if cfg.device is None else replace(cfg.train, device=cfg.device)
    train = replace(train, lr=lr, seed=seed, z_loss=Z_LOSS if treatment == "z-loss" else 0.0)
    if cfg.optimizer != "adamw":  # AdamW runs' configs stay the act study's, field for field
        train = replace(train, optimizer=cfg.optimizer)
    model = ModelConfig(vocab_size=vocab_size, head_dim=cfg.head_dim,
                        scale="qk_norm" if treatment == "qk-norm" else "inv_sqrt_d",
                        **{**cfg.model, "d_model": cfg.d_model, "norm": "pre"})
    watch = {"clip": act_study.watch_spec("B", None, train.record_every),
             "alarm-clip": act_study.watch_spec("C", cfg.level, train.record_every)}.get(treatment)
    return RunSpec(run_id(prefix, cfg.optimizer, cfg.d_model, lr, treatment, seed), model, train, group, watch=watch)


def block_specs(cfg: LrConfig, vocab_size: int, prefix: str = "lr", group: str = GROUP) -> list[RunSpec]:
    """Every run the block trains up front, seed by seed and, within a seed, rate by rate (a block cut short has
    whole curves: every rate of its first seeds): each treatment but ``alarm-clip``, whose runs follow from its
    ``none`` runs (``alarm_specs``)."""
    return [_spec(cfg, vocab_size, prefix, group, t, lr, s) for s in cfg.seeds for lr in cfg.lrs
            for t in cfg.treatments if t != "alarm-clip"]


def crossed(row: dict[str, Any], level: float) -> int | None:
    """The first probe step after training began whose max |score| is over ``level``: the step a watch probing the
    records' sequence alarms at (it probes after a step, never at step 0); None where none is."""
    return alarm_step(row, level)


def alarm_specs(cfg: LrConfig, vocab_size: int, none_rows: list[dict[str, Any]], prefix: str = "lr",
                group: str = GROUP) -> list[RunSpec]:
    """The ``alarm-clip`` runs to train: at the (rate, seed) points whose ``none`` run crossed the level."""
    if "alarm-clip" not in cfg.treatments:
        return []
    fired = {(r["lr"], r["seed"]) for r in none_rows if r["treatment"] == "none" and crossed(r, cfg.level) is not None}
    return [_spec(cfg, vocab_size, prefix, group, "alarm-clip", lr, s) for s in cfg.seeds for lr in cfg.lrs
            if (lr, s) in fired]


def outcome_of(row: dict[str, Any]) -> dict[str, Any]:
    """The act study's outcome rules (learned level, floor), "degraded" against the warn study's best run of the same
    scheme and z-loss (docs/lr-study.md: the study reads breaks and never-learned runs, not "degraded")."""
    from attnscale.analysis.act_judging import outcome_of as act_outcome

    cell = "z1e-4" if row["treatment"] == "z-loss" else "z0"
    return act_outcome({**row, "cell": cell, "arm": "E" if row["treatment"] == "qk-norm" else "A"})


def rows(runs) -> list[dict[str, Any]]:
    """The finished runs as the series keeps them: act_study's row (losses, probes, held-out loss, alarm and
    action steps, outcome, code) under the lr study's names (optimizer, d_model, lr, treatment, seed)."""
    def parts(text):
        p = parse_run_id(text)
        return f"{p['optimizer']}-w{p['d_model']}-lr{_rate(p['lr'])}", p["treatment"], p["seed"]

    def outcome(row):
        return outcome_of({**row, **parse_run_id(row["run_id"])})

    out = []
    for row in act_study.run_rows(runs, parts=parts, outcome=outcome):
        row.update(parse_run_id(row["run_id"]))
        for key in ("cell", "arm"):
            row.pop(key, None)
        out.append(row)
    return out


def with_alarm_rows(got: list[dict[str, Any]], level: float = LEVEL) -> list[dict[str, Any]]:
    """``got`` with an ``alarm-clip`` row at every point whose ``none`` run never crossed ``level`` (every block
    with a ``none`` treatment has ``alarm-clip``): that run, under the treatment's name, marked ``"same_as": "none"`` (the two are one
    run: the alarm never fired). A point whose ``none`` run crossed the level keeps only what was trained."""
    have = {(r["optimizer"], r["d_model"], r["lr"], r["seed"]) for r in got if r["treatment"] == "alarm-clip"}
    extra = [{**r, "treatment": "alarm-clip", "same_as": "none"} for r in got
             if r["treatment"] == "none" and (r["optimizer"], r["d_model"], r["lr"], r["seed"]) not in have
             and crossed(r, level) is None]
    return got + extra


def _execute(specs, cfg, out, jobs, progress, corpus):
    return execute(specs, cfg.corpus_spec, Path(out), jobs=jobs, progress=progress, corpus=corpus, keep_order=True)


def run_block(cfg: LrConfig, out: Path, jobs: int = 1, progress: bool = True) -> list[dict[str, Any]]:
    """Train what is missing of the block in ``out``: its up-front runs, then the ``alarm-clip`` runs they call
    for. The rows of every finished run of the block."""
    corpus = cfg.corpus_spec.load()
    first = rows(_execute(block_specs(cfg, corpus.vocab_size), cfg, out, jobs, progress, corpus))
    later = alarm_specs(cfg, corpus.vocab_size, first)
    return first + (rows(_execute(later, cfg, out, jobs, progress, corpus)) if later else [])


def muon_pilot_config(size: str = "full", corpus: str = "default") -> LrConfig:
    base = replace(preset(1, size, corpus), optimizer="muon", treatments=("none", "qk-norm"))
    if size == "smoke":
        return replace(base, seeds=(PILOT_SEED,))
    return replace(base, lrs=MUON_PILOT_LRS, seeds=(PILOT_SEED,))


def run_muon_pilot(cfg: LrConfig, out: Path, jobs: int = 1, progress: bool = True) -> dict[str, Any]:
    """Train the Muon pilot in ``out``; its rows and the grid it gives (``muon_grid``)."""
    corpus = cfg.corpus_spec.load()
    got = rows(_execute(block_specs(cfg, corpus.vocab_size, prefix="pilot", group=PILOT_GROUP), cfg, out, jobs,
                        progress, corpus))
    return {"pilot": True, "rows": got, "grid": muon_grid(got, cfg.lrs)}


def muon_grid(pilot_rows: list[dict[str, Any]], ladder: tuple[float, ...] = MUON_PILOT_LRS) -> dict[str, Any]:
    """The rule fixed before the pilot: r1, the lowest pilot rate whose ``none`` run broke mid-run or never learnt;
    the grid r1 × 2^k, k = −4 … 1. Where every ``none`` run learnt and held, the ladder's top six rates."""
    from attnscale.analysis.sensitivity import failed as fails

    failed = sorted(r["lr"] for r in pilot_rows if r["treatment"] == "none" and fails(r))
    if not failed:
        return {"lrs": tuple(sorted(ladder)[-6:]), "r1": None, "why": "every none run learnt and held: the top six"}
    r1 = failed[0]
    return {"lrs": tuple(float(f"{r1 * 2.0 ** k:.6g}") for k in range(-4, 2)), "r1": r1,
            "why": "the lowest rate whose none run broke mid-run or never learnt, as the grid's fifth"}


def width64_grid(width64_rows: list[dict[str, Any]], optimizer: str, size: str = "full") -> list[float]:
    """The grid of the width-64 block of ``optimizer`` (1 or 2) at ``size``, read only off the whole block: ``none``
    and ``qk-norm`` finished at each of its rates (six; two at the smoke size) on every one of its seeds (a block's
    low rates and first seeds finish first, and a grid read off a part could miss its top or centre on the wrong
    rate)."""
    like = preset(1, size)
    seeds, rates = like.seeds, len(like.lrs)
    mine = [r for r in width64_rows if r["optimizer"] == optimizer and r["d_model"] == like.d_model]
    grid = sorted({r["lr"] for r in mine if r["treatment"] in ("none", "qk-norm")})
    have = {(r["treatment"], r["lr"], r["seed"]) for r in mine}
    want = {(t, lr, s) for t in ("none", "qk-norm") for lr in grid for s in seeds}
    if len(grid) != rates or not want <= have:
        n = len({k for k in have if k[0] in ("none", "qk-norm") and k[2] in seeds})
        first = 1 if optimizer == "adamw" else 2
        raise ConfigError(f"the width-64 {optimizer} block has {n} of its {2 * rates * len(seeds)} none and qk-norm "
                          f"runs finished; finish block {first} first (attnscale lr-study --block {first} ...)")
    return grid


def narrowed(width64_rows: list[dict[str, Any]], optimizer: str, size: str = "full") -> tuple[float, ...]:
    """The wider model's rates, by the rule fixed before block 1 (docs/lr-study.md): three consecutive rates of the
    width-64 grid centred on the width-64 ``qk-norm`` curve's best rate (at an end of the grid, the three at that
    end), and the next rate up where the width-64 ``none`` curve failed (a mid-run break or never learnt) at none
    of the three. Read only off a whole block (``width64_grid``)."""
    from attnscale.analysis import sensitivity

    grid = width64_grid(width64_rows, optimizer, size)
    mine = [r for r in width64_rows if r["optimizer"] == optimizer and r["d_model"] == preset(1, size).d_model]
    qk = [r for r in mine if r["treatment"] == "qk-norm"]
    best = sensitivity.curve(qk, act_study.FLOOR)["best_lr"]
    i = min(max(grid.index(best), 1), len(grid) - 2)
    three = grid[max(i - 1, 0):i + 2]
    failed = {r["lr"] for r in mine if r["treatment"] == "none" and sensitivity.failed(r)}
    if not failed & set(three) and grid.index(three[-1]) + 1 < len(grid):
        three.append(grid[grid.index(three[-1]) + 1])
    return tuple(three)


def z_loss_configs(width64_rows: list[dict[str, Any]], size: str = "full", corpus: str = "default") -> list[LrConfig]:
    """Block 5: z-loss alone at width 64 under AdamW, then under Muon, each on the grid its whole width-64 block
    trained (``width64_grid``), so that its curve sits beside that block's treatments, rate for rate and seed for
    seed."""
    return [preset(5, size, corpus, lrs=tuple(width64_grid(width64_rows, opt, size)), optimizer=opt)
            for opt in OPTIMIZERS]


def read_rows(folders, group: str = GROUP) -> list[dict[str, Any]]:
    """The finished runs of ``group`` in ``folders`` (in run-id order), a run id found twice refused."""
    from attnscale.runs import record as rec

    runs = []
    for folder in folders:
        if not Path(folder).is_dir():
            raise ConfigError(f"{str(folder)!r} is not a folder of lr-study runs; give the --out of `attnscale lr-study`")
        runs += [t for t in (rec.TrainRun.load(p) for p in rec.find(Path(folder))) if t.group == group]
    ids = [t.run_id for t in runs]
    twice = next((x for x in ids if ids.count(x) > 1), None)
    if twice is not None:
        raise ConfigError(f"run {twice} is in more than one folder; publish each run once")
    return rows(sorted(runs, key=lambda t: t.run_id))


SERIES_KEYS = ("run_id", "optimizer", "d_model", "lr", "treatment", "seed", "same_as", "steps", "losses", "probes",
               "outcome", "valid_loss", "alarm_step", "action_steps", "code", "pilot")


def pilot_finished(pilot: list[dict[str, Any]], lrs: tuple[float, ...] = MUON_PILOT_LRS) -> tuple[int, int]:
    """How many of the Muon pilot's runs (``none`` and ``qk-norm`` at each of ``lrs``) are among ``pilot``, of how
    many."""
    want = {(t, lr) for t in ("none", "qk-norm") for lr in lrs}
    return len(want & {(r["treatment"], r["lr"]) for r in pilot}), len(want)


def pilot_block(pilot: list[dict[str, Any]]) -> dict[str, Any]:
    """The Muon pilot as published: each run's held-out loss and outcome, whether all 16 finished, and the grid
    ``muon_grid`` reads off them (the grid block 2 trained on only where the pilot is whole)."""
    runs = [{"treatment": r["treatment"], "lr": r["lr"], "valid_loss": r["valid_loss"],
             "learned_at": r["outcome"]["learned_at"], "break_step": r["outcome"]["break_step"]}
            for r in sorted(pilot, key=lambda r: (r["treatment"], r["lr"]))]
    finished, wanted = pilot_finished(pilot)
    return {"seed": PILOT_SEED, "whole": finished == wanted, "runs": runs, "grid": muon_grid(pilot)}


def block(got: list[dict[str, Any]], command: str | None = None,
          pilot: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON block "sensitivity" (docs/lr-study.md): ``analysis.sensitivity.judge`` of the rows with their
    alarm-clip rows read in, every group labelled interim unless it has all of ``SEEDS`` at every rate, and the alarm
    in its ``none`` runs (``sensitivity.alarm_readings``, read after the fact); with the Muon pilot's runs
    (``pilot_block``) where given."""
    from attnscale.analysis import sensitivity

    judged = sensitivity.judge(with_alarm_rows(got), act_study.FLOOR)
    for g in judged["groups"]:
        g["interim"] = any(tuple(c["seeds"]) != SEEDS for c in g["curves"].values())
        g["alarm"] = sensitivity.alarm_readings([r for r in got if (r["optimizer"], r["d_model"]) ==
                                                 (g["optimizer"], g["d_model"])], LEVEL)
    out = {"command": command, "level": LEVEL, "tau": TAU, "steps": STEPS, **judged}
    return out | ({"muon_pilot": pilot_block(pilot)} if pilot else {})


def publish(folders, json_out: Path | None, series: Path | None, command: str | None = None) -> dict[str, Any]:
    """The block from the finished runs in ``folders`` (the study's, and the Muon pilot's wherever one of them holds
    it), written into the studies' JSON ``json_out`` (key "sensitivity") and every run's series into ``series``,
    the pilot's runs marked; both checked before anything is written."""
    from attnscale.experiments import publish as pub

    pub.check_targets(json_out, series, "lr-study")
    got = read_rows(folders)
    if not got:
        raise ConfigError(f"no finished lr-study runs in {', '.join(map(str, folders))}")
    pilot = [{**r, "pilot": True} for r in read_rows(folders, PILOT_GROUP)]
    out = block(got, command, pilot)
    pub.publish(json_out, "sensitivity", out, series, "lr", [{k: r.get(k) for k in SERIES_KEYS} for r in pilot + got],
                {"floor": act_study.FLOOR, "learned_level": act_study.LEARNED_LEVEL, "level": LEVEL})
    return {"publish": True, **out}


def block_from_series(data: dict[str, Any], command: str | None = None) -> dict[str, Any]:
    """The "sensitivity" block again from a series file's contents alone: each run's outcome judged again from its
    losses and held-out loss, then ``block``, the runs marked ``pilot`` read as the Muon pilot."""
    got = [{**r, "outcome": outcome_of(r)} for r in data["runs"]]
    return block([r for r in got if not r.get("pilot")], command, [r for r in got if r.get("pilot")])
