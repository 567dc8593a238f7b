"""The setup study (`attnscale study`): its config, its runs, reuse by config, and its report section."""

from dataclasses import replace

import pytest

from attnscale.analysis import setups
from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.experiments import setup_study, sweep
from attnscale.lm.presets import FULL_STEPS, budget, with_steps
from attnscale.lm.study_axes import AXES
from attnscale.report import assemble, setup_section
from attnscale.runs import store
from attnscale.runs.record import TrainRun


def test_axes_change_one_setting_each():
    b = budget("default")
    changed = {axis: setup_study.apply(b.model, b.train, axis, value) for axis, value in
               [("lr", 9e-3), ("schedule", "constant"), ("weight_decay", 0.0), ("init", "unit"), ("norm", "pre"),
                ("steps", 1200)]}
    assert changed["lr"][1] == replace(b.train, lr=9e-3) and changed["schedule"][1].min_lr_ratio == 1.0
    assert changed["weight_decay"][1].weight_decay == 0.0 and changed["steps"][1] == with_steps(b.train, 1200)
    assert changed["init"][0] == {**b.model, "init": "unit"} and changed["norm"][0] == {**b.model, "norm": "pre"}
    assert setup_study.apply(b.model, b.train, "schedule", "cosine") == (b.model, b.train)
    constant = replace(b.train, min_lr_ratio=1.0)  # a constant base can try the cosine schedule
    assert setup_study.apply(b.model, constant, "schedule", "cosine")[1].min_lr_ratio == 0.1


def test_the_base_moves_and_the_axes_follow_it():
    """--steps or --lr on the command line move the base; the axes are taken around it."""
    train = with_steps(budget("default").train, FULL_STEPS)
    cfg = setup_study.preset("quick", vocab_size=104, train=replace(train, lr=9e-3))
    axes = dict(cfg.axes)
    assert axes["lr"] == (0.03, 0.09) and axes["steps"] == (FULL_STEPS // 2, FULL_STEPS * 2)


@pytest.mark.parametrize("axes, words", [
    ((("depth", (3,)),), "unknown study axis 'depth'"),
    ((("norm", ("post",)),), "post is the base setup's own value"),
    ((("norm", ("pre",)), ("norm", ("post",))), "given twice"),
    ((("schedule", ("linear",)),), "schedule takes one of cosine, constant"),
    ((("init", ("xavier",)),), "init"),
    ((("steps", (200, 200)),), "values 200, 200 repeat; give each value once"),
])
def test_bad_axes_are_refused_before_anything_runs(axes, words):
    with pytest.raises(ConfigError, match=words):
        setup_study.StudyConfig(axes=axes)


def test_a_combination_changes_its_settings_together_and_names_each():
    b = budget("default")
    cfg = setup_study.StudyConfig(head_dim=16, seeds=(0,), scales=("none",), model=b.model, train=b.train,
                                  axes=(("lr", (9e-3,)), ("lr+schedule+steps", ((9e-3, "constant", 1200),))))
    base, lr, both = setup_study.specs(cfg, 104)
    assert both.run_id == "d16-none-s0-lr-9e-3-schedule-constant-steps-1200"
    assert both.group == "study:lr+schedule+steps" and lr.group == "study:lr"
    # each setting as its own axis sets it: the combination is the single axes applied in turn
    alone = setup_study.apply(b.model, b.train, "steps", 1200)[1]
    assert both.train == replace(alone, lr=9e-3, min_lr_ratio=1.0) and both.model == base.model
    assert base.train.min_lr_ratio == 0.1 and base.train.steps == b.train.steps


@pytest.mark.parametrize("axes, words", [
    ((("schedule+weight_decay", (("constant", 0.1),)),), "keeps the base setup's own weight_decay"),
    ((("schedule+weight_decay", (("constant",),)),), "takes one value per axis"),
    ((("weight_decay+schedule", ((0.0, "constant"),)),), "two or more different axes"),
    ((("lr+depth", ((9e-3, 3),)),), "two or more different axes"),
])
def test_bad_combinations_are_refused_before_anything_runs(axes, words):
    b = budget("default")
    with pytest.raises(ConfigError, match=words):
        setup_study.StudyConfig(axes=axes, model=b.model, train=b.train)


def test_combine_on_the_command_line_runs_the_base_and_its_combinations(tmp_path):
    out = tmp_path / "out"
    args = ["study", "--quick", "--width", "8", "--steps", "4", "--seeds", "0", "--scale", "none", "--out", str(out)]
    assert main(args + ["--combine", "weight_decay=0,schedule=constant", "--combine", "schedule=constant,lr=9e-3"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "d8-none-s0", "d8-none-s0-lr-9e-3-schedule-constant", "d8-none-s0-schedule-constant-weight_decay-0"]
    run = TrainRun.load(out / "d8-none-s0-schedule-constant-weight_decay-0")
    assert run.group == "study:schedule+weight_decay"
    assert run.train["min_lr_ratio"] == 1.0 and run.train["weight_decay"] == 0.0
    rows = setups.summary_rows([setups.run_row(TrainRun.load(p)) for p in out.iterdir()])
    assert [(r["axis"], r["value"]) for r in rows] == [
        ("base", "base"), ("lr+schedule", "9e-3 + constant"), ("schedule+weight_decay", "constant + 0")]
    md = assemble.build(out)["markdown"].read_text()
    assert "| schedule constant + weight decay 0 |" in md


def test_the_presets_vary_every_axis_around_their_budget():
    quick, full = setup_study.preset("quick", vocab_size=104), setup_study.preset("full", vocab_size=104)
    assert [a for a, _ in quick.axes] == [a for a, _ in full.axes] == list(AXES)
    assert quick.train == budget("default").train and full.train == budget("full").train
    assert dict(quick.axes)["steps"] == (200, FULL_STEPS)  # its longest rows are reproduce --full's runs
    assert dict(full.axes)["lr"] == (1e-3, 9e-3, 3e-2) and dict(quick.axes)["lr"] == (9e-3, 3e-2)
    assert dict(full.axes)["init"] == ("gpt2", "unit")
    assert quick.seeds == full.seeds == (0, 1) and quick.head_dim == 1024
    specs = setup_study.specs(quick, 104)
    assert len(specs) == (1 + 8) * 2 * 2
    assert [s.run_id for s in specs[:2]] == [store.run_id(1024, "none", 0), store.run_id(1024, "inv_sqrt_d", 0)]
    assert specs[-1].run_id == "d1024-inv_sqrt_d-s1-steps-1200" and specs[-1].group == "study:steps"
    assert len({s.run_id for s in specs}) == len(specs)


def test_study_end_to_end_reuses_by_config_and_reports(tmp_path):
    b = budget("quick")
    train = with_steps(b.train, 10)
    # a finished run of the base setup under another name: the study copies it instead of training it
    earlier = sweep.SweepConfig(head_dims=(16,), scales=("none",), model=b.model, train=train)
    sweep.run_records(earlier, tmp_path / "earlier", progress=False, group="dynamics")
    (tmp_path / "earlier" / "d16-none-s0").rename(tmp_path / "earlier" / "renamed")
    cfg = setup_study.StudyConfig(head_dim=16, seeds=(0,), axes=(("norm", ("pre",)),), model=b.model, train=train)
    result = setup_study.run(cfg, tmp_path / "out", progress=False, reuse=[tmp_path / "earlier"])
    runs = {p.name: TrainRun.load(p) for p in (tmp_path / "out").iterdir()}
    assert sorted(runs) == ["d16-inv_sqrt_d-s0", "d16-inv_sqrt_d-s0-norm-pre", "d16-none-s0", "d16-none-s0-norm-pre"]
    assert runs["d16-none-s0"].record.copied_from.endswith("renamed") and runs["d16-none-s0"].group == "study:base"
    assert runs["d16-none-s0-norm-pre"].model["norm"] == "pre" and runs["d16-none-s0-norm-pre"].group == "study:norm"
    assert [(r["axis"], r["value"], r["scale"]) for r in result["rows"]] == [
        ("base", "base", "none"), ("base", "base", "inv_sqrt_d"), ("norm", "pre", "none"), ("norm", "pre", "inv_sqrt_d")]
    assert all(r["end_spread"] > 0 and r["perplexity"] > 1 for r in result["rows"])
    assert result["claims"]["end_spread"]["setups"] == [("base", "base"), ("norm", "pre")]
    text = setup_study.format_table(result)
    assert text.splitlines()[3].split()[:4] == ["norm", "placement", "pre", "none"]

    paths = assemble.build(tmp_path / "out")
    md = paths["markdown"].read_text()
    assert setup_section.TITLE in md and "| the course's claim at d=1,024 | direction holds in |" in md
    assert "Width 16; base setup: learning rate 3e-3, schedule cosine" in md and "(./)" not in md
    assert paths["study-end-spread"].stat().st_size > 10_000
    panel = setup_section._panels(setup_section.summary(list(runs.values()))[0])["norm placement"]
    assert [label for label, _ in panel] == ["post (base)", "pre"] and set(panel[0][1]) == {"none", "inv_sqrt_d"}


@pytest.mark.parametrize("args, words", [
    (["--axis", "depth=3"], "AXIS=V1,V2"),
    (["--axis", "lr=fast"], "lr takes numbers"),
    (["--axis", "norm=post"], "base setup's own value"),
    (["--reuse", "/nonexistent/dir"], "--reuse: /nonexistent/dir is not a folder"),
    (["--axis", "steps=200,200"], "repeat; give each value once"),
    (["--combine", "lr=9e-3"], "combines two or more settings"),
    (["--combine", "lr=9e-3,lr=3e-2"], "lr is given twice"),
    (["--combine", "lr=9e-3,depth=3"], "AXIS=V,AXIS=V"),
    (["--combine", "lr=9e-3,norm=pre", "--combine", "norm=pre,lr=9e-3"], "given twice; give each combination once"),
])
def test_study_command_errors_are_one_line(args, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["study", "--quick", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and not out.exists()
