"""experiments/recipe_study and `attnscale warn-study --study`: the plan the pilot's choice sets (16 seeds on
the chosen rungs, 1 elsewhere, every arm), the refusals before any study seed runs, and the smoke study end
to end on real tiny runs whose probes carry what every detector reads."""

import json
from pathlib import Path

import pytest

from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.experiments import recipe_study as st
from attnscale.experiments import warn_study as ws

PILOT = {"bigram": 2.3, "uniform": 2.4, "floor": 2.3, "best": 1.5, "level": 1.9, "chosen": [0.03, 0.1], "lrs": [0.003, 0.01, 0.03, 0.1, 0.3],
         "runs": 80}


def test_the_plan_puts_24_seeds_on_the_chosen_rungs_and_one_on_the_others():
    cfg = st.study_preset(Path("pilot"))
    specs = st.study_specs(cfg, 104, PILOT)
    assert len(specs) == 4 * (2 * 24 + 3 * 1) and len({s.run_id for s in specs}) == len(specs)
    by = {}
    for s in specs:
        by.setdefault((s.model.scale, s.train.z_loss, s.train.lr), []).append(s.train.seed)
    assert by[("qk_norm", 1e-4, 0.1)] == list(range(24)) and by[("inv_sqrt_d", 0.0, 0.3)] == [0]
    s = next(s for s in specs if s.run_id == "study-qk-off-z1e-4-lr0.03-seed23")
    t = s.train
    assert (s.model.norm, s.model.scale, t.z_loss, t.lr, t.steps, t.record_every, t.beta2, t.independent_wd,
            t.warmup, s.group) == ("pre", "inv_sqrt_d", 1e-4, 0.03, 1500, 10, 0.95, True, 500, "warn-recipe")
    assert not set(ws.PILOT_SEEDS) & {s.train.seed for s in specs}
    assert {s.train.lr for s in specs[:4 * 2 * 16]} == {0.03, 0.1}  # the chosen rungs' runs come first


def test_no_study_seed_runs_without_a_finished_pilot_that_chose_rungs(tmp_path):
    cfg = st.study_preset(tmp_path / "none", "smoke")
    corpus = cfg.corpus_spec.load()
    with pytest.raises(ConfigError, match="no pilot folder .*none: run `attnscale warn-study --pilot --out"):
        st.read_pilot(cfg, corpus)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has 0 finished runs of 6: finish it"):
        st.read_pilot(st.study_preset(tmp_path / "empty", "smoke"), corpus)
    with pytest.raises(ConfigError, match="study rung_seeds must be distinct seeds among 0–23"):
        st.StudyConfig(rung_seeds=(0, 100))


def test_the_smoke_study_trains_judges_and_prints(tmp_path, monkeypatch, capsys):
    pilot = {**PILOT, "chosen": [0.3], "lrs": [3e-3, 0.3]}
    monkeypatch.setattr(st, "read_pilot", lambda cfg, corpus: dict(pilot))
    cfg = st.study_preset(tmp_path / "pilot", "smoke")
    result = st.run_study(cfg, tmp_path / "study", progress=False)
    assert sorted((c["arm"], c["lr"], c["runs"]) for c in result["cells"]) == sorted(
        (arm, lr, 2 if lr == 0.3 else 1) for arm in ws.ARMS for lr in (3e-3, 0.3))
    from attnscale.runs import record as rec
    rows = st.rows_of([rec.TrainRun.load(p) for p in rec.find(tmp_path / "study")], 10)
    assert len(rows) == 12 and all(r["series"].steps == 40 for r in rows)
    steps, m = rows[0]["series"].probes[1]
    assert steps == 10 and set(m) >= {"max_score", "effective_words", "grad_norm", "log_z", "qk_rms"}
    assert len(m["qk_rms"]) == 2 * 2  # q and k of each of the 2 layers
    text = st.format_study(result)
    assert "chosen rungs 0.3" in text and "max_score>100" in text and "Defaults: NonFinite alone" in text
    json.dumps(st.study_json(result), allow_nan=False)
    # the study's folder keeps its pilot, and the report judges the records again to the same numbers
    assert json.loads((tmp_path / "study" / st.PILOT_FILE).read_text())["chosen"] == [0.3]
    from attnscale import report
    from attnscale.report import recipe_section

    md = report.build(tmp_path / "study")["markdown"].read_text(encoding="utf-8")
    assert recipe_section.TITLE in md and "The defaults' rule:" in md
    for c in result["cells"]:
        assert f"| {c['arm']} | {c['lr']:g} | {c['runs']} | {c['learned']} | " in md
    # a second pilot cannot judge the same study
    with pytest.raises(ConfigError, match="keeps another pilot's rungs and level"):
        st.write_pilot(tmp_path / "study", {**pilot, "chosen": [3e-3]})
    # the command refuses a ladder of its own before reading anything
    assert main(["warn-study", "--study", str(tmp_path / "pilot"), "--lrs", "0.1", "--out", str(tmp_path / "x")]) == 2
    assert "drop --pilot, --family, --scale, --norm, --warmup, --lr, --lrs and --seeds" in capsys.readouterr().err


@pytest.mark.parametrize("text, says", [('{"chosen": [0.08', "cannot be read as the pilot the study keeps"),
                                        ('[0.08, 0.09]', "holds no kept pilot")])
def test_a_kept_pilot_that_is_not_one_is_one_line_before_any_run(tmp_path, text, says):
    """The study folder's warn-pilot.json, cut short or of another shape, once a traceback as the study began."""
    (tmp_path / st.PILOT_FILE).write_text(text)
    pilot = dict.fromkeys(st.PILOT_KEYS, 1.0)
    for call in (lambda: st.write_pilot(tmp_path, pilot), lambda: st.read_kept_pilot(tmp_path)):
        with pytest.raises(ConfigError, match=says) as got:
            call()
        assert "\n" not in str(got.value)
    assert (tmp_path / st.PILOT_FILE).read_text() == text  # not written over
    assert st.write_pilot(tmp_path / "fresh", pilot) == st.read_kept_pilot(tmp_path / "fresh") == pilot
