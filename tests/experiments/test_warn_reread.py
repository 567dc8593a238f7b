"""experiments/warn_reread and `attnscale warn-study --reread`: a small series file written here, read by the
command to the numbers worked out by hand; the runs that took an action are left out; the refusals."""

import gzip
import json
from pathlib import Path

import pytest

from attnscale.cli import main

ROOT = Path(__file__).resolve().parents[2]
LEVEL = 2.0
LEARNT = [3.0] * 20 + [1.0] * 980  # learns at step 30; 1,000 steps at 1.0 so its landmark (700) falls inside


def _run(rid, arm, seed, losses, scores, broke, pilot=False):
    probes = [{"step": t, "max_score": scores(t), "min_effective_words": 2.0, "grad_norm": 1.0, "log_z": 0.5,
               "qk_rms_max": 0.1} for t in range(0, len(losses), 10)]
    return {"run_id": rid, "cell": "z0", "arm": arm, "seed": seed, "pilot": pilot, "steps": len(losses),
            "losses": losses, "probes": probes, "valid_loss": 1.0, "alarm_step": None, "action_steps": [],
            "outcome": {"learned_at": 30, "break_step": broke, "degraded": broke is not None}}


def _series(path: Path) -> Path:
    # the breaker: from step 1000 the loss is 1.5 to the end (1,100 steps): the study's rule dates it at 1000;
    # its max |score| crosses 1e3 at step 900, 100 steps before, after its landmark at 700
    rise = LEARNT + [1.5] * 100
    runs = [_run("z0-A-0", "A", 0, rise, lambda t: 5000.0 if t >= 900 else 50.0, 1000),
            _run("z0-A-1", "A", 1, LEARNT + [1.0] * 100, lambda t: 5000.0, None, pilot=True),  # held, on throughout
            _run("z0-E-0", "E", 0, LEARNT + [1.0] * 100, lambda t: 5.0, None),  # held, silent
            _run("z0-D-0", "D", 0, rise, lambda t: 5000.0, 1000)]  # acted on: not read
    path.write_bytes(gzip.compress(json.dumps({"study": "act", "learned_level": LEVEL, "runs": runs}).encode()))
    return path


def test_the_reread_command_derives_its_numbers_from_a_series_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    series = _series(tmp_path / "series.json.gz")
    assert main(["warn-study", "--reread", str(series), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    a, e = got["series"]["groups"]["z0, A"], got["series"]["groups"]["z0, E"]
    assert set(got["series"]["groups"]) == {"z0, A", "z0, E", "all, A", "all, E"}  # arm D is left out
    assert (a["runs"], a["pilot_runs"], a["mid_run_breaks"], e["runs"]) == (2, 1, 1, 1)
    lm = a["landmark"]["1000"]
    assert (lm["breakers"], lm["holders"], lm["hits"]["k"], lm["fresh_crossings"]) == (1, 1, 1, 1)
    assert lm["lead"]["median"] == 100 and lm["survival"]["median"] == 300  # 1000 − 900; 1000 − 700
    assert lm["holders_alarmed"]["k"] == 1 and e["held_alarmed"]["1000"]["k"] == 0
    assert e["held_alarmed"]["1000"]["at_risk_steps"] == 1100 - 500  # from the warm-up's end, after it learnt at 30
    # from the landmark (700) in 100-step intervals: the breaker's 700, 800, 900 and 1000 (its break in the last;
    # no break at 50, so the events are separated by max |score|: no estimate), the holder's 700 … 1000
    assert (a["hazard"]["intervals"], a["hazard"]["events"]) == (4 + 4, 1)
    # the smoothed rule: the mean at 999 + n holds n losses of 1.5, within 0.1 of 1.0 up to n = 4: 1004
    assert a["dating"]["runs"]["z0-A-0"] == {"study": 1000, "smoothed": 1004, "crossing": 1019, "raw_0.2": 1000}
    assert got["series"]["groups"]["all, E"]["dating"] == {"breaks": 0, "runs": {}, "rules": {
        name: {"moved": 0, "median_shift": None, "largest_shift": None} for name in ("smoothed", "crossing", "raw_0.2")}}
    # the tables say the same
    assert main(["warn-study", "--reread", str(series), "--published", str(ROOT / "docs" / "warn-study.json")]) == 0
    text = capsys.readouterr().out
    assert "z0, A: 2 runs (1 pilot), 2 learned, 1 mid-run breaks, 0 never learned" in text
    assert "Hazard from the landmark: 1 breaks in 8 100-step intervals; no estimate" in text
    assert "AUC intervals leaving out 0.5: 7 of 72 (4 distinct readings of 48)" in text
    assert not (tmp_path / "attnscale-out").exists()  # it trains nothing, so it makes no --out folder


def test_the_reread_refuses_a_file_that_is_not_a_series(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"runs": "none"}))
    assert main(["warn-study", "--reread", str(bad)]) == 2
    assert "holds no list of runs" in capsys.readouterr().err
    bad.write_text(json.dumps({"runs": []}))
    assert main(["warn-study", "--reread", str(bad)]) == 2
    assert "names no learned_level" in capsys.readouterr().err
    assert main(["warn-study", "--reread", str(tmp_path / "missing.json.gz")]) == 2
    assert "--reread: no file" in capsys.readouterr().err
    (tmp_path / "junk").write_bytes(b"\x1f\x8bnot gzip")
    assert main(["warn-study", "--reread", str(tmp_path / "junk")]) == 2
    assert "is not JSON or gzip'd JSON" in capsys.readouterr().err
    assert main(["warn-study", "--published", str(ROOT / "docs" / "warn-study.json"), "--pilot"]) == 2
    assert "train nothing: drop --pilot and --study" in capsys.readouterr().err


def test_the_published_reread_kept_in_the_json_is_what_the_command_derives():
    from attnscale.experiments import warn_reread

    path = ROOT / "docs" / "warn-study.json"
    kept = json.loads(path.read_text())["reread"]["published"]
    got = warn_reread.reread_json(warn_reread.reread_files(None, path))["published"]
    got.pop("path")
    assert got == kept


def test_the_act_studys_reread_kept_in_the_json_is_what_the_command_derives_from_its_series():
    """Where the act study's series file is the one read (its sha256), the figures kept are the command's."""
    import hashlib

    import pytest

    from attnscale.experiments import warn_reread

    kept = json.loads((ROOT / "docs" / "warn-study.json").read_text())["reread"]["series"]
    path = ROOT / "docs" / "act-study-series.json.gz"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != kept["sha256"]:
        pytest.skip("docs/act-study-series.json.gz is not the series file the re-read was made from")
    got = warn_reread.reread_json(warn_reread.reread_files(path))["series"]
    assert {k: v for k, v in got.items() if k != "path"} == {k: v for k, v in kept.items() if k not in ("path", "sha256")}
    both = kept["groups"]["all, A"]["landmark"]["1000"]
    assert (both["lead"]["median"], both["survival"]["median"], both["hits"]["k"], both["holders"]) == (464, 467.5, 34, 0)


def test_the_library_names_a_series_file_it_cannot_read(tmp_path):
    """The command refuses a missing file before any work; the library call names it too."""
    from attnscale.errors import ConfigError
    from attnscale.experiments import warn_reread

    with pytest.raises(ConfigError, match="^cannot read .*missing.json.gz"):
        warn_reread.reread_files(tmp_path / "missing.json.gz")


def _bad(path: Path, change) -> Path:
    """The small series file with ``change`` made to its contents (a dict), written as plain JSON."""
    data = json.loads(gzip.decompress(_series(path.with_suffix(".gz")).read_bytes()))
    change(data)
    path.write_text(json.dumps(data))  # json writes NaN as NaN, as a careless writer would
    return path


def _set(key, value, run=None):
    def change(data):
        (data if run is None else data["runs"][run])[key] = value
    return change


@pytest.mark.parametrize("change, says", [
    (_set("learned_level", float("nan")), "holds NaN where a number is meant"),  # a line of the output once went
    (_set("learned_level", True), "names no learned_level (a positive loss in nats; it has True)"),
    (_set("learned_level", -1.0), "names no learned_level"),
    (_set("study", "warn"), "is a series of the study 'warn', not the act study's"),
    (_set("runs", []), "holds no runs"),
    (_set("seed", "0", run=0), "run z0-A-0 has a run_id or cell that is not text, or a seed that is not"),
    (_set("arm", "Z", run=1), "run z0-A-1 has the arm 'Z'"),
    (_set("losses", [1.0, "x"], run=2), "run z0-E-0 has losses that are not a list of numbers"),
    (_set("losses", [1.0, float("inf")], run=2), "holds Infinity where a number is meant"),
    (_set("steps", 3, run=0), "run z0-A-0 has steps 3, not a whole number at least its 1100 losses"),
    (_set("probes", [{"step": "ten", "max_score": 1.0}], run=0), "run z0-A-0 has probes that are not steps"),
    (_set("probes", [{"step": 10, "max_score": "big"}], run=0), "run z0-A-0 has probes that are not steps"),
    (_set("outcome", {"learned_at": 1.5, "break_step": None}, run=0), "has an outcome whose learned_at"),
    (_set("outcome", {"learned_at": None, "break_step": 9}, run=0), "breaks at step 9 but learnt at None"),
    (_set("outcome", {"learned_at": 30, "break_step": 20}, run=0), "breaks at step 20 but learnt at 30"),
    (_set("outcome", {"learned_at": 30, "break_step": 5000}, run=0), "within its 1100 steps"),
    (_set("outcome", {"learned_at": 1100, "break_step": None}, run=2), "run z0-E-0 learnt at step 1100, past its 1100"),
    (lambda d: d["runs"].append(dict(d["runs"][0])), "run z0-A-0 is there twice"),
    (lambda d: d["runs"].append(7), "run number 5 is not a JSON object"),
])
def test_a_series_file_is_read_like_user_input(tmp_path, capsys, change, says):
    bad = _bad(tmp_path / "bad.json", change)
    assert main(["warn-study", "--reread", str(bad)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_cut_or_corrupt_gzip_is_one_line(tmp_path, capsys):
    """A series cut short (once an EOFError) or corrupt inside its stream (once a zlib.error)."""
    whole = _series(tmp_path / "s.json.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(whole[: len(whole) // 2])
    inside = bytearray(gzip.compress(json.dumps({"runs": [{"run_id": str(i)} for i in range(500)]}).encode()))
    inside[40:60] = bytes(20)
    (tmp_path / "corrupt.gz").write_bytes(bytes(inside))
    for name in ("cut.gz", "corrupt.gz"):
        assert main(["warn-study", "--reread", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert f"{name} is not JSON or gzip'd JSON" in err and err.count("\n") == 1


@pytest.mark.parametrize("recipe, says", [
    ({}, "its \"recipe\" study lacks pilot, cells, outcomes, folds, max_false_alarms_per_1000"),  # once a KeyError
    (None, "has no \"recipe\" study"),
    ("cut", "cells lacking their detectors"),
])
def test_a_published_json_is_read_like_user_input(tmp_path, capsys, recipe, says):
    if recipe == "cut":  # the parts there, a key missing inside one
        recipe = json.loads((ROOT / "docs" / "warn-study.json").read_text())["recipe"]
        for cell in recipe["cells"]:
            del cell["detectors"]
        says = "its \"recipe\" study cannot be read (KeyError: 'detectors')"
    (tmp_path / "w.json").write_text(json.dumps({"recipe": recipe}))
    assert main(["warn-study", "--published", str(tmp_path / "w.json")]) == 2
    err = capsys.readouterr().err
    assert says in err and "give docs/warn-study.json" in err and err.count("\n") == 1
