"""experiments/act_study and `attnscale act-study`: the plan (seed by seed, every arm, each arm's watch as plain
data), the alarm level's rule on hand-made pilot runs, the alarm reading the very number the records hold, and
the smoke pilot and study end to end through the command line."""

import json
import math

import pytest

from attnscale.analysis import act_judging as aj
from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.experiments import act_study as act
from attnscale.runs import record as rec


def test_the_plan_runs_seed_by_seed_with_each_arms_watch():
    specs = act.study_specs(act.preset(level=300.0), 104)
    assert len(specs) == 4 * 2 * 5 and len({s.run_id for s in specs}) == len(specs)
    assert [s.train.seed for s in specs] == [seed for seed in (0, 1, 2, 3) for _ in range(10)]  # whole pairs first
    by = {s.run_id: s for s in specs}
    a, e = by["study-z1e-4-A-seed2"], by["study-z1e-4-E-seed2"]
    t = a.train
    assert (a.model.scale, a.model.norm, a.model.head_dim, t.steps, t.warmup, t.lr, t.z_loss, t.record_every,
            t.record_sequences, t.min_lr_ratio, t.beta2, t.independent_wd, t.dtype) == (
        "inv_sqrt_d", "pre", 64, 3000, 500, 0.08, 1e-4, 10, 1, 1.0, 0.95, True, "fp32")
    assert e.model.scale == "qk_norm" and e.train == t and a.watch is None and e.watch is None
    assert by["study-z0-B-seed0"].watch == {"every": 10, "probe": "records", "qk_clip": 100.0}
    assert by["study-z0-C-seed0"].watch["alerts"] == [{"max_score": {"tau": 300.0, "action": {"clip_qk": {"tau": 100.0}}}}]
    assert by["study-z0-D-seed0"].watch["alerts"] == [
        {"max_score": {"tau": 300.0, "action": {"scale_lr": {"factor": 0.5, "steps": None}}}}]
    pilot = act.pilot_specs(act.preset(pilot=True), 104)
    assert [s.run_id for s in pilot[:2]] == ["pilot-z0-A-seed100", "pilot-z1e-4-A-seed100"] and len(pilot) == 8
    assert not {s.train.seed for s in pilot} & {s for block in act.BLOCKS for s in block}
    with pytest.raises(ConfigError, match="arms C and D need the alarm's level"):
        act.preset()
    both = act.study_specs(act.preset(level=300.0, block=2), 104)
    assert [s.train.seed for s in both][::10] == list(range(16)) and both[:40] == specs  # block 1's runs first
    assert act.ALL_SEEDS == tuple(range(16))
    with pytest.raises(ConfigError, match="blocks 1 and 2"):
        act.preset(level=300.0, block=3)


def _run(run_id, probes, losses):
    cell, arm, seed = act._parts(run_id)
    r = {"run_id": run_id, "cell": cell, "arm": arm, "seed": seed, "losses": losses, "valid_loss": 2.0,
         "probes": [{"step": s, "max_score": m} for s, m in probes]}
    r["outcome"] = aj.outcome_of(r)
    return r


def _losses(break_at=None, n=600):
    return [3.0] * 20 + [1.7] * ((break_at or n) - 20) + ([2.7] * (n - break_at) if break_at else [])


def test_the_level_is_the_highest_every_break_crossed_100_steps_ahead():
    # two breaks, at 400 and 500: the first crosses 1e3 at step 300 (100 ahead: enough) and 3e3 at 350 (50: not)
    one = _run("pilot-z0-A-seed100", [(100, 50.0), (200, 500.0), (300, 2000.0), (350, 5000.0)], _losses(400))
    two = _run("pilot-z0-A-seed101", [(100, 400.0), (150, 4000.0), (450, 9e4)], _losses(500))
    held = _run("pilot-z0-A-seed102", [(100, 2e3)], _losses())
    assert (one["outcome"]["break_step"], two["outcome"]["break_step"]) == (400, 500)
    got = act.choose_level([one, two, held])
    assert got["level"] == 1e3
    by = {t["level"]: t for t in got["levels"]}
    assert by[1e3]["leads"] == [100, 350] and by[1e3]["held_crossed"] == 1
    assert by[3e3]["leads"] == [50, 350] and not by[3e3]["ok"]
    assert by[1e5]["leads"] == [None, None]  # 9e4 is under 1e5; a crossing at or after the break never counts
    # no break: the warning study's 1e3; no level early enough: the lowest
    assert act.choose_level([held])["level"] == 1e3 and act.choose_level([held])["why"] == "no pilot run broke mid-run"
    late = _run("pilot-z0-A-seed103", [(390, 1e5)], _losses(400))
    assert act.choose_level([late])["level"] == 100.0


def test_the_alarm_reads_the_number_the_records_hold(tmp_path):
    from dataclasses import replace

    cfg = replace(act.preset("smoke", level=20.0), cells=("z0",), arms=("A", "C", "D"))
    result = act.run_study(cfg, tmp_path / "study", progress=False)
    runs = {t.run_id: t for t in (rec.TrainRun.load(p) for p in rec.find(tmp_path / "study"))}
    rows = {r["arm"]: r for r in result["rows"]}
    for arm, kind in (("C", "clip_qk"), ("D", "scale_lr")):
        row = rows[arm]
        (action,) = row["actions"]
        # the first probe after step 0 (the watch's first is after 10 updates) whose max |score| is over the level
        first = next(p["step"] for p in row["probes"] if p["step"] > 0 and p["max_score"] > 20.0)
        assert row["alarm_step"] == action["step"] == first and action["action"] == kind
        line = next(x for x in runs[row["run_id"]].history if x["step"] == first)
        assert action["value"] == pytest.approx(abs(line["max_score"][action["layer"]][action["head"]]), rel=1e-5)
        assert action["value"] > 20.0
        # until the alarm, the run is arm A's: same seed, same batches, the watch only probing
        assert row["losses"][:first + 1] == rows["A"]["losses"][:first + 1]
        assert row["losses"][first + 2:] != rows["A"]["losses"][first + 2:]
    assert rows["A"]["alarm_step"] is None and rows["A"]["actions"] == []
    # the record keeps the watch it trained with
    assert runs["study-z0-C-seed0"].record.config["watch"]["alerts"][0]["max_score"]["tau"] == 20.0


def test_the_smoke_pilot_and_study_end_to_end(tmp_path, capsys):
    """The study trained into its pilot's own folder, as a user may: each run is in the series once (the study's
    runs were once read as the pilot's too, and published twice)."""
    pilot, series = tmp_path / "pilot", tmp_path / "s.json.gz"
    study = pilot
    assert main(["act-study", "--pilot", "--quick", "--out", str(pilot), "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "Alarm level L = 1000 (no pilot run broke mid-run)" in out
    assert json.loads((pilot / act.PILOT_FILE).read_text())["level"] == 1000.0
    assert main(["act-study", "--study", str(pilot), "--quick", "--out", str(study), "--series", str(series),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["level"] == 1000.0 and got["seeds"] == [0] and set(got["arms"]) == set(act.ARMS)
    assert got["arms"]["C"]["tally"]["runs"] == 2 and got["arms"]["C"]["decision"] == "does not save runs"
    data = act.read_series(series)
    assert len(data["runs"]) == 2 + 10 and sum(r["pilot"] for r in data["runs"]) == 2
    r = next(r for r in data["runs"] if r["run_id"] == "study-z0-B-seed0")
    assert set(r) >= {"run_id", "cell", "arm", "seed", "losses", "probes", "outcome", "valid_loss", "alarm_step",
                      "action_steps", "code"}
    kept = json.loads((study / "study-z0-B-seed0" / "record.json").read_text())["environment"].get("git")
    assert r["code"] == kept  # the commit that trained the run, as its record says
    assert len(r["losses"]) == 60 and [p["step"] for p in r["probes"]][:3] == [0, 10, 20]
    assert set(r["probes"][0]) == {"step", "max_score", "min_effective_words", "grad_norm", "log_z", "qk_rms_max"}
    assert all(math.isfinite(x) for x in r["losses"])


def test_the_command_refuses_what_it_cannot_do(tmp_path, capsys):
    assert main(["act-study", "--out", str(tmp_path / "x")]) == 2
    assert "one of the arguments --pilot --study is required" in capsys.readouterr().err
    assert main(["act-study", "--pilot", "--study", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["act-study", "--pilot", "--series", str(tmp_path / "s.gz"), "--out", str(tmp_path / "x")]) == 2
    assert "give it with --study" in capsys.readouterr().err
    assert main(["act-study", "--pilot", "--block", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--block picks the study's seeds" in capsys.readouterr().err
    assert main(["act-study", "--study", str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
    assert "--study: " in (err := capsys.readouterr().err) and "is not a folder" in err
    (tmp_path / "empty").mkdir()
    assert main(["act-study", "--study", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert "--study: no finished pilot in" in capsys.readouterr().err
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / act.PILOT_FILE).write_text(json.dumps({"level": 1e4, "runs": 8, "size": 64, "corpus": "default"}))
    assert act.read_pilot(tmp_path / "p") == 1e4
    assert main(["act-study", "--study", str(tmp_path / "p"), "--corpus", "tinyshakespeare", "--out",
                 str(tmp_path / "x")]) == 2
    assert "chose its level on --corpus default, not tinyshakespeare" in capsys.readouterr().err


def _no_training(monkeypatch):
    """Any study or pilot that starts training fails the test at once (a refusal must come before any run)."""
    def trained(*a, **k):
        raise AssertionError("a run began training")

    monkeypatch.setattr(act, "run_study", trained)
    monkeypatch.setattr(act, "run_pilot", trained)


FULL_PILOT = {"level": 1e4, "runs": 8, "size": 64, "corpus": "default"}


@pytest.mark.parametrize("text, says", [
    ('{"level": 1000.0, "ru', "cannot be read as the pilot's JSON"),  # cut short
    ('[1000.0]', "holds no pilot"),
    ('{"level": "high", "runs": 8, "size": 64}', "holds the level 'high'"),
    ('{"level": true, "runs": 8, "size": 64}', "holds the level True"),  # once read as 1.0
    ('{"level": NaN, "runs": 8, "size": 64}', "holds the level nan"),
    ('{"level": 500, "runs": 8, "size": 64}', "not one of the ladder's 100, 300, 1000"),
    ('{"level": 1000, "runs": 2, "size": 8}', "is a --quick pilot, not one for the full study"),
    ('{"level": 1000, "runs": 5, "size": 64}', "a pilot of 5 runs of head width 64, which no act-study pilot trains"),
])
def test_a_pilot_file_is_read_like_user_input(tmp_path, capsys, monkeypatch, text, says):
    """A cut, mistyped or other study's act-pilot.json is one line and exit 2, before any run, nothing written."""
    _no_training(monkeypatch)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / act.PILOT_FILE).write_text(text)
    with pytest.raises(ConfigError, match=None) as got:
        act.read_pilot(tmp_path / "p")
    assert says in str(got.value)
    assert main(["act-study", "--study", str(tmp_path / "p"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_quick_study_needs_a_quick_pilot_and_a_full_one_a_full_pilot(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / act.PILOT_FILE).write_text(json.dumps(FULL_PILOT))
    assert act.read_pilot(tmp_path / "p") == 1e4
    with pytest.raises(ConfigError, match="is a full pilot, not one for the --quick study"):
        act.read_pilot(tmp_path / "p", size="smoke")
    (tmp_path / "p" / act.PILOT_FILE).write_text(json.dumps({"level": 1000, "runs": 2, "size": 8}))
    assert act.read_pilot(tmp_path / "p", size="smoke") == 1000.0  # no corpus: the default corpus's


def test_series_writes_over_no_file_it_did_not_write(tmp_path, capsys, monkeypatch):
    """--series: a folder, or a file act-study did not write, is refused before the study starts; a series it
    wrote may be written again (a study resumed); a run is never written twice."""
    from attnscale.runs.writers import written_by

    _no_training(monkeypatch)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / act.PILOT_FILE).write_text(json.dumps(FULL_PILOT))
    study = ["act-study", "--study", str(tmp_path / "p"), "--out", str(tmp_path / "x"), "--series"]
    assert main(study + [str(tmp_path)]) == 2  # once an IsADirectoryError after the whole study
    assert "is a folder; give the file to write" in capsys.readouterr().err
    mine = tmp_path / "notes.json.gz"
    mine.write_bytes(b"a user's own file")
    assert main(study + [str(mine)]) == 2
    assert "--series" in (err := capsys.readouterr().err) and "is not a series file attnscale act-study wrote" in err
    assert mine.read_bytes() == b"a user's own file" and not (tmp_path / "x").exists()
    row = {"run_id": "study-z0-A-seed0", "losses": [1.0], "probes": []}
    act.write_series(tmp_path / "ours.json.gz", [row])
    assert written_by(tmp_path / "ours.json.gz") == "act-study"
    with pytest.raises(ValueError, match="run study-z0-A-seed0 is given twice"):
        act.write_series(tmp_path / "twice.json.gz", [row, row])
    assert not (tmp_path / "twice.json.gz").exists()


def test_the_usage_shows_which_modes_are_required(capsys):
    from attnscale.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert "(--pilot | --study PILOT_DIR)" in sub["act-study"].format_usage()  # one of them is required
    assert "[--pilot | --study PILOT_DIR]" in sub["warn-study"].format_usage()  # optional, but not both
