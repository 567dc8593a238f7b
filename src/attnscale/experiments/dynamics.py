"""Experiment 3 — what training does to the scores, with and without the scale.

Trains the tiny model at one head width (1,024 by default, the course's) once
per scheme, same seed and budget, recording every ``record_every`` steps, per
layer and head: spread of the scores, frozen fraction, effective words, push,
and the loss (``attnscale.lm.train``). The course's run: without the division the
spread grew from about 21 to over 5,000 and 99.9% of rows froze; with it the
spread settled around 3.4.

Runs go to ``out/<run_id>`` with record extra "dynamics" and are
resumed like any sweep (``attnscale.runs.runner``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnscale import limits
from attnscale.runs import store
from attnscale.runs.record import TrainRun
from attnscale.experiments.training_config import TrainingConfig
from attnscale.core.scales import display_name
from attnscale.errors import ConfigError
from attnscale.terminal import table
from attnscale.runs.runner import CorpusSpec, RunSpec, execute
from attnscale.lm.train import TrainConfig
from attnscale.lm.presets import budget, preset_name

__all__ = ["DynamicsConfig", "check_budget", "preset", "specs", "model_config", "run", "rows_from_records",
           "format_table"]


@dataclass(frozen=True)
class DynamicsConfig(TrainingConfig):
    """One width, several schemes. ``model`` holds ModelConfig fields other than
    vocab_size (from the corpus), head_dim and scale (set per run); ``train.seed``
    is replaced by ``seed``. ``device`` ("auto", "cpu", "cuda", "cuda:N", "mps"),
    when given, is where every run trains (it sets ``train.device``)."""

    head_dim: int = 1024
    scales: tuple[str, ...] = ("none", "inv_sqrt_d")
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ConfigError(f"head_dim must be a positive integer, got {self.head_dim!r}")
        if not self.scales or len(set(self.scales)) != len(self.scales):
            raise ConfigError(f"scales must be distinct scheme names, got {self.scales}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        for scale in self.scales:
            model_config(self.model, 1, self.head_dim, scale)  # raises ConfigError for a bad field or scheme
        check_budget(self.model, self.train, {self.head_dim: len(self.scales)})

    @property
    def corpus_spec(self) -> CorpusSpec:
        return CorpusSpec(self.corpus, self.tokenizer)


def model_config(model: dict[str, Any], vocab_size: int, head_dim: int, scale: str):
    """``ModelConfig`` for one run; unknown fields are a ConfigError, not a TypeError."""
    from attnscale.lm.model import ModelConfig

    try:
        return ModelConfig(vocab_size=vocab_size, head_dim=head_dim, scale=scale, **model)
    except TypeError as e:
        raise ConfigError(f"model settings {sorted(model)}: {e}") from None


def check_budget(model: dict[str, Any], train: TrainConfig, runs_per_head_dim: dict[int, int], vocab_size: int = 1) -> None:
    """Refuse, before anything is built, training that cannot fit this machine's memory or
    time limit (``attnscale.limits``); ``runs_per_head_dim``: head width -> runs at that width."""
    cfg = model_config(model, vocab_size, 1, "none")
    limits.check(limits.head_dims_cost(runs_per_head_dim, vocab=vocab_size, context=cfg.context, d_model=cfg.d_model,
                                    n_layers=cfg.n_layers, n_heads=cfg.n_heads, mlp_ratio=cfg.mlp_ratio,
                                    batch=train.batch, steps=train.steps),
                 "lower --steps, --batch, --context or the widths")


def preset(quick: bool = False, corpus: str = "default", seed: int = 0, tokenizer: str | None = None,
           vocab_size: int | None = None, full: bool = False) -> DynamicsConfig:
    """The course's pair (none, inv_sqrt_d) at width 1,024 on ``lm.presets.budget`` ("quick",
    "default", or with ``full`` the "full" budget).

    The budget depends on the corpus's vocabulary: give ``vocab_size`` where the
    corpus is loaded already, else it is loaded here (cached after the first time)."""
    vocab = vocab_size if vocab_size is not None else CorpusSpec(corpus, tokenizer).load().vocab_size
    b = budget(preset_name(quick, full), vocab)
    return DynamicsConfig(corpus=corpus, tokenizer=tokenizer, seed=seed, model=b.model, train=b.train)


def specs(cfg: DynamicsConfig, vocab_size: int) -> list[RunSpec]:
    check_budget(cfg.model, cfg.train, {cfg.head_dim: len(cfg.scales)}, vocab_size)
    train_cfg = replace(cfg.train, seed=cfg.seed, **({"device": cfg.device} if cfg.device is not None else {}))
    return [
        RunSpec(store.run_id(cfg.head_dim, s, cfg.seed), model_config(cfg.model, vocab_size, cfg.head_dim, s),
                train_cfg, "dynamics")
        for s in cfg.scales
    ]


def run(cfg: DynamicsConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
        ray_address: str | None = None, pace=None) -> list[dict[str, Any]]:
    """Train each scheme at ``cfg.head_dim`` under ``out/<run_id>`` (finished runs are kept); return rows.

    ``executor``, ``ray_address``: where the runs train (``runs.runner.execute``)."""
    corpus = cfg.corpus_spec.load()
    records = execute(specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs,
                      progress=progress, corpus=corpus, executor=executor, ray_address=ray_address, pace=pace)
    return rows_from_records(records)


def rows_from_records(runs: list[TrainRun]) -> list[dict[str, Any]]:
    """One row per run: the diagnostics at the first and last recorded step, and perplexity.

    ``start``/``end`` are ``lm.train.summarize`` of a recorded step: means over
    layers and heads, with ``spread_by_layer`` and ``frozen_by_layer``."""
    return [{
        "run_id": t.run_id,
        "head_dim": t.head_dim,
        "scale": t.scale,
        "seed": t.seed,
        "status": t.status,
        "steps_done": t.steps_done,
        "diverged_at": t.diverged_at,
        "valid_ppl": t.perplexity,
        "start": t.results.start,
        "end": t.results.end,
        "train_seconds": t.results.train_seconds,
    } for t in runs]


def _pair(row: dict, key: str, fmt: str) -> str:
    a = (row.get("start") or {}).get(key)
    b = (row.get("end") or {}).get(key)
    return f"{'-' if a is None else format(a, fmt)} → {'-' if b is None else format(b, fmt)}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Start → end of training, per scheme: spread, frozen fraction, effective words, push; perplexity."""
    def line(r):
        ppl = "-" if r["valid_ppl"] is None else f"{r['valid_ppl']:.2f}"
        status = r["status"] + (f" at step {r['diverged_at']}" if r.get("diverged_at") is not None else "")
        return [r["head_dim"], display_name(r["scale"]), _pair(r, "spread", ".2f"), _pair(r, "frozen_fraction", ".3f"),
                _pair(r, "effective_words", ".1f"), _pair(r, "push", ".3f"), ppl, status]

    lines = table(("width", "scale", "spread", "frozen", "eff. words", "push", "valid ppl", "status"),
                  map(line, rows), "><>>>>><")
    lines.append("start → end: the freshly initialised model, then after the last step (means over layers and heads)")
    return "\n".join(lines)
