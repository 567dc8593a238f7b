"""Experiment 3 — what training does to the scores, with and without the scale.

Trains the tiny model at one head width (1,024 by default, the course's) once
per scheme, same seed and budget, recording every ``record_every`` steps, per
layer and head: spread of the scores, frozen fraction, effective words, push,
and the loss (``attnscale.lm.train``). The course's run: without the division the
spread grew from about 21 to over 5,000 and 99.9% of rows froze; with it the
spread settled around 3.4.

Runs go to ``out/<run_id>`` with record extra {"group": "dynamics"} and are
resumed like any sweep (``attnscale.runs.runner``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnscale.runs import store
from attnscale.core.device import check_device_spec
from attnscale.errors import ConfigError
from attnscale.runs.runner import CorpusSpec, RunSpec, execute
from attnscale.lm.train import TrainConfig
from attnscale.lm.train import preset as train_preset

__all__ = ["DynamicsConfig", "budget", "preset", "specs", "model_config", "run", "rows_from_records", "format_table",
           "LARGE_VOCAB", "CHECKPOINT_EVERY"]


def default_model() -> dict[str, Any]:
    return budget(False, 0)[0]  # the full budget of a small-vocabulary corpus


def default_train() -> TrainConfig:
    return budget(False, 0)[1]


@dataclass(frozen=True)
class DynamicsConfig:
    """One width, several schemes. ``model`` holds ModelConfig fields other than
    vocab_size (from the corpus), head_dim and scale (set per run); ``train.seed``
    is replaced by ``seed``. ``device`` ("auto", "cpu", "cuda", "cuda:N", "mps"),
    when given, is where every run trains (it sets ``train.device``)."""

    corpus: str = "default"
    tokenizer: str | None = None
    head_dim: int = 1024
    scales: tuple[str, ...] = ("none", "inv_sqrt_d")
    seed: int = 0
    model: dict[str, Any] = field(default_factory=default_model)
    train: TrainConfig = field(default_factory=default_train)
    device: str | None = None

    def __post_init__(self):
        if self.device is not None:
            check_device_spec(self.device)
        if not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ConfigError(f"head_dim must be a positive integer, got {self.head_dim!r}")
        if not self.scales or len(set(self.scales)) != len(self.scales):
            raise ConfigError(f"scales must be distinct scheme names, got {self.scales}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        for scale in self.scales:
            model_config(self.model, 1, self.head_dim, scale)  # raises ConfigError for a bad field or scheme

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


# A word-level vocabulary (WikiText-2: 33,278 words) makes the output layer cost
# more than the rest of the tiny model at every width (measured: 0.7 s of CPU a
# step at width 32, 0.9 at 1,024, batch 16); on such corpora the full budget
# halves the batch, keeping the number of updates and the schedule, so the
# course's sweep (12 runs) fits ~15 minutes on 2 cores.
LARGE_VOCAB = 8192
CHECKPOINT_EVERY = 100  # full runs save a checkpoint this often, so a killed run resumes mid-way


def budget(quick: bool, vocab_size: int) -> tuple[dict[str, Any], TrainConfig]:
    """Model settings and training budget shared by the dynamics pair and the sweep.

    One budget for both, recording every 10 steps, so the sweep's widest pair is
    the dynamics pair run for run (``sweep.run(..., reuse=[dynamics folder])``
    copies it instead of training it twice). ``quick``: train.py's "quick" preset."""
    model, train_cfg = train_preset("quick" if quick else "dynamics")
    if not quick:
        train_cfg = replace(train_cfg, checkpoint_every=CHECKPOINT_EVERY)
        if vocab_size > LARGE_VOCAB:
            train_cfg = replace(train_cfg, batch=max(1, train_cfg.batch // 2))
    return dict(model), train_cfg


def preset(quick: bool = False, corpus: str = "default", seed: int = 0, tokenizer: str | None = None) -> DynamicsConfig:
    """The course's pair (none, inv_sqrt_d) at width 1,024 on ``budget``.

    Loads the corpus (cached after the first time) to size the budget by its vocabulary."""
    model, train_cfg = budget(quick, CorpusSpec(corpus, tokenizer).load().vocab_size)
    return DynamicsConfig(corpus=corpus, tokenizer=tokenizer, seed=seed, model=model, train=train_cfg)


def specs(cfg: DynamicsConfig, vocab_size: int) -> list[RunSpec]:
    train_cfg = replace(cfg.train, seed=cfg.seed, **({"device": cfg.device} if cfg.device is not None else {}))
    return [
        RunSpec(store.run_id(cfg.head_dim, s, cfg.seed), model_config(cfg.model, vocab_size, cfg.head_dim, s),
                train_cfg, {"group": "dynamics"})
        for s in cfg.scales
    ]


def run(cfg: DynamicsConfig, out: Path, jobs: int = 1, progress: bool = True) -> list[dict[str, Any]]:
    """Train each scheme at ``cfg.head_dim`` under ``out/<run_id>`` (finished runs are kept); return rows."""
    corpus = cfg.corpus_spec.load()
    records = execute(specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs,
                      progress=progress, corpus=corpus)
    return rows_from_records(records)


def rows_from_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: the diagnostics at the first and last recorded step, and perplexity.

    ``start``/``end`` are ``train.summarize`` of a recorded step: means over
    layers and heads (max for max_score)."""
    rows = []
    for rec in records:
        res = rec.get("results") or {}
        model = rec["config"]["model"]
        rows.append({
            "run_id": Path(rec.get("run_dir", "")).name or None,
            "width": model["head_dim"],
            "scale": model["scale"],
            "seed": rec["config"]["train"]["seed"],
            "status": rec["status"],
            "steps_done": res.get("steps_done"),
            "diverged_at": res.get("diverged_at"),
            "valid_ppl": res.get("perplexity"),
            "start": res.get("start"),
            "end": res.get("end"),
            "train_seconds": res.get("train_seconds"),
        })
    return rows


def _pair(row: dict, key: str, fmt: str) -> str:
    a = (row.get("start") or {}).get(key)
    b = (row.get("end") or {}).get(key)
    return f"{'-' if a is None else format(a, fmt)} → {'-' if b is None else format(b, fmt)}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Start → end of training, per scheme: spread, frozen fraction, effective words, push; perplexity."""
    head = (f"{'width':>6} {'scale':<13} {'spread':>19} {'frozen':>15} {'eff. words':>15} "
            f"{'push':>15} {'valid ppl':>10}  status")
    lines = [head]
    for r in rows:
        ppl = "-" if r["valid_ppl"] is None else f"{r['valid_ppl']:.2f}"
        status = r["status"] + (f" at step {r['diverged_at']}" if r.get("diverged_at") is not None else "")
        lines.append(
            f"{r['width']:>6} {r['scale']:<13} {_pair(r, 'spread', '.2f'):>19} {_pair(r, 'frozen_fraction', '.3f'):>15} "
            f"{_pair(r, 'effective_words', '.1f'):>15} {_pair(r, 'push', '.3f'):>15} {ppl:>10}  {status}"
        )
    lines.append("start → end: the freshly initialised model, then after the last step (means over layers and heads)")
    return "\n".join(lines)
