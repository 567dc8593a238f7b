"""Alerts: each condition on a hand-built table, warn once per head, stop, a function, the spike alarm."""

import logging
import math

import pytest
import torch

from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.watch.alerts import Alerts, Collapsed, Frozen, MaxScore, NonFinite, Spike, default_alerts
from attnscale.capture.stats import HeadStats

M = {name: i for i, name in enumerate(HEAD_MEASURES)}


def stats(layers=2, heads=3, **set_values) -> HeadStats:
    """A healthy table (spread 1, max |score| 3, 10 words, nothing frozen), with ``measure=[(l, h, v)]`` set."""
    values_LMH = torch.zeros(layers, len(HEAD_MEASURES), heads)
    values_LMH[:, M["spread"]] = 1.0
    values_LMH[:, M["max_score"]] = 3.0
    values_LMH[:, M["effective_words"]] = 10.0
    values_LMH[:, M["push"]] = 0.3
    values_LMH[:, M["max_weight"]] = 0.2
    for measure, cells in set_values.items():
        for layer, head, value in cells:
            values_LMH[layer, M[measure], head] = value
    return HeadStats(values_LMH, torch.full((layers, heads), 60.0), HEAD_MEASURES)


def test_a_healthy_table_fires_nothing():
    assert Alerts(default_alerts()).check(stats(), step=1) == []


@pytest.mark.parametrize("alert, measure, value, said", [
    (MaxScore(tau=100), "max_score", 131.0, "131"),
    (Collapsed(words=2), "effective_words", 1.4, "1.4"),
    (Frozen(limit=0.5), "frozen_fraction", 0.8, "80.0%"),
])
def test_each_condition_names_layer_head_step_and_value(alert, measure, value, said, caplog):
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        fired = Alerts([alert]).check(stats(**{measure: [(1, 2, value)]}), step=70)
    assert [(f.alert, f.layer, f.head, f.step) for f in fired] == [(alert.name, 1, 2, 70)]
    assert fired[0].value == pytest.approx(value)
    assert "step 70" in caplog.text and "layer 1 head 2" in caplog.text and said in caplog.text


def test_thresholds_are_strict_on_the_right_side():
    at = stats(max_score=[(0, 0, 100.0)], effective_words=[(0, 1, 2.0)], frozen_fraction=[(0, 2, 0.5)])
    assert Alerts([MaxScore(), Collapsed(), Frozen()]).check(at, step=1) == []


def test_nan_or_a_head_without_rows_is_non_finite():
    s = stats(spread=[(0, 1, math.nan)])
    rows = s.rows_LH.clone()
    rows[1, 0] = 0
    fired = Alerts([NonFinite()]).check(HeadStats(s.values_LMH, rows, HEAD_MEASURES), step=5)
    assert sorted((f.layer, f.head) for f in fired) == [(0, 1), (1, 0)]


def test_a_warning_is_said_once_per_head_and_condition_but_recorded_every_step(caplog):
    alerts = Alerts([MaxScore()])
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        for step in (10, 20, 30):
            fired = alerts.check(stats(max_score=[(0, 0, 200.0)]), step=step)
            assert len(fired) == 1  # the log's record of each step keeps it
        alerts.check(stats(max_score=[(0, 0, 200.0), (1, 1, 300.0)]), step=40)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "step 10" in said[0] and "layer 0 head 0" in said[0]
    assert "step 40" in said[1] and "layer 1 head 1" in said[1]


def test_stop_sets_should_stop_and_a_function_gets_the_firing():
    seen = []
    alerts = Alerts([Collapsed(action="stop"), MaxScore(action=seen.append)])
    alerts.check(stats(max_score=[(0, 1, 150.0)]), step=3)
    assert not alerts.should_stop and [(f.layer, f.head, f.step, f.action) for f in seen] == [(0, 1, 3, "call")]
    alerts.check(stats(effective_words=[(1, 0, 1.01)]), step=4)
    assert alerts.should_stop


def test_a_bad_action_is_refused():
    with pytest.raises(ValueError, match="action"):
        MaxScore(action="page me")


def test_spike_fires_on_a_jump_of_several_sd_over_its_own_window():
    """History 10, 11, 10, 11, ... (mean 10.5, SD 0.5): 14 is 7 SD up (fires at 6), 13 is 5 SD (does not)."""
    spike = Spike(measure="max_score", sigmas=6, window=8, min_history=4)
    alerts = Alerts([spike])
    for step in range(8):
        assert alerts.check(stats(max_score=[(0, 0, 10.0 + step % 2)]), step=step) == []
    assert alerts.check(stats(max_score=[(0, 0, 13.0)]), step=8) == []
    # the window now holds 13 too: recompute its mean and SD by hand for the next value
    window = [10.0 + s % 2 for s in range(1, 8)] + [13.0]
    mean = sum(window) / 8
    sd = math.sqrt(sum((x - mean) ** 2 for x in window) / 8)
    jump = mean + 6.5 * sd
    fired = alerts.check(stats(max_score=[(0, 0, jump)]), step=9)
    assert [(f.alert, f.layer, f.head, f.step) for f in fired] == [("spike", 0, 0, 9)]
    assert spike.z(window, jump) == pytest.approx(6.5)


def test_spike_waits_for_history_and_watches_its_direction():
    down = Alerts([Spike(measure="effective_words", direction="down", min_history=3, window=5)])
    for step in range(2):
        assert down.check(stats(effective_words=[(0, 0, 10.0 + step)]), step=step) == []
    assert down.check(stats(effective_words=[(0, 0, 1.0)]), step=2) == []  # two values: too little history
    watch = Alerts([Spike(measure="effective_words", direction="down", min_history=3, window=5)])
    for step in range(4):  # heads 0 and 1 alternate 10, 11: mean 10.5, SD 0.5
        watch.check(stats(effective_words=[(0, 0, 10.0 + step % 2), (0, 1, 10.0 + step % 2)]), step=step)
    rise_and_drop = stats(effective_words=[(0, 0, 30.0), (0, 1, 1.0)])  # +39 SD on head 0, -19 SD on head 1
    assert [(f.head, f.step) for f in watch.check(rise_and_drop, step=4)] == [(1, 4)]
