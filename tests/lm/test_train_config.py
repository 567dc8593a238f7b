"""lm.train_config: every field of TrainConfig refuses a hostile value in one line naming it, and lr_at's schedule
at its corners, against the formulas written out here."""

import math

import pytest

from attnscale.errors import ConfigError
from attnscale.lm.train_config import WSD_STABLE, TrainConfig, lr_at


@pytest.mark.parametrize("field, value, says", [
    ("steps", 0, "steps"), ("steps", 1.5, "steps"), ("batch", -1, "batch"), ("record_every", 0, "record_every"),
    ("warmup", -1, "warmup"), ("warmup", 2.0, "warmup"), ("lr", 0, "lr"), ("lr", math.nan, "lr"),
    ("lr", math.inf, "lr"), ("lr", "1e-3", "lr"), ("min_lr_ratio", 1.5, "min_lr_ratio"),
    ("weight_decay", -0.1, "weight_decay"), ("clip", 0, "clip"), ("beta2", 1.0, "beta2"),
    ("eval_batches", 0, "eval_batches"), ("dtype", "fp64", "dtype"), ("threads", 0, "threads"),
    ("checkpoint_every", -1, "checkpoint_every"), ("device", "tpu", "device"), ("attention", "flash", "attention"),
    ("weights", "fp16", "weights"), ("z_loss", -1e-4, "z_loss"), ("beta1", 1.0, "beta1"), ("adam_eps", 0, "adam_eps"),
    ("independent_wd", 1, "independent_wd"), ("optimizer", "sgd", "optimizer"), ("optimizer", None, "optimizer"),
    ("schedule", "linear", "schedule"), ("eval_every", True, "eval_every"), ("eval_every", -5, "eval_every"),
    ("frozen_threshold", 1.0, "frozen_threshold"), ("weight_decay", math.nan, "weight_decay"),
    ("weight_decay", math.inf, "weight_decay"), ("clip", math.inf, "clip"), ("min_lr_ratio", "0.1", "min_lr_ratio"),
    ("beta2", True, "beta2"), ("z_loss", math.nan, "z_loss"), ("adam_eps", None, "adam_eps"),
])
def test_a_hostile_field_is_one_line_naming_it(field, value, says):
    with pytest.raises(ConfigError, match=says) as e:
        TrainConfig(**{field: value})
    assert "\n" not in str(e.value)


def test_bf16_weights_need_bf16_compute_and_wsd_needs_its_warmup_before_the_cool_down():
    with pytest.raises(ConfigError, match="weights 'bf16' need dtype bf16"):
        TrainConfig(weights="bf16", dtype="fp32")
    with pytest.raises(ConfigError, match="runs past the wsd cool-down at step 80"):
        TrainConfig(schedule="wsd", steps=100, warmup=81)


def test_lr_at_is_the_warm_up_then_the_schedules_decay():
    cfg = TrainConfig(steps=110, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in (0, 4, 9)] == [pytest.approx(0.1), pytest.approx(0.5), pytest.approx(1.0)]
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # half-way: 0.55
    assert lr_at(110, cfg) == pytest.approx(0.1) and lr_at(500, cfg) == pytest.approx(0.1)
    wsd = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1, schedule="wsd")
    stable = int(WSD_STABLE * 100)
    assert lr_at(stable, wsd) == pytest.approx(1.0) and lr_at(stable - 1, wsd) == pytest.approx(1.0)
    assert lr_at(90, wsd) == pytest.approx(1.0 - 0.9 * 10 / 20) and lr_at(100, wsd) == pytest.approx(0.1)
