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


@pytest.mark.parametrize("alert, measure, base, still, moved", [
    # a sink head at 1.5 words from the start: 1.0 is under 2 but not a halving; 0.7 is both
    (Collapsed(relative=True), "effective_words", 1.5, 1.0, 0.7),
    # a head born at 150: 250 is over tau but not double; 320 is both
    (MaxScore(relative=True), "max_score", 150.0, 250.0, 320.0),
    # 60% frozen from the start (40% not frozen): 70% is over the limit; 85% leaves 15%, under half of 40%
    (Frozen(relative=True), "frozen_fraction", 0.6, 0.7, 0.85),
])
def test_a_relative_alert_fires_on_a_head_past_its_line_and_moved_from_its_own_baseline(alert, measure, base,
                                                                                        still, moved, caplog):
    alerts = Alerts([alert])
    absolute = Alerts([type(alert)()])
    first = stats(**{measure: [(1, 2, base)]})
    assert alerts.check(first, step=0) == [] and absolute.check(first, step=0) != []  # the baseline itself
    assert alerts.check(stats(**{measure: [(1, 2, still)]}), step=1) == []
    # a head of 10 words (3 max |score|, 0 frozen) that moved past the line fires from its own baseline too
    healthy = {"effective_words": 1.9, "max_score": 101.0, "frozen_fraction": 0.51}[measure]
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        fired = alerts.check(stats(**{measure: [(1, 2, moved), (0, 0, healthy)]}), step=2)
    assert sorted((f.layer, f.head) for f in fired) == [(0, 0), (1, 2)]
    assert "2-fold from its baseline" in caplog.text


def test_a_relative_alerts_baseline_is_its_first_check_and_goes_with_its_state():
    alerts = Alerts([Collapsed(relative=True, factor=4)])
    alerts.check(stats(effective_words=[(0, 0, 6.0)]), step=0)
    resumed = Alerts([Collapsed(relative=True, factor=4)])
    resumed.load_state_dict(alerts.state_dict())
    assert resumed.check(stats(effective_words=[(0, 0, 1.9)]), step=5) == []  # 6 / 1.9 < 4
    assert [f.head for f in resumed.check(stats(effective_words=[(0, 0, 1.4)]), step=6)] == [0]
    fresh = Alerts([Collapsed(relative=True, factor=4)])  # with no state, 1.4 would be its own baseline
    assert fresh.check(stats(effective_words=[(0, 0, 1.4)]), step=6) == []


@pytest.mark.parametrize("options, says", [({"factor": 1.0}, "factor takes a finite number above 1"),
                                           ({"relative": "yes"}, "relative takes True or False")])
def test_a_relative_alerts_options_are_checked(options, says):
    from attnscale.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        Collapsed(**options)


def test_a_check_that_does_not_act_says_and_returns_its_firings_but_neither_stops_nor_takes_an_action():
    from attnscale.watch.actions import ScaleLR

    alerts = Alerts([MaxScore(tau=100, action="stop"), MaxScore(tau=100, action=ScaleLR(0.5))])
    fired = alerts.check(stats(max_score=[(0, 0, 131.0)]), step=0, act=False)
    assert len(fired) == 2 and not alerts.should_stop and alerts.due == [] and alerts.taken == set()
    alerts.check(stats(max_score=[(0, 0, 131.0)]), step=2)
    assert alerts.should_stop and [f.step for _, f in alerts.due] == [2]
