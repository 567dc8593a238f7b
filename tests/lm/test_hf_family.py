"""lm/hf_family: the Llama family's config is checked where it is made, and a run it cannot train as asked is
refused before transformers loads, and its held-out loss is what its saved weights give (its training through
the real Trainer, watched: tests/experiments/test_warn_study.py)."""

import math

import pytest
import torch

from attnscale.errors import ConfigError
from attnscale.lm.hf_family import LlamaModelConfig, train
from attnscale.lm.train import TrainConfig
from tiny_corpus import V, corpus  # noqa: F401  (the module-scoped fixture)


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


def test_the_held_out_loss_is_the_saved_models_every_target_once(tmp_path, corpus):  # noqa: F811
    """Through the real Trainer, two steps: the held-out loss the run reports is the one its saved weights give,
    computed here window by window (every held-out token after the first, once), not by lm.train.evaluate."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from attnscale.lm.hf_family import build

    cfg = LlamaModelConfig(vocab_size=V, context=16, d_model=16, n_layers=1, n_heads=2)
    res = train(cfg, TrainConfig(steps=2, batch=4, warmup=0, record_every=1, eval_batches=None, threads=1),
                corpus, weights=tmp_path / "model.safetensors")
    model = build(cfg, seed=0).eval()
    model.load_state_dict(load_file(tmp_path / "model.safetensors"))
    ids, total = corpus.valid, 0.0
    with torch.no_grad():
        for lo in range(0, len(ids) - 1, 16):
            x, y = ids[lo:lo + 16][: len(ids) - 1 - lo], ids[lo + 1:lo + 17]
            total += float(torch.nn.functional.cross_entropy(model(input_ids=x[None]).logits[0], y, reduction="sum"))
    assert res["status"] == "done" and res["eval_tokens"] == len(ids) - 1 == 999
    assert res["valid_loss"] == pytest.approx(total / 999, rel=1e-5)
    assert res["perplexity"] == pytest.approx(math.exp(total / 999), rel=1e-5)
