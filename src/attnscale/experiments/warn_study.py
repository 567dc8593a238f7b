"""Does the watch warn before a run breaks? The divergence study behind the watch's default alerts.

Trains the tiny LM (unscaled and 1/sqrt(d), post-LN and pre-LN, without warm-up and with) over a
learning-rate ladder from the presets' comfortable 3e-3 to 100× it, past the edge, with ten seeds a
cell, at a constant rate after the warm-up so that no decay rescues a run at the edge. Each run
records the loss at every step and every head's measures at every step (``record_every=1``); the
watch is read at every ``probe_every``-th step (5), as a probe at that cadence would see it.

What a run is (broken at a step, or healthy) is ``analysis.outcomes.first_round_break``; each alert's
first alarm and their judging are ``analysis.detectors``; ``analyse`` applies them: thresholds chosen on half the seeds
(``detectors.split_seeds``) at a false-alarm target, rates and lead times read on the other half,
with Wilson intervals for the rates and percentile intervals from resampling seeds for the leads.
The runs go through the runs/ layer like every
sweep (``runs.runner.execute``: local workers or Ray, resume per run and from checkpoints), into
``out/<run_id>`` with record group "warn".

Measured on the training step's own forward (its first 4 sequences, in the run's precision), not on
a fixed fp32 probe batch as ``Watch`` measures: the same measures (``core.diagnostics``), another batch.

The second family (``family="llama"``): a Llama-shaped Hugging Face model (``lm.hf_family``: hidden 64,
2 layers, 4 heads of width 16, no qk-norm, Llama's 1/sqrt(d), context 64) trained by transformers'
``Trainer`` (batch 8, AdamW as the tiny LM's, fp32), the loss logged at every step and the watch's
``WatchCallback`` (its fixed fp32 probe of the first batch's first 4 sequences) every 5 steps; 400 steps
at a constant rate after a warm-up of 0 or 40 steps, learning rates 1e-2 to 1.6e-1 by factors of 2,
12 seeds a cell. The design was fixed before any study run, so that breaks happen mid-run rather than at
the end of the first window: the tiny LM's broken runs almost all sit on the unigram plateau from step
19, which leaves a lead time little to say. Wortsman et al. 2023 report attention logits growing at
high learning rates in models without qk-layernorm, which a Llama is. Only the ladder's range and the
run length were set by a pilot on seeds 100 and 101, outside the study (300 steps: 1e-2 healthy;
1e-1 learnt, then fell back towards the unigram loss near the end; 3e-1 and 1 never left the unigram
plateau, with or without a warm-up): 400 steps give the rise room to happen mid-run, and the factor-2
ladder puts three rungs around that edge. The named run did not bear the design out: 12 of its 14
breaks, and every one on a held-out seed, are again runs that never left the plateau (README).

The recipe's pilot (``PilotConfig``, ``run_pilot``; ``attnscale warn-study --pilot``) is the first step of
the study that replaces it (docs/warn-study.md): Wortsman et al. 2023's small-scale recipe in four arms
(qk-norm off/on × z-loss 0/1e-4) over a learning-rate ladder, on seeds outside the study's, judged by
``analysis.outcomes``; it picks the rungs where runs learn and then break mid-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from attnscale.analysis import alarms
from attnscale.analysis import detectors as det
from attnscale.analysis.alarms import (GROUP, STOP_FALSE_ALARMS, TARGET_FALSE_ALARMS, analyse, breaks_by_cell,
                                       pct_text, rule_text, steps_text)
from attnscale.errors import ConfigError
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.train import TrainConfig
from attnscale.runs.record import TrainRun
from attnscale.runs.runner import RunSpec, execute
from attnscale.terminal import table

__all__ = ["WarnConfig", "preset", "specs", "run_records", "run", "as_json", "format_table", "SIZES", "LRS",
           "FAMILIES", "LLAMA_LRS", "configs", "format_tables", "as_json_all",
           # the recipe's pilot
           "ARMS", "PILOT_ARMS", "FIRST_PILOT", "PILOT_SEEDS", "PILOT_LRS", "STUDY_SEEDS", "recipe_train", "PilotConfig", "pilot_preset",
           "pilot_specs", "pilot_rows", "arm_of", "run_pilot", "choose_rungs", "pilot_summary", "format_pilot", "pilot_json"]

SIZES = ("smoke", "full")
FAMILIES = tuple(alarms.FAMILIES)  # "tiny": the tiny LM's own loop; "llama": under transformers' Trainer (lm.hf_family)
LRS = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1)  # half-decades from the presets' 3e-3; fixed before any result
LLAMA_LRS = (1e-2, 2e-2, 4e-2, 8e-2, 1.6e-1)  # factors of 2 over the edge a pilot found (the docstring)
LLAMA_MODEL = {"context": 64, "d_model": 64, "n_layers": 2, "n_heads": 4}  # head width 16


def _train() -> TrainConfig:
    # the default preset's optimiser (AdamW, weight decay 0.1, clip 1.0), 200 steps at a constant rate
    return TrainConfig(steps=200, batch=16, lr=3e-3, warmup=0, min_lr_ratio=1.0, record_every=1, eval_batches=None,
                       dtype="auto", checkpoint_every=100)


def _llama_train() -> TrainConfig:
    # AdamW as the tiny LM's (weight decay 0.1, clip 1.0, beta2 0.99), 400 steps at a constant rate, fp32; the
    # watch's cadence is record_every (set to probe_every); a cut run restarts at step 0 (no checkpoint)
    return TrainConfig(steps=400, batch=8, lr=1e-2, warmup=0, min_lr_ratio=1.0, record_every=5, eval_batches=None,
                       dtype="fp32", checkpoint_every=0)


@dataclass(frozen=True)
class WarnConfig(TrainingConfig):
    """Scales × norms × warm-ups × learning rates × seeds of the tiny LM at head width ``head_dim``; with
    ``family="llama"``, warm-ups × learning rates × seeds of the Llama (``model``: ``LlamaModelConfig``
    fields; its scale and norm are Llama's own)."""

    family: str = "tiny"
    head_dim: int = 64
    scales: tuple[str, ...] = ("none", "inv_sqrt_d")
    norms: tuple[str, ...] = ("post", "pre")
    warmups: tuple[int, ...] = (0, 20)
    lrs: tuple[float, ...] = LRS
    seeds: tuple[int, ...] = tuple(range(10))
    probe_every: int = 5
    train: TrainConfig = _train()

    def __post_init__(self):
        super().__post_init__()
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown warn-study family {self.family!r}; choose one of: {', '.join(FAMILIES)}")
        if self.family == "llama" and (tuple(self.scales), tuple(self.norms)) != (("inv_sqrt_d",), ("pre",)):
            raise ConfigError("the llama family has Llama's own scale (inv_sqrt_d) and pre-norm: "
                              "--scale and --norm vary the tiny LM only; drop them, or use --family tiny or all")
        self.check_lists(("scales", "norms", "warmups", "lrs", "seeds"), "warn-study")
        if len(self.seeds) < 2:  # analysis.detectors.split_seeds: every other seed chooses, the rest judge
            raise ConfigError(f"warn-study needs at least 2 seeds, got {list(self.seeds)}: half choose the thresholds "
                              "and the other half judge them; give e.g. --seeds 0 1")
        if any(not (isinstance(w, int) and 0 <= w < self.train.steps) for w in self.warmups):
            raise ConfigError(f"warn-study warm-ups must be whole steps below the run's {self.train.steps}")
        if not isinstance(self.probe_every, int) or self.probe_every < 1:
            raise ConfigError(f"warn-study probe_every must be a positive integer, got {self.probe_every!r}")


def preset(size: str = "full", corpus: str = "default", tokenizer: str | None = None,
           family: str = "tiny") -> WarnConfig:
    """"full": the named run (tiny: 400 runs of 200 steps; llama: 120 runs of 400 steps); "smoke": a check
    that the study and its section work (4 runs, of 40 steps for the tiny LM, 20 for the Llama, at two
    learning rates and two seeds), not a measurement."""
    if size not in SIZES:
        raise ConfigError(f"unknown warn-study preset {size!r}; choose one of: {', '.join(SIZES)}")
    if family == "llama":
        base = WarnConfig(corpus=corpus, tokenizer=tokenizer, family="llama", scales=("inv_sqrt_d",), norms=("pre",),
                          warmups=(0, 40), lrs=LLAMA_LRS, seeds=tuple(range(12)), model=dict(LLAMA_MODEL),
                          train=_llama_train())
        if size == "smoke":
            return replace(base, warmups=(0,), lrs=(1e-2, 1.6e-1), seeds=(0, 1),
                           model={"context": 16, "d_model": 16, "n_layers": 2, "n_heads": 2},
                           train=replace(base.train, steps=20, batch=2, eval_batches=2, record_sequences=1))
        return base
    base = WarnConfig(corpus=corpus, tokenizer=tokenizer, family=family)
    if size == "smoke":
        return replace(base, head_dim=8, scales=("none",), norms=("post",), warmups=(0,), lrs=(3e-3, 3e-1),
                       seeds=(0, 1), model={**base.model, "context": 16, "d_model": 16},
                       train=replace(base.train, steps=40, batch=2, eval_batches=2, checkpoint_every=0,
                                     record_sequences=1))
    return base


def configs(family: str, size: str = "full", corpus: str = "default", tokenizer: str | None = None) -> list[WarnConfig]:
    """The presets of ``family`` ("tiny", "llama" or "all": both)."""
    if family not in (*FAMILIES, "all"):
        raise ConfigError(f"unknown warn-study family {family!r}; choose one of: {', '.join(FAMILIES)}, all")
    return [preset(size, corpus, tokenizer, f) for f in (FAMILIES if family == "all" else (family,))]


def _run_id(scale: str, norm: str, warmup: int, lr: float, seed: int) -> str:
    return f"{scale}-{norm}-warmup{warmup}-lr{lr:g}-seed{seed}"


def _llama_specs(cfg: WarnConfig, vocab_size: int, train: TrainConfig) -> list[RunSpec]:
    from attnscale.lm.hf_family import LlamaModelConfig, check_train

    model = LlamaModelConfig(vocab_size=vocab_size, **cfg.model)
    train = replace(train, record_every=cfg.probe_every)  # the watch's cadence
    check_train(train)  # before any folder is written
    return [RunSpec(f"llama-warmup{warmup}-lr{lr:g}-seed{seed}", model, replace(train, lr=lr, warmup=warmup, seed=seed),
                    GROUP) for warmup in cfg.warmups for lr in cfg.lrs for seed in cfg.seeds]


def specs(cfg: WarnConfig, vocab_size: int) -> list[RunSpec]:
    from attnscale.lm.model import ModelConfig

    train = cfg.train if cfg.device is None else replace(cfg.train, device=cfg.device)
    if cfg.family == "llama":
        return _llama_specs(cfg, vocab_size, train)
    out = []
    for scale in cfg.scales:
        for norm in cfg.norms:
            for warmup in cfg.warmups:
                for lr in cfg.lrs:
                    for seed in cfg.seeds:
                        model = ModelConfig(vocab_size=vocab_size, head_dim=cfg.head_dim, scale=scale,
                                            **{**cfg.model, "norm": norm})
                        out.append(RunSpec(_run_id(scale, norm, warmup, lr, seed), model,
                                           replace(train, lr=lr, warmup=warmup, seed=seed), GROUP))
    return out


def run_records(cfg: WarnConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
                ray_address: str | None = None, corpus=None) -> list[TrainRun]:
    """Train every run not yet finished under ``out/<run_id>``; return every run as read back."""
    corpus = corpus if corpus is not None else cfg.corpus_spec.load()
    return execute(specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs, progress=progress,
                   corpus=corpus, executor=executor, ray_address=ray_address)


def run(cfg: WarnConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
        ray_address: str | None = None) -> dict[str, Any]:
    """Train what is missing, then ``analyse`` every run against a unigram model's held-out loss on the corpus."""
    from attnscale.analysis.schemes import unigram_loss

    corpus = cfg.corpus_spec.load()
    runs = run_records(cfg, out, jobs, progress, executor, ray_address, corpus)
    floor = unigram_loss(corpus.train.tolist(), corpus.valid.tolist(), corpus.vocab_size)
    return analyse(runs, floor, cfg.probe_every, family=cfg.family)


# ---- the printout ------------------------------------------------------------------------------


def format_table(result: dict[str, Any]) -> str:
    """Per detector on the held-out seeds: its chosen threshold, hit rate, false-alarm rate and lead (intervals)."""
    rows = []
    for name, d in result["detectors"].items():
        w = d["warn"]
        if w is None:
            rows.append([name, "none under the target", "—", "—", "—", "—"])
            continue
        rows.append([name, rule_text(w["parts"]), f"{w['hits']}/{w['broken']} {pct_text(w['hit_rate'], w['hit_rate_ci'])}",
                     f"{w['false_alarms']}/{w['healthy']} {pct_text(w['false_alarm_rate'], w['false_alarm_rate_ci'])}",
                     steps_text(w["lead_median"], w["lead_median_ci"]),
                     steps_text(w["lead_q1"]) + "–" + steps_text(w["lead_q3"])])
    for name, c in (("default", result["default"]), ("former defaults", result["former"]["together"])):
        rows.append([name, rule_text(c["parts"]), f"{c['hits']}/{c['broken']} {pct_text(c['hit_rate'], c['hit_rate_ci'])}",
                     f"{c['false_alarms']}/{c['healthy']} {pct_text(c['false_alarm_rate'], c['false_alarm_rate_ci'])}",
                     steps_text(c["lead_median"], c["lead_median_ci"]), steps_text(c["lead_q1"]) + "–" + steps_text(c["lead_q3"])])
    c = result["combined"]
    if c is not None:
        rows.append(["combined", rule_text(c["parts"]), f"{c['hits']}/{c['broken']} {pct_text(c['hit_rate'], c['hit_rate_ci'])}",
                     f"{c['false_alarms']}/{c['healthy']} {pct_text(c['false_alarm_rate'], c['false_alarm_rate_ci'])}",
                     steps_text(c["lead_median"], c["lead_median_ci"]), steps_text(c["lead_q1"]) + "–" + steps_text(c["lead_q3"])])
    lines = table(("detector", "rule (chosen on seeds " + " ".join(map(str, result["choosing_seeds"])) + ")",
                   "hits", "false alarms", "median lead, steps [95%]", "lead quartiles"), rows, "<<>>>>")
    lines.append(f"Held-out seeds {' '.join(map(str, result['held_out_seeds']))}; thresholds chosen for at most "
                 f"{100 * TARGET_FALSE_ALARMS:g}% false alarms on the others; intervals: 95% percentile bootstrap "
                 f"over seeds for leads, Wilson for rates. Break rule: {result['rule'].text()}"
                 + (f" (unigram loss {result['floor']:.3f} nats)." if result["floor"] is not None else "."))
    return "\n".join(lines)


def format_tables(results: list[dict[str, Any]]) -> str:
    """``format_table`` of each family's result, each under its family's name (a pilot: ``format_pilot``)."""
    if results and results[0].get("pilot") is True:
        return format_pilot(results[0])
    return "\n\n".join(f"{r['family']}:\n{format_table(r)}" if len(results) > 1 else format_table(r) for r in results)


def _plain(judged: dict | None) -> dict | None:
    return None if judged is None else {k: v for k, v in judged.items() if k != "outcomes"}


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    """The study's numbers without the runs' series: what --json prints and docs/warn-study.json keeps."""
    return {"family": result["family"], "family_key": result["key"], "break_rule": result["rule"].text(), "unigram_loss": result["floor"],
            "probe_every": result["probe_every"], "choosing_seeds": list(result["choosing_seeds"]),
            "held_out_seeds": list(result["held_out_seeds"]), "target_false_alarms": TARGET_FALSE_ALARMS,
            "stop_false_alarms": STOP_FALSE_ALARMS, "cells": breaks_by_cell(result),
            "detectors": {name: {"curve_held_out": d["curve_held_out"], "curve_choosing": d["curve_choosing"],
                                 "warn": _plain(d["warn"]), "stop": _plain(d["stop"])}
                          for name, d in result["detectors"].items()},
            "combined": _plain(result["combined"]), "best": _plain(result["best"]), "default": _plain(result["default"]),
            "former_defaults": {k: _plain(v) for k, v in result["former"].items()},
            "versus_loss": result["versus_loss"]}


def as_json_all(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Every family's ``as_json``, by family ("tiny", "llama"): what docs/warn-study.json keeps (a pilot: ``pilot_json``)."""
    if results and results[0].get("pilot") is True:
        return pilot_json(results[0])
    return {"families": {r["key"]: as_json(r) for r in results}}


# ---- the recipe's pilot (issue 42): which learning rates make runs break after they learn ------------
# Wortsman et al. 2023's small-scale recipe at a size two CPU cores train: pre-LN, AdamW (0.9, 0.95),
# eps 1e-8, clip 1, independent weight decay 1e-4, a linear warm-up then a constant rate. Four arms:
# qk-layernorm off/on × z-loss 0/1e-4. The pilot runs on seeds outside the study's and picks the
# rungs where 30–70% of the qk-norm-off runs learn and then break mid-run (``choose_rungs``); the
# outcomes are ``analysis.outcomes``, the learned level set from the pilot's own best run.

PILOT_GROUP = "warn-pilot"
STUDY_SEEDS = tuple(range(24))  # the study's seeds: a pilot seed may not be one of them
PILOT_SEEDS = (100, 101, 102, 103)
# up to Wortsman et al.'s largest, 3e-1, finest where runs stop holding and start to fall back (docs/warn-study.md)
PILOT_LRS = (1e-2, 3e-2, 6e-2, 7e-2, 8e-2, 9e-2, 1e-1, 2e-1, 3e-1)
FIRST_PILOT = {"lrs": (3e-3, 1e-2, 3e-2, 1e-1, 3e-1), "warmup": 100}  # the first pilot's recipe, which no rung passed
ARMS = {"qk-off-z0": ("inv_sqrt_d", 0.0), "qk-off-z1e-4": ("inv_sqrt_d", 1e-4),
        "qk-on-z0": ("qk_norm", 0.0), "qk-on-z1e-4": ("qk_norm", 1e-4)}  # arm -> (score scale, z-loss)
# the pilot's arms: the qk-norm-off ones, whose share of mid-run breaks chooses the rungs; no rule reads the others
PILOT_ARMS = ("qk-off-z0", "qk-off-z1e-4")
FLOOR_ARM = "uniform"  # the recipe's model with uniform attention (scale "uniform"): the no-attention floor
FLOOR_SEEDS = (PILOT_SEEDS[0],)  # one seed a rung: its best rung's held-out loss is the floor
BREAK_SHARE = (0.3, 0.7)  # a rung is chosen where this share of qk-norm-off runs break mid-run
CHOSEN_RUNGS = 2
PROBE_EVERY = 10  # steps between probes of the recipe's runs (the issue's cadence)


def recipe_train(steps: int = 1500, warmup: int = 500) -> TrainConfig:
    """The recipe's optimiser and schedule: a linear warm-up of ``warmup`` steps (500: long enough that a run
    learns while the rate is still low, as a Wortsman et al. run does in its thousands of warm-up steps;
    the first pilot's 100 left runs at 1e-1 and 3e-1 on the plateau from the start), then constant. The loss of every step is kept (``results.losses``: the
    outcomes' 20-step means read them all); the heads, gradient norm, log Z and q/k weight RMS are
    probed every ``PROBE_EVERY`` steps, on one sequence."""
    return TrainConfig(steps=steps, batch=16, lr=1e-2, warmup=warmup, min_lr_ratio=1.0, weight_decay=1e-4,
                       independent_wd=True, beta1=0.9, beta2=0.95, adam_eps=1e-8, clip=1.0, record_every=PROBE_EVERY,
                       record_sequences=1, eval_batches=20, dtype="fp32", checkpoint_every=500)


@dataclass(frozen=True)
class PilotConfig(TrainingConfig):
    """Arms × learning rates × pilot seeds of the pre-LN tiny LM at head width ``head_dim``."""

    head_dim: int = 64
    arms: tuple[str, ...] = PILOT_ARMS
    lrs: tuple[float, ...] = PILOT_LRS
    seeds: tuple[int, ...] = PILOT_SEEDS
    train: TrainConfig = recipe_train()

    def __post_init__(self):
        super().__post_init__()
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ConfigError(f"unknown pilot arm {unknown[0]!r}; choose from: {', '.join(ARMS)}")
        self.check_lists(("arms", "lrs", "seeds"), "warn-study pilot")
        inside = sorted(set(self.seeds) & set(STUDY_SEEDS))
        if inside:
            raise ConfigError(f"pilot seeds must lie outside the study's seeds 0–{STUDY_SEEDS[-1]}, got {inside}; "
                              f"use e.g. {' '.join(map(str, PILOT_SEEDS))}")


def pilot_preset(size: str = "full", corpus: str = "default", tokenizer: str | None = None) -> PilotConfig:
    """"full": 2 arms × 9 rungs × 4 seeds of 1,500 steps and the floor; "smoke": the same arms at two rungs, one seed,
    40 steps of a 16-wide model: a check that the pilot and its table work, not a measurement."""
    if size not in SIZES:
        raise ConfigError(f"unknown warn-study preset {size!r}; choose one of: {', '.join(SIZES)}")
    base = PilotConfig(corpus=corpus, tokenizer=tokenizer)
    if size == "smoke":
        return replace(base, head_dim=8, lrs=(1e-2, 3e-1), seeds=(PILOT_SEEDS[0],),
                       model={**base.model, "context": 16, "d_model": 16},
                       train=replace(recipe_train(steps=40, warmup=4), batch=2, eval_batches=2, checkpoint_every=0))
    return base


def pilot_specs(cfg: PilotConfig, vocab_size: int) -> list[RunSpec]:
    from attnscale.lm.model import ModelConfig

    train = cfg.train if cfg.device is None else replace(cfg.train, device=cfg.device)
    out = []
    for arm in cfg.arms:
        scale, z_loss = ARMS[arm]
        model = ModelConfig(vocab_size=vocab_size, head_dim=cfg.head_dim, scale=scale, **{**cfg.model, "norm": "pre"})
        out += [RunSpec(f"pilot-{arm}-lr{lr:g}-seed{seed}", model, replace(train, lr=lr, seed=seed, z_loss=z_loss),
                        PILOT_GROUP) for lr in cfg.lrs for seed in cfg.seeds]
    # the no-attention floor: the same model, attention uniform over the past, on every rung
    model = ModelConfig(vocab_size=vocab_size, head_dim=cfg.head_dim, scale="uniform", **{**cfg.model, "norm": "pre"})
    out += [RunSpec(f"pilot-{FLOOR_ARM}-lr{lr:g}-seed{seed}", model, replace(train, lr=lr, seed=seed), PILOT_GROUP)
            for lr in cfg.lrs for seed in FLOOR_SEEDS]
    return out


def arm_of(run: TrainRun) -> str:
    """The recipe arm a run trained in, from its score scale and z-loss."""
    if run.scale == "uniform":
        return FLOOR_ARM
    z_loss = run.train_config.z_loss
    return next(a for a, (s, z) in ARMS.items() if s == run.scale and z == z_loss)


def pilot_rows(runs) -> list[dict[str, Any]]:
    """The finished runs as ``pilot_summary`` takes them: arm, lr, seed, every step's loss, held-out loss."""
    return [{"arm": arm_of(t), "lr": t.lr, "seed": t.seed, "losses": alarms.series_of(t, 1).losses,
             "final": t.results.valid_loss} for t in runs if t.status in ("done", "diverged")]


def run_pilot(cfg: PilotConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
              ray_address: str | None = None) -> dict[str, Any]:
    """Train what is missing, then ``pilot_summary`` against a bigram model of the corpus."""
    from attnscale.analysis.outcomes import bigram_loss

    corpus = cfg.corpus_spec.load()
    runs = execute(pilot_specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs, progress=progress,
                   corpus=corpus, executor=executor, ray_address=ray_address)
    return pilot_summary(pilot_rows(runs), bigram_loss(corpus.train.tolist(), corpus.valid.tolist(), corpus.vocab_size))


def choose_rungs(counts: dict[float, tuple[int, int]], share: tuple[float, float] = BREAK_SHARE,
                 n: int = CHOSEN_RUNGS) -> list[float]:
    """The study's rungs from (mid-run breaks, runs) of the qk-norm-off arms per learning rate: those whose
    share lies in ``share`` (ends included), the ``n`` nearest half (ties: the lower rate), in rate order."""
    def frac(lr):  # exact, so that 3 of 10 and 7 of 10 tie at a distance of 1/5 from half
        return Fraction(*counts[lr])

    low, high = Fraction(str(share[0])), Fraction(str(share[1]))
    ok = [lr for lr, (_, runs) in counts.items() if runs and low <= frac(lr) <= high]
    return sorted(sorted(ok, key=lambda lr: (abs(frac(lr) - Fraction(1, 2)), lr))[:n])


def pilot_summary(rows: list[dict[str, Any]], bigram: float) -> dict[str, Any]:
    """Per arm and rung the outcome tally (``outcomes.tally``), and per rung the qk-norm-off runs' mid-run
    breaks; the rungs chosen for the study. ``rows``: arm, lr, seed, losses (every step), final (held-out).
    The no-attention floor is the lower of the bigram's loss and the best held-out loss of the ``FLOOR_ARM``
    runs (``outcomes.no_attention_floor``); the learned level lies halfway from it to the pilot's best run
    of the arms (``outcomes.learned_level``)."""
    from attnscale.analysis import outcomes as oc

    def finite(rs):
        return [r["final"] for r in rs if isinstance(r["final"], float) and math.isfinite(r["final"])]

    uniform = min(finite(r for r in rows if r["arm"] == FLOOR_ARM), default=None)
    floor = oc.no_attention_floor(bigram, uniform)
    rows = [r for r in rows if r["arm"] != FLOOR_ARM]
    best = min(finite(rows), default=None)
    result: dict[str, Any] = {"pilot": True, "bigram": bigram, "uniform": uniform, "floor": floor, "best": best,
                              "level": None, "cells": [], "qk_off": {}, "chosen": [], "runs": len(rows)}
    if best is None or best >= floor:
        result["note"] = ("no pilot run beat the no-attention floor, so none learned and no rung can be chosen: "
                          "change the recipe (longer runs, larger rates up to 3e-1, a shorter warm-up) and pilot again")
        return result
    result["level"] = level = oc.learned_level(floor, best)
    qk_off: dict[float, list[int]] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        by_lr: dict[float, list] = {}
        for r in mine:
            by_lr.setdefault(r["lr"], []).append(r["final"])
        try:
            arm_best = oc.arm_best(by_lr)
        except ConfigError:
            arm_best = math.inf  # no rate of the arm ends finite: only the floor can mark a run degraded
        for lr in sorted(by_lr):
            tally = oc.tally(oc.classify(r["losses"], r["final"], level, floor, arm_best)
                             for r in mine if r["lr"] == lr)
            result["cells"].append({"arm": arm, "lr": lr, **tally})
            if ARMS[arm][0] != "qk_norm":
                k = qk_off.setdefault(lr, [0, 0])
                k[0], k[1] = k[0] + tally["mid_run_breaks"], k[1] + tally["runs"]
    result["qk_off"] = {lr: {"mid_run_breaks": k, "runs": n, "share": k / n, "ci": det.wilson(k, n)}
                        for lr, (k, n) in sorted(qk_off.items())}
    result["chosen"] = choose_rungs({lr: (k, n) for lr, (k, n) in qk_off.items()})
    if not result["chosen"]:
        result["note"] = (f"no rung has {BREAK_SHARE[0]:.0%}–{BREAK_SHARE[1]:.0%} of its qk-norm-off runs breaking "
                          "mid-run: change the recipe (longer runs, larger rates up to 3e-1, a shorter warm-up) "
                          "and pilot again before any study seed runs")
    return result


def format_pilot(result: dict[str, Any]) -> str:
    """Per rung: each arm's mid-run breaks of its runs (never learned apart), the qk-norm-off share; the choice."""
    head = (f"No-attention floor {result['floor']:.3f} nats (bigram {result['bigram']:.3f}, uniform attention "
            + ("—" if result.get("uniform") is None else f"{result['uniform']:.3f}") + "); best pilot run "
            + ("—" if result["best"] is None else f"{result['best']:.3f}")
            + ("" if result["level"] is None else f"; learned: 20-step mean under {result['level']:.3f} nats") + ".")
    if result["level"] is None:
        return head + "\n" + result["note"] + "."
    arms = list(dict.fromkeys(c["arm"] for c in result["cells"]))
    cells = {(c["arm"], c["lr"]): c for c in result["cells"]}
    rows = []
    for lr in sorted({c["lr"] for c in result["cells"]}):
        q = result["qk_off"].get(lr)
        got = [cells.get((a, lr)) for a in arms]
        rows.append([f"{lr:g}"] + ["—" if c is None else f"{c['mid_run_breaks']}/{c['runs']} ({c['never_learned']})"
                                   for c in got]
                    + ["—" if q is None else f"{q['mid_run_breaks']}/{q['runs']} " + pct_text(q["share"], q["ci"])])
    lines = table(("lr", *arms, "qk-norm off: broke mid-run [95% Wilson]"), rows, "<" + ">" * (len(arms) + 1))
    lines.append("Cells: mid-run breaks/runs (never learned, apart). " + (
        f"Rungs for the study: {' '.join(f'{lr:g}' for lr in result['chosen'])}." if result["chosen"]
        else result["note"] + "."))
    return "\n".join([head, *lines])


def pilot_json(result: dict[str, Any]) -> dict[str, Any]:
    """The pilot's numbers as --json prints them (rates keyed by their printed form)."""
    return {**{k: v for k, v in result.items() if k != "qk_off"},
            "qk_off": {f"{lr:g}": v for lr, v in result["qk_off"].items()}}
