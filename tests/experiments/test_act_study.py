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
    pilot, study, series = tmp_path / "pilot", tmp_path / "study", tmp_path / "s.json.gz"
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
    assert "give --pilot, or --study PILOT_DIR" in capsys.readouterr().err
    assert main(["act-study", "--pilot", "--study", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    capsys.readouterr()
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
    (tmp_path / "p" / act.PILOT_FILE).write_text(json.dumps({"level": 1e4, "corpus": "default"}))
    assert act.read_pilot(tmp_path / "p") == 1e4
    assert main(["act-study", "--study", str(tmp_path / "p"), "--corpus", "tinyshakespeare", "--out",
                 str(tmp_path / "x")]) == 2
    assert "chose its level on --corpus default, not tinyshakespeare" in capsys.readouterr().err
