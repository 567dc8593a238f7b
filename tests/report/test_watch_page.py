"""report.watch_page, through attnscale watch-report: one self-contained page from a watch log; a bad log is one
line, exit 2."""

import re
from pathlib import Path

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


# ---- what the page never loses, and the logs it reads as they are found -------------------------------------


def _refused(argv, capsys, says: str) -> str:
    """``main(argv)`` ends in exit 2 and one error line holding ``says``, no traceback; returns stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("attnscale: error: "), err
    assert says in err.strip().splitlines()[-1], err
    return err


def test_out_is_never_the_log_it_reads(log, tmp_path, capsys):
    before = log.read_bytes()
    _refused(["watch-report", str(log), "--out", str(log)], capsys, "is the watch log it reads")
    _refused(["watch-report", str(log), "--out", str(tmp_path / "." / log.name)], capsys, "is the watch log it reads")
    assert log.read_bytes() == before
    named_html = tmp_path / "run.html"  # a log whose own name ends .html: the default page would be the log
    named_html.write_bytes(before)
    _refused(["watch-report", str(named_html)], capsys, "is the watch log it reads")
    assert named_html.read_bytes() == before


def test_out_never_replaces_a_file_it_did_not_write(log, tmp_path, capsys):
    notes = tmp_path / "notes.html"
    notes.write_text("<!DOCTYPE html><p>my notes</p>")
    _refused(["watch-report", str(log), "--out", str(notes)], capsys, "is not a page attnscale watch-report wrote")
    assert notes.read_text() == "<!DOCTYPE html><p>my notes</p>"
    _refused(["watch-report", str(log), "--out", str(tmp_path)], capsys, "is a folder")
    # its own page is rewritten, as often as asked
    page = tmp_path / "page.html"
    assert main(["watch-report", str(log), "--out", str(page)]) == 0
    assert watch_page.MARK in page.read_text()
    assert main(["watch-report", str(log), "--out", str(page)]) == 0
    # a page written before the marker: known by the head this module has always given it
    page.write_text(page.read_text().replace(watch_page.MARK, ""))
    assert main(["watch-report", str(log), "--out", str(page)]) == 0


def test_a_killed_runs_log_is_read_to_its_last_complete_record(log, capsys):
    text = log.read_text()
    log.write_text(text + _record(40).to_line()[:57])  # killed while writing step 40
    before = log.read_bytes()
    assert main(["watch-report", str(log)]) == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"attnscale: {log}: line 4 was cut short (a run killed while writing); "
                                        "read the 3 complete records"]
    assert "3 probe steps, 10 to 30" in log.with_suffix(".html").read_text()
    assert log.read_bytes() == before


@pytest.mark.parametrize("lines", [1, 3])
def test_a_log_that_starts_with_a_byte_order_mark_is_read_as_text(log, lines, capsys):
    """An editor's save or a Windows tool puts a UTF-8 byte-order mark first: text, not a line cut short."""
    text = "".join(line + "\n" for line in log.read_text().splitlines()[:lines])
    log.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert main(["watch-report", str(log)]) == 0
    assert capsys.readouterr().err == ""  # no note: nothing was cut, and one run
    page = log.with_suffix(".html").read_text()
    assert f"{lines} probe steps, 10 to {10 * lines}" in page


def test_a_run_resumed_after_a_kill_is_read_past_the_cut_line(tmp_path):
    """A run killed mid-line, then started again on the same log: its first record is glued to the cut one."""
    from attnscale.watch.logs.line import read_watch_log

    path = tmp_path / "watch.jsonl"
    path.write_text(_record(10).to_line() + _record(20).to_line()[:40] + _record(10).to_line() + _record(20).to_line())
    read = read_watch_log(path)
    assert [r.step for r in read.records] == [10, 10, 20] and read.cut == (2,) and read.lines == [1, 2, 3]
    assert read.runs() == [[0], [1, 2]] and [r.step for r in read.last_run().records] == [10, 20]


def test_a_run_resumed_from_a_checkpoint_is_one_run_from_its_first_step(tmp_path):
    """Steps 10..40 logged, the run killed and resumed from its step-20 checkpoint: the records at 30 and 40
    are superseded by the resumed run's, which goes on; the run is still one, starting at step 10."""
    from attnscale.watch.logs.line import read_watch_log

    path = tmp_path / "watch.jsonl"
    path.write_text("".join(_record(s).to_line() for s in (10, 20, 30, 40, 30, 40, 50)))
    read = read_watch_log(path)
    assert read.runs() == [[0, 1, 4, 5, 6]] and read.runs_note() is None
    shown = read.last_run()
    assert [r.step for r in shown.records] == [10, 20, 30, 40, 50] and shown.lines == [1, 2, 5, 6, 7]
    # a step back to the run's first step or before is a run started again, not a resume
    path.write_text("".join(_record(s).to_line() for s in (10, 20, 30, 10, 20)))
    assert read_watch_log(path).runs() == [[0, 1, 2], [3, 4]]


@pytest.mark.parametrize("edit, says", [
    (lambda line: line.replace('"step": 20', '"step": Infinity'), ":2 holds Infinity, which a Watch never writes"),
    (lambda line: line.replace('"values": [[[', '"values": [[["high", '), ":2 lacks a well-formed field ('values' holds 'high'"),
    (lambda line: line.replace('"step": 20', '"step": "20"'), ":2 lacks a well-formed field ('step' is '20'"),
    (lambda line: line.replace('"alerts": [{"alert": "max_score", "layer": 1', '"alerts": [{"alert": "max_score", "layer": null'),
     ":2 lacks a well-formed field (an alert lacks its name, layer, head or step"),
])
def test_a_bad_record_is_one_line_naming_its_line(log, edit, says, capsys):
    lines = log.read_text().splitlines(keepends=True)
    lines[1] = edit(lines[1])
    log.write_text("".join(lines))
    before = log.read_bytes()
    _refused(["watch-report", str(log)], capsys, says)
    assert log.read_bytes() == before and not log.with_suffix(".html").exists()


def _wider(step: int) -> WatchLine:
    """Another model's record: 3 layers of 2 heads."""
    r = _record(step)
    return WatchLine(step=step, time=r.time, measures=r.measures, values=[[heads[:2] for heads in r.values[0]]] * 3,
                     rows=[[30] * 2] * 3, summary=r.summary, probe=r.probe, threshold=r.threshold)


@pytest.mark.parametrize("second, shown", [(_record, "2 layers × 3 heads"), (_wider, "3 layers × 2 heads")])
def test_two_runs_in_one_log_show_the_last_with_a_note(log, second, shown, capsys):
    sink = JsonlSink(log)  # a second run appends to the same file; the wider model's steps even go on rising
    for step in ((40, 50) if second is _wider else (10, 20)):
        sink.write(second(step))
    sink.close()
    assert main(["watch-report", str(log)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    steps = "40 to 50" if second is _wider else "10 to 20"
    assert err == [f"attnscale: {log} holds 2 runs (the steps start again, or the table changes shape, at line 4); "
                   f"shown: the last, lines 4 to 5, steps {steps}; give each run its own log to see the others"]
    html = log.with_suffix(".html").read_text()
    assert f"2 probe steps, {steps}; {shown}" in html and "holds 2 runs" in html


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1", "soon"])
def test_follow_seconds_are_checked_before_anything_is_read(log, value, capsys):
    _refused(["watch-report", str(log), "--follow", value], capsys, f"--follow takes a positive number of seconds, got {value}")
    _refused(["watch-report", str(log), "--follow", "--give-up", value], capsys, f"--give-up takes a positive number")
    assert not log.with_suffix(".html").exists()


def test_give_up_goes_with_follow(log, capsys):
    _refused(["watch-report", str(log), "--give-up", "5"], capsys, "--give-up goes with --follow")


@pytest.mark.parametrize("content, says", [
    (None, "it is a folder"),
    ('{"schema": "attnscale.watch", "version": 99, "step": 1}\n', "version 99"),
    ("step,time,layer\n1,2,3\n", ":1 is not JSON"),
])
def test_follow_refuses_at_once_what_it_can_never_read(tmp_path, content, says, capsys):
    path = tmp_path / "watch.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    # --give-up of an hour: a refusal that waited would hang the test, not pass it
    err = _refused(["watch-report", str(path), "--follow", "0.01", "--give-up", "3600"], capsys, says)
    assert len(err.strip().splitlines()) == 1  # refused before it says what it would wait for
    if content is not None:
        assert path.read_text() == content


def test_follow_says_what_it_waits_for_once_then_gives_up(tmp_path, capsys):
    path = tmp_path / "watch.jsonl"
    path.write_text("")
    err = _refused(["watch-report", str(path), "--follow", "0.01", "--give-up", "0.2"], capsys,
                   "gave up following")
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"attnscale: following {path}: ") and "0.2 s without one" in lines[0]
    assert lines[1:-1] == [f"attnscale: waiting for the first record in {path}"]
    assert "still holds no complete record in 0.2 s" in lines[-1]
    assert path.read_text() == "" and not path.with_suffix(".html").exists()


def test_follow_stops_with_a_message_when_the_writer_died(log, capsys):
    log.write_text(log.read_text() + _record(40).to_line()[:57])
    before = log.read_bytes()
    assert main(["watch-report", str(log), "--follow", "0.01", "--give-up", "0.2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines() == [f"page: {log.with_suffix('.html')} (3 probe steps, the last at step 30)"]
    assert captured.err.strip().splitlines()[-1] == (
        f"attnscale: stopped following {log}: no new record in 0.2 s; its last line is cut short, as a run killed "
        f"while writing leaves it; the page stays at {log.with_suffix('.html')}")
    assert log.read_bytes() == before


def test_follow_says_once_when_a_second_run_starts_in_the_log(log):
    said, warned = [], []
    pending = [lambda: None, lambda: JsonlSink(log).write(_record(10)), lambda: None]  # one action a check
    stop = lambda: not pending or bool(pending.pop(0)())  # noqa: E731  each action returns None: go on
    out = watch_page.follow(log, every=0.01, say=said.append, warn=warned.append, stop=stop)
    assert said == [f"page: {out} (3 probe steps, the last at step 30)", f"page: {out} (1 probe steps, the last at step 10)"]
    assert len(warned) == 1 and warned[0].startswith(f"{log} holds 2 runs") and "lines 4 to 4, steps 10 to 10" in warned[0]


@pytest.fixture
def figures(monkeypatch):
    """Every figure the page draws, by file name, kept as it is saved."""
    drawn = {}
    save = watch_page.drawing.save

    def keep(fig, path):
        drawn[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(watch_page.drawing, "save", keep)
    return drawn


def test_the_last_probe_names_measures_as_the_readme_does_and_shares_as_percents(log, tmp_path):
    text = watch_page.build(log, tmp_path / "page.html").read_text()
    cells = re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">([^<]+)</td><td>([^<]+)</td></tr>", text)
    assert ("frozen share of rows (all heads)", "5.00%", "attn/frozen_fraction") in cells  # the log's 0.05
    assert ("max |score| (the largest of any head)", "38", "attn/max_score") in cells
    assert [row[0] for row in watch_page.summary_rows({"attn/min_effective_words": 1.5, "new/key": 2.0})] == [
        "effective words (the fewest of any head)", "new/key"]  # a key it does not know keeps its own name


def test_the_alerts_panel_is_drawn_only_where_an_alert_fired(tmp_path, figures):
    quiet = JsonlSink(tmp_path / "quiet.jsonl")
    for step in (10, 20):
        quiet.write(_record(step))
    quiet.close()
    watch_page.build(tmp_path / "quiet.jsonl", tmp_path / "quiet.html")
    assert len(figures["steps.png"].axes) == 2 and "No alert fired." in (tmp_path / "quiet.html").read_text()
    fired = JsonlSink(tmp_path / "fired.jsonl")
    fired.write(_record(10, [_alert(10, 0, 0)]))
    fired.close()
    watch_page.build(tmp_path / "fired.jsonl", tmp_path / "fired.html")
    assert [ax.get_title() for ax in figures["steps.png"].axes][2] == "Alerts (one mark per head and step)"


def test_the_colour_bars_read_round_numbers_written_plainly(log, tmp_path, figures):
    watch_page.build(log, tmp_path / "page.html")
    labels = [t.get_text() for ax in figures["heads.png"].axes if ax.get_label() == "<colorbar>"
              for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(re.fullmatch(r"[\d,]+(\.\d+)?", t) for t in labels), labels  # never 6×10⁰
    assert watch_page.round_ticks(1.37, 13.7) == [2, 5, 10] and watch_page.round_ticks(5.1, 8.3) == [6, 7, 8]
    assert watch_page.round_ticks(3, 3e4) == [10, 100, 1000, 10000]


def test_the_baselines_sink_and_previous_token_heads_are_marked_with_their_words_then_and_now(tmp_path):
    import dataclasses

    base = dataclasses.replace(_record(0), kinds=[["sink", "", ""], ["", "previous", ""]])
    records = [base, _record(10), _record(20)]
    assert watch_page.baseline_kinds(records) == (0, base.kinds)
    assert watch_page.head_labels(records) == ["0.0 sink", "0.1", "0.2", "1.0", "1.1 prev", "1.2"]
    sink = JsonlSink(tmp_path / "w.jsonl")
    for r in records:
        sink.write(r)
    sink.close()
    text = watch_page.build(tmp_path / "w.jsonl", tmp_path / "page.html").read_text()
    assert "Sink and previous-token heads" in text
    rows = re.findall(r"<tr><td class=\"num\">(\d)</td><td class=\"num\">(\d)</td><td>([\w-]+)</td>"
                      r"<td class=\"num\">([\d.]+)</td><td class=\"num\">([\d.]+)</td>", text)
    # words of head (l, h) at step s: 10 - h - s / 50
    assert rows == [("0", "0", "sink", "10", "9.6"), ("1", "1", "previous-token", "9", "8.6")]


def test_a_log_whose_baseline_marks_no_kind_says_so_and_one_that_marks_none_has_no_such_panel(tmp_path, log):
    import dataclasses

    text = watch_page.build(log, tmp_path / "page.html").read_text()
    assert "Sink and previous-token heads" not in text  # no record marks the heads' kinds: no empty panel
    plain = dataclasses.replace(_record(0), kinds=[[""] * 3] * 2)
    assert watch_page.head_labels([plain]) == ["0.0", "0.1", "0.2", "1.0", "1.1", "1.2"]
    sink = JsonlSink(tmp_path / "w.jsonl")
    sink.write(plain)
    sink.write(_record(10))
    sink.close()
    text = watch_page.build(tmp_path / "w.jsonl", tmp_path / "page2.html").read_text()
    assert "No head was a sink or previous-token head at step 0." in text
