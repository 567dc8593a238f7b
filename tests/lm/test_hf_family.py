"""lm/hf_family: the Llama family's config is checked where it is made, and a run it cannot train as asked is
refused before transformers loads (its training, through the real Trainer: tests/experiments/test_warn_study.py)."""

import pytest

from attnscale.errors import ConfigError
from attnscale.lm.hf_family import LlamaModelConfig, train
from attnscale.lm.train import TrainConfig


def test_the_config_resolves_its_widths_and_names_its_family():
    cfg = LlamaModelConfig(vocab_size=104, d_model=64, n_heads=4)
    assert (cfg.head_dim, cfg.kv_heads, cfg.scale, cfg.family) == (16, 4, "inv_sqrt_d", "llama")


@pytest.mark.parametrize("kwargs, words", [
    ({"d_model": 30, "n_heads": 4}, "d_model=30 is not divisible by n_heads=4"),
    ({"n_heads": 4, "kv_heads": 3}, "n_heads=4 must be a multiple of kv_heads=3"),
    ({"n_layers": 0}, "llama n_layers must be a positive integer, got 0"),
    ({"scale": "none"}, "Llama's own score scale"),
])
def test_bad_configs_say_what_is_wrong(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        LlamaModelConfig(vocab_size=104, **kwargs)


@pytest.mark.parametrize("kwargs, words", [
    ({"checkpoint_every": 10}, "set checkpoint_every to 0"),
    ({"dtype": "bf16", "weights": "bf16"}, "set weights to fp32"),
])
def test_a_run_it_cannot_train_as_asked_is_refused_before_training(kwargs, words):
    class Corpus:
        vocab_size = 104

    with pytest.raises(ConfigError, match=words):
        train(LlamaModelConfig(vocab_size=104), TrainConfig(**kwargs), Corpus())
