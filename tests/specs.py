"""The tiny training runs of the runner's tests (local, Ray, a Ray cluster, the pace): one corpus, one model shape,
one short schedule, so that every room that runs a sweep runs the same one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnscale.lm.model import ModelConfig
from attnscale.lm.train import TrainConfig
from attnscale.runs import store
from attnscale.runs.runner import CorpusSpec, RunSpec

CORPUS = CorpusSpec("default")
TINY = TrainConfig(steps=8, batch=4, warmup=1, record_every=4, eval_batches=2)
# the dynamics and sweep experiments' own tiny runs, built from their configs rather than from RunSpecs
TINY_MODEL = {"context": 16, "d_model": 16, "n_layers": 1, "n_heads": 2}
TINY_TRAIN = TrainConfig(steps=6, batch=4, warmup=1, record_every=3, eval_batches=2)


@pytest.fixture(scope="module")
def corpus():
    return CORPUS.load()


def spec(corpus, head_dim=8, scale="none", seed=0, *, base=TINY, group="test", model_scale=None, **train) -> RunSpec:
    """A one-layer, two-head run named by its width, scale and seed; ``model_scale`` where the model's own scale
    differs from the one in its name (the pace's runs, whose cost does not depend on it)."""
    model = ModelConfig(vocab_size=corpus.vocab_size, context=16, d_model=16, n_layers=1, n_heads=2,
                        head_dim=head_dim, scale=scale if model_scale is None else model_scale)
    return RunSpec(store.run_id(head_dim, scale, seed), model, replace(base, seed=seed, **train), group)
