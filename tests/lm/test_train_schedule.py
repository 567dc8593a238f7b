"""The named learning-rate schedule (cosine, wsd) and the held-out loss every ``eval_every`` steps."""

import math

import pytest
import torch

from attnscale.errors import ConfigError
from attnscale.lm.checkpoint import comparable_config
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.train import TrainConfig, evaluate, lr_at, train
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)

torch.set_num_threads(1)


def test_wsd_warms_up_holds_then_falls_in_a_straight_line_to_the_floor():
    cfg = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1, schedule="wsd")
    # by hand: warm-up (s+1)/10; 1 until step 80 (80% of 100); then 1 − 0.9·(s − 80)/20
    corners = {0: 0.1, 4: 0.5, 9: 1.0, 10: 1.0, 50: 1.0, 79: 1.0, 80: 1.0, 90: 0.55, 99: 0.145, 100: 0.1}
    for step, want in corners.items():
        assert lr_at(step, cfg) == pytest.approx(want, abs=1e-12), step


def test_wsd_at_the_end_state_budget_holds_3e3_to_step_5760():
    cfg = TrainConfig(steps=7200, lr=3e-3, warmup=40, min_lr_ratio=0.1, schedule="wsd")
    assert lr_at(39, cfg) == pytest.approx(3e-3) and lr_at(5759, cfg) == 3e-3 and lr_at(5760, cfg) == 3e-3
    assert lr_at(6480, cfg) == pytest.approx(3e-3 - 2.7e-3 * 720 / 1440)  # half-way down: 1.65e-3
    assert lr_at(7200, cfg) == pytest.approx(3e-4)


def test_cosine_is_still_the_default_and_unchanged():
    cfg = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert cfg.schedule == "cosine" and cfg.eval_every == 0
    assert lr_at(40, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 30 / 90)))


def test_a_bad_schedule_or_eval_every_is_one_line_naming_the_fix():
    with pytest.raises(ConfigError, match="schedule 'linear' is unknown; choose one of: cosine, wsd"):
        TrainConfig(schedule="linear")
    with pytest.raises(ConfigError, match="warmup 90 runs past the wsd cool-down at step 80"):
        TrainConfig(steps=100, warmup=90, schedule="wsd")
    with pytest.raises(ConfigError, match="eval_every must be a non-negative integer"):
        TrainConfig(eval_every=-1)


def test_a_config_written_before_the_schedule_existed_is_the_same_cosine_run():
    before = {"model": {"d_model": 64}, "train": {"steps": 10, "lr": 3e-3}}
    now = {"model": {"d_model": 64}, "train": {"steps": 10, "lr": 3e-3, "schedule": "cosine", "eval_every": 0}}
    assert comparable_config(before) == comparable_config(now)
    assert comparable_config(before) != comparable_config({**now, "train": {**now["train"], "schedule": "wsd"}})
    assert comparable_config(before) != comparable_config({**now, "train": {**now["train"], "eval_every": 5}})


def _cfgs(**kw):
    model = ModelConfig(vocab_size=V, context=8, d_model=16, n_layers=1, n_heads=2, head_dim=4)
    # a constant rate (cosine from 1 to 1): the first 3 steps of a 6-step run are a 3-step run
    train_cfg = TrainConfig(**{**dict(steps=6, batch=4, lr=1e-2, warmup=0, min_lr_ratio=1.0, record_every=3,
                                      eval_batches=None, eval_every=3, threads=1), **kw})
    return model, train_cfg


def test_eval_every_gives_the_held_out_loss_at_its_steps_as_evaluate_does(corpus, tmp_path):
    model_cfg, train_cfg = _cfgs()
    got = train(model_cfg, train_cfg, corpus, weights=tmp_path / "w.safetensors")
    assert [e["step"] for e in got["evals"]] == [3, 6]
    # the last is the run's own evaluation, and evaluate on the saved weights gives it again
    from safetensors.torch import load_file

    model = TinyLM(model_cfg)
    model.load_state_dict(load_file(tmp_path / "w.safetensors"))
    again = evaluate(model, corpus.valid, 4, None)
    assert got["evals"][-1]["valid_loss"] == pytest.approx(again["valid_loss"], rel=1e-6)
    assert got["evals"][-1]["perplexity"] == pytest.approx(got["perplexity"], rel=1e-12)
    # the one at step 3 is what a 3-step run ends with
    short = train(model_cfg, TrainConfig(**{**train_cfg.__dict__, "steps": 3, "eval_every": 0}), corpus)
    assert got["evals"][0]["valid_loss"] == pytest.approx(short["valid_loss"], rel=1e-6)
    assert got["evals"][0]["valid_loss"] != pytest.approx(got["evals"][1]["valid_loss"], rel=1e-6)
    assert train(model_cfg, TrainConfig(**{**train_cfg.__dict__, "eval_every": 0}), corpus)["evals"] == []


def test_a_resumed_run_keeps_the_held_out_losses_it_had(corpus, tmp_path):
    model_cfg, train_cfg = _cfgs(steps=9, checkpoint_every=2)
    whole = train(model_cfg, train_cfg, corpus)
    calls = iter(range(100))
    stopped = train(model_cfg, train_cfg, corpus, checkpoint=tmp_path / "c.pt", should_stop=lambda: next(calls) >= 5)
    assert stopped["status"] == "stopped" and [e["step"] for e in stopped["evals"]] == [3]
    resumed = train(model_cfg, train_cfg, corpus, checkpoint=tmp_path / "c.pt")
    assert resumed["resumed_from"] == 4
    assert [e["step"] for e in resumed["evals"]] == [3, 6, 9]
    for a, b in zip(resumed["evals"], whole["evals"]):
        assert a["valid_loss"] == pytest.approx(b["valid_loss"], rel=1e-6)
