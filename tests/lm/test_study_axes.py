"""The setup study's definitions: reading an axis back from a recorded config, and how values read."""

from types import SimpleNamespace

from attnscale.lm.study_axes import AXES, SCHEDULES, is_study, label, lr_text, value_of
from attnscale.lm.train import TrainConfig


def test_value_of_reads_the_axis_back_from_a_config():
    model, train = {"init": "unit", "norm": "pre"}, {"lr": 0.009, "min_lr_ratio": 1.0, "weight_decay": 0.0, "steps": 1200}
    assert [value_of(a, model, train) for a in AXES] == [0.009, "constant", 0.0, "unit", "pre", 1200]
    assert value_of("schedule", {}, {"min_lr_ratio": 0.1}) == "cosine"
    assert [label("lr", 0.009), label("lr", 1e-3), label("weight_decay", 0.0), label("steps", 1200)] == \
        ["9e-3", "1e-3", "0", "1200"]


def test_a_learning_rate_is_written_without_trailing_zeros():
    assert [lr_text(x) for x in (3e-3, 9.5e-4, 1e-2, 1.25e-3, 3e-2)] == ["3e-3", "9.5e-4", "1e-2", "1.25e-3", "3e-2"]


def test_each_schedule_reads_back_as_itself():
    # the cosine floor is the training default's, so a default run reads as cosine
    assert SCHEDULES["cosine"] == TrainConfig().min_lr_ratio < 1.0
    assert [value_of("schedule", {}, {"min_lr_ratio": r}) for r in SCHEDULES.values()] == list(SCHEDULES)


def test_a_study_run_is_one_whose_group_names_a_known_axis():
    assert [is_study(SimpleNamespace(group=g)) for g in ("study:base", "study:lr", "study:color", "sweep")] == \
        [True, True, False, False]


def test_a_combination_reads_back_every_setting_it_changes_in_one_order():
    from attnscale.lm.study_axes import combine, setting_text

    axis, value = combine({"weight_decay": 0.0, "lr": 0.009, "schedule": "constant"})  # given out of order
    assert (axis, value) == ("lr+schedule+weight_decay", (0.009, "constant", 0.0))
    model, train = {}, {"lr": 0.009, "min_lr_ratio": 1.0, "weight_decay": 0.0}
    assert value_of(axis, model, train) == value
    assert label(axis, value) == "9e-3 + constant + 0"
    assert setting_text(axis, label(axis, value)) == "learning rate 9e-3 + schedule constant + weight decay 0"
    assert setting_text("norm", "pre") == "norm placement pre" and setting_text("base", "base") == "base"


def test_a_combination_is_a_study_only_of_distinct_known_axes_in_order():
    groups = ["study:schedule+weight_decay", "study:weight_decay+schedule", "study:lr+lr", "study:lr+color"]
    assert [is_study(SimpleNamespace(group=g)) for g in groups] == [True, False, False, False]
