"""The learning-rate study's plan (docs/lr-study.md): its runs, its rules, and one smoke block end to end."""

import dataclasses

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import act_study
from attnscale.experiments import lr_study as ls


def test_grids_are_the_documented_ones():
    assert ls.ADAMW_LRS == (5e-3, 1e-2, 2e-2, 4e-2, 8e-2, 1.6e-1)
    assert ls.MUON_PILOT_LRS == pytest.approx((2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2, 8e-2, 1.6e-1, 3.2e-1))
    assert ls.LEVEL == 1e4 and ls.TAU == 100.0 and ls.SEEDS == (0, 1, 2)


def test_adamw_runs_are_the_act_study_runs_at_the_same_rate():
    """At 8e-2 the lr study's none, clip, alarm-clip and qk-norm runs are the act study's arms A, B, C and E of the
    z-loss 0 cell, field for field: the two studies' runs are comparable."""
    lr = ls.preset(1)
    act = dataclasses.replace(act_study.preset("full", level=1e4), seeds=(1,))
    mine = {s.run_id: s for s in ls.block_specs(dataclasses.replace(lr, lrs=(8e-2,), seeds=(1,)), 99)}
    none = [{"treatment": "none", "lr": 8e-2, "seed": 1, "probes": [{"step": 20, "max_score": 2e4}]}]
    mine.update({s.run_id: s for s in ls.alarm_specs(dataclasses.replace(lr, lrs=(8e-2,), seeds=(1,)), 99, none)})
    theirs = {s.run_id: s for s in act_study.study_specs(act, 99)}
    for t, arm in (("none", "A"), ("clip", "B"), ("alarm-clip", "C"), ("qk-norm", "E")):
        a = mine[ls.run_id("lr", "adamw", 64, 8e-2, t, 1)]
        b = theirs[f"study-z0-{arm}-seed1"]
        assert (a.model, a.train, a.watch) == (b.model, b.train, b.watch), t


def test_block_specs_go_seed_by_seed_then_rate_by_rate():
    cfg = dataclasses.replace(ls.preset(1), seeds=(0, 1))
    ids = [s.run_id for s in ls.block_specs(cfg, 99)]
    assert len(ids) == 2 * 6 * 3 and all("alarmclip" not in i for i in ids)
    assert [ls.parse_run_id(i)["seed"] for i in ids] == [0] * 18 + [1] * 18
    assert [ls.parse_run_id(i)["lr"] for i in ids[:6]] == [5e-3, 5e-3, 5e-3, 1e-2, 1e-2, 1e-2]


def test_alarm_specs_only_where_the_none_run_crossed_after_step_0():
    cfg = dataclasses.replace(ls.preset(1), lrs=(1e-2, 8e-2), seeds=(0, 1))
    rows = [{"treatment": "none", "lr": 8e-2, "seed": 0, "probes": [{"step": 10, "max_score": 5.0},
                                                                     {"step": 700, "max_score": 1.5e4}]},
            {"treatment": "none", "lr": 8e-2, "seed": 1, "probes": [{"step": 10, "max_score": 1e4}]},  # not over
            {"treatment": "none", "lr": 1e-2, "seed": 0, "probes": [{"step": 0, "max_score": 2e4}]},  # step 0: no alarm
            {"treatment": "clip", "lr": 1e-2, "seed": 1, "probes": [{"step": 10, "max_score": 2e4}]}]
    specs = ls.alarm_specs(cfg, 99, rows)
    assert [s.run_id for s in specs] == [ls.run_id("lr", "adamw", 64, 8e-2, "alarm-clip", 0)]
    assert specs[0].watch["alerts"][0]["max_score"]["tau"] == 1e4
    assert ls.crossed(rows[0], 1e4) == 700


def test_with_alarm_rows_reads_the_none_run_where_no_alarm_fired():
    base = {"optimizer": "adamw", "d_model": 64, "seed": 0}
    quiet = {**base, "lr": 1e-2, "treatment": "none", "probes": [{"step": 10, "max_score": 50.0}], "valid_loss": 1.6}
    loud = {**base, "lr": 8e-2, "treatment": "none", "probes": [{"step": 10, "max_score": 5e4}], "valid_loss": 2.8}
    got = ls.with_alarm_rows([quiet, loud])
    extra = [r for r in got if r["treatment"] == "alarm-clip"]
    assert len(extra) == 1 and extra[0]["lr"] == 1e-2 and extra[0]["same_as"] == "none" and extra[0]["valid_loss"] == 1.6
    trained = {**loud, "treatment": "alarm-clip", "valid_loss": 1.8}
    assert [r for r in ls.with_alarm_rows([quiet, loud, trained]) if r["treatment"] == "alarm-clip" and r["lr"] == 8e-2] == [trained]


def test_muon_grid_rule():
    def row(lr, learned, broke=None):
        return {"treatment": "none", "lr": lr, "outcome": {"learned_at": 5 if learned else None, "break_step": broke}}

    pilot = [row(lr, True) for lr in ls.MUON_PILOT_LRS[:4]] + [row(4e-2, True, broke=1200), row(8e-2, False),
                                                             row(1.6e-1, False), row(3.2e-1, False)]
    pilot.append({"treatment": "qk-norm", "lr": 2.5e-3, "outcome": {"learned_at": None, "break_step": None}})
    g = ls.muon_grid(pilot)
    assert g["r1"] == 4e-2
    assert g["lrs"] == pytest.approx((2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2, 8e-2))
    held = ls.muon_grid([row(lr, True) for lr in ls.MUON_PILOT_LRS])
    assert held["r1"] is None and held["lrs"] == pytest.approx(ls.MUON_PILOT_LRS[-6:])


@pytest.mark.parametrize("text", ["", "lr-adamw-w64-lr0.01-bogus-seed0", "study-z0-A-seed1",
                                  "lr-sgd-w64-lr0.01-none-seed0", "lr-adamw-w64-lr0.01-none-seedx"])
def test_parse_run_id_refuses_other_names(text):
    with pytest.raises(ConfigError, match="not a run of the lr study"):
        ls.parse_run_id(text)


def test_run_ids_round_trip():
    for t in ls.TREATMENTS:
        text = ls.run_id("lr", "muon", 256, 1.6e-1, t, 2)
        assert ls.parse_run_id(text) == {"optimizer": "muon", "d_model": 256, "lr": 1.6e-1, "treatment": t, "seed": 2}


@pytest.mark.parametrize("change, match", [
    ({"optimizer": "sgd"}, "optimizer"), ({"optimizer": ""}, "optimizer"), ({"treatments": ("nope",)}, "treatment"),
    ({"treatments": ()}, "treatments"), ({"lrs": (1e-2, 1e-2)}, "lrs"), ({"lrs": (float("nan"),)}, "rates"),
    ({"lrs": (0,)}, "rates"), ({"lrs": (True,)}, "rates"), ({"seeds": ()}, "seeds"), ({"d_model": 0}, "d_model"),
    ({"d_model": 64.0}, "d_model"), ({"head_dim": True}, "head_dim"), ({"level": float("nan")}, "level"),
    ({"level": 0}, "level"), ({"level": "1e4"}, "level")])
def test_config_refuses_hostile_values(change, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(ls.preset(1), **change)


@pytest.mark.parametrize("kwargs, match", [
    ({"block": 6}, "blocks 1 to 5"), ({"block": 0}, "blocks 1 to 5"), ({"block": True}, "blocks 1 to 5"),
    ({"block": [1]}, "blocks 1 to 5"), ({"size": "huge"}, "size"), ({"block": 2}, "Muon pilot"),
    ({"block": 3}, "earlier block"), ({"block": 5, "lrs": (1e-2,)}, "name one of adamw, muon, got None"),
    ({"block": 5, "lrs": (1e-2,), "optimizer": "sgd"}, "name one"),
    ({"block": 5, "lrs": (1e-2,), "optimizer": ""}, "name one"),
    ({"block": 5, "lrs": (1e-2,), "optimizer": str}, "name one"),
    ({"block": 1, "optimizer": "muon"}, "block 1 trains under adamw only"),
    ({"block": 5, "optimizer": "muon"}, "earlier block")])
def test_preset_refusals(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ls.preset(**kwargs)


@pytest.fixture(scope="module")
def smoke_block(tmp_path_factory):
    """One rate, one seed, at the smoke size, with the alarm's level low enough to fire."""
    out = tmp_path_factory.mktemp("lr") / "out"
    cfg = dataclasses.replace(ls.preset(1, "smoke"), lrs=(8e-2,), level=1.0)
    return out, ls.run_block(cfg, out, progress=False)


def test_smoke_block_end_to_end(smoke_block):
    """The alarm-clip run is trained, and its loss equals the none run's at every step up to its alarm (what lets
    the study not retrain it where the alarm never fires)."""
    _, got = smoke_block
    by = {r["treatment"]: r for r in got}
    assert set(by) == {"none", "qk-norm", "clip", "alarm-clip"}
    alarm = by["alarm-clip"]["alarm_step"]
    assert alarm is not None and alarm == ls.crossed(by["none"], 1.0)
    assert by["alarm-clip"]["losses"][:alarm] == by["none"]["losses"][:alarm]
    assert by["alarm-clip"]["losses"][alarm + 1:] != by["none"]["losses"][alarm + 1:]


def test_publish_writes_what_the_series_re_derives(smoke_block, tmp_path):
    import json

    from attnscale.cli import main
    from attnscale.experiments import publish

    out, _ = smoke_block
    studies, series = tmp_path / "studies.json", tmp_path / "lr.json.gz"
    studies.write_text(json.dumps({"act": {"kept": 1}}))
    assert main(["lr-study", "--publish", str(out), "--json-out", str(studies), "--series", str(series)]) == 0
    data = json.loads(studies.read_text())
    assert data["act"] == {"kept": 1}  # the other blocks are kept as they were
    again = ls.block_from_series(publish.read_series(series, "lr"), data["sensitivity"]["command"])
    assert json.loads(json.dumps(again)) == data["sensitivity"]
    runs = publish.read_series(series, "lr")["runs"]
    assert sorted(r["treatment"] for r in runs) == ["alarm-clip", "clip", "none", "qk-norm"]
    # a second publish over its own files is allowed; a run in two folders is refused
    assert main(["lr-study", "--publish", str(out), "--series", str(series)]) == 0
    assert main(["lr-study", "--publish", str(out), str(out), "--series", str(series)]) == 2


@pytest.mark.parametrize("argv", [
    ["lr-study"], ["lr-study", "--block", "1"], ["lr-study", "--block", "5", "--out", "X"],
    ["lr-study", "--block", "1", "--lrs", "0.1", "--out", "X"], ["lr-study", "--block", "2", "--out", "X"],
    ["lr-study", "--block", "1", "--out", "X", "--series", "S.json.gz"], ["lr-study", "--publish", "NOPE", "--series", "S"],
    ["lr-study", "--publish", "X"], ["lr-study", "--muon-pilot", "--lrs", "0.1", "--out", "X"],
    ["lr-study", "--block", "2", "--from", "NOPE", "--out", "X"], ["lr-study", "--block", "1", "--muon-pilot", "--out", "X"],
    ["lr-study", "--block", "2", "--lrs", "nan", "--out", "X"], ["lr-study", "--block", "2", "--lrs", "0", "--out", "X"]])
def test_cli_refusals_are_one_line_and_exit_2(argv, tmp_path, monkeypatch, capsys):
    from attnscale.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "X").mkdir()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) >= 1 and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "X" / "lr-adamw-w64-lr0.005-none-seed0").exists()


def test_publish_refuses_a_file_it_did_not_write(smoke_block, tmp_path):
    from attnscale.cli import main

    out, _ = smoke_block
    mine = tmp_path / "thesis.json.gz"
    mine.write_bytes(b"not ours")
    other = tmp_path / "notes.json"
    other.write_text('{"x": 1}')
    assert main(["lr-study", "--publish", str(out), "--series", str(mine)]) == 2
    assert main(["lr-study", "--publish", str(out), "--json-out", str(other)]) == 2
    assert mine.read_bytes() == b"not ours" and other.read_text() == '{"x": 1}'


def test_the_published_sensitivity_block_re_derives_from_its_series():
    """docs/warn-study.json's "sensitivity" is what lr_study.block gives on docs/lr-study-series.json.gz alone, and
    docs/lr-study.md shows its best losses as the block holds them."""
    import json

    from attnscale.experiments.lr_study_text import mean_text
    from published import doc_text, published_block

    published, series, docs = published_block("sensitivity", "lr-study-series.json.gz", "lr")
    again = ls.block_from_series(series, published["command"])
    assert json.loads(json.dumps(again)) == published
    doc = doc_text(docs, "lr-study.md")
    for g in published["groups"]:
        for t, c in g["curves"].items():
            if c["seeds"]:
                assert mean_text(c["best"]) in doc, (g["optimizer"], t)
    watch = doc_text(docs, "watch.md")
    first = next(g for g in published["groups"] if (g["optimizer"], g["d_model"]) == ("adamw", 64))
    for t in ("qk-norm", "none"):  # the watch page's advice quotes block 1's LR sensitivity
        assert mean_text(first["curves"][t]["sensitivity"]) in watch, t


def test_block_2_refuses_a_muon_pilot_that_has_not_finished(tmp_path, monkeypatch, capsys):
    """A grid read off part of the pilot could miss its r1 (the low rates finish first, all of them held): block 2
    takes its grid only from the whole pilot, 16 runs, and says how to finish it."""
    from attnscale.cli import main

    def row(lr, treatment):
        return {"lr": lr, "treatment": treatment, "outcome": {"learned_at": 300, "break_step": None}}

    part = [row(lr, t) for lr in ls.MUON_PILOT_LRS[:5] for t in ("none", "qk-norm")]
    monkeypatch.setattr(ls, "read_rows", lambda folders, group=None: part)
    (tmp_path / "pilot").mkdir()
    assert main(["lr-study", "--block", "2", "--from", str(tmp_path / "pilot"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 10 of its 16 runs finished; finish it first: attnscale lr-study --muon-pilot" in err[0]
    assert not (tmp_path / "out").exists()


def _curve_rows(optimizer, lrs, treatment, losses, failed=(), seeds=ls.SEEDS):
    """Width-64 rows of one treatment: loss ``losses[i]`` at ``lrs[i]`` on every seed; a rate in ``failed`` never learnt."""
    return [{"optimizer": optimizer, "d_model": 64, "lr": lr, "treatment": treatment, "seed": s,
             "valid_loss": None if lr in failed else loss,
             "outcome": {"learned_at": None if lr in failed else 100, "break_step": None}}
            for lr, loss in zip(lrs, losses) for s in seeds]


@pytest.mark.parametrize("qk_losses, none_failed, want", [
    # best qk-norm rate inside the grid (4e-2): it and one rung each side; none fails at 8e-2, one of the three
    ((1.60, 1.55, 1.52, 1.50, 1.53, 1.58), (8e-2, 1.6e-1), (2e-2, 4e-2, 8e-2)),
    # the same, but none fails only above the three: 1.6e-1 is added
    ((1.60, 1.55, 1.52, 1.50, 1.53, 1.58), (1.6e-1,), (2e-2, 4e-2, 8e-2, 1.6e-1)),
    # block 1 as it ran: qk-norm best at the lowest rate, so the three at that end; none failed at none of them,
    # so the next rate up is added
    ((1.520, 1.527, 1.535, 1.542, 1.597, 1.659), (8e-2, 1.6e-1), (5e-3, 1e-2, 2e-2, 4e-2)),
    # best at the top of the grid: the three at that end, nothing above them to add
    ((1.70, 1.65, 1.60, 1.55, 1.52, 1.50), (), (4e-2, 8e-2, 1.6e-1)),
])
def test_narrowed_takes_three_rates_round_the_qk_norm_best_and_the_next_up_where_none_held(qk_losses, none_failed, want):
    none_losses = [1.6] * 6
    rows = (_curve_rows("adamw", ls.ADAMW_LRS, "qk-norm", qk_losses)
            + _curve_rows("adamw", ls.ADAMW_LRS, "none", none_losses, failed=none_failed)
            + _curve_rows("muon", ls.ADAMW_LRS, "qk-norm", qk_losses[::-1]))  # another optimizer: not read
    assert ls.narrowed(rows, "adamw") == pytest.approx(want)


def test_narrowed_reads_a_break_as_a_failure():
    rows = _curve_rows("adamw", ls.ADAMW_LRS, "qk-norm", (1.52, 1.53, 1.54, 1.55, 1.60, 1.66))
    rows += _curve_rows("adamw", ls.ADAMW_LRS, "none", [1.6] * 6)
    for r in rows:
        if r["treatment"] == "none" and r["lr"] == 2e-2 and r["seed"] == 1:  # one seed broke at 2e-2
            r["outcome"] = {"learned_at": 100, "break_step": 1500}
    assert ls.narrowed(rows, "adamw") == pytest.approx((5e-3, 1e-2, 2e-2))


@pytest.mark.parametrize("cut", ["seed", "rate", "treatment", "empty"])
def test_narrowed_refuses_part_of_a_block(cut):
    """The low rates of the first seeds finish first: a grid narrowed from part of a block could centre on the wrong
    rate, so the wider blocks take it only from a width-64 block whose none and qk-norm runs are all finished."""
    full = (_curve_rows("muon", ls.ADAMW_LRS, "qk-norm", (1.60, 1.55, 1.52, 1.50, 1.53, 1.58))
            + _curve_rows("muon", ls.ADAMW_LRS, "none", [1.6] * 6))
    part = {"seed": [r for r in full if r["seed"] != 2],
            "rate": [r for r in full if r["lr"] != 1.6e-1],
            "treatment": [r for r in full if r["treatment"] != "none"],
            "empty": []}[cut]
    with pytest.raises(ConfigError, match=r"finished; finish block 2 first"):
        ls.narrowed(part, "muon")


@pytest.mark.parametrize("whole", [True, False])
def test_block_3_takes_its_rates_from_a_whole_block_1(whole, tmp_path, monkeypatch, capsys):
    """``--block 3 --from`` trains the rates ``narrowed`` gives, and refuses part of block 1 in one line, training
    nothing."""
    from attnscale.cli import main

    rows = (_curve_rows("adamw", ls.ADAMW_LRS, "qk-norm", (1.520, 1.527, 1.535, 1.542, 1.597, 1.659))
            + _curve_rows("adamw", ls.ADAMW_LRS, "none", [1.6] * 6, failed=(8e-2, 1.6e-1)))
    if not whole:
        rows = [r for r in rows if r["seed"] != 2]
    monkeypatch.setattr(ls, "read_rows", lambda folders, group=None: rows)
    trained = []
    monkeypatch.setattr(ls, "run_block", lambda cfg, out, jobs=1, progress=True: trained.append(cfg) or [])
    (tmp_path / "w64").mkdir()
    code = main(["lr-study", "--block", "3", "--from", str(tmp_path / "w64"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    if whole:
        assert code == 0 and len(trained) == 1
        assert trained[0].lrs == pytest.approx((5e-3, 1e-2, 2e-2, 4e-2)) and trained[0].d_model == 256
    else:
        assert code == 2 and not trained and len(err) == 1
        assert "has 24 of its 36 none and qk-norm runs finished; finish block 1 first" in err[0]


def test_publish_carries_the_muon_pilot_and_re_derives_its_grid(smoke_block, tmp_path):
    """Published with the pilot's folder, the block holds the pilot's runs and the grid ``muon_grid`` reads off them,
    the series holds the pilot's runs marked, and the block re-derives from the series alone."""
    import json

    from attnscale.cli import main
    from attnscale.experiments import publish
    from attnscale.experiments.lr_study_text import format_result

    out, _ = smoke_block
    pilot_dir = tmp_path / "pilot"
    pilot = ls.run_muon_pilot(ls.muon_pilot_config("smoke"), pilot_dir, progress=False)
    studies, series = tmp_path / "studies.json", tmp_path / "lr.json.gz"
    assert main(["lr-study", "--publish", str(out), str(pilot_dir), "--json-out", str(studies),
                 "--series", str(series)]) == 0
    got = json.loads(studies.read_text())["sensitivity"]
    p = got["muon_pilot"]
    assert p["seed"] == ls.PILOT_SEED and p["whole"] is False  # the smoke pilot trains 2 of the 8 rates
    assert len(p["runs"]) == len(pilot["rows"]) == 4
    assert {(r["treatment"], r["lr"], r["valid_loss"]) for r in p["runs"]} == {
        (r["treatment"], r["lr"], r["valid_loss"]) for r in pilot["rows"]}
    assert p["grid"] == json.loads(json.dumps(pilot["grid"]))
    data = publish.read_series(series, "lr")
    assert sum(bool(r.get("pilot")) for r in data["runs"]) == 4
    assert json.loads(json.dumps(ls.block_from_series(data, got["command"]))) == got
    text = format_result(got)
    assert "Muon pilot, seed 100 (interim" in text and "r1 = " in text


def _whole_width64(optimizer, lrs):
    return (_curve_rows(optimizer, lrs, "qk-norm", (1.52, 1.53, 1.54, 1.55, 1.60, 1.66))
            + _curve_rows(optimizer, lrs, "none", [1.6] * 6, failed=lrs[-2:]))


MUON_LRS = (2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2, 8e-2)


def test_block_5_is_z_loss_alone_on_each_width_64_grid():
    """Block 5 trains z-loss (1e-4, no qk-norm, no action) at width 64 under AdamW on block 1's grid, then under Muon
    on block 2's, seeds 0-2: its curve sits beside the other treatments rate for rate and seed for seed."""
    adamw, muon = ls.z_loss_configs(_whole_width64("adamw", ls.ADAMW_LRS) + _whole_width64("muon", MUON_LRS))
    assert (adamw.optimizer, muon.optimizer) == ("adamw", "muon")
    assert adamw.lrs == pytest.approx(ls.ADAMW_LRS) and muon.lrs == pytest.approx(MUON_LRS)
    for cfg in (adamw, muon):
        assert cfg.treatments == ("z-loss",) and cfg.d_model == 64 and cfg.seeds == ls.SEEDS
        specs = ls.block_specs(cfg, 99)
        assert len(specs) == 18 and not ls.alarm_specs(cfg, 99, [])
        assert {s.train.z_loss for s in specs} == {1e-4} and {s.model.scale for s in specs} == {"inv_sqrt_d"}
        assert all(s.watch is None for s in specs)
    assert {s.train.optimizer for s in ls.block_specs(muon, 99)} == {"muon"}
    # the AdamW z-loss run is the none run of its rate and seed but for the z-loss
    none = ls._spec(ls.preset(1), 99, "lr", ls.GROUP, "none", 1e-2, 1)
    z = ls._spec(adamw, 99, "lr", ls.GROUP, "z-loss", 1e-2, 1)
    assert z.model == none.model and dataclasses.replace(z.train, z_loss=0.0) == none.train


def test_block_5_refuses_until_block_2_is_whole():
    part = _whole_width64("adamw", ls.ADAMW_LRS) + [r for r in _whole_width64("muon", MUON_LRS) if r["seed"] == 0]
    with pytest.raises(ConfigError, match="the width-64 muon block has 12 of its 36 none and qk-norm runs finished; "
                                          "finish block 2 first"):
        ls.z_loss_configs(part)


@pytest.mark.parametrize("argv, code, message", [
    ([], 2, "give --from their folder"), (["--lrs", "0.01"], 2, "give --from their folder"),
    (["--from", "FROM"], 0, None)])
def test_block_5_on_the_command_line(argv, code, message, tmp_path, monkeypatch, capsys):
    from attnscale.cli import main

    rows = _whole_width64("adamw", ls.ADAMW_LRS) + _whole_width64("muon", MUON_LRS)
    monkeypatch.setattr(ls, "read_rows", lambda folders, group=None: rows)
    trained = []
    monkeypatch.setattr(ls, "run_block", lambda cfg, out, jobs=1, progress=True: trained.append(cfg) or [])
    (tmp_path / "FROM").mkdir()
    argv = [str(tmp_path / a) if a == "FROM" else a for a in argv]
    assert main(["lr-study", "--block", "5", "--out", str(tmp_path / "out"), *argv]) == code
    err = capsys.readouterr().err.strip().splitlines()
    if message:
        assert len(err) == 1 and message in err[0] and not trained
    else:
        assert [(c.optimizer, c.treatments) for c in trained] == [("adamw", ("z-loss",)), ("muon", ("z-loss",))]


def test_publish_draws_the_figure_from_the_block(smoke_block, tmp_path):
    from attnscale.cli import main

    out, _ = smoke_block
    figure = tmp_path / "figs" / "lr.png"
    assert main(["lr-study", "--publish", str(out), "--figure", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
    assert main(["lr-study", "--publish", str(out), "--figure", str(figure)]) == 0  # a PNG is redrawn


@pytest.mark.parametrize("name, message", [("lr.txt", "is not a .png file name"), ("folder.png", "is a folder"),
                                           ("a-file/below.png", "lies under a file"),
                                           ("notes.png", "exists and is not a PNG")])
def test_publish_refuses_a_bad_figure_path_before_writing_anything(name, message, smoke_block, tmp_path, capsys):
    from attnscale.cli import main

    out, _ = smoke_block
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "notes.png").write_text("my notes")
    studies = tmp_path / "studies.json"
    assert main(["lr-study", "--publish", str(out), "--json-out", str(studies), "--figure", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--figure" in err[0] and message in err[0]
    assert not studies.exists() and (tmp_path / "notes.png").read_text() == "my notes"


def test_figure_goes_with_publish_only(tmp_path, capsys):
    from attnscale.cli import main

    assert main(["lr-study", "--block", "1", "--out", str(tmp_path / "o"), "--figure", str(tmp_path / "f.png")]) == 2
    assert "--figure go with --publish" in capsys.readouterr().err


def test_the_printout_gives_the_alarm_in_the_none_runs():
    from attnscale.experiments.lr_study_text import format_result

    def run(lr, seed, score, broke=None, learned=True):
        return {"optimizer": "adamw", "d_model": 64, "treatment": "none", "lr": lr, "seed": seed, "valid_loss": 1.6,
                "losses": [], "probes": [{"step": 10, "max_score": score}],
                "outcome": {"learned_at": 5 if learned else None, "break_step": broke}}

    rows = [run(1e-2, 0, 5.0), run(1e-2, 1, 2e4), run(8e-2, 0, 2e4, broke=900), run(1.6e-1, 0, 2e4, learned=False)]
    text = format_result(ls.block(rows))
    assert "ahead of the break 1/1, 100% [21%, 100%]; in the runs that held 1/2, 50% [9%, 91%]" in text
    assert "0.01: held 1/2 · 0.08: broke 1/1 · 0.16: never learnt 1/1" in text


@pytest.mark.slow
def test_the_quick_chain_runs_from_the_command_line(tmp_path):
    """Every block that reads another's runs, at the smoke size, as docs/lr-study.md chains them: the Muon pilot,
    block 1, block 2 from the pilot, blocks 3 and 4 from the width-64 blocks, block 5 from both, then --publish."""
    import json

    from attnscale.cli import main

    pilot, runs = str(tmp_path / "pilot"), str(tmp_path / "runs")
    for argv in (["--muon-pilot", "--out", pilot], ["--block", "1", "--out", runs],
                 ["--block", "2", "--from", pilot, "--out", runs], ["--block", "3", "--from", runs, "--out", runs],
                 ["--block", "4", "--from", runs, "--out", runs], ["--block", "5", "--from", runs, "--out", runs]):
        assert main(["lr-study", "--quick", "-j", "1", *argv]) == 0, argv
    studies = tmp_path / "studies.json"
    assert main(["lr-study", "--publish", runs, pilot, "--json-out", str(studies)]) == 0
    got = json.loads(studies.read_text())["sensitivity"]
    groups = {(g["optimizer"], g["d_model"]): set(g["curves"]) for g in got["groups"]}
    assert set(groups) == {("adamw", 16), ("muon", 16), ("adamw", 32), ("muon", 32)}  # smoke: 16 wide, wider 32
    assert {"none", "qk-norm", "clip", "alarm-clip", "z-loss"} <= groups["adamw", 16]
    assert "z-loss" in groups["muon", 16] and "z-loss" not in groups["muon", 32]
    assert got["muon_pilot"]["whole"] is False  # the smoke pilot trains 2 of its 8 rates


def test_the_docs_quote_the_published_width_64_blocks():
    """docs/lr-study.md, docs/watch.md, README and default_alerts quote blocks 1, 2 and 5 as the published block
    holds them; the alarm's lateness under Muon (after the break in 5 of 6) is counted here from the series: each
    run's outcome judged again, its alarm the first probe after step 0 over 1e4."""
    import inspect

    from attnscale.analysis import paired
    from attnscale.experiments.alarm_study_text import share_text
    from attnscale.experiments.lr_study_text import mean_text
    from attnscale.watch import alerts
    from published import doc_text, published_block

    published, series, docs = published_block("sensitivity", "lr-study-series.json.gz", "lr")
    groups = {(g["optimizer"], g["d_model"]): g for g in published["groups"]}
    lr_doc, watch = doc_text(docs, "lr-study.md"), doc_text(docs, "watch.md")
    readme = doc_text(docs.parent, "README.md")
    advice = " ".join(inspect.getdoc(alerts.default_alerts).split())
    for opt in ("adamw", "muon"):
        g = groups[opt, 64]
        assert not g["interim"]
        for t, c in g["curves"].items():
            assert mean_text(c["sensitivity"]) in lr_doc, (opt, t)
        tables = [("z-loss", "none"), ("z-loss", "qk-norm")] + ([  # block 5's table, and block 2's under Muon
            ("qk-norm", "none"), ("clip", "none"), ("alarm-clip", "none"), ("clip", "qk-norm"),
            ("alarm-clip", "qk-norm")] if opt == "muon" else [])
        for t, ref in tables:
            for key in ("best", "sensitivity"):
                e = g["against"][t][ref][key]
                if not e["se"]:
                    assert all(g["curves"][t]["best_by_seed"][s] == g["curves"][ref]["best_by_seed"][s]
                               for s in g["curves"][t]["best_by_seed"]) and key == "best"
                    continue  # the doc says "identical on every seed"
                text = paired.estimate_text(e["diff"], e["se"], e["n"], e["interval"], signed=True)
                assert f"{text} {e['reading']}" in lr_doc.replace("−", "-"), (opt, t, ref, key)
    muon = groups["muon", 64]
    for t in ("qk-norm", "none", "clip"):
        assert mean_text(muon["curves"][t]["sensitivity"]) in watch, t
    for opt in ("adamw", "muon"):
        assert mean_text(groups[opt, 64]["curves"]["z-loss"]["sensitivity"]) in watch, opt
    # README's LR sensitivities, to two figures, AdamW then Muon
    for t, name in (("qk-norm", "qk-norm"), ("none", "nothing"), ("clip", "QK-Clip from step 0")):
        a, m = (groups[o, 64]["curves"][t]["sensitivity"]["mean"] for o in ("adamw", "muon"))
        assert f"{name} {a:.2g}, {m:.2g}" in readme, t
    alarm = muon["alarm"]
    assert share_text(alarm["sensitivity"]["study"]) in watch and share_text(alarm["false_alarms"]) in watch
    assert share_text(alarm["sensitivity"]["study"]) in lr_doc and share_text(alarm["false_alarms"]) in lr_doc
    # after the break, counted from the series
    broke = late = 0
    for r in series["runs"]:
        if r.get("pilot") or (r["optimizer"], r["d_model"], r["treatment"]) != ("muon", 64, "none"):
            continue
        out = ls.outcome_of(r)
        if out["learned_at"] is None or out["break_step"] is None:
            continue
        broke += 1
        first = next((p["step"] for p in r["probes"] if p["step"] > 0 and p["max_score"] is not None
                      and p["max_score"] > 1e4), None)
        late += first is None or first > out["break_step"]
    assert (late, broke) == (5, 6)
    # the Muon pilot: its table's losses, and the grid it gave is the one block 2 trained
    pilot = published["muon_pilot"]
    assert pilot["whole"] and len(pilot["runs"]) == 16
    row = next(part for part in lr_doc.split("| rate |")[1:] if part.startswith(" 2.5e-3")).split("r₁ =")[0]
    assert row.count("|") > 30  # the pilot's table, and only it
    for r in pilot["runs"]:
        assert f"{r['valid_loss']:.3f}" in row, r
    assert pilot["grid"]["lrs"] == pytest.approx(muon["curves"]["none"]["lrs"])
    for text in (readme, watch, advice):
        assert f"after {'the break in ' if text is not readme else ''}{late} of {'the ' if text is not readme else ''}{broke}" in text
