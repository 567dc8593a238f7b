"""watch.arguments: what the Watch refuses as it is made, each a one-line ConfigError naming the fix."""

import pytest

from attnscale.errors import ConfigError
from attnscale.watch.actions import ClipQK, ScaleLR
from attnscale.watch.alerts import MaxScore, NonFinite
from attnscale.watch.arguments import check_clip_check, clip_fights, one_line, outputs, step_number
from attnscale.watch.logs.sinks import JsonlSink


@pytest.mark.parametrize("sinks, alerts, says", [
    ("watch.jsonl", None, r"sinks=\[JsonlSink\('watch.jsonl'\)\]"),
    (JsonlSink, None, r"wrap it: sinks=\[JsonlSink\(\.\.\.\)\]"),
    (["watch.jsonl"], None, r"sinks=\[JsonlSink\('watch.jsonl'\)\]"),
    ([], "max_score", r"alerts=\[MaxScore\(tau=100\), NonFinite\(\)\]"),
    ([], [MaxScore], r"not the class MaxScore: give MaxScore\(...\)"),
    ([], MaxScore(), r"give alerts=\[MaxScore\(\.\.\.\)\]"),
    ([], [None], "an alert is one of attnscale.watch's alerts"),
])
def test_outputs_refuse_what_is_no_sink_or_alert_naming_the_fix(sinks, alerts, says):
    with pytest.raises(ConfigError, match=says) as e:
        outputs(sinks, alerts)
    assert "\n" not in str(e.value)


def test_outputs_take_lists_and_refuse_a_closed_sink(tmp_path):
    sink = JsonlSink(tmp_path / "w.jsonl")
    assert outputs([sink], None) == ([sink], None)
    assert outputs((sink,), [NonFinite()])[1] == (NonFinite(),)
    sink.closed = True
    with pytest.raises(ConfigError, match="a sink is closed"):
        outputs([sink], None)


def test_a_max_score_at_or_under_the_clips_tau_fights_it_and_one_that_acts_does_not():
    with pytest.raises(ConfigError, match=r"MaxScore\(tau=30\) and QK-Clip at tau=30 would fight"):
        clip_fights([MaxScore(tau=30)], 30.0)
    with pytest.raises(ConfigError, match="would fight"):
        clip_fights([MaxScore(tau=50), MaxScore(tau=200, action=ClipQK(100))], None)
    clip_fights([MaxScore(tau=61)], 30.0)  # above the clip: it fires where the clip lost hold
    clip_fights([MaxScore(tau=30, action=ScaleLR(0.5))], 30.0)  # acts once
    clip_fights("not a list", 30.0)  # refused by its own check


@pytest.mark.parametrize("check, clip, alerts, says", [
    ("yes", 30.0, [], "qk_clip_check takes True or False"), (1, 30.0, [], "takes True or False"),
    (True, None, [], "give qk_clip="), (True, None, [MaxScore(tau=200)], "give qk_clip="),
])
def test_qk_clip_check_is_a_flag_and_needs_a_clip(check, clip, alerts, says):
    with pytest.raises(ConfigError, match=says):
        check_clip_check(check, clip, alerts)


def test_a_step_is_an_int_and_an_exception_is_one_line():
    import numpy as np

    assert step_number(3) == 3 and step_number(np.int64(4)) == 4
    for bad in (1.0, True, "3", None):
        with pytest.raises(ConfigError, match="Watch.step takes the step's number"):
            step_number(bad)
    assert one_line(OSError(28, "No space left on device")) == "OSError: [Errno 28] No space left on device"
    assert one_line(ValueError("first\nsecond")) == "ValueError: first" and one_line(KeyError()) == "KeyError"
