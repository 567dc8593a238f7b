"""What every training experiment's config shares: the corpus and its tokenizer, the model
settings, the budget, and where the runs train.

``DynamicsConfig``, ``SweepConfig``, ``SchemesConfig`` and ``StudyConfig`` each add
what they vary (widths, schemes, seeds, learning rates, axes) to these fields;
``model`` holds ModelConfig fields other than vocab_size (from the corpus),
head_dim and scale (set per run). ``device`` ("auto", "cpu", "cuda", "cuda:N",
"mps"), when given, is where every run trains: it sets ``train.device``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnscale.core.device import check_device_spec
from attnscale.lm.presets import budget
from attnscale.lm.train import TrainConfig
from attnscale.runs.runner import CorpusSpec

__all__ = ["TrainingConfig", "default_model", "default_train"]


def default_model() -> dict[str, Any]:
    return budget().model  # the default budget of a small-vocabulary corpus


def default_train() -> TrainConfig:
    return budget().train


@dataclass(frozen=True)
class TrainingConfig:
    corpus: str = "default"
    tokenizer: str | None = None
    model: dict[str, Any] = field(default_factory=default_model)
    train: TrainConfig = field(default_factory=default_train)
    device: str | None = None

    def __post_init__(self):
        if self.device is not None:
            check_device_spec(self.device)

    def check_lists(self, names, what: str) -> None:
        """A ConfigError naming the first of the fields ``names`` that is empty or repeats a value
        (``what``: the command's words for the config, e.g. "act-study")."""
        from attnscale.errors import ConfigError

        for name in names:
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{what} {name} must be a non-empty list without repeats, got {list(values)}")

    @property
    def corpus_spec(self) -> CorpusSpec:
        return CorpusSpec(self.corpus, self.tokenizer)
