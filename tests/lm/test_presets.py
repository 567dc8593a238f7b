"""lm.presets: every budget in one place."""

import pytest

from attnscale.errors import ConfigError
from attnscale.lm.model import ModelConfig
from attnscale.lm.presets import CHECKPOINT_EVERY, LARGE_VOCAB, PRESETS, budget, model_settings, with_steps
from attnscale.lm.train import TrainConfig


@pytest.mark.parametrize("name", PRESETS)
def test_presets_build(name):
    b = budget(name)
    assert ModelConfig(vocab_size=100, head_dim=1024, scale="none", **b.model).head_dim == 1024
    assert isinstance(b.train, TrainConfig) and b.name == name
    with pytest.raises(ConfigError, match="quick"):
        budget("huge")


def test_a_large_vocabulary_halves_the_default_batch_and_keeps_the_schedule():
    small, large = budget("default", 100), budget("default", LARGE_VOCAB + 1)
    assert large.train.batch * 2 == small.train.batch
    assert (large.train.steps, large.train.lr, large.train.warmup) == (small.train.steps, small.train.lr, small.train.warmup)
    assert small.train.checkpoint_every == CHECKPOINT_EVERY and budget("quick").train.checkpoint_every == 0


def test_fewer_steps_keep_the_warmup_within_a_tenth():
    train = budget("default").train
    assert with_steps(train, 100).warmup == 10 and with_steps(train, 100).steps == 100
    assert with_steps(train, 10_000).warmup == train.warmup
    assert with_steps(train, 5).warmup == 0


def test_the_fresh_head_reads_the_model_the_default_preset_trains():
    assert model_settings() == budget("default").model
    settings = model_settings()
    settings["d_model"] = 1  # a copy: callers cannot change the preset
    assert budget("default").model["d_model"] == 64
