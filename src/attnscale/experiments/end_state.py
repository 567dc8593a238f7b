"""The long run designed to reach the course's end of training (``lm.presets.end_state_budget``).

At d = 1,024 the pair the course compares, without a scale and with 1/√d, on two seeds; at
d = 128 the same pair on the same two seeds, and beside it the ``uniform`` model of the same shape
(attention that learns nothing through its scores): the no-attention floor the gaps are read
against. The rule that judges it was written before it ran: ``analysis.end_state``.

Runs go to ``out/<run_id>`` with record group "end-state"; a rerun trains only what is missing,
and a killed run resumes from its checkpoint (every 200 steps). The corpus's counted floors
(``analysis.floors``) are written beside the runs, as a sweep writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from attnscale.errors import ConfigError
from attnscale.experiments.dynamics import check_budget, model_config
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.presets import end_state_budget
from attnscale.lm.train import TrainConfig
from attnscale.runs import store
from attnscale.runs.record import TrainRun
from attnscale.runs.runner import RunSpec, execute

__all__ = ["EndStateConfig", "GROUP", "specs", "run_records"]

GROUP = "end-state"


def _model() -> dict:
    return end_state_budget().model


def _train() -> TrainConfig:
    return end_state_budget().train


@dataclass(frozen=True)
class EndStateConfig(TrainingConfig):
    """``wide``: the course's width, trained on ``seeds``; ``narrow``: the width where the course's
    gap is small, trained on ``narrow_seeds`` with the ``uniform`` floor beside it (first seed)."""

    model: dict = field(default_factory=_model)
    train: TrainConfig = field(default_factory=_train)
    wide: int = 1024
    narrow: int = 128
    seeds: tuple[int, ...] = (0, 1)
    narrow_seeds: tuple[int, ...] = (0, 1)

    def __post_init__(self):
        super().__post_init__()
        for name in ("seeds", "narrow_seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{name} must be a non-empty list without repeats, got {values}")
        if self.wide == self.narrow:
            raise ConfigError(f"the wide and narrow widths must differ, got {self.wide} twice")


def specs(cfg: EndStateConfig, vocab_size: int) -> list[RunSpec]:
    """(width, scale, seed) of every run, widest first."""
    plan = [(cfg.wide, s, seed) for seed in cfg.seeds for s in ("none", "inv_sqrt_d")]
    plan += [(cfg.narrow, s, seed) for seed in cfg.narrow_seeds for s in ("none", "inv_sqrt_d")]
    plan.append((cfg.narrow, "uniform", cfg.narrow_seeds[0]))
    counts: dict[int, int] = {}
    for w, _, _ in plan:
        counts[w] = counts.get(w, 0) + 1
    check_budget(cfg.model, cfg.train, counts, vocab_size)
    device = {} if cfg.device is None else {"device": cfg.device}
    return [RunSpec(store.run_id(w, s, seed), model_config(cfg.model, vocab_size, w, s),
                    replace(cfg.train, seed=seed, **device), GROUP) for w, s, seed in plan]


def run_records(cfg: EndStateConfig, out: Path, jobs: int = 2, progress: bool = True, executor: str = "local",
                ray_address: str | None = None) -> list[TrainRun]:
    """Train every run not yet finished under ``out`` (``executor``: where, as ``runs.runner.execute`` takes
    it); every run as read back."""
    from attnscale.experiments.sweep import write_floors

    corpus = cfg.corpus_spec.load()
    runs = execute(specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs, progress=progress,
                   corpus=corpus, executor=executor, ray_address=ray_address)
    write_floors(corpus, out)  # the counted floors, beside the trained one
    return runs
