"""attnscale watch-report: one self-contained page from a watch log; a bad log is one line, exit 2."""

import re

import numpy as np
import pytest

from attnscale.cli import main
from attnscale.core.gaussian_scores import expected_effective_words
from attnscale.report import watch_page
from attnscale.watch.logs.line import WatchLine
from attnscale.watch.logs.sinks import JsonlSink

MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")


def _record(step: int, alerts=()) -> WatchLine:
    """2 layers × 3 heads; spread of head (l, h) = 0.5 + l + 0.25 h + step / 100, words 10 − h − step / 50."""
    values = []
    for layer in range(2):
        by_measure = {"spread": [0.5 + layer + 0.25 * h + step / 100 for h in range(3)],
                      "max_score": [3.0 * (layer + 1) + h + step for h in range(3)],
                      "effective_words": [10.0 - h - step / 50 for h in range(3)],
                      "frozen_fraction": [0.1 * layer + step / 1000 for h in range(3)],
                      "push": [0.3] * 3, "max_weight": [0.2] * 3}
        values.append([by_measure[m] for m in MEASURES])
    return WatchLine(step=step, time=1.7e9 + step, measures=MEASURES, values=values, rows=[[30] * 3] * 2,
                       summary={"attn/max_score": 8.0 + step, "attn/frozen_fraction": 0.05},
                       alerts=list(alerts), watch={"seconds": 0.01, "total_seconds": 0.1, "share": 0.004},
                       probe={"sequences": 4, "tokens": 32}, threshold=0.99)


def _alert(step, layer, head, name="max_score"):
    return {"alert": name, "layer": layer, "head": head, "step": step, "value": 123.0, "action": "warn", "message": ""}


@pytest.fixture
def log(tmp_path):
    sink = JsonlSink(tmp_path / "watch.jsonl")
    sink.write(_record(10))
    sink.write(_record(20, [_alert(20, 1, 2)]))
    sink.write(_record(30, [_alert(30, 1, 2), _alert(30, 0, 1, "collapsed")]))
    sink.close()
    return tmp_path / "watch.jsonl"


def test_grid_rows_are_layer_dot_head_and_columns_steps():
    grid = watch_page.grid_over_steps([_record(10), _record(20)], "max_score")
    assert grid.shape == (6, 2)
    assert grid[1 * 3 + 2].tolist() == [3.0 * 2 + 2 + 10, 3.0 * 2 + 2 + 20]


def test_the_reference_is_random_scores_at_each_heads_own_spread():
    r = _record(20)
    measured, expected = watch_page.reference_words(r)
    spreads = [0.5 + l + 0.25 * h + 0.2 for l in range(2) for h in range(3)]
    assert expected == pytest.approx(np.mean([expected_effective_words(s, 32, causal=True) for s in spreads]))
    assert measured == pytest.approx(np.mean([10.0 - h - 0.4 for h in range(3)]))
    # random scores of spread near 0 spread over about as many words as a causal row sees on average
    assert watch_page.reference_words(_record(0))[1] < np.mean(range(2, 33))


def test_first_firings_keep_the_first_step_of_each_alert_and_head(log):
    firings = watch_page.first_firings(watch_page.read_log(log))
    assert [(a["alert"], a["layer"], a["head"], a["step"]) for a in firings] == [("max_score", 1, 2, 20),
                                                                              ("collapsed", 0, 1, 30)]


def test_the_page_is_one_offline_file_with_its_figures_and_alert_table(log, tmp_path):
    page = watch_page.build(log, tmp_path / "page.html")
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 2
    assert not re.search(r"(src|href)=\"https?:", text)
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td class=\"num\">(\d)</td><td class=\"num\">(\d)</td><td>(\w+)</td>", text)
    assert rows == [("20", "1", "2", "max_score"), ("30", "0", "1", "collapsed")]
    assert "3 probe steps, 10 to 30; 2 layers × 3 heads" in text
    measured, expected = watch_page.reference_words(_record(30))
    assert f"{measured:.3g} effective words" in text and f"{expected:,.4g}" in text


def test_cli_writes_the_page_beside_the_log(log, tmp_path, capsys):
    assert main(["watch-report", str(log)]) == 0
    assert (tmp_path / "watch.html").exists() and "page:" in capsys.readouterr().out


@pytest.mark.parametrize("content, says", [("{oops\n", "is not JSON"), (None, "cannot read watch log")])
def test_cli_refuses_a_bad_log_in_one_line(tmp_path, content, says, capsys):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["watch-report", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
