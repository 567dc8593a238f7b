"""The alarm study's plan (docs/alarm-study.md): its arms, its pilot file read like user input, a smoke block and its
publishing end to end."""

import json

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import alarm_study as al
from attnscale.experiments import lr_study as ls


def test_plan_is_the_documented_one():
    assert al.PILOT_LRS == (5e-2, 6e-2, 7e-2) and al.PILOT_SEEDS == tuple(range(100, 108))
    assert al.BLOCKS[1] == tuple(range(24)) and al.BLOCKS[2] == tuple(range(24, 80))
    a, f = al.block_config(1, 6e-2)
    assert a.lrs == (6e-2,) and set(a.treatments) == {"none", "clip", "qk-norm", "alarm-clip"}
    assert f.lrs == (3e-2,) and f.treatments == ("none",)
    (b2,) = al.block_config(2, 6e-2)
    assert b2.treatments == ("none",) and b2.seeds == tuple(range(24, 80))


@pytest.mark.parametrize("rate", [0, -1, float("nan"), float("inf"), True, "0.06", None])
def test_block_config_refuses_a_bad_rate(rate):
    with pytest.raises(ConfigError, match="rate"):
        al.block_config(1, rate)


def test_arm_rows_names_the_arms():
    base = {"optimizer": "adamw", "d_model": 64, "seed": 0, "probes": [{"step": 10, "max_score": 5.0}]}
    got = al.arm_rows([{**base, "lr": 0.06, "treatment": "none"}, {**base, "lr": 0.06, "treatment": "clip"},
                       {**base, "lr": 0.06, "treatment": "qk-norm"}, {**base, "lr": 0.03, "treatment": "none"}], 0.06)
    assert sorted(r["arm"] for r in got) == ["A", "B", "C", "E", "F"]  # C: A's run, the alarm never fired
    assert next(r for r in got if r["arm"] == "C")["same_as"] == "none"


@pytest.mark.parametrize("text, match", [
    (None, "no finished alarm pilot"), ("{", "cannot be read"), ("[]", "no rate"), ('{"rate": "high"}', "no rate"),
    ('{"rate": true, "d_model": 64}', "no rate"), ('{"rate": NaN, "d_model": 64}', "no rate"),
    ('{"rate": 0, "d_model": 64}', "no rate"), ('{"rate": null, "add": 0.065}', "adds 0.065"),
    ('{"rate": 0.06, "d_model": 16}', "d_model 16")])
def test_read_pilot_refuses(tmp_path, text, match):
    if text is not None:
        (tmp_path / al.PILOT_FILE).write_text(text)
    with pytest.raises(ConfigError, match=match):
        al.read_pilot(tmp_path)


def test_read_pilot_takes_a_whole_file(tmp_path):
    (tmp_path / al.PILOT_FILE).write_text(json.dumps({"rate": 0.06, "add": None, "runs": 24, "d_model": 64}))
    assert al.read_pilot(tmp_path) == 0.06


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """A smoke pilot folder holding a chosen rate, and block 1 at the smoke size (seed 0, every arm)."""
    root = tmp_path_factory.mktemp("alarm")
    pilot = root / "pilot"
    pilot.mkdir()
    (pilot / al.PILOT_FILE).write_text(json.dumps({"rate": 0.08, "add": None, "runs": 2, "d_model": 16}))
    rows = al.run_block(1, 0.08, root / "study", size="smoke", progress=False)
    return root, pilot, rows


def test_smoke_block_has_every_arm_on_its_seed(smoke):
    _, _, rows = smoke
    assert sorted(r["arm"] for r in rows) == ["A", "B", "C", "E", "F"]
    f = next(r for r in rows if r["arm"] == "F")
    assert f["lr"] == pytest.approx(0.04) and f["treatment"] == "none"


def test_publish_and_re_derive(smoke, tmp_path):
    from attnscale.cli import main
    from attnscale.experiments import publish

    root, pilot, _ = smoke
    studies, series = tmp_path / "studies.json", tmp_path / "alarm.json.gz"
    argv = ["alarm-study", "--publish", str(root / "study"), "--pilot-dir", str(pilot), "--json-out", str(studies),
            "--series", str(series)]
    assert main(argv) == 0
    data = json.loads(studies.read_text())["alarm"]
    assert data["rate"] == 0.08 and data["interim"] is True
    again = al.block_from_series(publish.read_series(series, "alarm"), data["command"])
    assert json.loads(json.dumps(again)) == data
    assert ls.parse_run_id(publish.read_series(series, "alarm")["runs"][0]["run_id"])["d_model"] == 16


@pytest.mark.parametrize("argv", [["alarm-study"], ["alarm-study", "--block", "1", "--out", "X"],
                                  ["alarm-study", "--pilot"], ["alarm-study", "--block", "3", "--out", "X"],
                                  ["alarm-study", "--pilot", "--out", "X", "--pilot-dir", "X"],
                                  ["alarm-study", "--publish", "X", "--pilot-dir", "X"],
                                  ["alarm-study", "--block", "1", "--pilot-dir", "NOPE", "--out", "X"],
                                  ["alarm-study", "--block", "1", "--pilot-dir", "X", "--out", "X"]])
def test_cli_refusals(argv, tmp_path, monkeypatch, capsys):
    from attnscale.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "X").mkdir()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.strip()


def test_run_pilot_adds_the_rule_s_rate_once_on_the_same_seeds(tmp_path, monkeypatch):
    """Where the three rates qualify none, the pilot trains the rate the rule adds (sqrt(5e-2 * 6e-2) = 5.48e-2)
    on the same seeds, and keeps the rate chosen with it. The training is stood in for: a run breaks where its rate
    is over 5.5e-2, or at 5.48e-2 on an even seed (half the learned runs)."""
    calls = []

    def execute(specs, *args, **kwargs):
        calls.append([ls.parse_run_id(s.run_id) for s in specs])
        return list(specs)

    def rows(specs):
        out = []
        for s in specs:
            p = ls.parse_run_id(s.run_id)
            broke = p["lr"] > 0.055 or (abs(p["lr"] - 0.0548) < 1e-9 and p["seed"] % 2 == 0)
            out.append({**p, "outcome": {"learned_at": 300, "break_step": 1800 if broke else None}})
        return out

    monkeypatch.setattr(al, "execute", execute)
    monkeypatch.setattr(ls, "rows", rows)
    got = al.run_pilot(al.pilot_config(), tmp_path, progress=False)
    assert [sorted({p["lr"] for p in c}) for c in calls] == [[0.05, 0.06, 0.07], [0.0548]]
    assert [sorted({p["seed"] for p in c}) for c in calls] == [list(al.PILOT_SEEDS)] * 2
    assert got["choice"] == {"rate": 0.0548, "add": None}
    kept = json.loads((tmp_path / al.PILOT_FILE).read_text())
    assert kept["rate"] == 0.0548 and kept["runs"] == 32 and "fallback" not in kept
    assert al.read_pilot(tmp_path) == 0.0548
    # run again, nothing changed: the same two trainings asked for (execute keeps what finished), the same choice
    assert al.run_pilot(al.pilot_config(), tmp_path, progress=False)["choice"]["rate"] == 0.0548


def test_the_published_alarm_block_re_derives_from_its_series_and_the_doc_quotes_it():
    """docs/warn-study.json's "alarm" is what alarm_study.block gives on docs/alarm-study-series.json.gz alone, and
    docs/alarm-study.md quotes its endpoints and decision as the block holds them."""
    from attnscale.analysis import paired
    from attnscale.experiments.alarm_study_text import share_text
    from published import doc_text, published_block

    published, series, docs = published_block("alarm", "alarm-study-series.json.gz", "alarm")
    again = al.block_from_series(series, published["command"])
    assert json.loads(json.dumps(again)) == published
    doc = doc_text(docs, "alarm-study.md")
    for dating, s in published["sensitivity"].items():
        assert share_text(s) in doc, dating
    assert share_text(published["false_alarms"]) in doc
    for key in ("false_alarm_cost", "F_vs_C", "E_vs_best"):
        e = published[key]
        assert paired.estimate_text(e["diff"], e["se"], e["n"], e["interval"], signed=True) in doc, key
    eq = published["C_vs_B"]
    if eq["interval_90"] is not None:
        assert "[{:+.4f}, {:+.4f}]".format(*eq["interval_90"]) in doc
    assert f"**{published['decision']}**" in doc
    # the advice quotes the false-alarm share, with its Wilson interval counted here (all fired: lower end
    # n / (n + z²)), and the decision, in README, docs/watch.md and default_alerts
    import inspect
    import math

    from attnscale.watch import alerts

    fa, arms = published["false_alarms"], published["arms"]
    assert fa["k"] == fa["n"] == arms["A holders"]["runs"]  # every holder: the share's interval by hand below
    lower = fa["n"] / (fa["n"] + 1.959964 ** 2)
    quoted = f"{fa['k']} of {fa['n']}"
    fc, ef = published["F_vs_C"], published["E_vs_best"]
    rounded = (f"{-fc['diff']:.2f} nats below", f"{-ef['diff']:.3f} below that")
    whole = tuple(paired.estimate_text(e["diff"], e["se"], e["n"], e["interval"], signed=True) for e in (fc, ef))
    for text, said in ((doc_text(docs.parent, "README.md"), rounded), (doc_text(docs, "watch.md"), whole),
                       (" ".join(inspect.getdoc(alerts.default_alerts).split()), rounded)):
        assert quoted in text and f"[{math.floor(lower * 100 + 0.5)}%, 100%]" in text, text[:60]
        assert all(x in text for x in said), (said, text[:60])
    assert f"{arms['A']['breaks']} of {arms['A']['runs']} runs without action broke" in doc_text(docs.parent, "README.md")
