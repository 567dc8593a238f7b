"""assemble: load the runs folder (a bad or partial record is noted, never fatal; none at all is one line),
judge (a claim that differs names the study that measured it), and build the same report from the same
records; one test runs the real spread and fresh experiments at tiny sizes to hold the contract between them
and the report."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from attnscale import report
from attnscale.errors import ConfigError
from attnscale.report import assemble, course, setup_section
from test_report import _record, _spread_rows, _train, write_runs


def _tables(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("|")]


def test_rebuild_gives_the_same_report(tmp_path):
    runs = write_runs(tmp_path / "runs")
    a, b = report.build(runs, tmp_path / "a"), report.build(runs, tmp_path / "b")
    assert _tables(a["markdown"].read_text()) == _tables(b["markdown"].read_text())
    assert a["markdown"].read_text() == b["markdown"].read_text()
    assert a["html"].read_bytes() == b["html"].read_bytes()  # PNGs carry no timestamp


def test_no_records_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no run records") as info:
        report.build(tmp_path)
    assert "\n" not in str(info.value) and "no run records" in str(info.value)
    assert not (tmp_path / "report").exists()


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_bad_and_partial_records_are_noted_not_fatal(tmp_path):
    runs = write_runs(tmp_path / "runs", training=False)
    (runs / "broken").mkdir()
    (runs / "broken" / "record.json").write_text("{not json")
    _record(runs / "spread-old", "spread", {}, _spread_rows()[:2], finished=1.0)
    _train(runs, "dynamics", 256, "none", 0, ppl=60.0, corpus="c")
    with open(runs / "dynamics" / "d256-none-s0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 50, "lo')  # a run killed mid-line
    md = report.build(runs)["markdown"].read_text()
    assert "broken: skipped (record.json is not valid JSON" in md
    assert "spread-old: an older spread record, not used" in md
    assert "1 unreadable line(s) in metrics.jsonl" in md
    assert "dynamics ran at d=256" in md  # the 1024 claims say why they are not run


def test_real_spread_and_fresh_records(tmp_path):
    from attnscale.experiments import fresh, spread

    spread.run(spread.SpreadConfig(head_dims=(4, 256), pairs=400), out=tmp_path / "spread")
    fresh.run(fresh.FreshConfig(head_dims=(4, 256), sequences=4, init="unit"), out=tmp_path / "fresh-unit")
    paths = report.build(tmp_path)
    html_text = paths["html"].read_text()
    assert "d=256, no scale" in html_text and html_text.count("data:image/png;base64,") == 3


def test_a_verdict_that_does_not_agree_names_the_study_measurement(monkeypatch):
    v = course.Verdict("dynamics", "… grows to over 5,000", "> 5,000", "1,900", "> 5,000", course.PARTLY,
                       note="up from 21", key="end_spread")
    ok = replace(v, verdict=course.AGREES, key="end_frozen")
    monkeypatch.setattr(course, "evaluate", lambda runs: [v, ok])
    monkeypatch.setattr(setup_section, "notes", lambda runs: {"end_spread": "setup study: lr 9e-3 reaches 6,500",
                                                              "end_frozen": "not shown: that claim agrees"})
    got = assemble.verdicts(SimpleNamespace(end_state=()))  # no end-state run among the records
    assert got[0].note == "up from 21; setup study: lr 9e-3 reaches 6,500" and got[1].note == "up from 21"
